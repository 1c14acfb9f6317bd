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


def clip_gradients(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Scale the gradients down to a total norm of at most max_norm (0: leave them); their norm before, as
    a 0-dim tensor on the model's device: reading it would make the host wait for the device (the
    trainer reads it every training.log_every steps). Non-finite gradients give a non-finite norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros((), device=next(model.parameters()).device)
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))


def step_unless(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, skip: torch.Tensor) -> None:
    """The optimizer's step, which changes nothing (weights, moments, step count) where `skip`, a 0-dim
    bool tensor on the parameters' device, is true. A fused optimizer's kernel reads the flag itself (as
    `found_inf`, what GradScaler hands it), so the host never waits for the device; fp16's GradScaler
    finds non-finite gradients itself; only an optimizer without a fused kernel (MPS) makes the host look."""
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
    elif optimizer.defaults.get("fused"):
        optimizer.found_inf, optimizer.grad_scale = skip.float(), None
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf, optimizer.grad_scale
    elif not bool(skip):
        optimizer.step()


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
