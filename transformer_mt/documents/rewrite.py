"""Text rewritten by replacing some of its stretches, and where each character went: masking a sentence's
spans, putting them back in its translation and joining sentences all move text, and word alignments and
inline markup must follow it."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """[start, end) of the old text replaced by `new`."""

    start: int
    end: int
    new: str


@dataclass(frozen=True)
class Rewrite:
    """An old text and the new one made from it by non-overlapping edits; `segments` pair each edited
    stretch of the old text with the stretch of the new one that replaced it."""

    old: str
    new: str
    segments: tuple[tuple[int, int, int, int], ...]  # (old start, old end, new start, new end)

    @classmethod
    def of(cls, old: str, edits: Sequence[Edit]) -> Rewrite:
        """`old` with each edit applied (edits in any order, never overlapping)."""
        parts, segments, at, shift = [], [], 0, 0
        for e in sorted(edits, key=lambda e: e.start):
            if e.start < at:
                raise ValueError(f"edits overlap at {e.start}")
            parts += [old[at:e.start], e.new]
            segments.append((e.start, e.end, e.start + shift, e.start + shift + len(e.new)))
            shift += len(e.new) - (e.end - e.start)
            at = e.end
        parts.append(old[at:])
        return cls(old, "".join(parts), tuple(segments))

    def forward(self, start: int, end: int) -> tuple[int, int]:
        """Where the old characters [start, end) are in the new text (an edited stretch they touch
        counts whole)."""
        return _mapped(start, end, [(a, b, c, d) for a, b, c, d in self.segments])

    def backward(self, start: int, end: int) -> tuple[int, int]:
        """Where the new characters [start, end) came from in the old text."""
        return _mapped(start, end, [(c, d, a, b) for a, b, c, d in self.segments])


def _mapped(start: int, end: int, segments: list[tuple[int, int, int, int]]) -> tuple[int, int]:
    """[start, end) carried from one side of `segments` (sorted, non-overlapping) to the other."""
    def char(x: int) -> tuple[int, int]:  # where character x went: an edit's whole stretch, or x shifted
        i = bisect.bisect_right([s[0] for s in segments], x) - 1
        if i >= 0 and segments[i][0] <= x < segments[i][1]:
            return segments[i][2], segments[i][3]
        shift = segments[i][3] - segments[i][1] if i >= 0 else 0
        return x + shift, x + shift + 1

    if end <= start:
        at = char(start)[0]
        return at, at
    return char(start)[0], max(char(start)[0], char(end - 1)[1])
