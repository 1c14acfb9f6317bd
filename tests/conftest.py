"""Shared fixtures: the real corpus beside the checkout, and tiny training overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "fra-eng.zip"
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The real Tatoeba zip from ../shared/data (CI has it); tests needing it skip without it."""
    for candidate in (CORPUS, ROOT / "data" / "fra-eng.zip"):
        if candidate.is_file():
            return candidate
    pytest.skip("Tatoeba corpus not found at ../shared/data/fra-eng.zip or data/fra-eng.zip")


def tiny_overrides(corpus: Path, run_dir: Path, **extra: object) -> list[str]:
    """A training run that finishes in seconds: tiny model, 600 real pairs, small vocabulary."""
    values: dict[str, object] = {
        "model": "tiny",
        "device": "cpu",
        "dataset.path": corpus,
        "dataset.url": "null",
        "dataset.cache_dir": run_dir.parent / "cache",
        "dataset.max_pairs": 600,
        "dataset.valid_size": 60,
        "dataset.test_size": 60,
        "tokenizer.vocab_size": 400,
        "training.epochs": 2,
        "training.batch_tokens": 1024,
        "training.warmup_steps": 20,
        "training.valid_max_sentences": 30,
        "training.progress": "false",
        "checkpoint.dir": run_dir,
        "device.num_threads": 2,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def run_cli(*args: str, input: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m transformer_mt` as a user would, from the project root."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "transformer_mt", *map(str, args)], cwd=ROOT,
                          input=input, capture_output=True, text=True, timeout=timeout, env=env)
