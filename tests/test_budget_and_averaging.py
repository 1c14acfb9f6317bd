"""Time budgets, budget-aware learning-rate decay, mid-epoch validation and checkpoint averaging."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import script_module, smoke_overrides, tiny_overrides
from transformer_mt.checkpoints.store import (
    CheckpointError,
    average_checkpoints,
    load_checkpoint,
    numbered_checkpoints,
    save_checkpoint,
)
from transformer_mt.config import TrainingConfig
from transformer_mt.jobs.train import build_trainer
from transformer_mt.training.optim import lr_lambda


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
def test_decay_follows_steps_or_time_whichever_is_further(scheduler: str) -> None:
    training = TrainingConfig(scheduler=scheduler, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    used = {"fraction": 0.0}
    factor = lr_lambda(training, total_steps=110, time_used=lambda: used["fraction"])
    assert factor(4) == pytest.approx(0.5)  # warm-up: step 5 of 10
    assert factor(9) == pytest.approx(1.0)
    assert factor(59) == pytest.approx(0.55)  # half-way by steps: (1 + 0.1) / 2 either way
    used["fraction"] = 0.75  # the clock is further along than the steps: it wins
    shape = 0.25 if scheduler == "linear" else 0.5 * (1 + math.cos(0.75 * math.pi))
    expected = 0.1 + 0.9 * shape
    assert factor(59) == pytest.approx(expected)
    used["fraction"] = 1.5  # past the budget: the floor, never below
    assert factor(59) == pytest.approx(0.1)


def test_noam_ignores_the_clock() -> None:
    training = TrainingConfig(scheduler="noam", warmup_steps=100)
    factor = lr_lambda(training, total_steps=10, time_used=lambda: 5.0)
    assert factor(99) == pytest.approx(1.0) and factor(399) == pytest.approx(0.5)


def test_one_rule_decides_what_is_better() -> None:
    """Best tracking (strictly better) and checkpoint averaging (not worse) ask the same function."""
    from transformer_mt.decoding.metrics import improves

    assert improves("bleu", 30.0, None) and improves("bleu", 30.1, 30.0) and not improves("bleu", 29.9, 30.0)
    assert improves("loss", 1.9, 2.0) and not improves("loss", 2.1, 2.0)
    assert not improves("bleu", 30.0, 30.0) and improves("bleu", 30.0, 30.0, ties=True)
    assert not improves("bleu", float("nan"), None) and not improves("loss", float("inf"), 2.0)


def _fake_checkpoint(path: Path, weight: float, d_model: int = 4) -> Path:
    state = {"model_config": {"d_model": d_model}, "config": {}, "tokenizer": "{}", "step": int(weight),
             "model": {"w": torch.full((2, d_model), weight), "b": torch.full((d_model,), -weight)},
             "optimizer": {}, "scheduler": {}, "scaler": {}, "rng": {}}
    save_checkpoint(state, path)
    return path


def test_average_is_the_elementwise_mean(tmp_path: Path) -> None:
    paths = [_fake_checkpoint(tmp_path / f"step_{i:07d}.pt", float(i)) for i in (1, 2, 6)]
    state = average_checkpoints(paths)
    assert torch.equal(state["model"]["w"], torch.full((2, 4), 3.0))
    assert torch.equal(state["model"]["b"], torch.full((4,), -3.0))
    assert state["step"] == 6 and "optimizer" not in state  # newest metadata, inference only
    mismatched = _fake_checkpoint(tmp_path / "other.pt", 1.0, d_model=8)
    with pytest.raises(CheckpointError, match="different models"):
        average_checkpoints([paths[0], mismatched])


def test_average_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/average_checkpoints.py's main (tests/test_scripts.py runs it on a trained run)."""
    run = tmp_path / "run"
    run.mkdir()
    for i in (1, 2, 3):
        _fake_checkpoint(run / f"step_{i:07d}.pt", float(i))
    out = tmp_path / "avg.pt"
    average = script_module("average_checkpoints").main
    assert average([str(run), "--last", "2", "--out", str(out)]) == 0, capsys.readouterr().err
    assert torch.equal(load_checkpoint(out)["model"]["w"], torch.full((2, 4), 2.5))
    assert average([str(out), "--out", str(out)]) == 2 and "at least two" in capsys.readouterr().err


def test_validation_every_n_steps_then_averaging(tmp_path: Path, corpus: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    with caplog.at_level("INFO"):
        tmt.train(smoke_overrides(corpus, run_dir, **{
            "training.epochs": 3, "training.valid_every_steps": 2, "training.keep_last": 3,
            "training.average_last": 3, "training.scheduler": "linear", "training.valid_max_sentences": 10}))
    records = _records(run_dir)
    single = [r for r in records if "model" not in r]
    assert len(single) > 3, "expected validations inside epochs, not only at their ends"
    assert [r["step"] for r in single] == sorted({r["step"] for r in single})  # none twice
    kept = numbered_checkpoints(run_dir)
    assert len(kept) == 3 and kept[-1].name == "epoch_003.pt"
    averaged = [r for r in records if r.get("model") == "averaged"]
    assert len(averaged) == 1 and averaged[0]["epoch"] == 3  # the last epoch, not one past it
    best = max(r["bleu"] for r in single)
    if averaged[0]["bleu"] >= best:  # kept only when validation does not drop
        assert (run_dir / "best.pt").samefile(run_dir / "averaged.pt")
        with pytest.raises(CheckpointError, match="averaged \\(inference-only\\)"):
            tmt.train([f"resume={run_dir / 'averaged.pt'}"])
    else:
        assert not (run_dir / "averaged.pt").exists()
    assert "average of" in caplog.text


class FakeClock:
    """A clock that advances a fixed number of seconds each time it is read: time budgets, tested
    without depending on how fast this machine is."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("warmup", [0, 1, 20])  # 0 and 1 once read the clock before it existed
def test_time_budget_stops_cleanly_with_a_checkpoint(tmp_path: Path, corpus: Path, warmup: int,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    cfg = tmt.compose("train", tiny_overrides(corpus, run_dir, **{
        "training.epochs": 1000, "training.max_minutes": 0.1, "training.scheduler": "linear",
        "training.warmup_steps": warmup}))
    with caplog.at_level("INFO"):
        build_trainer(cfg, run_dir, clock=FakeClock(0.25)).fit()  # 6 s of budget: about 24 readings
    assert "time budget of 0.1 minutes reached" in caplog.text
    state = load_checkpoint(run_dir / "latest.pt")
    assert 6 <= state["train_seconds"] < 30 and state["epoch"] < 1000  # stopped on the clock it saved
    assert state["scheduler"]["_last_lr"][0] < 2e-4  # the budget-aware decay had cooled down
    assert state["validated"] and len(_records(run_dir)) == state["epoch"] + 1  # each epoch, and the stop


def test_resumed_past_the_budget_it_validates_where_the_run_would_have(tmp_path: Path, corpus: Path) -> None:
    """A latest.pt written after the budget ran out but before that step's validation (killed in
    between): resuming it validates and keeps that step, as the run would have, then stops."""
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(corpus, run_dir, **{
        "training.epochs": 1000, "training.max_minutes": 0.1, "training.scheduler": "linear"})
    build_trainer(tmt.compose("train", overrides), run_dir, overrides, clock=FakeClock(0.25)).fit()
    state = load_checkpoint(run_dir / "latest.pt")
    state["validated"] = False
    earlier = [r for r in _records(run_dir) if r["step"] != state["step"]]  # that validation never ran
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    before = len(earlier)
    save_checkpoint(state, run_dir / "latest.pt")
    tmt.train([f"resume={run_dir}"])
    records = _records(run_dir)
    assert len(records) == before + 1 and records[-1]["step"] == state["step"]
    assert load_checkpoint(run_dir / "latest.pt")["validated"]
