"""What the training steps tell the loop without making the host wait for the device.

Reading a tensor that lives on a GPU (`.item()`, `bool()`, `float()`) waits for every kernel queued
before it, so a loop that reads its loss at every step can never queue the next step while the GPU runs
this one. The trainer's steps therefore leave their loss, gradient norm and skip flags in a `StepTally` on
the device, and the loop reads it every `training.log_every` steps and before it validates or saves.
"""

from __future__ import annotations

import torch


class StepTally:
    """What the steps tell the loop, kept on the device until `read`: the loss summed over the micro-batches
    since the last read and their count (non-finite ones left out), the optimizer steps skipped for a
    non-finite loss or gradient, the current and the longest run of them in a row, the last gradient norm."""

    def __init__(self, device: torch.device) -> None:
        def zero() -> torch.Tensor:
            return torch.zeros((), device=device)  # float32 counts are exact up to 2**24

        self.loss_sum, self.batches, self.skipped, self.in_a_row, self.longest, self.grad_norm = (
            zero() for _ in range(6))
        self.step_bad = torch.zeros((), dtype=torch.bool, device=device)  # this step's loss was not finite

    def add_loss(self, mean: torch.Tensor, skips_step: bool) -> None:
        """A micro-batch's mean loss; with skips_step, a non-finite one marks its optimizer step as bad."""
        finite = torch.isfinite(mean.detach())
        self.loss_sum += torch.where(finite, mean.detach().float(), 0.0)
        self.batches += finite
        if skips_step:
            self.step_bad |= ~finite

    def end_step(self, grad_norm: torch.Tensor, grad_counts: bool) -> torch.Tensor:
        """Close an optimizer step; whether it must be skipped (a 0-dim bool tensor): its loss, or with
        grad_counts its gradient norm, was not finite."""
        bad = self.step_bad | ~torch.isfinite(grad_norm) if grad_counts else self.step_bad
        self.step_bad = torch.zeros_like(self.step_bad)
        self.skipped += bad
        self.in_a_row = torch.where(bad, self.in_a_row + 1, 0.0)
        self.longest = torch.maximum(self.longest, self.in_a_row)
        self.grad_norm = grad_norm.detach().float()
        return bad

    def read(self) -> dict[str, float]:
        """Every value at once (the one host synchronisation), then start the next window's sums."""
        names = ("loss_sum", "batches", "skipped", "in_a_row", "longest", "grad_norm")
        values = dict(zip(names, torch.stack([getattr(self, n) for n in names]).tolist(), strict=True))
        for tensor in (self.loss_sum, self.batches, self.skipped):
            tensor.zero_()
        self.longest = self.in_a_row.clone()
        return values
