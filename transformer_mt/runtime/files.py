"""Files a run keeps: every one (checkpoints, caches, exports, reports) is written to a temporary name beside
it, fsynced and renamed, so that a crash or a full disk never leaves half a file behind; an exported
directory is written whole or not at all; and the space a run needs."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from transformer_mt.errors import ConfigError, ExportError, OutputError

TEMPORARY = ".tmp"  # the suffix of a file being written (.<name>.<random>.tmp): a kill leaves it behind
META_FILE = "transformer_mt.json"  # in every exported directory: what it is and where it came from


def _new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the umask (read at import, before any thread)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


NEW_FILE_MODE = _new_file_mode()


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it, then rename it into place. The
    file gets the permissions `open()` would give it (mkstemp's are the owner's alone)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY, dir=path.parent)
    try:
        os.fchmod(fd, NEW_FILE_MODE)
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


def write_output(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """atomic_write of a job's output file: a failed write (a full disk, no permission) is one line naming
    the file, and leaves no file behind (nor a previous one changed)."""
    try:
        atomic_write(path, write)
    except OSError as ex:
        why = ex.strerror or (str(ex).strip().splitlines() or [type(ex).__name__])[0][:200]
        raise OutputError(f"cannot write {path} ({why}); free space on its disk, or give another "
                          "output path") from None


def refuse_existing(output_dir: Path, overwrite: bool) -> None:
    """ExportError when output_dir exists and may not be replaced."""
    if output_dir.expanduser().exists() and not overwrite:
        raise ExportError(f"{output_dir} exists; choose another output_dir, or overwrite=true to replace it")


@contextmanager
def written_into(output_dir: Path, overwrite: bool = False) -> Iterator[Path]:
    """A temporary directory beside output_dir to write an export into; moved into place when the block
    ends, removed if it fails. An existing output_dir is refused unless `overwrite` (and then only an
    earlier export, one with a META_FILE, never another directory): nothing is replaced by accident or
    left half-written."""
    output_dir = output_dir.expanduser().resolve()
    refuse_existing(output_dir, overwrite)
    if output_dir.exists() and (not output_dir.is_dir()
                                or (any(output_dir.iterdir()) and not (output_dir / META_FILE).is_file())):
        raise ExportError(f"{output_dir} exists and is not an export of transformer-mt; "
                          "choose another output_dir")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=TEMPORARY, dir=output_dir.parent))
    try:
        yield tmp
        if output_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".old", dir=output_dir.parent))
            os.replace(output_dir, old / output_dir.name)
            os.replace(tmp, output_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_writable(run_dir: Path, min_free_mib: int) -> None:
    """Fail before hours of training, not at the first checkpoint: the directory must take files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as ex:
        raise ConfigError(f"cannot write to {run_dir} ({ex.strerror}); set checkpoint.dir= or "
                          "checkpoint.root= to a writable place") from ex
    free = free_mib(run_dir)
    if free < min_free_mib:
        raise ConfigError(f"only {free:.0f} MiB free at {run_dir}; free space or lower "
                          f"training.min_free_mib={min_free_mib}")


def free_mib(directory: Path) -> float:
    """The space free for files in `directory`, in MiB."""
    return shutil.disk_usage(directory).free / 2**20
