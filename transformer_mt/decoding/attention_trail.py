"""Beam search's cross-attention history, kept in O(steps) rather than O(steps²).

Beam search reorders its beams at every step. Copying each beam's whole attention history along with it
costs O(steps) a step, O(steps²) a sentence. The trail instead keeps each step's attention once, with
back-pointers (each beam's row at the step before), and reads a hypothesis's history back along them
once, at the end, for the hypotheses returned only. Same values, same order: nothing is recomputed.
"""

from __future__ import annotations

import torch
from torch import Tensor


class AttentionTrail:
    """Each step's cross-attention, each step's back-pointers, and where each hypothesis ended."""

    def __init__(self) -> None:
        self.steps: list[Tensor] = []  # step t: (rows of step t, layers, H, S)
        self.parents: list[Tensor] = []  # step t: (rows of step t + 1,) their rows at step t
        self.ends: dict[int, tuple[int, int]] = {}  # id(hypothesis) → (its <eos> step, its row there)

    def add(self, attention: Tensor) -> None:
        """The attention (rows, layers, H, S) of the step being decoded."""
        self.steps.append(attention)

    def moved(self, rows: Tensor) -> None:
        """After a step: the row (at that step) each beam of the next step continues."""
        self.parents.append(rows)

    def end(self, hypothesis: object, step: int, row: int) -> None:
        """A hypothesis ended (produced <eos>) at `step`, continuing `row`."""
        self.ends[id(hypothesis)] = (step, row)

    def histories(self, hypotheses: list[object]) -> list[Tensor]:
        """The (steps + 1, layers, H, S) attention of each ended hypothesis: one gather a step for all."""
        if not hypotheses:
            return []
        ends = [self.ends[id(h)] for h in hypotheses]
        last = max(step for step, _ in ends)
        steps = torch.tensor([step for step, _ in ends])
        row = torch.tensor([r for _, r in ends], device=self.steps[0].device)
        out = self.steps[0].new_zeros((len(ends), last + 1, *self.steps[0].shape[1:]))
        for t in range(last, -1, -1):
            live = (steps >= t).nonzero().squeeze(1).to(row.device)  # the hypotheses ended at or after t
            out[live, t] = self.steps[t][row[live]]
            if t > 0:
                row[live] = self.parents[t - 1][row[live]]
        return [out[n, : step + 1] for n, step in enumerate(steps.tolist())]
