"""Checkpoint files: atomic writes, safe loads, and finding the right file in a run directory.

A checkpoint describes itself (model config, run config, tokenizer, optimizer, scheduler, RNG state,
position in training), so evaluate, translate and resume need nothing else: `build_model` is the one
place where a model meets its tokenizer. Files are written atomically (`runtime.atomic_write`) and
loaded with `weights_only=True`, so a checkpoint carrying code is refused, not run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoints import check
from transformer_mt.checkpoints.fields import (
    FORMAT_VERSION,
    TRAINED,
    WEIGHTS,
    WORDS,
    check_entries,
    counter,
    existing,
    wrong,
)
from transformer_mt.checkpoints.header import read_header
from transformer_mt.checkpoints.paths import (
    BEST,
    LATEST,
    first_loadable,
    numbered_checkpoints,
    resolve_checkpoint,
)
from transformer_mt.config import ModelConfig
from transformer_mt.data.tokenizer import PAD_ID, Vocabulary
from transformer_mt.errors import CheckpointError, TrainingError
from transformer_mt.model import Transformer
from transformer_mt.runtime.files import TEMPORARY, atomic_write, free_mib

log = logging.getLogger(__name__)
UPDATES = "ema_updates"


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write a checkpoint atomically; a write that fails (a full disk) raises its OSError."""
    try:
        atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))
    except RuntimeError as ex:  # torch.save reports its file's failed write so; the OSError is the context
        if isinstance(ex.__context__, OSError):
            raise OSError(ex.__context__.errno, ex.__context__.strerror, str(path)) from ex
        raise


def word_entry(words: Iterable[str]) -> str:
    """The training words (data/words.py) as a checkpoint keeps them: case folded, sorted, one a line."""
    return "\n".join(sorted(words))


def word_list(state: dict[str, Any]) -> frozenset[str] | None:
    """The training words a checkpoint lists; None for one saved before checkpoints listed them."""
    entry = state.get(WORDS)
    return frozenset(entry.split("\n")) if isinstance(entry, str) and entry else None


def link_checkpoint(source: Path, alias: Path) -> None:
    """Point `alias` (best.pt, latest.pt) at `source` atomically: a hard link, or a copy if not possible."""
    tmp = alias.with_name(f".{alias.name}.link{TEMPORARY}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
        os.replace(tmp, alias)
    except OSError:
        atomic_write(alias, lambda f: f.write(source.read_bytes()))


def keep_checkpoint(state: dict[str, Any], run_dir: Path, name: str | None, keep_last: int,
                    best: bool) -> Path:
    """Write a training checkpoint: a numbered one (`name`, e.g. epoch_003.pt: linked as latest.pt, and
    only the newest keep_last numbered ones are kept) or, without a name, latest.pt itself; linked as
    best.pt when best. Returns the file written.

    A save that cannot succeed (less space free than the last checkpoint took, or any error writing)
    stops training with one line naming the step and how to resume; the previous checkpoint is intact,
    since nothing replaces it before the new file is complete."""
    path = run_dir / (name or LATEST)
    stop = f"step {state['step']} was not saved to {path}; {intact(run_dir)}"
    needed, free = _last_checkpoint_mib(run_dir), free_mib(run_dir)
    if free < needed:
        raise TrainingError(f"only {free:.1f} MiB free at {run_dir}, less than the last checkpoint's "
                            f"{needed:.1f} MiB: {stop}")
    try:
        save_checkpoint(state, path)
        if name:
            link_checkpoint(path, run_dir / LATEST)
            prune_checkpoints(run_dir, keep_last)
        if best:
            link_checkpoint(path, run_dir / BEST)
    except OSError as ex:
        why = ex.strerror or (str(ex).strip().splitlines() or [type(ex).__name__])[0][:200]
        raise TrainingError(f"could not write the checkpoint ({why}): {stop}") from ex
    return path


def intact(run_dir: Path) -> str:
    """What a run stopped by a failed write says: its last checkpoint is good, and how to go on from it."""
    return ("the previous checkpoint is intact: free space, then continue with: "
            f"transformer-mt train resume={run_dir}")


def _last_checkpoint_mib(run_dir: Path) -> float:
    """The size of the checkpoint written last (latest.pt is it, or a link to it), in MiB; 0 before any."""
    latest = run_dir / LATEST
    return latest.stat().st_size / 2**20 if latest.is_file() else 0.0


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict[str, Any]:
    """Load safely and check it is one of ours: first its header without torch (header.read_header: the
    archive from its first byte, a pickle that names no code, the entries, storages and sizes it claims),
    then with torch (`weights_only=True`: no code runs) its entries' types, its format, weights that are
    dense tensors (checkpoint_check). Every load goes through here, the command line's and the Python
    API's alike. With mmap, tensors are mapped from the file and read only when used."""
    path = existing(path)
    read_header(path, claims=False)  # what torch will read is the archive, holding no code
    state = check.read_file(path, map_location, mmap)
    check_entries(path, state, check.check_tensors)
    return state


def load_latest_good(path: str | Path, mmap: bool = False) -> tuple[Path, dict[str, Any]]:
    """The newest loadable checkpoint of a run (checked as `checked_for_resume`): latest.pt, else epoch
    files newest first, with a warning for each that fails (checkpoint_paths.first_loadable)."""
    return first_loadable(path, lambda file: checked_for_resume(file, mmap))


def checked_for_resume(path: Path, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint whose model, tokenizer and weights fit each other and, if it is a training checkpoint
    (with its optimizer), whose position in training has the types training reads back."""
    state = load_checkpoint(path, mmap=mmap)
    check.check_model(path, state, WEIGHTS)
    if "optimizer" in state:
        check.check_position(path, state)
    if UPDATES in state:
        counter(path, state, UPDATES)
    return state


def saved_overrides(path: str | Path) -> list[str]:
    """The overrides a run was started with, from the checkpoint `resume=path` continues from. Its
    tensors stay on disk (mmap), so that resuming reads them once: in the Trainer."""
    file, state = load_latest_good(path, mmap=True)
    if "overrides" not in state:
        raise CheckpointError(f"checkpoint {file} does not record the overrides its run was started "
                              f"with, so resume= cannot compose its config; fine-tune from it instead "
                              f"(init={path})")
    overrides = state["overrides"]
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise wrong(file, "overrides", overrides, "a list of strings")
    return overrides


def prune_checkpoints(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` epoch/step files (best.pt is a separate link and survives)."""
    for old in numbered_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The last checkpoint's state with the model weights averaged over all of them.

    Averaging the weights of the last few checkpoints (Vaswani et al. 2017; fairseq's
    average_checkpoints.py) smooths the noise of the final updates, usually for a small BLEU gain.
    Only the model is averaged; the optimizer state is dropped, so the result is for inference.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    first = states[0]
    shapes = {name: (t.shape, t.dtype) for name, t in first["model"].items()}
    for path, state in zip(paths[1:], states[1:]):
        if state["model_config"] != first["model_config"] or shapes != {
                name: (t.shape, t.dtype) for name, t in state["model"].items()}:
            raise CheckpointError(f"cannot average {paths[0]} with {path}: different models")
    averaged = {}
    for name, tensor in first["model"].items():
        if tensor.is_floating_point():
            total = torch.stack([s["model"][name].double() for s in states]).mean(dim=0)
            averaged[name] = total.to(tensor.dtype)
        else:  # integer buffers (none today) are taken from the newest checkpoint
            averaged[name] = states[-1]["model"][name]
    result = {k: v for k, v in states[-1].items()
              if k not in ("optimizer", "scheduler", "scaler", "rng", TRAINED, UPDATES)}
    result["model"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    return result


def trained_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights training continues from: `model`, unless the run kept an average (then TRAINED)."""
    return state.get(TRAINED, state["model"])


def build_model(cfg: ModelConfig, vocab: Vocabulary, resumed: dict[str, Any] | None = None) -> Transformer:
    """A new model for a tokenizer: the one place its vocabulary sizes and pad id are filled in. Given
    the state a run resumes from, its model must be this one, checked before anything is allocated."""
    if resumed is not None:
        _check_same_model(resumed, _spec(cfg, vocab.src_vocab_size, vocab.tgt_vocab_size, PAD_ID))
    return Transformer(cfg, vocab.src_vocab_size, vocab.tgt_vocab_size, PAD_ID)


def _spec(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> dict[str, Any]:
    return {"src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size, "pad_id": pad_id,
            **dataclasses.asdict(cfg)}


def model_spec(model: Transformer) -> dict[str, Any]:
    """What a checkpoint records as `model_config`: the hyper-parameters, vocabulary sizes and pad id."""
    return _spec(model.config, model.src_vocab_size, model.tgt_vocab_size, model.pad_id)


def _check_same_model(state: dict[str, Any], expected: dict[str, Any]) -> None:
    """The checkpoint's model is the config's (every setting that differs is named)."""
    diff = [f"model.{k}: checkpoint {state['model_config'].get(k)!r} vs config {v!r}"
            for k, v in expected.items() if state["model_config"].get(k) != v]
    if diff:
        raise CheckpointError(f"cannot resume: the checkpoint's model differs from the config "
                              f"({'; '.join(diff)}); drop those overrides")


def check_resumable(state: dict[str, Any], model: Transformer, world_size: int) -> None:
    """Training can continue from a checkpoint of the same model, with its optimizer state, and
    mid-epoch only with as many processes as dealt that epoch's batches."""
    _check_same_model(state, model_spec(model))
    if "optimizer" not in state:
        raise CheckpointError("cannot resume from an averaged (inference-only) checkpoint; "
                              "resume from the run directory or its latest.pt")
    saved_world = state["world_size"]
    if state["batch_in_epoch"] and saved_world != world_size:
        raise CheckpointError(
            f"cannot resume mid-epoch with {world_size} processes: the checkpoint was written by "
            f"{saved_world}, which dealt the epoch's batches differently; resume with {saved_world} "
            "processes, or from an epoch checkpoint (epoch_NNN.pt)")


def restore_training(state: dict[str, Any], model: Transformer, world_size: int, ema: Any = None,
                     **stateful: Any) -> None:
    """Load what training continues from (check_resumable): the weights, the EMA average (if the run
    keeps one), and each of `stateful` (optimizer, scheduler, ...) from the entry of its name."""
    check_resumable(state, model, world_size)
    model.load_state_dict(trained_weights(state))
    if ema:
        ema.restore(state, model)
    for name, part in stateful.items():
        part.load_state_dict(state[name])


def model_from_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any], Transformer, Vocabulary]:
    """(file, state, model in eval mode, tokenizer) rebuilt from a checkpoint file or run directory."""
    file = resolve_checkpoint(path)
    state = load_checkpoint(file)
    config, vocab = check.check_model(file, state, WEIGHTS)  # the shapes fit: now it can be built
    model = build_model(config, vocab)
    model.load_state_dict(state["model"])
    return file, state, model.eval(), vocab
