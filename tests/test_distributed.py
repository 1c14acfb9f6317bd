"""DDP: two gloo processes on the CPU train exactly like one process that accumulates their batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_mt as tmt
from tests.conftest import ROOT, tiny_overrides
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.cli import main
from transformer_mt.data import TokenBatchSampler, collate
from transformer_mt.training import distributed, loss

# Dropout off: ranks draw their own dropout masks, one process draws them in another order.
# One thread: a matrix product may sum in another order with another thread count.
# An even number of batches an epoch (of the tiny runs' pairs, at 576 tokens): the ranks drop an odd last
# batch (each must take as many steps), which one process would accumulate alone.
EXACT = {"model.dropout": 0, "training.batch_tokens": 576, "training.log_every": 1, "device.num_threads": 1}


def _torchrun(*args: object, timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=2 -m transformer_mt ...` on the CPU (gloo)."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "transformer_mt", *map(str, args)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/loss")]


# Two torchrun launches of two ranks each take both cores for the time of several quick files: under
# `slow` (CI runs it); how a step is split and counted across ranks runs in the quick suite below.
@pytest.mark.slow
def test_ddp_matches_one_process_with_the_same_global_batch(tmp_path: Path, corpus: Path) -> None:
    """Per-step losses and final weights of 2 ranks (1 epoch, then resumed for a 2nd) equal those of
    one process accumulating 2 batches per step for 2 epochs."""
    single = tmp_path / "single"
    tmt.train(tiny_overrides(corpus, single, **EXACT, **{"training.accumulate": 2}))

    root = tmp_path / "ddp"  # no checkpoint.dir: the ranks must agree on a timestamped directory
    overrides = [o for o in tiny_overrides(corpus, root, **EXACT, **{"training.epochs": 1})
                 if not o.startswith("checkpoint.dir=")]
    result = _torchrun("train", *overrides, f"checkpoint.root={root}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = list(root.iterdir())
    assert len(runs) == 1, runs
    ddp = runs[0]
    assert (ddp / ".hydra" / "config.yaml").is_file() and (ddp / "epoch_001.pt").is_file()
    result = _torchrun("train", f"resume={ddp}", "training.epochs=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "resumed at epoch 2" in result.stdout + result.stderr

    one, two = load_checkpoint(single / "latest.pt"), load_checkpoint(ddp / "latest.pt")
    assert (one["epoch"], one["step"]) == (two["epoch"], two["step"]) == (2, one["step"])
    assert two["world_size"] == 2 and one["world_size"] == 1
    for name, weight in one["model"].items():
        torch.testing.assert_close(two["model"][name], weight, rtol=0, atol=1e-5, msg=name)
    single_losses, ddp_losses = _losses(single), _losses(ddp)
    assert [s for s, _ in ddp_losses] == [s for s, _ in single_losses] == list(range(1, one["step"] + 1))
    np.testing.assert_allclose([v for _, v in ddp_losses], [v for _, v in single_losses], rtol=0, atol=1e-5)
    report = json.loads((ddp / "result.json").read_text())
    assert report["world_size"] == 2 and report["epochs"] == 2


def test_step_tokens_count_every_ranks_micro_batches() -> None:
    """The loss normaliser of each step is the target tokens of all micro-batches of all ranks."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=(300, 2))
    sampler = TokenBatchSampler(lengths, batch_tokens=128, seed=3)
    world, accumulate = 3, 2
    shards = [sampler.batches(1, r, world) for r in range(world)]
    tgt_ids = [np.zeros(n, dtype=np.int64) for n in lengths[:, 1]]
    expected = []
    for start in range(0, len(shards[0]), accumulate):
        batches = [b for shard in shards for b in shard[start:start + accumulate]]
        expected.append(sum(collate([[5]] * len(b), [tgt_ids[i] for i in b]).n_tgt_tokens for b in batches))
    every_rank = sampler.batches(1)[:len(shards[0]) * world]
    assert loss.step_tokens(every_rank, lengths[:, 1], accumulate * world) == expected


def test_world_comes_from_torchrun_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    world = distributed.env_world()
    assert (world.rank, world.local_rank, world.size) == (3, 1, 4)
    assert world.distributed and not world.is_main
    assert distributed.current() == distributed.World()  # no process group joined: a single process


@pytest.mark.parametrize(("args", "expected"), [
    (["train", "-m", "training.lr=1e-3,5e-4"], "torchrun runs one training job"),
    (["evaluate", "checkpoint=x"], "evaluate runs in one process"),
])
def test_torchrun_refuses_what_it_cannot_split(args: list[str], expected: str,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(args) == 2
    assert expected in capsys.readouterr().err
