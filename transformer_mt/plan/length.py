"""How long a planned run is: the updates and epochs that the rest of its budget holds at a batch size and
its speed, and the batch the plan chose with what was measured of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from transformer_mt.data import PreparedData, TokenBatchSampler
from transformer_mt.plan import rules


class Batch(NamedTuple):
    """A planned batch size, its tokens/s (measured, or the largest measured size's below it), the probe's
    tokens/s at each size it measured, and those the plan assumed at each size it weighed."""

    tokens: int
    tokens_per_s: float
    measured: dict[int, float]
    weighed: dict[int, float]


@dataclass
class RunLength:
    """How many updates and epochs the rest of the budget holds at a batch size and its tokens/s (or
    the user's training.epochs, when they end the run first)."""

    data: PreparedData
    budget_s: float
    started: float  # time.perf_counter() when planning began: the budget counts the probe
    accumulate: int
    world_size: int
    pad: int
    epochs: int | None  # the user's training.epochs, None when the budget ends the run
    _epochs: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)

    @property
    def batches_per_update(self) -> int:
        return self.accumulate * self.world_size

    def epoch(self, batch_tokens: int) -> tuple[int, int]:
        """(optimizer steps per epoch, target tokens per epoch) at this batch size."""
        if batch_tokens not in self._epochs:
            self._epochs[batch_tokens] = _epoch(self.data, batch_tokens, self.accumulate, self.world_size,
                                                self.pad)
        return self._epochs[batch_tokens]

    def update_tokens(self, batch_tokens: int) -> float:
        """Target tokens of one process in an update at this batch size (an epoch's mean)."""
        steps_per_epoch, epoch_tokens = self.epoch(batch_tokens)
        return epoch_tokens / self.world_size / steps_per_epoch

    def expect(self, batch_tokens: int, tokens_per_s: float) -> tuple[float, float, str]:
        """(updates, epochs, what ends the run: "budget" or "epochs"), tokens_per_s of one process."""
        steps_per_epoch = self.epoch(batch_tokens)[0]
        step_s = self.update_tokens(batch_tokens) / tokens_per_s
        train_s = (self.budget_s - (time.perf_counter() - self.started)) * (1 - rules.VALIDATION_SHARE)
        epochs = train_s / step_s / steps_per_epoch
        if self.epochs is not None and self.epochs < epochs:
            return self.epochs * steps_per_epoch, float(self.epochs), "epochs"
        return epochs * steps_per_epoch, epochs, "budget"

    def updates(self, batch_tokens: int, tokens_per_s: float) -> float:
        return self.expect(batch_tokens, tokens_per_s)[0]


def _epoch(data: PreparedData, batch_tokens: int, accumulate: int, world_size: int,
           pad: int) -> tuple[int, int]:
    """(optimizer steps per epoch, target tokens per epoch, eos included) of the first epoch."""
    rows = data.mixture.rows(0) if data.mixture is not None else np.arange(len(data.train))
    lengths = data.train.lengths()[rows]
    sampler = TokenBatchSampler(lengths, batch_tokens, shuffle=False, pad_to_multiple=pad)
    batches = sampler.num_batches(world_size)
    return max(math.ceil(batches / accumulate), 1), int(lengths[:, 1].sum()) + len(rows)
