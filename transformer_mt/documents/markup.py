"""A run's inline markup, both ways: `RunText` builds a Run as a format's reader walks its source (text,
marks, keep ranges), and `render_run` writes a (translated) run back with its marks around their characters,
its keep ranges verbatim and the rest escaped for the format."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformer_mt.documents.pieces import Mark, Run


def _checked(text: str, marks: Sequence[Mark], keep: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    ranges = sorted(keep)
    for (start, end), (after, _) in zip(ranges, [*ranges[1:], (len(text), len(text))]):
        if not 0 <= start < end <= after:
            raise ValueError(f"keep range {(start, end)} is empty, overlaps another or lies outside the text")
    for mark in marks:
        if not 0 <= mark.start <= mark.end <= len(text):
            raise ValueError(f"mark {mark} lies outside the text ({len(text)} characters)")
    return ranges


def _snapped(mark: Mark, ranges: list[tuple[int, int]]) -> Mark:
    """The mark with any end inside a keep range moved to that range's edge: a keep range is written
    whole, so markup goes around it, never into it."""
    start, end = mark.start, mark.end
    for low, high in ranges:
        if low < start < high:
            start = low
        if low < end < high:
            end = low if mark.start == mark.end else high
    return Mark(start, max(start, end), mark.open, mark.close)


def render_run(text: str, marks: Sequence[Mark], keep: Sequence[tuple[int, int]],
               escape: Callable[[str], str]) -> str:
    """`text` written with each mark's `open` before its characters and `close` after them, properly
    nested, keep ranges verbatim and everything else through `escape`.

    Marks may come in any order: a mark whose range lies within another's goes inside it; marks with the
    same range nest in the order given (the first is outermost); a zero-width mark is written where it
    stands, outside the marks that open or close there; two marks that cross are split (the inner one is
    closed and opened again) so the output still nests."""
    ranges = _checked(text, marks, keep)
    marks = [_snapped(mark, ranges) for mark in marks]
    # zero-width marks first at their place, then the longest mark outermost, ties in the order given
    order = sorted(marks, key=lambda m: (m.start, m.start != m.end, -m.end))
    cuts = sorted({0, len(text)} | {m.start for m in marks} | {m.end for m in marks}
                  | {edge for span in ranges for edge in span})
    kept = dict(ranges)
    out: list[str] = []
    stack: list[Mark] = []
    waiting = 0
    for here, after in zip(cuts, [*cuts[1:], None]):
        if any(mark.end == here for mark in stack):
            reopen = []
            while any(mark.end == here for mark in stack):
                mark = stack.pop()
                out.append(mark.close)
                if mark.end != here:
                    reopen.append(mark)
            for mark in reversed(reopen):
                out.append(mark.open)
                stack.append(mark)
        while waiting < len(order) and order[waiting].start == here:
            mark = order[waiting]
            out.append(mark.open)
            if mark.end == here:
                out.append(mark.close)
            else:
                stack.append(mark)
            waiting += 1
        if after is not None:  # no cut falls inside a keep range, so one that starts one ends it
            out.append(text[here:after] if here in kept else escape(text[here:after]))
    return "".join(out)


class RunText:
    """A run as a reader meets it, in source order: text, keep ranges and marks opened and closed. A mark
    closed with nothing inside it becomes a keep range (its tags verbatim), since it marks no words and a
    zero-width mark could not say on which side of its neighbours it stood."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._length = 0
        self._keep: list[tuple[int, int]] = []
        self._marks: list[Mark | None] = []
        self._open: list[tuple[int, int, str]] = []  # (index in _marks, start, open)

    def add_text(self, text: str) -> None:
        """Characters to translate."""
        self._text.append(text)
        self._length += len(text)

    def add_keep(self, raw: str) -> None:
        """Source that must come through verbatim (inline code, an image, a line break's markup)."""
        if raw:
            self._keep.append((self._length, self._length + len(raw)))
            self.add_text(raw)

    def open_mark(self, raw: str) -> None:
        """The opening markup of a mark (`<b>`, `**`, `[`)."""
        self._open.append((len(self._marks), self._length, raw))
        self._marks.append(None)

    def close_mark(self, raw: str) -> None:
        """The closing markup of the mark opened last."""
        index, start, opening = self._open.pop()
        if start == self._length:
            del self._marks[index]
            self.add_keep(opening + raw)
        else:
            self._marks[index] = Mark(start, self._length, opening, raw)

    def run(self, raw: str) -> Run | None:
        """The Run read from `raw`, or None when it has nothing to translate (only whitespace and keep
        ranges)."""
        text = "".join(self._text)
        kept = set()
        for start, end in self._keep:
            kept.update(range(start, end))
        if all(ch.isspace() or i in kept for i, ch in enumerate(text)):
            return None
        return Run(text, raw, tuple(m for m in self._marks if m is not None), tuple(self._keep))
