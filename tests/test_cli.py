"""The command line: help, one-line configuration errors, Hydra's own features."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer_mt.cli import main
from transformer_mt.errors import ConfigError
from transformer_mt.jobs.composition import explain_composition_error


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "evaluate", "translate"):
        assert command in out


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.d_model=250", "model.d_model=250 is not divisible by model.n_heads=4"),
        ("dataset=nope",
         "dataset=nope is not a known option; choose one of: hf, opus_books, parallel, tatoeba"),
        ("training.lr=abc", "training.lr=abc"),
        ("training.lrr=1", "'training.lrr' is not a known key"),
        ("+foo=1", "'foo' is not a known key"),
        ("model.dropout=-0.1", "model.dropout=-0.1 is out of range"),
        ("tokenizer=bogus", "tokenizer=bogus is not a known option"),
        ("training.scheduler=exponential", "training.scheduler='exponential' is not allowed"),
        ("tokenizer.vocab_size=3", "tokenizer.vocab_size=3 is out of range"),
        # validation's search is `decoding` (it was training.valid_beam_size, which took 0 and crashed)
        ("training.valid_beam_size=0", "'training.valid_beam_size' was renamed: use decoding.beam_size"),
        ("decoding.beam_size=0", "decoding.beam_size=0 is out of range; it must be >= 1"),
        # what only evaluate/translate use is not silently accepted by train
        ("decoding.sampling=true", "'decoding.sampling' is not a known key"),
        ("decoding.n_best=2", "'decoding.n_best' is not a known key"),
        ("debug=true", "'debug' was renamed: use traceback"),
        ("debug=nope", "debug=nope is not a known option; choose one of: smoke, tiny"),
    ],
)
def test_bad_config_fails_at_once_with_one_line(
    override: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err
    assert len(err.splitlines()) == 1


def test_checkpoint_dir_and_another_hydra_run_dir_fail_at_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """checkpoint.dir is where the run's files go: a different hydra.run.dir would split them."""
    x, y = tmp_path / "x", tmp_path / "y"
    assert main(["train", f"checkpoint.dir={x}", f"hydra.run.dir={y}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: checkpoint.dir={x} and Hydra's output directory {y} differ")
    assert len(err.splitlines()) == 1 and not x.exists() and not y.exists()
    assert main(["train", f"checkpoint.dir={x}", f"hydra.run.dir={x}", "--cfg", "job"]) == 0  # the same: fine


def test_a_checkpoint_dir_through_a_link_is_fine(tmp_path: Path) -> None:
    """A directory reached through a link is the same directory: the run's files stay together, and the
    check that keeps them together compares directories, not their spellings."""
    from transformer_mt.jobs.composition import compose_hydra

    (tmp_path / "disk").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "disk")
    disk, link = tmp_path / "disk" / "run", tmp_path / "link" / "run"
    cfg = compose_hydra("train", [f"checkpoint.dir={link}"])
    assert Path(cfg.hydra.runtime.output_dir) == disk and Path(cfg.checkpoint.dir).resolve() == disk
    for checkpoint_dir, run_dir in ((link, disk), (disk, link), (link, link)):  # each accepted
        assert main(["train", f"checkpoint.dir={checkpoint_dir}", f"hydra.run.dir={run_dir}", "--cfg",
                     "job"]) == 0


def test_traceback_true_holds_before_hydra_starts_too() -> None:
    """One condition for a traceback: `traceback=true` also shows it for a mistake found before the run."""
    with pytest.raises(ConfigError, match="model.dropout"):
        main(["train", "model.dropout=2", "traceback=true"])


def test_every_problem_is_reported_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "model.dropout=2", "training.epochs=0"]) == 2
    err = capsys.readouterr().err
    assert "model.dropout" in err and "training.epochs" in err


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bogus"]) == 2
    assert "choose one of: train, evaluate, translate" in capsys.readouterr().err


def test_sweep_values_are_checked_before_launch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "-m", "model=tiny,nope"]) == 2
    assert "model=nope is not a known option" in capsys.readouterr().err


def test_hydra_cfg_job_prints_the_composed_config(run_cli_here) -> None:
    result = run_cli_here("train", "--cfg", "job", "model=tiny", "training.lr=5e-4")
    assert result.returncode == 0, result.stderr
    assert "d_model: 64" in result.stdout and "lr: 0.0005" in result.stdout


def test_each_command_has_its_own_config(run_cli_here) -> None:
    for command, key in (("evaluate", "split: test"), ("translate", "scores: false")):
        result = run_cli_here(command, "--cfg", "job")
        assert result.returncode == 0, result.stderr
        assert key in result.stdout and "decoding:" in result.stdout


def test_missing_checkpoint_is_one_line(run_cli_here) -> None:
    result = run_cli_here("translate", "checkpoint=/nonexistent/run", "text=Hello")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: checkpoint path /nonexistent/run does not exist; give a .pt file or a run directory"
    ]


def test_explain_falls_back_to_one_line() -> None:
    assert "\n" not in explain_composition_error(ValueError("first\nsecond"))


def test_shell_completion_suggests_groups() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "COMP_LINE": "transformer-mt train mod", "COMP_POINT": "24"}
    result = subprocess.run([sys.executable, "-m", "transformer_mt", "-sc", "query=bash"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "model=" in result.stdout
