"""Sweeps: a multirun compares its jobs in one table and in TensorBoard; Optuna and launchers compose.

The sweeps run through the command line's entry point in this process (`run_cli_here`): a subprocess
would add seconds of imports to each; tests/test_faults.py starts a sweep as a subprocess."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.conftest import require, smoke_overrides
from transformer_mt.cli import main
from transformer_mt.config import ConfigError
from transformer_mt.jobs.composition import compose_hydra, explain_composition_error, precheck
from transformer_mt.jobs.sweep import markdown, write_summary


def _sweep_overrides(corpus: Path, root: Path, **extra: object) -> list[str]:
    """Smoke jobs (one epoch of 200 pairs); the sweep directory comes from checkpoint.root, not
    checkpoint.dir."""
    return [o for o in smoke_overrides(corpus, root / "unused", **extra)
            if not o.startswith("checkpoint.dir=")] + [f"checkpoint.root={root}"]


def _sweep_dir(root: Path) -> Path:
    sweeps = list((root / "sweeps").iterdir())
    assert len(sweeps) == 1, sweeps
    return sweeps[0]


def _hparams(run_dir: Path) -> dict[str, object]:
    """The hyperparameters of the run's HParams entry, read back from its event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(content)
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} >= {"best/bleu", "best/chrf"}
    assert "best/bleu" in acc.Tags()["scalars"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    return {k: v.string_value or v.number_value for k, v in start.session_start_info.hparams.items()}


def test_each_job_of_a_sweep_writes_into_its_own_checkpoint_dir(tmp_path: Path, corpus: Path,
                                                                run_cli_here: Callable[..., Any]) -> None:
    """The usual way to give each job its own directory: Hydra's job number in checkpoint.dir."""
    runs = tmp_path / "runs"
    result = run_cli_here("train", "-m", *_sweep_overrides(corpus, tmp_path), "training.lr=5e-4,1e-3",
                          f"checkpoint.dir={runs}/${{hydra:job.num}}")
    assert result.returncode == 0, result.stderr[-3000:]
    for job in (0, 1):
        for name in ("best.pt", "result.json", "train.log", ".hydra/config.yaml", "split/test.tsv"):
            assert (runs / str(job) / name).exists(), f"{job}/{name}"
    rows = list(csv.DictReader((_sweep_dir(tmp_path) / "summary.csv").open(encoding="utf-8")))
    assert [Path(r["checkpoint"]) for r in rows] == [(runs / str(j) / "best.pt").resolve() for j in (0, 1)]


def test_jobs_that_would_share_a_checkpoint_dir_fail_at_start(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "-m", "debug=tiny", "training.lr=5e-4,1e-3", f"checkpoint.dir={tmp_path}/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: jobs 0 and 1 of this sweep would share checkpoint.dir=")
    assert len(err.splitlines()) == 1 and not (tmp_path / "x").exists()
    assert main(["train", "-m", "sweep=optuna", f"checkpoint.dir={tmp_path}/x"]) == 2  # trials too
    assert "would share" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["runs/${hydra:job.num}", "runs/${now:%Y-%m-%d}/lr${training.lr}",
                                  "${hydra:runtime.output_dir}/checkpoints", "runs/${hydra:job.name}"])
def test_hydra_interpolations_work_in_path_keys(path: str) -> None:
    """Resolved as Hydra resolves them in the job: before it starts (precheck), in any path key."""
    multirun = "job.num" in path
    precheck("train", [*(["-m"] if multirun else []), f"checkpoint.dir={path}",
                       f"dataset.cache_dir={path}/cache", "training.lr=1e-3,5e-4" if multirun else "seed=1"])
    cfg = compose_hydra("train", [f"checkpoint.dir={path}"], job_num=3 if multirun else None)
    assert "${" not in str(OmegaConf.to_container(cfg.checkpoint, resolve=True))


def test_multirun_compares_its_jobs(tmp_path: Path, corpus: Path, run_cli_here: Callable[..., Any]) -> None:
    result = run_cli_here("train", "-m", *_sweep_overrides(corpus, tmp_path),
                          "model.d_ff=64,128", "training.lr=5e-4,1e-3")
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _sweep_dir(tmp_path)
    with (sweep / "summary.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert [(r["overrides"].split()[-2:]) for r in rows] == [
        ["model.d_ff=64", "training.lr=0.0005"], ["model.d_ff=64", "training.lr=0.001"],
        ["model.d_ff=128", "training.lr=0.0005"], ["model.d_ff=128", "training.lr=0.001"]]
    assert len({r["checkpoint"] for r in rows}) == 4  # nothing shared or overwritten
    for job, row in enumerate(rows):
        assert Path(row["checkpoint"]) == (sweep / str(job) / "best.pt").resolve()
        assert float(row["best_chrf"]) >= 0 and int(row["epochs"]) == 1
        assert float(row["tgt_tokens_per_s"]) > 0 and float(row["wall_seconds"]) > 0
        params = _hparams(sweep / str(job))
        assert params["training.lr"] == pytest.approx([5e-4, 1e-3][job % 2])
        assert params["model.d_ff"] == [64, 128][job // 2] and params["model.d_model"] == 64
    table = (sweep / "summary.md").read_text(encoding="utf-8")
    assert "| 3 | model.d_ff=128 training.lr=0.001 |" in table  # only what differs between jobs
    assert table in result.stdout  # printed too


@pytest.mark.slow  # three trials; the quick suite's sweep is the basic sweeper's (the same job, compared)
@pytest.mark.filterwarnings("ignore::DeprecationWarning:optuna.*")  # its SQLAlchemy 1.x idioms
def test_optuna_sweep_maximises_bleu_in_three_trials(tmp_path: Path, corpus: Path,
                                                     run_cli_here: Callable[..., Any]) -> None:
    require("hydra_plugins.hydra_optuna_sweeper")
    result = run_cli_here("train", "-m", "sweep=optuna", "hydra.sweeper.n_trials=3",
                          *_sweep_overrides(corpus, tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = _sweep_dir(tmp_path)
    assert "Directions: ['maximize']" in result.stdout
    best = (sweep / "optimization_results.yaml").read_text(encoding="utf-8")
    assert "training.lr" in best and "best_value" in best
    for job in range(3):
        assert json.loads((sweep / str(job) / "result.json").read_text())["best_metric"] == "bleu"
    lrs = [_hparams(sweep / str(job))["training.lr"] for job in range(3)]
    assert all(1e-4 <= lr <= 3e-3 for lr in lrs) and len(set(lrs)) == 3  # drawn from the search space
    assert len((sweep / "summary.csv").read_text().splitlines()) == 4


def _compose(*overrides: str):  # noqa: ANN202 - a DictConfig
    return compose_hydra("train", list(overrides))


def test_slurm_launcher_composes() -> None:
    require("hydra_plugins.hydra_submitit_launcher")
    launcher = _compose("hydra/launcher=slurm", "hydra.launcher.partition=gpu").hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node) == ("gpu", 1, 1)
    assert launcher.timeout_min == 240 and launcher.array_parallelism == 8
    plain = _compose("hydra/launcher=submitit_slurm").hydra.launcher
    assert plain._target_ == launcher._target_ and plain.gpus_per_node is None


def test_optuna_and_joblib_configs_compose() -> None:
    require("hydra_plugins.hydra_optuna_sweeper")
    require("hydra_plugins.hydra_joblib_launcher")
    cfg = _compose("sweep=optuna", "hydra/launcher=parallel")
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and cfg.hydra.sweeper.direction == "maximize"
    assert cfg.hydra.sweeper.params["training.lr"] == "tag(log, interval(1e-4, 3e-3))"
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == 2
    assert cfg.training.lr == 1e-3  # the search space lives in the sweeper, the run config is unchanged


@pytest.mark.parametrize(("overrides", "plugin", "jobs"), [
    (["sweep=optuna"], "sweeper.OptunaSweeper", 2), (["hydra/sweeper=optuna"], "sweeper.OptunaSweeper", 2),
    (["hydra/launcher=joblib"], "launcher.JoblibLauncher", 1),
    (["hydra/launcher=parallel"], "launcher.JoblibLauncher", 1),
    (["hydra/launcher=submitit_slurm"], "launcher.SlurmLauncher", 1),
    (["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], "launcher.SlurmLauncher", 1),
])
def test_precheck_accepts_sweepers_and_launchers(overrides: list[str], plugin: str, jobs: int) -> None:
    """Each job is checked with the plugin in place; a search sweeper's first two trials, since it numbers
    them (and two trials must not share a directory)."""
    require("hydra_plugins.hydra_optuna_sweeper")
    require("hydra_plugins.hydra_submitit_launcher")
    checked = precheck("train", ["-m", *overrides])
    assert len(checked) == jobs and all(c.training.lr == 1e-3 for c in checked)  # the run's own settings
    group, name = plugin.split(".")
    assert _compose(*overrides).hydra[group]._target_.endswith(name)


def test_precheck_checks_every_value_of_a_search_space() -> None:
    """Each end of an interval and each choice, every swept key against the others' first values."""
    checked = precheck("train", ["-m", "training.lr=tag(log, interval(1e-4, 1e-2))",
                                 "model.d_ff=choice(512, 1024)"])
    assert [(c.training.lr, c.model.d_ff) for c in checked] == [(1e-4, 512), (1e-2, 512), (1e-4, 1024)]


def test_precheck_checks_both_ends_of_an_interval() -> None:
    with pytest.raises(ConfigError, match="training.lr=-0.1 is out of range"):
        precheck("train", ["-m", "training.lr=interval(-0.1, 1e-3)"])


def test_a_missing_plugin_names_the_extra_to_install() -> None:
    text = ("In 'hydra/config': Could not find 'hydra/launcher/submitit_slurm'\n\n"
            "Available options in 'hydra/launcher':\n\tbasic\n")
    assert explain_composition_error(ValueError(text)) == (
        "hydra/launcher=submitit_slurm needs a Hydra plugin that is not installed; "
        "install it with: pip install -e '.[slurm]'")


def test_summary_orders_jobs_and_shows_what_differs(tmp_path: Path) -> None:
    common = ["model=tiny", "training.epochs=1"]
    for job, (lr, bleu) in enumerate([("1e-3", 3.5), ("5e-4", 7.25)]):
        run = tmp_path / str(job)
        run.mkdir()
        (run / "result.json").write_text(json.dumps({
            "job": job, "overrides": [*common, f"training.lr={lr}"], "best_metric": "bleu",
            "best_value": bleu, "higher_is_better": True, "best_bleu": bleu, "best_chrf": 20.0,
            "epochs": 1, "wall_seconds": 12.5, "tgt_tokens_per_s": 1000.0,
            "checkpoint": str((run / "best.pt").resolve())}))
    table = write_summary(tmp_path)
    assert table.splitlines()[2] == "| 0 | training.lr=1e-3 | 3.50 | 20.00 | 1 | 12.5 | 1000 | 0/best.pt |"
    assert table.strip().endswith("best bleu: job 1 (7.25): training.lr=5e-4")
    assert (tmp_path / "summary.md").read_text() == table == markdown(
        [json.loads((tmp_path / str(j) / "result.json").read_text()) for j in (0, 1)], tmp_path)
