"""A document as this layer sees it: pieces copied byte for byte, and runs of text to translate, each with
the inline markup inside it. Every format reads into this form and writes back from it, so that what is
translated, and how, is decided once (pipeline.py) for plain text, Markdown, HTML and subtitles alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mark:
    """Inline markup around the characters [start, end) of a run's text: `open` is written before them and
    `close` after them, both exactly as the source had them (`<b class="x">` and `</b>`, `**` and `**`,
    `[` and `](https://example.com "title")`)."""

    start: int
    end: int
    open: str
    close: str


@dataclass(frozen=True)
class Run:
    """Text to translate. `text` is what a reader sees (markup taken out, entities decoded); `marks` the
    inline markup around parts of it; `keep` the (start, end) character ranges of `text` that must come
    through as they are (inline code, an image): they travel past the model as protected spans. `raw` is
    the source the run was read from, for the document written back untranslated."""

    text: str
    raw: str
    marks: tuple[Mark, ...] = ()
    keep: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Kept:
    """Source copied as it is: structure, code blocks, tags, cue numbers and timings."""

    raw: str


Piece = Kept | Run


def _as_is(text: str) -> str:
    return text


@dataclass
class Document:
    """A parsed document: its pieces in order (their raw text joined is the source), and how the format
    writes plain text back (`escape`: `&` as `&amp;` in HTML, nothing in plain text)."""

    format: str
    pieces: list[Piece]
    escape: Callable[[str], str] = field(default=_as_is)

    @property
    def runs(self) -> list[Run]:
        """The runs to translate, in document order."""
        return [p for p in self.pieces if isinstance(p, Run)]

    def source(self) -> str:
        """The document as it was read."""
        return "".join(p.raw for p in self.pieces)

    def render(self, translated: Sequence[str]) -> str:
        """The document with each run replaced by its translation (one per run, in order, its markup
        already in place and escaped); every kept piece as it was."""
        runs = self.runs
        if len(translated) != len(runs):
            raise ValueError(f"{len(translated)} translations for {len(runs)} runs")
        done = iter(translated)
        return "".join(next(done) if isinstance(p, Run) else p.raw for p in self.pieces)
