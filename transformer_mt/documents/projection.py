"""Inline markup carried onto a translation through word alignments, as Bergamot moves HTML tags: a
mark around some words of the source goes around the words of the translation linked to them.

Alignments rather than placeholders in the text: a small model trained on plain sentences drops or
moves tag placeholders it never saw, while the cross-attention links exist for every translation
(decoding/alignment.py), so a mark always lands, and the model translates the plain sentence it knows.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformer_mt.documents.assembly import words
from transformer_mt.documents.pieces import Mark

_FINAL = ".!?…。！？"


def project(marks: Sequence[Mark], source: str, translation: str,
            links: Sequence[tuple[int, int]]) -> list[Mark]:
    """Each mark of `source` as a mark of `translation`: around the span from the first to the last word
    linked to a word it marked; a mark whose words have no link goes, empty, before the final
    punctuation. Marks come out nested as in the source (a projected mark that would cross an earlier
    one is cut to end where that one ends)."""
    src, tgt = words(source), words(translation)
    linked: dict[int, set[int]] = {}
    for s, t in links:
        if t < len(tgt):
            linked.setdefault(s, set()).add(t)
    end = len(translation.rstrip().rstrip(_FINAL))
    placed = []
    for mark in marks:
        marked = [w for w, (a, b) in enumerate(src) if a < mark.end and mark.start < b]
        targets = sorted({t for w in marked for t in linked.get(w, ())})
        if targets:
            placed.append(Mark(tgt[targets[0]][0], tgt[targets[-1]][1], mark.open, mark.close))
        else:
            placed.append(Mark(end, end, mark.open, mark.close))
    return _nested(placed)


def _nested(marks: list[Mark]) -> list[Mark]:
    """The marks with any crossing undone: each is cut to fit inside the one it starts in."""
    out: list[Mark] = []
    for mark in sorted(marks, key=lambda m: (m.start, -m.end)):
        for outer in out:
            if outer.start <= mark.start < outer.end < mark.end:
                mark = Mark(mark.start, outer.end, mark.open, mark.close)
        out.append(mark)
    return out
