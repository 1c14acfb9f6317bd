"""UTF-8 text files and lines, as every reader here takes them: line ends ("\\n", "\\r\\n", a lone
"\\r"), a byte-order mark, gzip, and the one message for text that is not UTF-8 (the file and line) or a
file that is not there."""

from __future__ import annotations

import gzip
import re
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from transformer_mt.errors import DataError

_FLATTEN_WS = str.maketrans({"\t": " ", "\r": " ", "\n": " "})
_LINE_END = re.compile(r"\r\n|\r|\n")  # not str.splitlines: \v, \f, \x1c, U+2028 ... stay in a sentence
LINE_ENDS = "\\n, \\r\\n and a lone \\r each end a line"  # said where line counts differ


def one_line(text: str) -> str:
    """A text (a translation) as one line of a file read back line by line: each line end a space."""
    return _LINE_END.sub(" ", text)


def not_utf8(name: str, line: int, byte: int) -> DataError:
    """The one message for text that is not UTF-8: where, and how to convert it."""
    return DataError(f"{name}: line {line} is not valid UTF-8 (byte 0x{byte:02x}); re-save it as UTF-8, "
                     "e.g. iconv -f latin1 -t utf-8")


def decode_utf8(data: bytes, name: str) -> str:
    """Text of UTF-8 bytes without a byte-order mark."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as ex:
        bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
        before = data[:ex.start + bom]  # its line ends, counted as split_lines reads them
        line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        raise not_utf8(name, line, data[ex.start + bom]) from None


def no_file(path: Path, hint: str = "") -> DataError:
    """The one message for an input file that is not there: missing, or a directory."""
    return DataError(f"{path} {'is a directory, not a file' if path.is_dir() else 'does not exist'}{hint}")


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file (DataError naming the file when it is missing or not UTF-8)."""
    if not path.is_file():
        raise no_file(path)
    return decode_utf8(path.read_bytes(), str(path))


def split_lines(text: str) -> list[str]:
    """The lines of a text without their ends: "\\n", "\\r\\n" and a lone "\\r" (old Mac files) each end
    a line, as in Python's universal newlines; a final line end starts no empty line."""
    lines = _LINE_END.split(text)
    return lines[:-1] if not lines[-1] else lines


def _physical_lines(stream: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a binary stream without their ends, "\\r" ending a line too (a stream's own
    iteration splits at "\\n" only, so a file of "\\r" line ends would be one line)."""
    for raw in stream:
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = raw[:-1] if raw.endswith(b"\r") else raw  # the "\r" of "\r\n", or a last lone one
        if b"\r" in raw:
            yield from raw.split(b"\r")
        else:
            yield raw


def utf8_lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """Lines of a binary stream, decoded one by one (a large input streams), without line endings (any
    of "\\n", "\\r\\n", "\\r"); a damaged compressed file (truncated gzip or zip, not gzip at all) is a
    DataError naming the line."""
    number = 0
    try:
        for number, raw in enumerate(_physical_lines(stream), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as ex:
                raise not_utf8(name, number, raw[ex.start]) from None
            yield line.lstrip("\ufeff") if number == 1 else line
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as ex:
        raise DataError(f"{name}: unreadable after line {number} ({type(ex).__name__}: {ex}); is the file "
                        "complete, and compressed as its name says?") from None


def open_binary(path: Path) -> IO[bytes]:
    """A file for reading bytes; gzip-compressed when its name ends in .gz."""
    if not path.is_file():
        raise no_file(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")  # type: ignore[return-value]


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file (.gz too), without line endings (DataError when missing or not UTF-8)."""
    with open_binary(path) as stream:
        return list(utf8_lines(stream, str(path)))


def clean(text: str) -> str:
    """One sentence on one line without surrounding whitespace."""
    if "\t" in text or "\n" in text or "\r" in text:  # rare; translate is slow on millions of strings
        text = text.translate(_FLATTEN_WS)
    return text.strip()
