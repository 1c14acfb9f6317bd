"""One optimizer step of training, as the Trainer runs it and as the plan's probe and the benchmarks time
it: each micro-batch forward under autocast and backward, its loss normalised by the step's target
tokens; then clipping, the optimizer's step (skipped on the device where a loss or gradient was not
finite), the schedule and the weight average. Nothing here reads the device (tally.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from transformer_mt.data import Batch
from transformer_mt.runtime.device import autocast
from transformer_mt.training import distributed, loss
from transformer_mt.training.ema import WeightAverage
from transformer_mt.training.optim import clip_gradients, step_unless
from transformer_mt.training.tally import StepTally


class TrainStep:
    """The model, optimizer, schedule, scaler and weight average of a run, stepped one micro-batch and one
    update at a time. `forward` is what training calls (the model, compiled or wrapped in DDP); `model`
    owns the weights."""

    def __init__(self, forward: Callable[..., torch.Tensor], model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
                 scaler: torch.amp.GradScaler, device: torch.device, amp: torch.dtype | None,
                 label_smoothing: float, clip_grad_norm: float, world_size: int = 1,
                 ema: WeightAverage | None = None) -> None:
        self.forward, self.model = forward, model
        self.optimizer, self.scheduler = optimizer, scheduler
        self.scaler, self.ema = scaler, ema
        self.device, self.amp, self.world_size = device, amp, world_size
        self.label_smoothing, self.clip_grad_norm = label_smoothing, clip_grad_norm
        self.tally = StepTally(device)

    def micro_batch(self, batch: Batch, step_tokens: int, ends_step: bool) -> None:
        """Forward and backward of one micro-batch of an update that holds `step_tokens` target tokens
        on all ranks; its loss goes to the tally (a non-finite one marks the update to be skipped)."""
        distributed.set_grad_sync(self.forward, ends_step)  # DDP: all-reduce once per optimizer step
        with autocast(self.device, self.amp):
            logits = self.forward(batch.src, batch.tgt_in)  # (B, T, V)
        mean = loss.summed_nll(logits, batch.tgt_out, self.label_smoothing) / batch.n_tgt_tokens
        # Under DDP a non-finite loss shows in every rank's all-reduced gradient: all ranks skip.
        self.tally.add_loss(mean, skips_step=self.world_size == 1)
        weight = batch.n_tgt_tokens * self.world_size / step_tokens  # DDP then averages over ranks
        self.scaler.scale(mean * weight).backward()

    def update(self) -> None:
        """Clip, step, schedule, move the weight average. A non-finite loss or gradient skips the update on
        the device (fp16's GradScaler does it itself), yet counts as a step."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = clip_gradients(self.model, self.clip_grad_norm)
        bad = self.tally.end_step(grad_norm, grad_counts=not self.scaler.is_enabled())
        step_unless(self.optimizer, self.scaler, bad)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        if self.ema:
            self.ema.update(self.model)
