"""How fast this machine trains a model: real optimizer steps on real batches, timed, and the matmul
FLOPs those steps cost. `training.plan=auto` probes with it (probe.py); the benchmarks
(`scripts/benchmark.py`) report with it.
"""

from __future__ import annotations

import itertools
import time

import torch
import torch.nn as nn

from transformer_mt.config import ModelConfig, TrainingConfig
from transformer_mt.data import Batch, PreparedData, TokenBatchSampler
from transformer_mt.training.optim import build_optimizer, build_scheduler
from transformer_mt.training.step import TrainStep


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


def relative_flops(data: PreparedData, models: dict[str, ModelConfig], batch: int) -> dict[str, float]:
    """Each model's training FLOPs per target token over the first's, at a batch of the data's mean
    lengths."""
    src, tgt = (int(x) + 1 for x in data.train.lengths().mean(axis=0).round())
    rows = max(batch // max(src, tgt), 1)
    flops = {name: forward_flops(m, data.vocab.tgt_vocab_size, rows, src, tgt) for name, m in models.items()}
    first = next(iter(flops.values()))
    return {name: f / first for name, f in flops.items()}


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
    """(seconds, target tokens) of training steps over `batches` (moved to `device`, under autocast to dtype
    when given), after `warmup` untimed steps on the first of them. With `seconds`, steps go round
    `batches` until that much time has passed (and `min_steps` were made). Each step is the Trainer's
    own (step.py: its loss, clipping, fused optimizer and tally), one batch an update: the plan's probe
    times what training runs."""
    model.train()
    cfg = TrainingConfig(lr=1e-4, scheduler="constant", warmup_steps=0, label_smoothing=label_smoothing)
    optimizer = build_optimizer(model, cfg, device)
    steps = TrainStep(model, model, optimizer, build_scheduler(optimizer, cfg, 1, lambda: 0.0),
                      torch.amp.GradScaler(device.type, enabled=dtype == torch.float16), device, dtype,
                      cfg.label_smoothing, cfg.clip_grad_norm)
    batches = [b.to(device) for b in batches]

    def step(batch: Batch) -> None:
        steps.micro_batch(batch, batch.n_tgt_tokens, ends_step=True)
        steps.update()

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
