"""Nothing lost: kill -9 and resume is bit-exact, Ctrl-C saves, bad checkpoints are refused clearly."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import (
    as_teacher,
    run_cli,
    smoke_overrides,
    start_cli,
    tiny_overrides,
    wait_for_log,
)
from transformer_mt.checkpoints.store import TRAINED, CheckpointError, load_checkpoint, load_latest_good

FAULT_RUN = {"training.save_every_steps": 1, "training.log_every": 1, "dataset.max_pairs": 400,
             "training.valid_max_sentences": 10, "training.batch_tokens": 768}
# The uninterrupted runs the killed ones must end like: saving is not part of the computation, so they
# save only at each epoch's end.
UNINTERRUPTED = {**FAULT_RUN, "training.save_every_steps": 0}
REGULARISED = {"training.ema_decay": 0.9, "tokenizer.dropout": 0.1, "dataset.variants.caps": 0.1,
               "dataset.variants.typos": 0.1}
# training.plan=auto with the run's length fixed by training.epochs (the tiny run ends long before its
# budget, which is short so that the probe, a share of it, is too), so that the plan does not depend on
# the probe's timing; the killed run reuses its saved plan when resumed.
PLANNED = {"training.plan": "auto", "training.max_minutes": 1}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """An uninterrupted 2-epoch run with a checkpoint after every step."""
    run_dir = tmp_path_factory.mktemp("faults") / "reference"
    tmt.train(tiny_overrides(corpus, run_dir, **UNINTERRUPTED))
    return run_dir


@pytest.fixture(scope="module")
def regularised_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """The same run with a weight average (EMA), BPE-dropout and input variants: more state that must
    resume exactly."""
    run_dir = tmp_path_factory.mktemp("faults") / "regularised"
    tmt.train(tiny_overrides(corpus, run_dir, **UNINTERRUPTED, **REGULARISED))
    return run_dir


@pytest.fixture(scope="module")
def planned_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """The same run planned (training.plan=auto): the plan's learning rate, warm-up, schedule, averaging."""
    run_dir = tmp_path_factory.mktemp("faults") / "planned"
    tmt.train(tiny_overrides(corpus, run_dir, **UNINTERRUPTED, **PLANNED))
    return run_dir


@pytest.fixture(scope="module")
def finetuned_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path, reference_run: Path) -> Path:
    """The same run fine-tuned (init=) from the reference run: the parent's weights and tokenizer."""
    run_dir = tmp_path_factory.mktemp("faults") / "finetuned"
    tmt.train(tiny_overrides(corpus, run_dir, **UNINTERRUPTED, init=reference_run))
    return run_dir


@pytest.fixture(scope="module")
def teacher(fitted_model, reference_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A teacher of the runs' data (their split) that writes real words."""
    return as_teacher(fitted_model("marian", tmp_path_factory.mktemp("faults") / "teacher"), reference_run)


@pytest.fixture(scope="module")
def distilled_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path, teacher: Path) -> Path:
    """The same run distilled (distill.teacher=): the teacher's tokenizer and translations."""
    run_dir = tmp_path_factory.mktemp("faults") / "distilled"
    tmt.train(tiny_overrides(corpus, run_dir, **UNINTERRUPTED, **{"distill.teacher": teacher}))
    return run_dir


def test_kill_9_then_resume_is_bit_exact(regularised_run: Path, corpus: Path, tmp_path: Path,
                                         run_cli_here) -> None:
    """Killed in its second epoch and resumed by `transformer-mt train resume=<dir>` (the command line's
    entry point, in this process: the lock the killed one held is free again), a run with a weight average
    (EMA), BPE-dropout and input variants ends with the uninterrupted run's trained and averaged weights
    and validation records. (The plain, planned, fine-tuned and distilled runs: below, under `slow`.)"""
    kill_after_step = 14
    assert kill_after_step < 2 * load_checkpoint(regularised_run / "epoch_001.pt")["step"]
    run_dir = tmp_path / "killed"
    log_file = tmp_path / "first.log"
    proc = start_cli(["train", *tiny_overrides(corpus, run_dir, **FAULT_RUN, **REGULARISED)], log_file)
    wait_for_log(log_file, f"step {kill_after_step})", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = load_checkpoint(run_dir / "latest.pt")["step"]
    expected = load_checkpoint(regularised_run / "epoch_002.pt")
    assert killed_at < expected["step"], "the run finished before it was killed"

    resumed = run_cli_here("train", f"resume={run_dir}")  # the same computation, bit for bit
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"step {killed_at}, lr" in (run_dir / "train.log").read_text()  # continued where it was
    got = load_checkpoint(run_dir / "epoch_002.pt")
    for key in ("model", TRAINED):  # the average, and the trained weights
        assert expected[key].keys() == got[key].keys()
        for name in expected[key]:
            assert torch.equal(expected[key][name], got[key][name]), f"{key}.{name} differs after resume"
    assert _validated_steps(run_dir) == _validated_steps(regularised_run)


def _validated_steps(run_dir: Path) -> list[int]:
    """The steps of a run's validation records (metrics.jsonl): each once, as the uninterrupted run's."""
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# Each a run and a new process of its own, under `slow` (CI runs them): the regularised run above, killed
# in its second epoch and resumed through the same entry point, is the quick suite's.
@pytest.mark.slow
@pytest.mark.parametrize(("kill_after_step", "variant"), [
    (3, "plain"), *((14, variant) for variant in ("planned", "finetuned", "distilled"))])
def test_kill_9_then_resume_on_the_command_line_is_bit_exact(request: pytest.FixtureRequest, corpus: Path,
                                                             tmp_path: Path, kill_after_step: int,
                                                             variant: str, run_cli_here) -> None:
    """As a user would: the killed run is resumed by `transformer-mt train resume=<dir>` (the lock the
    killed one held is free again), and ends with the uninterrupted run's weights and validation records;
    killed in its first epoch (before any epoch's checkpoint) or its second. The planned run resumes in a
    new process, as a user's would; the others through the same entry point in this one."""
    reference_run = request.getfixturevalue("reference_run" if variant == "plain" else f"{variant}_run")
    extra = {**FAULT_RUN, **PLANNED} if variant == "planned" else dict(FAULT_RUN)
    if variant == "finetuned":
        extra["init"] = request.getfixturevalue("reference_run")
    if variant == "distilled":
        extra["distill.teacher"] = request.getfixturevalue("teacher")
    run_dir = tmp_path / "killed"
    proc = start_cli(["train", *tiny_overrides(corpus, run_dir, **extra)], tmp_path / "first.log")
    wait_for_log(tmp_path / "first.log", f"step {kill_after_step})", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = load_checkpoint(run_dir / "latest.pt")["step"]
    assert killed_at < load_checkpoint(reference_run / "epoch_002.pt")["step"], "it finished before the kill"
    assert (killed_at < load_checkpoint(reference_run / "epoch_001.pt")["step"]) == (kill_after_step == 3)

    resumed = (run_cli if variant == "planned" else run_cli_here)("train", f"resume={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert f"step {killed_at}, lr" in log  # continued where it was
    expected, got = load_checkpoint(reference_run / "epoch_002.pt"), load_checkpoint(run_dir / "epoch_002.pt")
    assert got["step"] == expected["step"] and got["parent"] == expected["parent"]
    assert (got["plan"] or {}).get("values") == (expected["plan"] or {}).get("values")
    assert ("the run's plan, as it was made" in log) == (variant == "planned")  # reused, not made again
    for name in expected["model"]:
        assert torch.equal(expected["model"][name], got["model"][name]), f"{name} differs after resume"
    assert _validated_steps(run_dir) == _validated_steps(reference_run)


def test_a_resumed_run_reads_its_checkpoint_once(reference_run: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The command line reads only the run's overrides from the checkpoint (its tensors stay on disk);
    training loads it, once. (Here with another best metric, whose best starts anew.)"""
    from transformer_mt.checkpoints import store as checkpoint

    run_dir = tmp_path / "again"
    run_dir.mkdir()
    for name in ("epoch_002.pt", "tokenizer.json"):
        (run_dir / name).write_bytes((reference_run / name).read_bytes())
    loads = []  # the loads that read the tensors (not mapped from the file)
    real = checkpoint.load_checkpoint

    def counted(path: Path, *args: object, mmap: bool = False, **kwargs: object) -> dict:
        if not mmap:
            loads.append(path)
        return real(path, *args, mmap=mmap, **kwargs)

    monkeypatch.setattr(checkpoint, "load_checkpoint", counted)
    tmt.train([f"resume={run_dir}", "training.epochs=3", "training.save_every_steps=0",
               "training.best_metric=chrf"])
    # Training reads it once; the calibration of confidence then reads the run's best, as any engine does.
    assert [p for p in loads if p.name != "best.pt"] == [run_dir / "epoch_002.pt"]
    state = load_checkpoint(run_dir / "latest.pt")
    assert state["epoch"] == 3 and state["best"]["metric"] == "chrf" and state["best"]["epoch"] == 3
    assert "training.best_metric is now chrf (was bleu)" in caplog.text


def test_a_run_saved_with_old_key_names_resumes(reference_run: Path, tmp_path: Path) -> None:
    """Its saved overrides are carried over to today's names (or dropped, if train ignored them)."""
    from transformer_mt.checkpoints.store import save_checkpoint
    from transformer_mt.jobs.replayed import with_resumed_overrides

    state = load_checkpoint(reference_run / "epoch_002.pt")
    state["overrides"] = [*state["overrides"], "training.valid_beam_size=2", "debug=false",
                          "decoding.sampling=false"]
    save_checkpoint(state, tmp_path / "epoch_002.pt")
    overrides = with_resumed_overrides([f"resume={tmp_path}"])
    assert "decoding.beam_size=2" in overrides and "traceback=false" in overrides
    old = ("training.valid_beam_size=", "debug=false", "decoding.sampling=")
    assert not any(o.startswith(old) for o in overrides) and "debug=tiny" in overrides  # the group stays
    assert tmt.compose("train", overrides).decoding.beam_size == 2


@pytest.mark.slow  # a process of its own; the sweep's Ctrl-C below (a job saved, the same line) is quick
def test_sigint_saves_a_checkpoint_and_says_how_to_resume(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "interrupted"
    log_file = tmp_path / "run.log"
    overrides = tiny_overrides(corpus, run_dir, **{**FAULT_RUN, "training.save_every_steps": 0,
                                                   "training.epochs": 50})
    proc = start_cli(["train", *overrides], log_file)
    wait_for_log(log_file, "step 2 (", proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    out = log_file.read_text()
    assert f"continue with: transformer-mt train resume={run_dir}" in out
    state = load_checkpoint(run_dir / "latest.pt")
    assert state["batch_in_epoch"] > 0 and state["step"] >= 2


def test_corrupt_latest_falls_back_to_the_previous_good_checkpoint(reference_run: Path,
                                                                   tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    run_dir.mkdir()
    for name in ("epoch_001.pt", "epoch_002.pt"):
        (run_dir / name).write_bytes((reference_run / name).read_bytes())
    (run_dir / "latest.pt").write_bytes((reference_run / "latest.pt").read_bytes()[:20_000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(run_dir / "latest.pt")
    path, state = load_latest_good(run_dir)
    assert path.name == "epoch_002.pt" and state["epoch"] == 2


class _Payload:
    """Would create a file when unpickled, if loading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_carrying_code_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "model_config": {}, "model": {}, "tokenizer": {},
                "config": _Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(evil)
    assert not marker.exists()
    result = run_cli("translate", f"checkpoint={evil}", "text=Hello")
    assert result.returncode == 2 and "refused" in result.stderr and not marker.exists()


def test_not_a_checkpoint(tmp_path: Path) -> None:
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(CheckpointError, match="not a transformer-mt checkpoint"):
        load_checkpoint(other)


def test_resume_into_another_model_shape_is_a_clear_error(reference_run: Path) -> None:
    with pytest.raises(CheckpointError, match="model.d_ff: checkpoint 128 vs config 96") as info:
        tmt.train([f"resume={reference_run}", "model.d_ff=96", "training.epochs=3"])
    assert "\n" not in str(info.value)


def test_diverging_run_stops_with_a_clear_message(corpus: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_mt.jobs.train import build_trainer
    from transformer_mt.training import trainer as train_module

    run_dir = tmp_path / "nan"
    cfg = tmt.compose("train", smoke_overrides(corpus, run_dir, **{"training.max_bad_steps": 3}))
    cfg.model.d_model, cfg.model.d_ff, cfg.model.encoder_layers, cfg.model.decoder_layers = 32, 64, 1, 1
    trainer = build_trainer(cfg, run_dir)
    nan = torch.tensor(float("nan"), requires_grad=True)
    monkeypatch.setattr(train_module.loss, "summed_nll", lambda *args, **kwargs: nan)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(train_module.TrainingError, match="3 non-finite values in a row"):
        trainer.fit()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(before[name], value), "a skipped step changed the weights"
    assert not (run_dir / "best.pt").exists()


def test_unwritable_run_directory_fails_before_training(tmp_path: Path) -> None:
    from transformer_mt.config import ConfigError
    from transformer_mt.runtime.files import check_writable

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot write to"):
        check_writable(blocker / "run", 0)
    with pytest.raises(ConfigError, match="MiB free"):
        check_writable(tmp_path / "run", 10**12)


def test_sigint_stops_a_whole_sweep(corpus: Path, tmp_path: Path) -> None:
    """In a multirun, Ctrl-C saves the running job where it was, says how to resume it, and does not go on
    to start the next ones."""
    log_file = tmp_path / "sweep.log"
    settings = {**FAULT_RUN, "training.save_every_steps": 0, "training.epochs": 50}
    overrides = [o for o in tiny_overrides(corpus, tmp_path / "unused", **settings)
                 if not o.startswith("checkpoint.dir=")]
    proc = start_cli(["train", "-m", *overrides, f"checkpoint.root={tmp_path / 'root'}",
                   "training.lr=1e-3,5e-4"], log_file)
    wait_for_log(log_file, "step 2 (", proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    out = log_file.read_text()
    assert "sweep interrupted" in out
    jobs = sorted(p.name for p in (tmp_path / "root" / "sweeps").glob("*/*") if p.is_dir())
    assert jobs == ["0"]
    job_dir = next((tmp_path / "root" / "sweeps").glob("*/0"))
    assert f"continue with: transformer-mt train resume={job_dir.resolve()}" in out
    state = load_checkpoint(job_dir / "latest.pt")
    assert state["batch_in_epoch"] > 0 and state["step"] >= 2
