"""The run directory: one run writes into it at a time, and a new run never mixes its files with an old one's.

A run, fresh or resumed, holds the lock file `.lock` in its directory for its whole life (filelock; the
operating system releases it when the process ends, kill -9 included), so a second run or resume into
the same directory is refused at once. A fresh run into a directory that already holds a run's
checkpoints or records is refused unless `checkpoint.overwrite=true`, which removes them first: sharing
them, pruning would delete the other run's checkpoints, best.pt and latest.pt would flip between the
runs, and result.json could report the other run's best. Resuming removes the temporary files that a
save killed half-way left behind. `composition.precheck` asks `check_available` before Hydra writes
anything into the directory; the train job then `claim`s it for the run's life.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from transformer_mt.errors import ConfigError
from transformer_mt.runtime.files import TEMPORARY
from transformer_mt.training.records import METRICS, RESULT, TENSORBOARD

log = logging.getLogger(__name__)
LOCK = ".lock"


def under_a_file(run_dir: Path) -> None:
    """A run directory cannot lie under a regular file (checkpoint.dir=/some/file/run): say so in one line."""
    for place in (run_dir, *run_dir.parents):
        if place.exists():
            if not place.is_dir():
                where = "is a file" if place == run_dir else f"lies under {place}, which is a file"
                raise ConfigError(f"checkpoint.dir={run_dir} {where}, not a directory; choose another "
                                  "checkpoint.dir")
            return


def run_files(run_dir: Path) -> list[str]:
    """What shows that a directory holds a run: its checkpoints (*.pt) and its records. (A run stopped
    before its first checkpoint left nothing worth keeping: its tokenizer and split are rewritten.)"""
    if not run_dir.is_dir():
        return []
    found = sorted(p.name for p in run_dir.glob("*.pt"))
    return found + [name for name in (METRICS, RESULT) if (run_dir / name).is_file()]


def continues(run_dir: Path, resume: str | None) -> bool:
    """Whether the run continues the one in run_dir (resume= names it, or a checkpoint file in it)."""
    if not resume:
        return False
    path = Path(resume).expanduser()
    return (path.parent if path.suffix == ".pt" else path).resolve() == run_dir.resolve()


def _held(run_dir: Path) -> ConfigError:
    return ConfigError(f"another run holds {run_dir} (its lock, {run_dir / LOCK}, is taken): wait for it to "
                      "end, or choose another checkpoint.dir")


def _occupied(run_dir: Path, found: list[str]) -> ConfigError:
    shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
    return ConfigError(f"{run_dir} already holds a run ({shown}): continue it with resume={run_dir}, choose "
                      "another checkpoint.dir, or set checkpoint.overwrite=true to replace it")


def _lock(run_dir: Path) -> FileLock:
    return FileLock(run_dir / LOCK, timeout=0)


def _taken(run_dir: Path) -> bool:
    if not (run_dir / LOCK).is_file():
        return False
    try:
        with _lock(run_dir):
            return False
    except Timeout:
        return True


def check_available(run_dir: Path, resume: str | None, overwrite: bool) -> None:
    """Before anything is written: the directory can be made, no other run holds it, and a fresh run
    finds it free of another run's files (or may overwrite them)."""
    under_a_file(run_dir)
    if _taken(run_dir):
        raise _held(run_dir)
    found = run_files(run_dir)
    if found and not overwrite and not continues(run_dir, resume):
        raise _occupied(run_dir, found)


@contextlib.contextmanager
def claim(run_dir: Path, resume: str | None, overwrite: bool, main: bool = True) -> Iterator[None]:
    """Hold the run directory for the run's life (on rank 0: the other ranks of a torchrun share its
    claim). A resumed run's directory loses its stale temporary files; a fresh run's, with
    checkpoint.overwrite, the files of the run it replaces."""
    if not main:
        yield
        return
    under_a_file(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise ConfigError(f"cannot create {run_dir} ({ex.strerror}); set checkpoint.dir= or "
                          "checkpoint.root= to a writable place") from ex
    lock = _lock(run_dir)
    try:
        lock.acquire()
    except Timeout:
        raise _held(run_dir) from None
    try:
        if continues(run_dir, resume):
            remove_temporaries(run_dir)
        else:
            found = run_files(run_dir)
            if found and not overwrite:
                raise _occupied(run_dir, found)
            if found:
                clear_previous_run(run_dir)
        yield
    finally:
        lock.release()


def remove_temporaries(run_dir: Path) -> None:
    """Delete the temporary files of writes that never finished (a save killed half-way)."""
    for path in sorted(run_dir.rglob(f".*{TEMPORARY}")):
        if path.is_file():
            log.info("removing %s, left by a write that did not finish", path)
            path.unlink(missing_ok=True)


def clear_previous_run(run_dir: Path) -> None:
    """checkpoint.overwrite: remove the previous run's checkpoints, records and TensorBoard events."""
    log.warning("checkpoint.overwrite=true: removing the checkpoints and records of the run in %s", run_dir)
    for path in run_dir.glob("*.pt"):
        path.unlink(missing_ok=True)
    for name in (METRICS, RESULT):
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / TENSORBOARD, ignore_errors=True)
    remove_temporaries(run_dir)
