"""How fast this machine trains a model: real optimizer steps on real batches, timed, and the matmul
FLOPs those steps cost. `training.plan=auto` probes with it (plan/probe.py); the benchmarks
(`scripts/benchmark.py`) report with it.
"""

from __future__ import annotations

import itertools
import time

import torch
import torch.nn as nn

from transformer_mt.config import ModelConfig, TrainingConfig
from transformer_mt.data import Batch, PreparedData, TokenBatchSampler
from transformer_mt.loss import summed_nll
from transformer_mt.optim import build_optimizer
from transformer_mt.runtime import autocast


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that the clock reads what it cost (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_flops(c: ModelConfig, vocab_size: int, batch_size: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one forward pass at padded shapes (training ≈ 3× this)."""
    d, f, B, S, T = c.d_model, c.d_ff, batch_size, src_len, tgt_len
    enc = B * S * (2 * d * 3 * d + 2 * d * d + 4 * d * f) + 4 * B * S * S * d
    dec = (B * T * (2 * d * 3 * d + 2 * d * d + 2 * d * d + 2 * d * d + 4 * d * f)
           + B * S * 2 * d * 2 * d + 4 * B * T * T * d + 4 * B * T * S * d)
    return c.encoder_layers * enc + c.decoder_layers * dec + 2 * B * T * d * vocab_size


def training_flops(c: ModelConfig, vocab_size: int, batches: list[Batch]) -> float:
    """Matmul FLOPs of training steps (forward and backward) on `batches`."""
    return 3 * sum(forward_flops(c, vocab_size, b.src.size(0), b.src.size(1), b.tgt_in.size(1))
                   for b in batches)


def real_batches(data: PreparedData, batch_tokens: int, seed: int, n: int, multiple: int = 1) -> list[Batch]:
    """The first n token batches of the first training epoch, as the training loop cuts and pads them
    with training.pad_to_multiple=multiple."""
    batches = TokenBatchSampler(data.train.lengths(), batch_tokens, shuffle=True, seed=seed,
                                pad_to_multiple=multiple).batches(0)
    return [data.train.batch(b).pad_to(multiple) for b in batches[:n]]


def time_training(model: nn.Module, batches: list[Batch], device: torch.device,
                  dtype: torch.dtype | None = None, label_smoothing: float = 0.1,
                  warmup: int = 2, seconds: float | None = None, min_steps: int = 4) -> tuple[float, float]:
    """(seconds, target tokens) of forward + backward + AdamW step over `batches` (moved to `device`,
    under autocast to dtype when given), after `warmup` untimed steps on the first of them. With
    `seconds`, steps go round `batches` until that much time has passed (and `min_steps` were made).
    The optimizer is training's own (fused where it can be): the plan's probe times what training runs."""
    model.train()
    optimizer = build_optimizer(model, TrainingConfig(lr=1e-4), device)
    batches = [b.to(device) for b in batches]

    def step(batch: Batch) -> None:
        with autocast(device, dtype):
            logits = model(batch.src, batch.tgt_in)
        loss = summed_nll(logits, batch.tgt_out, label_smoothing) / batch.n_tgt_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:warmup]:
        step(batch)
    synchronize(device)
    start, tokens = time.perf_counter(), 0
    order = batches if seconds is None else itertools.cycle(batches)
    for n, batch in enumerate(order, start=1):
        step(batch)
        tokens += batch.n_tgt_tokens
        # On a GPU the host runs ahead of the device, so this reads early; the synchronize below times
        # every step that was started.
        if seconds is not None and n >= min_steps and time.perf_counter() - start >= seconds:
            break
    synchronize(device)
    return time.perf_counter() - start, float(tokens)
