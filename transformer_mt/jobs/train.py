"""The `train` job: Hydra's view of the run (its directory, overrides, job number) handed to the Trainer
(`trainer.py`)."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from transformer_mt.config import TrainConfig
from transformer_mt.trainer import Trainer

log = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> float:
    """Entry point of `transformer-mt train`: the best validation metric, for sweepers."""
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = list(hydra_cfg.overrides.task) if hydra_cfg is not None else []
    multirun = hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN
    job = hydra_cfg.job.num if multirun else None
    run_dir = Path(cfg.checkpoint.dir).expanduser().resolve()  # Hydra's, unless given (resolvers.py)
    trainer = Trainer(cfg, run_dir, overrides, job)
    best = trainer.fit()
    if trainer.interrupt.requested and multirun:
        log.warning("sweep interrupted: the remaining jobs were not started")  # Ctrl-C stops the sweep
        raise SystemExit(130)
    return best
