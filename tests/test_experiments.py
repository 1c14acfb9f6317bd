"""The recipes in configs/experiment/ compose, and each trains a few steps on a CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import transformer_mt as tmt
from tests.conftest import DATA_CACHE, FIXTURES, runs_corpus
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.plan import decide

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "configs" / "experiment").glob("*.yaml"))


def test_the_recipes_exist() -> None:
    assert {"tatoeba_cpu", "tatoeba_cpu_tuned", "tatoeba_gpu", "opus_books_gpu"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_recipe_composes(experiment: str) -> None:
    cfg = tmt.compose("train", [f"experiment={experiment}"])
    if experiment.startswith("tatoeba_cpu"):
        assert cfg.training.max_minutes == 40.0
    if experiment == "tatoeba_cpu":  # planned: it sets nothing the plan would choose
        assert cfg.training.plan == "auto" and decide.chosen_by_you(cfg, []) == set()
    if experiment == "tatoeba_cpu_tuned":
        assert cfg.training.plan == "off" and cfg.training.scheduler == "linear"
    if experiment.endswith("_gpu"):
        assert cfg.model.d_model == 512 and cfg.device.name == "cuda"


# The GPU recipes' base model takes seconds to build, step and save on a CPU: their runs under `slow` (CI runs
# them); their composition is checked above in the quick suite.
@pytest.mark.parametrize("experiment", [pytest.param(e, marks=pytest.mark.slow) if e.endswith("_gpu") else e
                                        for e in EXPERIMENTS])
def test_recipe_trains_a_few_steps_on_cpu(experiment: str, tmp_path: Path, corpus: Path) -> None:
    """The recipe's own model and schedule (planned for a short budget where the recipe plans), on a
    sliver of data (three steps of the GPU recipes' base model), so it fits in seconds. The Tatoeba
    recipes share one encoded sliver (the session's data cache)."""
    run_dir = tmp_path / "run"
    data = {"dataset.path": runs_corpus(corpus), "dataset.url": "null",
            "dataset.cache_dir": os.environ[DATA_CACHE],
            "dataset.max_pairs": 30, "dataset.valid_size": 3, "dataset.test_size": 3,
            "tokenizer.vocab_size": 400, "training.batch_tokens": 256, "training.epochs": 1,
            "training.valid_max_sentences": 3, "training.progress": "false", "decoding.max_len_b": 3,
            "decoding.max_len_a": 0, "checkpoint.dir": run_dir, "device": "cpu", "training.max_minutes": 1}
    if "opus_books" in experiment:
        fixture = FIXTURES / "opus_books_en_fr.jsonl"
        del data["dataset.path"]
        data.update({"dataset.hf_path": "json", "dataset.hf_data_files": fixture})
    tmt.train([f"experiment={experiment}", *(f"{k}={v}" for k, v in data.items())])
    state = load_checkpoint(run_dir / "latest.pt", mmap=True)  # the base model's weights are not read
    assert state["step"] >= 2
    assert state["config"]["training"]["scheduler"] in ("linear", "noam")
