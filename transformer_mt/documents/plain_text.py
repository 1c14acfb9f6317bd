"""Plain text as a Document: each line's words are a run; line endings (\\n, \\r\\n, \\r), blank lines and
the spaces around a line's words are kept as they are, so the line structure comes out exactly."""

from __future__ import annotations

import re

from transformer_mt.documents.pieces import Document, Kept, Piece, Run

# a line's words: from its first character that is not a space to its last, on one line
_WORDS = re.compile(r"[^\s]+(?:[^\S\r\n]+[^\s]+)*")


def read_text(source: str) -> Document:
    """The text's lines as runs (without their line endings and surrounding spaces), the rest kept."""
    pieces: list[Piece] = []
    done = 0
    for words in _WORDS.finditer(source):
        if words.start() > done:
            pieces.append(Kept(source[done:words.start()]))
        pieces.append(Run(words.group(), words.group()))
        done = words.end()
    if done < len(source):
        pieces.append(Kept(source[done:]))
    return Document("text", pieces)
