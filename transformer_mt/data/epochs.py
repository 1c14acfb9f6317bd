"""What each training epoch trains on: the training pairs and their shuffled token batches.

Without input variants or subword regularisation that is the same split every epoch, shuffled anew.
In turn, each step on the pairs of the one before:
1. with variants (`dataset.variants`) some pairs are written as people type, or with other names and
   numbers (variants.py);
2. with several corpora (`dataset.mix`), the epoch holds the rows their weights draw for it (mixture.py);
3. with `dataset.variants.join`, some of those pairs are joined two or three at a time into longer
   examples (joining.py): here, where the epoch's pairs are known, so that only pairs the epoch holds
   are joined; the epoch then has fewer, longer examples;
4. with subword regularisation (`tokenizer.dropout`, `tokenizer.alpha`) the pairs, joined ones too, are
   segmented anew for the epoch (segmentation.py).
The batches follow the pairs' lengths; the batch size is the run's, fixed before training starts. An
epoch depends on its number and the run's seed alone, so a resumed run rebuilds the epoch it stopped
in and goes on at its batch. On a GPU (`ahead=True`) the next epoch is built in a worker process while
one trains (ahead.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from transformer_mt.data.ahead import EpochsAhead
from transformer_mt.data.batching import Batch, TokenBatchSampler
from transformer_mt.data.encode import EncodedSplit
from transformer_mt.data.joining import PairJoins
from transformer_mt.data.mixture import Mixture
from transformer_mt.data.segmentation import SubwordSampler
from transformer_mt.data.variants import InputVariants

log = logging.getLogger(__name__)


class TrainingEpochs:
    """The split and batch sampler of any epoch; the latest epoch's are kept, since a mid-epoch
    validation or a resume asks for them again. `ahead`: build the epoch after the one asked for in a
    worker process (for a GPU, whose host would otherwise keep it waiting); `close` ends the worker."""

    def __init__(self, train: EncodedSplit, batch_tokens: int, seed: int,
                 subwords: SubwordSampler | None = None, pad_to_multiple: int = 1,
                 mixture: Mixture | None = None, variants: InputVariants | None = None,
                 joins: PairJoins | None = None, ahead: bool = False) -> None:
        self.train, self.batch_tokens, self.seed = train, batch_tokens, seed
        self.subwords = subwords
        self.pad_to_multiple = pad_to_multiple  # batch lengths and row counts (batching.py)
        self.mixture, self.variants, self.joins = mixture, variants, joins
        self._varies = (subwords is not None or variants is not None or joins is not None
                        or (mixture is not None and mixture.varies))
        self._latest: tuple[int, EncodedSplit, TokenBatchSampler] | None = None
        self._ahead = EpochsAhead(self._build) if ahead and self._varies else None

    def __call__(self, epoch: int, start_next: bool = True) -> tuple[EncodedSplit, TokenBatchSampler]:
        """(pairs, sampler) of `epoch`: the sampler's batches(epoch, ...) index the pairs. The worker
        starts on the next epoch unless `start_next` is False (epoch 0 looked at before a resume)."""
        if self._stale(epoch):
            self._latest = (epoch, *self._take(epoch))
        if start_next and self._ahead is not None:
            self._ahead.start(epoch + 1)
        assert self._latest is not None
        return self._latest[1], self._latest[2]

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()

    def __getstate__(self) -> dict[str, Any]:
        """What the worker gets: what builds epochs, without the epoch kept or the worker itself."""
        return {**self.__dict__, "_latest": None, "_ahead": None}

    def _take(self, epoch: int) -> tuple[EncodedSplit, TokenBatchSampler]:
        """`epoch` as the worker built it, its log lines said now, or else built here."""
        started = time.perf_counter()
        ready = self._ahead.take(epoch) if self._ahead is not None else None
        if ready is None:
            return self._build(epoch, log.info)
        built, said = ready
        for line in said:
            log.info(*line)
        log.info("epoch %d: built while the one before trained (waited %.1fs for it)", epoch + 1,
                 time.perf_counter() - started)
        return built

    def _stale(self, epoch: int) -> bool:
        """Whether `epoch`'s pairs or batches differ from the latest epoch's kept."""
        return self._latest is None or (self._latest[0] != epoch and self._varies)

    def _build(self, epoch: int, say: Callable[..., None]) -> tuple[EncodedSplit, TokenBatchSampler]:
        """`epoch`'s pairs and sampler, each step that makes them told by `say` (a log level's function)."""
        split, shown, rows = self.train, {}, None
        if self.variants is not None:
            split, shown = self.variants.apply(split, epoch)
        if self.mixture is not None:
            rows = self.mixture.rows(epoch)
            split = split.subset(rows)
            say("epoch %d: %d training pairs: %s", epoch + 1, len(rows), self.mixture.describe(rows))
        said = [f"{n} pairs {name}" for name, n in shown.items()]
        if self.joins is not None:
            split, joined, examples = self.joins.apply(split, rows, epoch)
            said += [f"{joined} pairs joined into {examples} examples"] if joined else []
        if self.variants is not None or self.joins is not None:
            say("epoch %d: input variants: %s", epoch + 1, ", ".join(said) or "none drawn")
        if self.subwords is not None:
            split = self._resegment(split, epoch, say)
        sampler = TokenBatchSampler(split.lengths(), self.batch_tokens, seed=self.seed,
                                    pad_to_multiple=self.pad_to_multiple)
        say("epoch %d: %d batches in %d shapes, %.1f%% of their positions padding", epoch + 1, len(sampler),
            len(set(sampler.shapes(epoch))), 100 * sampler.padding_fraction(epoch))
        return split, sampler

    def batch(self, split: EncodedSplit, indices: list[int]) -> Batch:
        """The examples at indices of an epoch's pairs, padded as the sampler counted them."""
        return split.batch(indices).pad_to(self.pad_to_multiple)

    def _resegment(self, split: EncodedSplit, epoch: int, say: Callable[..., None]) -> EncodedSplit:
        assert self.subwords is not None
        started = time.perf_counter()
        plain, split = split, self.subwords.resegment(split, epoch)
        plain, sampled = (int(s.src_lens.sum() + s.tgt_lens.sum()) for s in (plain, split))
        say("epoch %d: training pairs segmented anew, %d tokens (%+.1f%%) in %.1fs", epoch + 1, sampled,
            100 * (sampled / max(plain, 1) - 1), time.perf_counter() - started)
        return split
