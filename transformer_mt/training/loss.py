"""The training objective: label-smoothed cross-entropy per target token, and what it is divided by.

One optimizer step may span several micro-batches (`training.accumulate`) on several ranks
(`torchrun`). Its loss is normalised by the target tokens of the whole step, so that accumulating or
adding processes changes no gradient: each micro-batch's mean loss is weighted by its share of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from transformer_mt.data.tokenizer import PAD_ID


def summed_nll(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy of logits (B, T, V) against targets (B, T), summed over the non-pad positions
    (in float32, whatever the logits' dtype). Validation uses it without label smoothing."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=PAD_ID,
                           label_smoothing=label_smoothing, reduction="sum")


def step_tokens(batches: Sequence[Sequence[int]], tgt_lens: Sequence[int], group: int) -> list[int]:
    """Target tokens (each target plus its <eos>) in each run of `group` consecutive batches.

    TokenBatchSampler deals rank r the batches r, r + W, r + 2W, ... of one list, so an optimizer step
    of `accumulate` micro-batches on each of W ranks covers `accumulate * W` consecutive batches of it:
    every rank computes the same totals without communicating.
    """
    lens = np.asarray(tgt_lens, dtype=np.int64)
    sizes = [int(lens[list(b)].sum()) + len(b) for b in batches]
    return [sum(sizes[i:i + group]) for i in range(0, len(sizes), group)]
