"""Keeping a large corpus's preparation small: index arrays no wider than they need, and memory given
back to the OS between the passes over it.

glibc keeps memory that Python objects and mid-sized arrays (below its adaptive mmap threshold, up to
32 MiB) freed, for reuse by the same process; after a pass that made millions of small objects or many
such arrays, the next pass would start from that high-water mark. malloc_trim returns the free pages.
"""

from __future__ import annotations

import ctypes

import numpy as np


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc's malloc_trim; nothing elsewhere)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc (macOS, musl): nothing to do
        pass


def index_type(n: int) -> type:
    """The dtype for indices below n: int32 while they fit (half the memory a pair), else int64."""
    return np.int32 if n < 2**31 else np.int64
