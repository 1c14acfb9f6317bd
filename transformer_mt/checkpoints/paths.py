"""Which checkpoint file a path means: a file as given; in a run directory, its best, latest or newest.

Torch-free, so that the command line can find the file it checks before torch is imported
(checkpoint_header.py); checkpoint.py loads what these name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from transformer_mt.errors import CheckpointError

log = logging.getLogger(__name__)
T = TypeVar("T")
BEST = "best.pt"
LATEST = "latest.pt"
_NUMBERED_FILE = re.compile(r"^(epoch|step)_(\d+)\.pt$")


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


def first_loadable(path: str | Path, load: Callable[[Path], T], warn: bool = True) -> tuple[Path, T]:
    """(file, load(file)) for the checkpoint `resume=path` continues from: a file as given, else the run's
    latest.pt, or its epoch and step files newest first when a newer one fails to load (a disk can
    corrupt a file; a crash only truncates temporary ones)."""
    path = Path(path).expanduser()
    if path.is_file():
        return path, load(path)
    first = resolve_checkpoint(path, prefer=LATEST)
    problems = []
    for candidate in [first] + [p for p in reversed(numbered_checkpoints(path)) if p != first]:
        try:
            return candidate, load(candidate)
        except CheckpointError as ex:
            problems.append(str(ex))
            if warn:
                log.warning("%s; trying the previous checkpoint", ex)
    raise CheckpointError(f"no loadable checkpoint in {path}: {problems[0]}")


def is_hf_dir(path: str | Path) -> bool:
    """Whether `path` is a directory with a Hugging Face config.json (rather than a run directory)."""
    return (Path(path) / "config.json").is_file() and not (Path(path) / "latest.pt").exists()
