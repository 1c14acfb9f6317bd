"""An exponential moving average (EMA) of the weights, kept beside training (`training.ema_decay`).

After every optimizer step the average moves towards the trained weights: ema = decay * ema +
(1 - decay) * weights (OpenNMT-py's `average_decay`, fairseq's `--ema`). It is a smoother model at
almost no cost per step, and the one that is validated, kept as best.pt and translated with.

In a checkpoint, `model` is always the weights to translate with (so evaluate, translate, export,
averaging and ensembles need nothing new): the average when EMA is on. The trained weights, which
training continues from, are then `trained_model`, and `ema_updates` counts the average's updates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel

from transformer_mt.checkpoints.store import TRAINED, UPDATES
from transformer_mt.model import Transformer


def warmed_up_decay(decay: float, updates: int) -> float:
    """The decay at the average's `updates`-th update: min(decay, (1 + n) / (10 + n)), as TensorFlow's
    ExponentialMovingAverage and OpenNMT-py do, so the first averages are not dominated by the random
    initial weights."""
    return min(decay, (1 + updates) / (10 + updates))


class WeightAverage:
    """The EMA of a model's parameters (torch's AveragedModel with an EMA update)."""

    def __init__(self, model: Transformer, decay: float) -> None:
        def ema_update(averaged: list[torch.Tensor], current: list[torch.Tensor], n: torch.Tensor) -> None:
            torch._foreach_lerp_(averaged, current, 1.0 - warmed_up_decay(decay, int(n)))

        self.averaged = AveragedModel(model, multi_avg_fn=torch.no_grad()(ema_update))
        self.model: Transformer = self.averaged.module  # what validation decodes with

    def update(self, model: Transformer) -> None:
        """Move the average towards the model's current weights (after an optimizer step)."""
        self.averaged.update_parameters(model)

    def checkpoint_entries(self, model: Transformer) -> dict[str, Any]:
        """A checkpoint's weights: the average to translate with, the trained weights to resume from."""
        return {"model": self.model.state_dict(), TRAINED: model.state_dict(),
                UPDATES: int(self.averaged.n_averaged)}

    def restore(self, state: dict[str, Any], model: Transformer) -> None:
        """Resume the average from a checkpoint; from a run without EMA it starts at the trained weights."""
        if TRAINED in state:
            self.model.load_state_dict(state["model"])
            self.averaged.n_averaged.fill_(state[UPDATES])
        else:
            self.model.load_state_dict(model.state_dict())
            self.averaged.n_averaged.fill_(0)


def build(model: Transformer, decay: float) -> WeightAverage | None:
    """The run's weight average, or None when `training.ema_decay` is 0."""
    return WeightAverage(model, decay) if decay > 0 else None


def validated(average: WeightAverage | None, model: Transformer) -> Transformer:
    """The weights a run validates, keeps as best.pt and translates with: the average when it has one."""
    return average.model if average else model
