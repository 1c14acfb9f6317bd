"""Batches: length-grouped token batches for training and decoding, padding, and the tensors a step takes.

Conventions shared with the model and the searches:
- The encoder input is a sentence's token ids followed by <eos> (no <bos>), in training and in
  decoding alike (`collate` and `pad_sources`).
- The decoder input is <bos> + y and its target is y + <eos>; padding is PAD_ID everywhere.
- A batch of n examples costs n * (longest + 1) tokens: the +1 is the source's <eos>, or the target's
  <bos>/<eos>. `greedy_cut` is the one rule that fills batches up to a budget of such tokens.
- With a `pad_to_multiple` m > 1 (compiling on a GPU), training batches round that length up to a multiple
  of m and their row count down to one (when they have m rows or more), so an epoch's batches come in a
  bounded set of shapes: a GPU's kernels (cuDNN attention plans, torch.compile graphs) are built per
  shape. The CPU's m = 1 leaves batches as they were: padding there only costs time.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """Padded tensors for one step: src = x + eos, tgt_in = bos + y, tgt_out = y + eos."""

    src: torch.Tensor  # (B, S) long
    tgt_in: torch.Tensor  # (B, T) long
    tgt_out: torch.Tensor  # (B, T) long
    n_tgt_tokens: int  # non-pad positions of tgt_out (the loss normaliser)
    n_src_tokens: int  # non-pad positions of src

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on device."""
        return dataclasses.replace(
            self, src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking))

    def pad_to(self, multiple: int) -> Batch:
        """The same batch with its source and target lengths padded up to a multiple (itself if they are)."""
        def widen(t: torch.Tensor) -> torch.Tensor:
            extra = -t.shape[1] % multiple
            return torch.nn.functional.pad(t, (0, extra), value=PAD_ID) if extra else t

        if multiple <= 1:
            return self
        return dataclasses.replace(self, src=widen(self.src), tgt_in=widen(self.tgt_in),
                                   tgt_out=widen(self.tgt_out))


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, prefix: int | None,
         suffix: int | None) -> tuple[np.ndarray, int]:
    """(B, width) int64 array of each seq wrapped in prefix/suffix, and its non-pad count."""
    if not len(seqs):
        raise ValueError("cannot pad an empty batch")
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    total = int(lengths.sum())
    if all(isinstance(s, np.ndarray) for s in seqs):
        flat = np.concatenate(seqs) if total else np.zeros(0, dtype=np.int64)
    else:
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)
    first = int(prefix is not None)
    extra = first + int(suffix is not None)
    out = np.full((len(seqs), int(lengths.max()) + extra), pad_id, dtype=np.int64)
    cols = np.arange(out.shape[1])
    # Row-major boolean assignment fills each row left to right, matching the flat order.
    out[(cols >= first) & (cols < first + lengths[:, None])] = flat
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(seqs)), first + lengths] = suffix
    return out, total + extra * len(seqs)


def pad_sources(src_ids: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    """Encoder input (B, S) long: each source's ids followed by <eos>, right-padded."""
    return torch.from_numpy(_pad(src_ids, pad_id, None, EOS_ID)[0])


def collate(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
            pad_id: int = PAD_ID) -> Batch:
    """A training batch from id lists or int arrays (without bos/eos)."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    src, n_src = _pad(src_ids, pad_id, None, EOS_ID)
    tgt_in, _ = _pad(tgt_ids, pad_id, BOS_ID, None)
    tgt_out, n_tgt = _pad(tgt_ids, pad_id, None, EOS_ID)
    return Batch(src=torch.from_numpy(src), tgt_in=torch.from_numpy(tgt_in),
                 tgt_out=torch.from_numpy(tgt_out), n_tgt_tokens=n_tgt, n_src_tokens=n_src)


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple (itself for multiple 1)."""
    return -(-n // multiple) * multiple


def greedy_cut(sizes: Sequence[int], budget: int, rows_multiple: int = 1) -> list[int]:
    """Start offsets (and the end) of batches over examples in length order: each batch takes examples
    while (its largest size) * (its count) stays within budget; an example larger than the budget gets
    a batch of its own. With rows_multiple m, a batch of m examples or more keeps a multiple of m and
    leaves the rest to the next one."""
    bounds = [0]
    longest, pos = 0, 0
    while pos < len(sizes):
        grown = max(longest, sizes[pos])
        count = pos - bounds[-1]
        if count and grown * (count + 1) > budget:
            if count > rows_multiple:
                count -= count % rows_multiple
            bounds.append(bounds[-1] + count)
            longest, pos = 0, bounds[-1]
            continue
        longest, pos = grown, pos + 1
    if len(sizes):
        bounds.append(len(sizes))
    return bounds


def length_sorted_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Decoding batches: indices of sentences of similar length (shortest first), each batch within
    `max_tokens` padded tokens (+1 per sentence for its <eos>)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    bounds = greedy_cut([lengths[i] + 1 for i in order], max_tokens)
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


class TokenBatchSampler:
    """Length-grouped training batches of example indices whose padded size fits in batch_tokens.

    Examples are sorted by (target, source) length and cut by `greedy_cut` on max(source, target) + 1
    (rounded up to pad_to_multiple, whose multiple the batch's row count also is: see the module's notes).
    Each epoch shuffles examples of identical lengths and the order of the batches, deterministically
    from (seed, epoch), so the batch count is the same every epoch and a resumed run can skip exactly
    the batches it already trained on. Without shuffle, batches come shortest first.
    """

    def __init__(self, lengths: Sequence[Sequence[int]] | np.ndarray, batch_tokens: int,
                 shuffle: bool = True, seed: int = 0, pad_to_multiple: int = 1) -> None:
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
        self.src_lens, self.tgt_lens = lengths[:, 0].copy(), lengths[:, 1].copy()
        self.batch_tokens = batch_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.pad_to_multiple = pad_to_multiple
        # Only lengths matter, and the sorted lengths are the same every epoch: cut once.
        order = np.lexsort((self.src_lens, self.tgt_lens))
        sizes = np.maximum(self.src_lens[order], self.tgt_lens[order]) + 1
        sizes = -(-sizes // pad_to_multiple) * pad_to_multiple
        self._bounds = greedy_cut(sizes.tolist(), batch_tokens, pad_to_multiple)

    def __len__(self) -> int:
        return max(len(self._bounds) - 1, 0)

    def num_batches(self, world_size: int = 1) -> int:
        """Batches each rank gets per epoch."""
        return len(self) // world_size

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """This rank's batches of epoch: fixed by (seed, epoch), disjoint across ranks."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        n = len(self.src_lens)
        rng = np.random.default_rng([self.seed, epoch])
        ties = rng.random(n) if self.shuffle else np.arange(n)
        index = np.lexsort((ties, self.src_lens, self.tgt_lens)).tolist()
        out = [index[a:b] for a, b in zip(self._bounds[:-1], self._bounds[1:], strict=True)]
        if self.shuffle:
            out = [out[i] for i in rng.permutation(len(out))]
        # Every rank must take the same number of steps, so the remainder is dropped.
        usable = self.num_batches(world_size) * world_size
        return out[:usable][rank::world_size]

    def shapes(self, epoch: int = 0) -> list[tuple[int, int, int]]:
        """(rows, source length, target length) of each padded batch of an epoch, as `Batch.pad_to` makes
        them (the target's <bos> + y and y + <eos> have the same length)."""
        m = self.pad_to_multiple
        return [(len(b), round_up(int(self.src_lens[b].max()) + 1, m),
                 round_up(int(self.tgt_lens[b].max()) + 1, m)) for b in self.batches(epoch)]

    def padding_fraction(self, epoch: int = 0) -> float:
        """The share of an epoch's padded source and target positions that are padding."""
        batches = self.batches(epoch)
        real = sum(int(self.src_lens[b].sum() + self.tgt_lens[b].sum()) + 2 * len(b) for b in batches)
        padded = sum(rows * (src + tgt) for rows, src, tgt in self.shapes(epoch))
        return 1.0 - real / padded if padded else 0.0
