"""Checkpoint files: atomic writes, safe loads, and finding the right file in a run directory.

A checkpoint describes itself (model config, run config, tokenizer, optimizer, scheduler, RNG state,
position in training), so evaluate, translate and resume need nothing else. Files are written to a
temporary name, fsynced and renamed, so a crash never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from transformer_mt.model import Transformer, TransformerConfig
from transformer_mt.tokenizer import Vocabulary

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
BEST = "best.pt"
LATEST = "latest.pt"
_NUMBERED_FILE = re.compile(r"^(epoch|step)_(\d+)\.pt$")
_REQUIRED = ("format_version", "model_config", "model", "tokenizer", "config")


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, unsafe or does not fit the current run."""


def atomic_write(path: Path, write: Any) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write a checkpoint atomically."""
    atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))


def link_checkpoint(source: Path, alias: Path) -> None:
    """Point `alias` (best.pt, latest.pt) at `source` atomically: a hard link, or a copy if not possible."""
    tmp = alias.with_name(f".{alias.name}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
        os.replace(tmp, alias)
    except OSError:
        atomic_write(alias, lambda f: f.write(source.read_bytes()))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load safely (`weights_only=True`: no code runs) and check it is one of ours."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as ex:
        raise CheckpointError(f"checkpoint {path} was refused: it holds objects other than tensors "
                              f"and plain data, which could run code when loaded ({_first_line(ex)})") from ex
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as ex:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({_first_line(ex)}); "
                              "use an earlier checkpoint of the run") from ex
    if not isinstance(state, dict) or any(key not in state for key in _REQUIRED):
        raise CheckpointError(f"{path} is not a transformer-mt checkpoint "
                              "(missing model, config or tokenizer)")
    if state["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer transformer-mt; upgrade to load it")
    return state


def _first_line(ex: BaseException) -> str:
    text = str(ex).strip().splitlines()
    return text[0][:200] if text else type(ex).__name__


def numbered_checkpoints(run_dir: Path) -> list[Path]:
    """The run's epoch_NNN.pt and step_NNNNNNN.pt checkpoints, oldest first (by write time)."""
    found = [p for p in run_dir.glob("*.pt") if _NUMBERED_FILE.match(p.name)]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name))


def resolve_checkpoint(path: str | Path, prefer: str = BEST) -> Path:
    """A file is used as given; a run directory means its best (or latest) checkpoint."""
    path = Path(path).expanduser()
    if path.is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} does not exist; give a .pt file or a run directory")
    for name in (prefer, BEST, LATEST):
        if (path / name).is_file():
            return path / name
    numbered = numbered_checkpoints(path)
    if numbered:
        return numbered[-1]
    raise CheckpointError(f"no checkpoint in {path}; expected {BEST}, {LATEST} or epoch_NNN.pt")


def load_latest_good(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The newest loadable checkpoint of a run: latest.pt, else epoch files newest first.

    A crash can only truncate a file being written under a temporary name, but a disk can still
    corrupt one; then the previous good checkpoint is used, with a warning.
    """
    path = Path(path).expanduser()
    if path.is_file():
        return path, load_checkpoint(path)
    first = resolve_checkpoint(path, prefer=LATEST)
    candidates = [first] + [p for p in reversed(numbered_checkpoints(path)) if p != first]
    problems = []
    for candidate in candidates:
        try:
            return candidate, load_checkpoint(candidate)
        except CheckpointError as ex:
            problems.append(str(ex))
            log.warning("%s; trying the previous checkpoint", ex)
    raise CheckpointError(f"no loadable checkpoint in {path}: {problems[0]}")


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
    for path, state in zip(paths[1:], states[1:]):
        if state["model_config"] != first["model_config"] or state["model"].keys() != first["model"].keys():
            raise CheckpointError(f"cannot average {paths[0]} with {path}: different models")
    averaged = {}
    for name, tensor in first["model"].items():
        if tensor.is_floating_point():
            total = torch.stack([s["model"][name].double() for s in states]).mean(dim=0)
            averaged[name] = total.to(tensor.dtype)
        else:  # integer buffers (none today) are taken from the newest checkpoint
            averaged[name] = states[-1]["model"][name]
    result = {k: v for k, v in states[-1].items() if k not in ("optimizer", "scheduler", "scaler", "rng")}
    result["model"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    return result


def model_from_checkpoint(path: str | Path) -> tuple[Path, dict[str, Any], Transformer, Vocabulary]:
    """(file, state, model in eval mode, tokenizer) rebuilt from a checkpoint file or run directory."""
    file = resolve_checkpoint(path)
    state = load_checkpoint(file)
    try:
        model = Transformer(TransformerConfig(**state["model_config"]))
        model.load_state_dict(state["model"])
        vocab = Vocabulary.from_json(state["tokenizer"])
    except (TypeError, RuntimeError, ValueError, KeyError) as ex:
        first = str(ex).strip().splitlines()[0][:200]
        raise CheckpointError(f"checkpoint {file} does not match this version's model or "
                              f"tokenizer ({first})") from ex
    if (vocab.src_vocab_size, vocab.tgt_vocab_size) != (model.config.src_vocab_size,
                                                        model.config.tgt_vocab_size):
        raise CheckpointError(f"checkpoint {file}: the tokenizer's vocabulary does not fit the "
                              "model's embeddings; it was assembled from different runs")
    return file, state, model.eval(), vocab
