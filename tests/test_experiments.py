"""The recipes in configs/experiment/ compose, and each trains a few steps on a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_cli, tiny_overrides
from transformer_mt.checkpoint import load_checkpoint

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "experiment").glob("*.yaml"))


def test_the_three_recipes_exist() -> None:
    assert {"tatoeba_cpu", "tatoeba_gpu", "opus_books_gpu"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_recipe_composes(experiment: str) -> None:
    result = run_cli("train", f"experiment={experiment}", "--cfg", "job")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dataset:" in result.stdout and "training:" in result.stdout
    if experiment == "tatoeba_cpu":
        assert "max_minutes: 40.0" in result.stdout and "scheduler: linear" in result.stdout
    if experiment.endswith("_gpu"):
        assert "d_model: 512" in result.stdout and "name: cuda" in result.stdout


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_recipe_trains_a_few_steps_on_cpu(experiment: str, tmp_path: Path, corpus: Path) -> None:
    """The recipe's own model and schedule, on a sliver of data, so it fits in seconds."""
    run_dir = tmp_path / "run"
    data = tiny_overrides(corpus, run_dir, **{
        "dataset.max_pairs": 120, "dataset.valid_size": 10, "dataset.test_size": 10,
        "training.batch_tokens": 256, "training.epochs": 1, "training.valid_max_sentences": 4,
        "decoding.max_len_b": 3, "decoding.max_len_a": 0})
    data = [o for o in data if not o.startswith("model=")]  # keep the recipe's model
    if "opus_books" in experiment:
        fixture = FIXTURES / "opus_books_en_fr.jsonl"
        data = [o for o in data if not o.startswith(("dataset.path=", "dataset.max_pairs="))]
        data += ["dataset.hf_path=json", f"dataset.hf_data_files={fixture}"]
    result = run_cli("train", f"experiment={experiment}", *data, "device=cpu", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir / "latest.pt")
    assert state["step"] >= 2
    assert state["config"]["training"]["scheduler"] in ("linear", "noam")
