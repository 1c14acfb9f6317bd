"""The leak-free split into train, valid and test, and reading the split files a run directory keeps.

Pairs that share a source or a target sentence (Tatoeba translates many sentences several ways) are
one group, and a group lands in one split whole, so no held-out sentence was seen in training. The
split works on one integer key per sentence (its hash), so it needs 16 bytes a pair whatever the
corpus's size; it does not depend on the direction (groups are ordered by their first pair), so en->fr
and fr->en runs with the same seed hold out the same pairs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transformer_mt.data.memory import index_type, release_freed_memory
from transformer_mt.data.text_files import no_file, read_utf8, split_lines
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)
SPLIT_DIR = "split"
TRAIN, VALID, TEST = 0, 1, 2
_CHUNK = 1 << 16  # Python ints at a time: few enough that their memory is reused


def sentence_key(sentence: str) -> int:
    """The key under which two sentences count as the same (a hash of the stripped text)."""
    return hash(sentence.strip())


@dataclass
class Assignment:
    """Where each pair goes: part[i] is TRAIN, VALID or TEST; orders[p] lists a part's pairs in split
    order (its groups in the seed's order, each group's pairs in corpus order)."""

    part: np.ndarray
    orders: dict[int, np.ndarray]
    valid_size: int
    test_size: int


def group_roots(src_keys: np.ndarray, tgt_keys: np.ndarray) -> np.ndarray:
    """For each pair, the first pair of its group: pairs linked by an equal source or target key."""
    n = len(src_keys)
    index = index_type(n)
    parent = np.arange(n, dtype=index)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving keeps the trees flat
            i = int(parent[i])
        return i

    for keys in (src_keys, tgt_keys):
        order = np.argsort(keys, kind="stable").astype(index)  # equal keys: consecutive, in corpus order
        ordered = keys[order]
        starts_run = np.ones(n, dtype=bool)
        np.not_equal(ordered[1:], ordered[:-1], out=starts_run[1:])
        del ordered
        run_start = np.arange(n, dtype=index)
        run_start[~starts_run] = 0
        np.maximum.accumulate(run_start, out=run_start)
        repeated = np.flatnonzero(~starts_run).astype(index)  # only repeated sentences need a union
        del starts_run
        for lo in range(0, len(repeated), _CHUNK):  # Python ints for one chunk at a time
            for pos in repeated[lo:lo + _CHUNK].tolist():
                a, b = find(int(order[pos])), find(int(order[run_start[pos]]))
                if a != b:
                    parent[max(a, b)] = min(a, b)  # the smaller index is the root: a group's first pair
        del order, run_start, repeated
    roots = parent.copy()
    while True:  # compress every path at once
        nxt = roots[roots]
        if np.array_equal(nxt, roots):
            return roots
        roots = nxt


def _sizes(n: int, valid_size: int, test_size: int) -> tuple[int, int]:
    """The held-out sizes to use: a small corpus (e.g. dataset.max_pairs=3000) keeps most pairs for
    training, so valid and test shrink to 10% each when they would take more than a fifth."""
    if valid_size + test_size > n // 5:
        limit = max(1, n // 10)
        shrunk = min(valid_size, limit), min(test_size, limit)
        log.warning("%d pairs: valid/test sizes %d/%d shrunk to %d/%d (10%% each)", n, valid_size,
                    test_size, *shrunk)
        return shrunk
    return valid_size, test_size


def assign(src_keys: np.ndarray, tgt_keys: np.ndarray, valid_size: int, test_size: int,
           seed: int) -> Assignment:
    """Fill valid, then test, with whole groups in the seed's random order (a group may overshoot a little);
    the rest is train."""
    n = len(src_keys)
    valid_size, test_size = _sizes(n, valid_size, test_size)
    too_small = DataError(f"only {n} pairs: dataset.valid_size={valid_size} + dataset.test_size="
                          f"{test_size} leave nothing to train on; lower them or use more data")
    if valid_size + test_size >= n:
        raise too_small
    roots = group_roots(np.asarray(src_keys), np.asarray(tgt_keys))
    release_freed_memory()  # the union-find's Python ints and sort buffers
    # groups numbered by their first pair (a root is its group's smallest index): np.unique's inverse,
    # without its sort and int64 temporaries
    is_first = roots == np.arange(n, dtype=roots.dtype)
    number = np.cumsum(is_first, dtype=roots.dtype) - 1
    group = number[roots]
    groups = int(is_first.sum())
    del roots, is_first, number
    sizes = np.bincount(group)
    rank = np.empty(groups, dtype=np.int64)
    rank[np.random.default_rng(seed).permutation(groups)] = np.arange(groups)
    by_rank = np.argsort(rank)
    before = np.cumsum(sizes[by_rank]) - sizes[by_rank]  # pairs placed before each group, in rank order
    n_valid = int(np.sum(before < valid_size))
    valid_end = int(before[n_valid]) if n_valid < len(before) else n
    n_test = int(np.sum((before[n_valid:] - valid_end) < test_size))
    part_of_rank = np.full(groups, TRAIN, dtype=np.int8)
    part_of_rank[:n_valid], part_of_rank[n_valid:n_valid + n_test] = VALID, TEST
    group_rank = rank[group].astype(group.dtype)
    del group
    part = part_of_rank[group_rank]
    if not (part == TRAIN).any():
        raise too_small
    order = np.argsort(group_rank, kind="stable")  # by group rank, then corpus order
    del group_rank
    orders = {p: order[part[order] == p] for p in (TRAIN, VALID, TEST)}
    return Assignment(part, orders, valid_size, test_size)


def load_split_tsv(path: str | Path) -> tuple[list[str], list[str]]:
    """(sources, targets) of a source<TAB>target file as save_split writes; blank lines ignored."""
    path = Path(path)
    if not path.is_file():
        raise no_file(path, "; give a source<TAB>reference file")
    src: list[str] = []
    tgt: list[str] = []
    for n, line in enumerate(split_lines(read_utf8(path)), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(f"{path}: line {n} has {len(parts)} tab-separated columns, "
                            "expected 2 (source<TAB>reference)")
        src.append(parts[0])
        tgt.append(parts[1])
    return src, tgt
