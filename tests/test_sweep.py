"""Sweeps: a multirun compares its jobs in one table and in TensorBoard."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, tiny_overrides
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
