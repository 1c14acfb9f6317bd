"""What a run starts from, read before its plan (plan/) and its Trainer are made: the processes and this
one's device and precision, every random generator seeded, the checkpoint it resumes or the parent it
fine-tunes, the prepared data encoded with the right tokenizer, and the words of its training pairs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoints import store as ckpt
from transformer_mt.config import TrainConfig
from transformer_mt.data import PreparedData, words
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.errors import ConfigError
from transformer_mt.runtime.device import Precision, configure_threads, precision, select_device
from transformer_mt.runtime.files import check_writable
from transformer_mt.runtime.rng import seed_everything
from transformer_mt.training import distill, distributed, finetune

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunStart:
    """A run's processes, device, precision and data; the checkpoint it resumes (`resume=`), or the parent
    checkpoint it fine-tunes (`init=`) and that checkpoint's path; when it started (time.perf_counter);
    the words its training pairs hold, its parent's too (data/words.py; None but on the main process)."""

    world: distributed.World
    device: torch.device
    precision: Precision
    data: PreparedData
    state: dict[str, Any] | None
    parent: dict[str, Any] | None
    parent_path: str | None  # recorded in checkpoints and result.json: the run this one fine-tunes
    started: float
    words: frozenset[str] | None = None


def start_run(cfg: TrainConfig, run_dir: Path) -> RunStart:
    """Check the run directory, set up this process, load what the run goes on from, prepare its data."""
    started, world = time.perf_counter(), distributed.current()
    if world.is_main:
        check_writable(run_dir, cfg.training.min_free_mib)
    configure_threads(cfg.device)
    device = distributed.rank_device(select_device(cfg.device), world)
    seed_everything(cfg.seed)
    state = parent = None
    parent_path = None
    if cfg.resume:
        path, state = ckpt.load_latest_good(cfg.resume)
        log.info("resuming from %s", path)
        parent_path = state.get("parent")  # (None in checkpoints older than fine-tuning)
    elif cfg.init:  # fine-tuning: the parent's tokenizer, model and weights; the rest starts anew
        path, parent = finetune.read_parent(cfg)
        parent_path = str(path.resolve())
    vocab = Vocabulary.from_json((state or parent)["tokenizer"]) if state or parent else None
    teacher = distill.load_teacher(cfg, device) if cfg.distill.teacher and world.is_main else None
    if teacher and vocab and vocab.to_json() != teacher.vocab.to_json():
        raise ConfigError(f"distill.teacher={cfg.distill.teacher} has another tokenizer than "
                          f"{'the resumed run' if state else 'init=' + str(cfg.init)}; a student keeps its "
                          "teacher's tokenizer: give a teacher and a parent trained with the same one")
    data = distributed.prepare_data(cfg.dataset, cfg.tokenizer, run_dir, vocab or (teacher and teacher.vocab),
                                    world)
    if cfg.distill.teacher:  # its translations as the training targets, and the teacher's memory freed
        data = distill.distilled_data(cfg, data, teacher, run_dir, world)
        del teacher
    known = _training_words(cfg, state, parent) if world.is_main else None
    return RunStart(world, device, precision(cfg.device, device), data, state, parent, parent_path, started,
                    known)


def _training_words(cfg: TrainConfig, state: dict[str, Any] | None,
                    parent: dict[str, Any] | None) -> frozenset[str]:
    """The words the model meets: those the resumed checkpoint lists, else its training pairs' and the
    fine-tuned parent's."""
    if state is not None and (listed := ckpt.word_list(state)) is not None:
        return listed
    took = time.perf_counter()
    inherited = ckpt.word_list(parent) if parent else None
    known = words.training_words(cfg.dataset) | (inherited or frozenset())
    log.info("%d words in the training pairs (%.1fs)", len(known), time.perf_counter() - took)
    return known
