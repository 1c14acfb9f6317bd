"""Shared fixtures: the real corpus beside the checkout, tiny training overrides, and the two ways to run a
command: in this process (compose the config, call the job) or as a user would (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Tests never use the network: Hugging Face libraries read only local files and caches.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    """A job run in this process sets torch's thread count (device.num_threads); restore it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def tiny_overrides(corpus: Path, run_dir: Path, **extra: object) -> list[str]:
    """A training run of seconds: `debug=tiny` (the tiny model, 600 real pairs, a 400-token vocabulary)
    for two epochs, on this machine's two threads, into run_dir."""
    values: dict[str, object] = {
        "debug": "tiny",
        "dataset.path": corpus,
        "dataset.url": "null",
        "dataset.cache_dir": run_dir.parent / "cache",
        "training.epochs": 2,
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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """A 2-epoch tiny run trained in this process, for tests that need a checkpoint but not its details."""
    import transformer_mt as tmt

    run_dir = tmp_path_factory.mktemp("tiny-run") / "run"
    tmt.train(tiny_overrides(corpus, run_dir, **{"training.progress": "false"}))
    return run_dir
