"""What text and paths given as arguments must be: text that encodes as UTF-8, and outputs that can be
written (checked before a command does its work, so that a long run does not end in a traceback)."""

from __future__ import annotations

import os
from pathlib import Path


def not_utf8_text(what: str, text: str | None) -> list[str]:
    """Text typed or given as an argument must encode as UTF-8: a byte that is not UTF-8 comes to Python
    as a lone surrogate (U+DC80-U+DCFF, the shell's bytes escaped), which the tokenizer cannot take."""
    bad = next((c for c in text or "" if "\ud800" <= c <= "\udfff"), None)
    if bad is None:
        return []
    byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if ord(bad) >= 0xDC80 else f"lone surrogate U+{ord(bad):04X}"
    return [f"{what} is not valid UTF-8 ({byte}); give it as UTF-8 text (a UTF-8 terminal or LANG=C.UTF-8)"]


def output_problems(key: str, value: str | None, directory: bool = False) -> list[str]:
    """An output a command writes at the end of its work, checked before the work starts: a regular file
    (or a directory) where there is anything, under a writable directory (missing ones are created)."""
    if value is None:
        return []
    path = Path(value).expanduser().absolute()
    if not directory and path.is_dir():
        return [f"{key}={value} is a directory; name a file, e.g. {key}={path / 'out.txt'}"]
    if not directory and path.exists() and not path.is_file():  # replaced, not written through: refused
        stdout = " (or leave output= out to print to stdout)" if key == "output" else ""
        return [f"{key}={value} is not a regular file but a device or a pipe; name a file{stdout}"]
    if directory and path.exists() and not path.is_dir():
        return [f"{key}={value} is a file; name a directory (created if missing)"]
    above = next(p for p in path.parents if p.exists())  # the root exists
    if not above.is_dir():
        return [f"{key}={value} cannot be written: {above} is a file, not a directory"]
    if not os.access(above, os.W_OK | os.X_OK):
        return [f"{key}={value} cannot be written: no permission to write in {above}"]
    return []
