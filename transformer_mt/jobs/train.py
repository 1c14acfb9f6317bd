"""The `train` job: Hydra's view of the run (its directory, overrides, job number); what the run starts from
(training/start.py), then its plan (plan/: `training.plan=auto`, or a resumed run's own), then the Trainer
with the planned config (training/trainer.py); at the end, confidence calibrated on held-out pairs
(decoding/calibration.py) and the shortlist counted from the training pairs (decoding/shortlist.py)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from transformer_mt import plan as planning
from transformer_mt.config import TrainConfig
from transformer_mt.decoding.calibration import calibrate_run
from transformer_mt.decoding.shortlist import write_shortlist
from transformer_mt.training import distributed, rundir
from transformer_mt.training.start import start_run
from transformer_mt.training.trainer import Trainer

log = logging.getLogger(__name__)
LOG_FILE = "train.log"  # the name Hydra's job logging gives it on the command line
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # and its format


def train(cfg: TrainConfig) -> float:
    """Entry point of `transformer-mt train`: the best validation metric, for sweepers."""
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = list(hydra_cfg.overrides.task) if hydra_cfg is not None else []
    multirun = hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN
    job = hydra_cfg.job.num if multirun else None
    run_dir = Path(cfg.checkpoint.dir).expanduser().resolve()  # Hydra's, unless given (resolvers.py)
    claim = rundir.claim(run_dir, cfg.resume, cfg.checkpoint.overwrite, distributed.current().is_main)
    with claim, _log_file(run_dir):  # one run at a time in the directory, for the run's life
        trainer = build_trainer(cfg, run_dir, overrides, job)
        best = trainer.fit()
        ended = not trainer.interrupt.requested and distributed.current().is_main
        if ended:
            write_shortlist(run_dir, trainer.data.train.src_ids, trainer.data.train.tgt_ids, trainer.vocab)
        sentences = cfg.training.calibration_sentences
        if sentences and ended:
            calibrate_run(run_dir, sentences, cfg.decoding, cfg.device)
    if trainer.interrupt.requested and multirun:
        log.warning("sweep interrupted: the remaining jobs were not started")  # Ctrl-C stops the sweep
        raise SystemExit(130)
    return best


def build_trainer(cfg: TrainConfig, run_dir: Path, overrides: Sequence[str] = (), job: int | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> Trainer:
    """The run's Trainer: its start, then its plan applied to its config, decided once before training."""
    cfg = planning.inputs(cfg, overrides)  # before the data: the tokenizer's sample shows them
    start = start_run(cfg, run_dir)
    cfg, plan = planning.settle(cfg, start, overrides)
    if plan is None:
        return Trainer(cfg, run_dir, start, overrides, job, clock=clock)
    return Trainer(cfg, run_dir, start, overrides, job, plan.record(), plan.measured.probe_seconds, clock)


@contextlib.contextmanager
def _log_file(run_dir: Path) -> Iterator[None]:
    """The run's log, train.log in its directory: Hydra's job logging writes it on the command line; from
    the Python API the package's records of INFO and above are appended to it here."""
    handler = _api_log(run_dir)
    if handler is None:
        yield
        return
    package = logging.getLogger("transformer_mt")
    level = package.level
    package.setLevel(min(package.getEffectiveLevel(), logging.INFO))
    package.addHandler(handler)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)
        handler.close()


def _api_log(run_dir: Path) -> logging.Handler | None:
    """A handler appending to the run's train.log, or None where Hydra's already does (or the directory
    cannot be made: the Trainer's check of it then says what to change)."""
    path = (run_dir / LOG_FILE).resolve()
    if any(isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve() == path
           for h in logging.getLogger().handlers):
        return None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler
