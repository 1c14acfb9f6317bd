"""The `train` job: the run directory, Hydra's view of the run, and the Trainer (`trainer.py`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from transformer_mt.config import TrainConfig
from transformer_mt.errors import ConfigError
from transformer_mt.trainer import Trainer

log = logging.getLogger(__name__)


def run_directory(cfg: TrainConfig) -> Path:
    """Where the run's files go: checkpoint.dir when given, else Hydra's output directory (which
    follows checkpoint.dir and resume, see composition.py)."""
    if cfg.checkpoint.dir:
        return Path(cfg.checkpoint.dir).expanduser().resolve()
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    raise ConfigError("checkpoint.dir must be set when training outside the CLI")


def train(cfg: TrainConfig, resume_from: tuple[Path, dict[str, Any]] | None = None) -> float:
    """Entry point of `transformer-mt train`: the best validation metric, for sweepers."""
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = list(hydra_cfg.overrides.task) if hydra_cfg is not None else []
    multirun = hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN
    job = hydra_cfg.job.num if multirun else None
    trainer = Trainer(cfg, run_directory(cfg), overrides, job, resume_from)
    best = trainer.fit()
    if trainer.interrupt.requested and multirun:
        log.warning("sweep interrupted: the remaining jobs were not started")  # Ctrl-C stops the sweep
        raise SystemExit(130)
    return best
