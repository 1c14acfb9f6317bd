"""Training throughput, measured three ways: bare steps on real batches, bare steps on one fixed shape,
and the whole `train` loop (data, logging, validation, checkpoints) over short epochs.

Not a script itself: `scripts/benchmark.py` uses it (Python puts a script's own directory first on
sys.path).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from transformer_mt.checkpoints.store import build_model
from transformer_mt.config import ModelConfig, TrainConfig
from transformer_mt.data import Batch, PreparedData, TokenBatchSampler
from transformer_mt.runtime import device as runtime
from transformer_mt.training.throughput import real_batches, synchronize, time_training


def fastest(models: dict[str, tuple[nn.Module, torch.dtype | None]], batches: list[Batch],
            device: torch.device, rounds: int) -> tuple[dict[str, float], float]:
    """Best training seconds of each (model, autocast dtype) over interleaved rounds on the same
    batches, and the batches' target tokens."""
    seconds = {name: math.inf for name in models}
    tokens = 0.0
    for _ in range(rounds):
        for name, (model, dtype) in models.items():
            elapsed, tokens = time_training(model, batches, device, dtype)
            seconds[name] = min(seconds[name], elapsed)
    return seconds, tokens


def epoch_shapes(data: PreparedData, batch_tokens: int, multiple: int, seed: int = 0) -> tuple[int, float]:
    """An epoch's distinct batch shapes and its padded share of source and target positions."""
    sampler = TokenBatchSampler(data.train.lengths(), batch_tokens, seed=seed, pad_to_multiple=multiple)
    return len(set(sampler.shapes(0))), sampler.padding_fraction(0)


def random_batch_padding(data: PreparedData, seed: int = 0) -> float:
    """The padded share of source and target positions in random 128-sentence batches (the reference)."""
    lengths = data.train.lengths() + 1  # + eos
    order = np.random.default_rng(seed).permutation(len(lengths))
    batches = [lengths[order[i:i + 128]] for i in range(0, len(order), 128)]
    real = sum(int(b.sum()) for b in batches)
    return 1 - real / sum(len(b) * int(b[:, 0].max() + b[:, 1].max()) for b in batches)


# -- the whole loop --------------------------------------------------------------------------------
class FirstBatches:
    """A trainer's batch sampler cut to each epoch's first n batches."""

    def __init__(self, sampler: Any, n: int) -> None:
        self.sampler, self.n = sampler, n

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """The sampler's batches of the epoch, the first n."""
        return self.sampler.batches(epoch, rank, world_size)[: self.n]

    def num_batches(self, world_size: int = 1) -> int:
        """Batches each rank gets per (short) epoch."""
        return min(self.n, self.sampler.num_batches(world_size))


class ShortEpochs:
    """A trainer's epochs (`Trainer.epochs`) of n batches each; counts each epoch's target tokens.
    Everything else the trainer asks of its epochs is theirs."""

    def __init__(self, epochs: Callable[[int], tuple[Any, Any]], n: int) -> None:
        self.epochs, self.n = epochs, n
        self.tokens: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.epochs, name)

    def __call__(self, epoch: int) -> tuple[Any, FirstBatches]:
        """(pairs, sampler) of the epoch, its sampler cut short."""
        split, sampler = self.epochs(epoch)
        short = FirstBatches(sampler, self.n)
        if epoch not in self.tokens:
            self.tokens[epoch] = sum(split.batch(b).n_tgt_tokens for b in short.batches(epoch))
        return split, short


def short_trainer(cfg: TrainConfig, run_dir: Path, n_batches: int, epochs: int, amp: str) -> Any:
    """The real Trainer in run_dir, for `epochs` epochs of `n_batches` batches each (`trainer.epochs`)."""
    from transformer_mt.jobs.train import build_trainer

    sub = dataclasses.replace(
        cfg, checkpoint=dataclasses.replace(cfg.checkpoint, dir=str(run_dir)),
        device=dataclasses.replace(cfg.device, amp=amp),
        training=dataclasses.replace(cfg.training, epochs=epochs, average_last=0, max_minutes=None,
                                     progress=False))
    trainer = build_trainer(sub, run_dir)
    trainer.epochs = ShortEpochs(trainer.epochs, n_batches)
    return trainer


def host_reads(cfg: TrainConfig, n_batches: int, amp: str) -> dict[str, Any]:
    """The host's reads of the device per optimizer step over one epoch of the real loop, as a GPU would
    make them: on the CPU the model's free reads are switched off (`attention.FREE_READS`), so the count is
    that of a GPU's code paths. Where they happen, so that a new one is easy to find."""
    from host_reads import HostReads

    from transformer_mt.model import attention

    free = attention.FREE_READS
    attention.FREE_READS = ()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = short_trainer(cfg, Path(tmp), n_batches, 1, amp)
            with HostReads(trainer.device.type) as reads:
                trainer.train_epoch()
    finally:
        attention.FREE_READS = free
    return {"host_syncs_per_step": reads.count / max(trainer.step, 1),
            "host_sync_sites": sorted(set(reads.sites))}


def train_loop(cfg: TrainConfig, n_batches: int, epochs: int, amp: str) -> dict[str, float]:
    """Train `epochs` epochs of `n_batches` batches each with the real loop (validation and a checkpoint
    after each, as configured) in a temporary directory: the first epoch's and the later epochs' speed
    (training time only), and the wall time of the whole run."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = short_trainer(cfg, Path(tmp), n_batches, epochs, amp)
        short = trainer.epochs
        seconds: list[float] = []
        train_epoch = trainer.train_epoch

        def timed_epoch() -> str:
            synchronize(trainer.device)
            start = time.perf_counter()
            reason = train_epoch()
            synchronize(trainer.device)
            seconds.append(time.perf_counter() - start)
            return reason

        trainer.train_epoch = timed_epoch
        start = time.perf_counter()
        trainer.fit()
        wall = time.perf_counter() - start
    tokens = [short.tokens[epoch] for epoch in range(len(seconds))]
    later = sum(seconds[1:])
    return {"loop_epochs": len(seconds), "loop_batches_per_epoch": short.n, "loop_wall_s": wall,
            "loop_tgt_tokens": float(sum(tokens)),
            "train_first_epoch_tgt_tok_s": tokens[0] / seconds[0],
            "train_loop_tgt_tok_s": sum(tokens[1:]) / later if later else None}


# -- options that are off by default on a CPU ------------------------------------------------------
def cheap_wins(model_cfg: ModelConfig, data: PreparedData, batch_tokens: int, seed: int, n: int,
               device: torch.device) -> dict[str, float]:
    """Training speed with torch.compile against eager, both ways it compiles: one graph with dynamic
    shapes over the usual batches, and a static graph per shape over batches padded to a multiple of 8
    (`runtime.compiled`). Compile time is reported apart: the first pass over the batches pays it."""
    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return build_model(model_cfg, data.vocab).to(device)

    found: dict[str, float] = {}
    for multiple, name in ((1, "dynamic"), (8, "static")):
        batches = real_batches(data, batch_tokens, seed, n, multiple)
        eager_s, tokens = time_training(fresh(), batches, device)
        compiled = runtime.compiled(fresh(), multiple)
        start = time.perf_counter()
        time_training(compiled, batches, device)  # compiles each new shape (one graph when dynamic)
        first_s = time.perf_counter() - start
        compiled_s, _ = time_training(compiled, batches, device)
        shapes = {(len(b), b.src.size(1), b.tgt_in.size(1)) for b in batches}
        found |= {f"train_tgt_tok_s_eager_{name}": tokens / eager_s,
                  f"train_tgt_tok_s_compiled_{name}": tokens / compiled_s,
                  f"torch_compile_{name}_speedup": eager_s / compiled_s,
                  f"torch_compile_{name}_seconds": max(0.0, first_s - compiled_s),
                  f"torch_compile_{name}_shapes": len(shapes)}
    return found
