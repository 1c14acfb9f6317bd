"""How long a run is: the updates and epochs a training budget holds at a batch size and a speed, counted
on the run's own batches (the plan weighs each batch size and shape by it, plan/decide.py)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from transformer_mt.data import PreparedData, TokenBatchSampler


@dataclass
class RunLength:
    """How many updates and epochs the rest of the budget holds at a batch size and its tokens/s (or the
    user's training.epochs, when they end the run first): the one place a run's length is computed."""

    data: PreparedData
    budget_s: float
    started: float  # time.perf_counter() when planning began: the budget counts the probe
    accumulate: int
    world_size: int
    pad: int
    epochs: int | None  # the user's training.epochs, None when the budget ends the run
    validation_share: float = 0.0  # of the budget, what validation takes at most
    _epochs: dict[int, tuple[int, int]] = field(default_factory=dict, repr=False)

    @property
    def batches_per_update(self) -> int:
        return self.accumulate * self.world_size

    def epoch(self, batch_tokens: int) -> tuple[int, int]:
        """(optimizer steps, target tokens with their eos) of the first epoch at this batch size."""
        if batch_tokens not in self._epochs:
            mixture, train = self.data.mixture, self.data.train
            lengths = train.lengths()[mixture.rows(0) if mixture is not None else np.arange(len(train))]
            sampler = TokenBatchSampler(lengths, batch_tokens, shuffle=False, pad_to_multiple=self.pad)
            steps = max(math.ceil(sampler.num_batches(self.world_size) / self.accumulate), 1)
            self._epochs[batch_tokens] = steps, int(lengths[:, 1].sum()) + len(lengths)
        return self._epochs[batch_tokens]

    def expect(self, batch_tokens: int, tokens_per_s: float) -> tuple[float, float, str]:
        """(updates, epochs, what ends the run: "budget" or "epochs"), tokens_per_s of one process."""
        steps_per_epoch, epoch_tokens = self.epoch(batch_tokens)
        step_s = epoch_tokens / self.world_size / steps_per_epoch / tokens_per_s  # one process's share
        train_s = (self.budget_s - (time.perf_counter() - self.started)) * (1 - self.validation_share)
        epochs = train_s / step_s / steps_per_epoch
        if self.epochs is not None and self.epochs < epochs:
            return self.epochs * steps_per_epoch, float(self.epochs), "epochs"
        return epochs * steps_per_epoch, epochs, "budget"
