"""One run per directory, and files that survive a full disk or a kill: a held directory is refused, a
fresh run never mixes its files with another run's, a failed save stops in one line with the previous
checkpoint intact, and a resumed run drops torn records, redone records and half-written files."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections import namedtuple
from pathlib import Path
from typing import IO, Any

import pytest
from filelock import FileLock

import transformer_mt as tmt
from tests.conftest import smoke_overrides
from transformer_mt.checkpoints import store as checkpoint
from transformer_mt.checkpoints.store import load_checkpoint, save_checkpoint
from transformer_mt.cli import main
from transformer_mt.errors import ConfigError, TrainingError
from transformer_mt.training.records import METRICS, RESULT, best_scores


def _listing(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / METRICS).read_text().splitlines()]


def _one_line(ex: pytest.ExceptionInfo[Exception]) -> str:
    message = str(ex.value)
    assert "\n" not in message
    return message


# -- one run per directory -----------------------------------------------------------------------
def test_a_held_directory_is_refused_to_a_second_run_and_to_a_resume(
        tiny_run_copy: Path, tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """While a run holds its directory, neither a new run nor a resume may write into it."""
    before = _listing(tiny_run_copy)
    with FileLock(str(tiny_run_copy / ".lock"), timeout=0):  # the lock a running run holds
        with pytest.raises(ConfigError, match="another run holds") as refused:
            tmt.train([f"resume={tiny_run_copy}", "training.epochs=3"])
        assert str(tiny_run_copy) in _one_line(refused)
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        with FileLock(str(fresh / ".lock"), timeout=0):
            with pytest.raises(ConfigError, match=f"another run holds {fresh}"):
                tmt.train(smoke_overrides(corpus, fresh))
            assert main(["train", f"resume={tiny_run_copy}", "training.epochs=3"]) == 2  # before Hydra starts
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: another run holds {tiny_run_copy}") and len(err.splitlines()) == 1
    assert _listing(tiny_run_copy) == before


def test_a_run_holds_its_directory_while_it_trains(corpus: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_mt.training.trainer import Trainer

    run_dir = tmp_path / "run"
    seen = []

    def fit(self: Trainer) -> float:
        with pytest.raises(ConfigError, match="another run holds"):
            tmt.train(smoke_overrides(corpus, run_dir))
        seen.append(True)
        return 0.0

    monkeypatch.setattr(Trainer, "fit", fit)
    tmt.train(smoke_overrides(corpus, run_dir))
    assert seen
    with FileLock(str(run_dir / ".lock"), timeout=0):  # released at the run's end
        pass


def test_a_fresh_run_into_a_directory_holding_a_run_is_refused(tiny_run_copy: Path, corpus: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing of the old run changes, not even Hydra's record of its config."""
    before = _listing(tiny_run_copy)
    with pytest.raises(ConfigError, match="already holds a run") as refused:
        tmt.train(smoke_overrides(corpus, tiny_run_copy))
    message = _one_line(refused)
    assert f"resume={tiny_run_copy}" in message and "checkpoint.overwrite=true" in message
    assert main(["train", *smoke_overrides(corpus, tiny_run_copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tiny_run_copy} already holds a run") and len(err.splitlines()) == 1
    assert _listing(tiny_run_copy) == before


def test_overwrite_replaces_the_previous_run_and_result_reports_only_its_own(tiny_run_copy: Path,
                                                                             corpus: Path) -> None:
    tmt.train(smoke_overrides(corpus, tiny_run_copy, **{"checkpoint.overwrite": "true", "training.lr": 1e-9}))
    assert not (tiny_run_copy / "epoch_002.pt").exists()  # the old run's checkpoints are gone
    records = [json.loads(line) for line in (tiny_run_copy / METRICS).read_text().splitlines()]
    assert len(records) == 1
    result = json.loads((tiny_run_copy / RESULT).read_text())
    assert result["best_bleu"] == records[0]["bleu"] and result["best_valid_loss"] == records[0]["valid_loss"]
    assert load_checkpoint(tiny_run_copy / "best.pt")["step"] == records[0]["step"]


def test_a_sweep_never_writes_into_a_directory_holding_a_run(tiny_run: Path, tmp_path: Path, corpus: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Each job's directory is checked before the sweep starts: no job runs."""
    runs = tmp_path / "runs"
    shutil.copytree(tiny_run, runs / "1")
    overrides = [o for o in smoke_overrides(corpus, tmp_path / "unused")
                 if not o.startswith("checkpoint.dir=")]
    assert main(["train", "-m", *overrides, f"checkpoint.dir={runs}/${{hydra:job.num}}",
                 "training.lr=1e-3,2e-3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {runs / '1'} already holds a run") and len(err.splitlines()) == 1
    assert not (runs / "0").exists()


def test_a_run_directory_under_a_regular_file_is_one_line(tmp_path: Path, corpus: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("not a directory")
    assert main(["train", *smoke_overrides(corpus, blocker / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: checkpoint.dir={blocker / 'run'} lies under {blocker}, which is a file, not a "
                   "directory; choose another checkpoint.dir")
    with pytest.raises(ConfigError, match="which is a file"):
        tmt.train(smoke_overrides(corpus, blocker / "run"))


# -- a full disk ---------------------------------------------------------------------------------
class _FullDisk:
    """A file on a disk that fills after `room` bytes: the next write raises ENOSPC."""

    def __init__(self, file: IO[bytes], room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def test_a_failed_save_stops_in_one_line_naming_the_step_and_how_to_resume(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    real = checkpoint.atomic_write
    saves = []

    def fills_at_the_third_save(path: Path, write: Any) -> None:
        saves.append(path)
        real(path, write if len(saves) < 3 else lambda f: write(_FullDisk(f, 10_000)))

    monkeypatch.setattr(checkpoint, "atomic_write", fills_at_the_third_save)
    with pytest.raises(TrainingError) as stopped:
        tmt.train(smoke_overrides(corpus, run_dir, **{"training.save_every_steps": 1}))
    message = _one_line(stopped)
    assert message.startswith("could not write the checkpoint (No space left on device): step 3 was not "
                              "saved")
    assert message.endswith(f"the previous checkpoint is intact: free space, then continue with: "
                            f"transformer-mt train resume={run_dir}")
    assert load_checkpoint(run_dir / "latest.pt")["step"] == 2
    assert not list(run_dir.rglob("*.tmp"))


def test_free_space_is_checked_against_the_last_checkpoint_before_each_save(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB free: enough to start (training.min_free_mib=0) and for the first checkpoint (about 2 MiB:
    nothing tells its size yet), not for the second, which is refused before a byte is written."""
    run_dir = tmp_path / "run"
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 2**20, 2**20))
    with pytest.raises(TrainingError) as stopped:
        tmt.train(smoke_overrides(corpus, run_dir, **{"training.save_every_steps": 1,
                                                      "training.min_free_mib": 0}))
    message = _one_line(stopped)
    assert message.startswith(f"only 1.0 MiB free at {run_dir}, less than the last checkpoint's 2.")
    assert f"step 2 was not saved to {run_dir / 'latest.pt'}" in message and f"resume={run_dir}" in message
    assert load_checkpoint(run_dir / "latest.pt")["step"] == 1


def test_a_full_disk_at_the_end_of_run_average_keeps_the_run(corpus: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The epochs are saved when the last checkpoints are averaged: a failed save of the average ends the
    run normally, best.pt a single checkpoint, with a warning."""
    from transformer_mt.training import validation

    real = checkpoint.save_checkpoint

    def full_for_the_average(state: dict[str, Any], path: Path) -> None:
        if path.name == validation.AVERAGED:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(state, path)

    monkeypatch.setattr(checkpoint, "save_checkpoint", full_for_the_average)
    monkeypatch.setattr(validation, "improves", lambda *args, **kwargs: True)  # the average is kept
    run_dir = tmp_path / "run"
    with caplog.at_level("WARNING"):
        tmt.train(smoke_overrides(corpus, run_dir, **{"training.epochs": 2, "training.average_last": 2}))
    assert "the average of the last checkpoints was not saved (No space left on device)" in caplog.text
    assert (run_dir / RESULT).is_file() and not (run_dir / validation.AVERAGED).exists()
    assert "averaged" not in load_checkpoint(run_dir / "best.pt")["best"]


def test_a_job_output_on_a_full_disk_is_one_line_and_no_file(tiny_run: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk shows at the latest when the file is synced: the output's one-line error, no file."""
    from transformer_mt.errors import OutputError

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    source = tmp_path / "in.txt"
    source.write_text("I am cold.\nWhere is the station?\n", encoding="utf-8")
    for command, args in ((tmt.translate, [f"input={source}"]),
                          (tmt.score, [f"src={source}", f"tgt={source}"])):
        out = tmp_path / f"{command.__name__}.out"
        with pytest.raises(OutputError, match=rf"^cannot write {out} \(No space left on device\)"):
            command([f"checkpoint={tiny_run}", "device=cpu", f"output={out}", *args])
        assert not out.exists() and not list(tmp_path.glob("*.tmp"))


# -- torn and redone records, half-written files -------------------------------------------------
def test_a_torn_record_is_skipped_with_a_warning(tiny_run_copy: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A kill or a full disk can cut the last line of metrics.jsonl short: the record is skipped, and a
    resumed run ends as it should."""
    steps = _steps(tiny_run_copy)
    expected = best_scores(tiny_run_copy)
    with (tiny_run_copy / METRICS).open("a") as f:
        f.write('{"epoch": 3, "step": 99, "valid_lo')
    assert best_scores(tiny_run_copy) == expected
    assert "line 3 is not a whole record" in caplog.text
    tmt.train([f"resume={tiny_run_copy}"])  # the run is complete: it only ends again
    assert _steps(tiny_run_copy) == steps
    assert json.loads((tiny_run_copy / RESULT).read_text())["best_bleu"] == expected["bleu"]


@pytest.mark.parametrize("killed", ["after_the_previous_checkpoint", "after_latest_of_the_same_step"])
def test_a_resumed_run_records_each_validation_once(tiny_run_copy: Path, killed: str) -> None:
    """Killed between the record of the last validation and its checkpoint, the run resumes from an
    earlier checkpoint, or from a latest.pt of the same step written before the validation (with
    training.save_every_steps): it validates again, and each step's record is kept once."""
    steps = _steps(tiny_run_copy)
    last = load_checkpoint(tiny_run_copy / "epoch_002.pt")
    for name in ("epoch_002.pt", "latest.pt", "best.pt"):
        (tiny_run_copy / name).unlink()
    if killed == "after_the_previous_checkpoint":
        for alias in ("latest.pt", "best.pt"):
            os.link(tiny_run_copy / "epoch_001.pt", tiny_run_copy / alias)
    else:
        save_checkpoint({**last, "validated": False}, tiny_run_copy / "latest.pt")
    tmt.train([f"resume={tiny_run_copy}"])
    assert _steps(tiny_run_copy) == steps
    assert load_checkpoint(tiny_run_copy / "latest.pt")["step"] == steps[-1]


def test_resume_removes_the_files_of_a_save_killed_half_way(tiny_run_copy: Path) -> None:
    left = [tiny_run_copy / ".epoch_003.pt.k2j4h1.tmp", tiny_run_copy / ".latest.pt.link.tmp",
            tiny_run_copy / "split" / ".train_summary.json.x81ka.tmp"]
    for path in left:
        path.write_bytes(b"half a file")
    tmt.train([f"resume={tiny_run_copy}"])
    assert not [p for p in left if p.exists()]


def test_files_written_atomically_get_the_permissions_open_gives(tmp_path: Path) -> None:
    """mkstemp makes the temporary file the owner's alone; the file renamed into place must not stay so."""
    from transformer_mt.runtime.files import atomic_write

    atomic_write(tmp_path / "atomic.txt", lambda f: f.write(b"x"))
    (tmp_path / "plain.txt").write_bytes(b"x")
    assert (tmp_path / "atomic.txt").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode
