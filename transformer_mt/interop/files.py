"""What every export shares: the one-line error, the file that says where a directory came from, and
writing a directory whole or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformer_mt.errors import ExportError

META_FILE = "transformer_mt.json"  # in every exported directory: what it is and where it came from

__all__ = ["META_FILE", "ExportError", "refuse_existing", "written_into"]


def refuse_existing(output_dir: Path, overwrite: bool) -> None:
    """ExportError when output_dir exists and may not be replaced."""
    if output_dir.expanduser().exists() and not overwrite:
        raise ExportError(f"{output_dir} exists; choose another output_dir, or overwrite=true to replace it")


@contextmanager
def written_into(output_dir: Path, overwrite: bool = False) -> Iterator[Path]:
    """A temporary directory beside output_dir to write an export into; moved into place when the block
    ends, removed if it fails. An existing output_dir is refused unless `overwrite` (and then only an
    earlier export, never another directory): nothing is replaced by accident or left half-written."""
    output_dir = output_dir.expanduser().resolve()
    refuse_existing(output_dir, overwrite)
    if output_dir.exists() and (not output_dir.is_dir()
                                or (any(output_dir.iterdir()) and not (output_dir / META_FILE).is_file())):
        raise ExportError(f"{output_dir} exists and is not an export of transformer-mt; "
                          "choose another output_dir")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".tmp", dir=output_dir.parent))
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
