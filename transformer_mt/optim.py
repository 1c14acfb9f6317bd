"""The optimizer and the learning-rate schedules."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from transformer_mt.config import TrainingConfig


def build_optimizer(model: torch.nn.Module, training: TrainingConfig,
                    device: torch.device) -> torch.optim.AdamW:
    """AdamW with the recipe's betas, eps and weight decay; fused (one kernel for all weights instead of
    several per weight) on CUDA and on the CPU, where the optimizer step is otherwise a visible share of
    a small model's step."""
    return torch.optim.AdamW(model.parameters(), lr=training.lr, betas=tuple(training.betas),
                             eps=training.eps, weight_decay=training.weight_decay,
                             fused=device.type in ("cuda", "cpu") or None)


def clip_gradients(model: torch.nn.Module, max_norm: float) -> float:
    """Scale the gradients down to a total norm of at most max_norm (0: leave them); their norm before."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))


def lr_lambda(training: TrainingConfig, total_steps: int,
              time_used: Callable[[], float] = lambda: 0.0) -> Callable[[int], float]:
    """Learning-rate multiplier per optimizer step: linear warm-up, then the chosen decay.

    The linear and cosine decays reach `min_lr` when the run ends: after `total_steps`, or when
    `time_used()` (the fraction of `max_minutes` spent) reaches 1, whichever comes first. A run on a
    time budget thus cools down properly instead of being cut off at a high learning rate.
    """
    warmup = training.warmup_steps

    def factor(step: int) -> float:
        step += 1
        if warmup and step < warmup:
            return step / warmup
        if training.scheduler == "noam":  # inverse square root, equal to 1 at the end of warm-up
            return math.sqrt(max(warmup, 1) / step)
        if training.scheduler in ("linear", "cosine"):
            by_steps = (step - warmup) / max(1, total_steps - warmup)
            progress = min(1.0, max(by_steps, time_used()))
            cosine = 0.5 * (1 + math.cos(math.pi * progress))
            shape = 1 - progress if training.scheduler == "linear" else cosine
            floor = training.min_lr / training.lr
            return floor + (1 - floor) * shape
        return 1.0

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, training: TrainingConfig, total_steps: int,
                    time_used: Callable[[], float]) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule of `lr_lambda` on the optimizer; time_used must work before training starts."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(training, total_steps, time_used))
