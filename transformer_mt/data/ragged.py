"""Token ids of many sentences in one flat array: the container of every encoded split.

The flat array may be memory-mapped from a cache file: selecting, reordering and cutting sequences
only changes the start and end arrays, never the ids, so a training split larger than memory is used
in place, and a worker process that gets the split maps the same file rather than a copy of it.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ragged:
    """Variable-length id sequences: slices [starts[i], ends[i]) of one flat int32 array, which may be
    memory-mapped. Selecting, reordering and cutting sequences only changes starts and ends.

    Indexing with an int gives that sequence (a read-only int32 view), with a slice a Ragged.
    """

    flat: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def from_offsets(cls, flat: np.ndarray, offsets: np.ndarray) -> Ragged:
        """Sequences laid end to end: sequence i is flat[offsets[i]:offsets[i + 1]]."""
        return cls(flat, offsets[:-1], offsets[1:])

    @classmethod
    def from_lists(cls, ids: Sequence[Sequence[int]]) -> Ragged:
        """Sequences given as lists of ids, copied into one new flat int32 array."""
        offsets = np.concatenate([[0], np.cumsum([len(row) for row in ids], dtype=np.int64)])
        flat = np.fromiter((i for row in ids for i in row), dtype=np.int32, count=int(offsets[-1]))
        return cls.from_offsets(flat, offsets)

    @classmethod
    def concat(cls, parts: Sequence[Ragged]) -> Ragged:
        """The sequences of all parts in order, their ids copied into one new flat array."""
        flats, offsets, total = [], [np.zeros(1, np.int64)], 0
        for part in parts:
            lengths = part.lengths
            ends = np.cumsum(lengths)
            size = int(ends[-1]) if len(ends) else 0
            # the new array's id j of a row lies at starts[row] + (j - where the row begins in it)
            gather = np.repeat(part.starts.astype(np.int64) - (ends - lengths), lengths) + np.arange(size)
            flats.append(np.asarray(part.flat[gather], dtype=np.int32))
            offsets.append(total + ends)
            total += size
        return cls.from_offsets(np.concatenate(flats or [np.zeros(0, np.int32)]), np.concatenate(offsets))

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled with its ids, or where they are a file's memory map (not a view of one), with the file's
        name: a worker process (data/ahead.py) then maps the file itself instead of holding a copy."""
        flat = self.flat
        if isinstance(flat, np.memmap) and isinstance(flat.base, mmap.mmap):
            return _mapped, (flat.filename, flat.dtype.str, flat.offset, flat.shape, self.starts, self.ends)
        return Ragged, (flat, self.starts, self.ends)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int | slice) -> np.ndarray | Ragged:
        if isinstance(i, slice):
            return Ragged(self.flat, self.starts[i], self.ends[i])
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} sequences")
        return self.flat[self.starts[i]:self.ends[i]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            yield self.flat[a:b]

    @property
    def lengths(self) -> np.ndarray:
        """Length of every sequence (int64)."""
        return (self.ends - self.starts).astype(np.int64)

    def take(self, rows: Sequence[int] | np.ndarray) -> Ragged:
        """The sequences at rows, in that order (no ids are copied)."""
        rows = np.asarray(rows, dtype=np.int64)
        return Ragged(self.flat, self.starts[rows], self.ends[rows])

    def truncate(self, max_len: int) -> Ragged:
        """Every sequence cut to at most max_len ids."""
        return Ragged(self.flat, self.starts, np.minimum(self.ends, self.starts + max_len))

    def tolist(self) -> list[list[int]]:
        """Plain Python lists."""
        return [a.tolist() for a in self]


def _mapped(path: str | os.PathLike[str], dtype: str, offset: int, shape: tuple[int, ...],
            starts: np.ndarray, ends: np.ndarray) -> Ragged:
    """A pickled Ragged whose ids are the memory map of `path` (Ragged.__reduce__)."""
    return Ragged(np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=shape), starts, ends)
