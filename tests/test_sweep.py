"""Sweeps: a multirun compares its jobs in one table and in TensorBoard; Optuna and launchers compose."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_overrides
from transformer_mt.cli import UserError, explain_composition_error, precheck
from transformer_mt.config import CONFIG_DIR, register_schemas
from transformer_mt.sweep import markdown, write_summary


def _sweep_overrides(corpus: Path, root: Path, **extra: object) -> list[str]:
    """Tiny one-epoch jobs; the sweep directory comes from checkpoint.root, not checkpoint.dir."""
    values = {"training.epochs": 1, "device.num_threads": 1, **extra}
    return [o for o in tiny_overrides(corpus, root / "unused", **values)
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


def test_multirun_compares_its_jobs(tmp_path: Path, corpus: Path) -> None:
    result = run_cli("train", "-m", *_sweep_overrides(corpus, tmp_path),
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


def test_optuna_sweep_maximises_bleu_in_three_trials(tmp_path: Path, corpus: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    result = run_cli("train", "-m", "sweep=optuna", "hydra.sweeper.n_trials=3",
                     *_sweep_overrides(corpus, tmp_path, **{"dataset.max_pairs": 300}))
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
    from hydra import compose, initialize_config_dir

    from transformer_mt.cli import _register_resolvers

    register_schemas()
    _register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="train"):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=True)


def test_slurm_launcher_composes() -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    launcher = _compose("hydra/launcher=slurm", "hydra.launcher.partition=gpu").hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node) == ("gpu", 1, 1)
    assert launcher.timeout_min == 240 and launcher.array_parallelism == 8
    plain = _compose("hydra/launcher=submitit_slurm").hydra.launcher
    assert plain._target_ == launcher._target_ and plain.gpus_per_node is None


def test_optuna_and_joblib_configs_compose() -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cfg = _compose("sweep=optuna", "hydra/launcher=parallel")
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and cfg.hydra.sweeper.direction == "maximize"
    assert cfg.hydra.sweeper.params["training.lr"] == "tag(log, interval(1e-4, 3e-3))"
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == 2
    assert cfg.training.lr == 1e-3  # the search space lives in the sweeper, the run config is unchanged


@pytest.mark.parametrize("overrides", [
    ["sweep=optuna"], ["hydra/sweeper=optuna"], ["hydra/launcher=joblib"], ["hydra/launcher=parallel"],
    ["hydra/launcher=submitit_slurm"], ["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
    ["training.lr=tag(log, interval(1e-4, 1e-2))", "model.d_ff=choice(512, 1024)"],
])
def test_precheck_accepts_sweepers_launchers_and_search_spaces(overrides: list[str]) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    precheck("train", ["-m", *overrides])


def test_precheck_checks_both_ends_of_an_interval() -> None:
    with pytest.raises(UserError, match="training.lr=-0.1 is out of range"):
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
