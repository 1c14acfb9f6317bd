"""Reading parallel text: the Tatoeba file (downloaded once), Opus Books, and UTF-8 text in general.

Every reader returns English and French sentences, one line each (tabs and line breaks inside a
sentence become spaces: they would break the TSV split files), and counts what it had to skip. Every
UTF-8 problem, in a corpus, a TSV or `translate`'s input, is reported by `not_utf8` with the file and
line.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from transformer_mt.config import DatasetConfig, resolve_path
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)

LANGS = ("en", "fr")
ANKI_PAGE = "https://www.manythings.org/anki/"
OPUS_ROW = '{"translation": {"en": ..., "fr": ...}}'
_FLATTEN_WS = str.maketrans({"\t": " ", "\r": " ", "\n": " "})


# -- UTF-8 text ------------------------------------------------------------------------------------
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
        raise not_utf8(name, data.count(b"\n", 0, ex.start + bom) + 1, data[ex.start + bom]) from None


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file (DataError naming the file when it is missing or not UTF-8)."""
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    return decode_utf8(path.read_bytes(), str(path))


def utf8_lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """Lines of a binary stream, decoded one by one (a large input streams), without line endings."""
    for number, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as ex:
            raise not_utf8(name, number, raw[ex.start]) from None
        yield line.rstrip("\r\n").lstrip("\ufeff") if number == 1 else line.rstrip("\r\n")


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file, without line endings (DataError when missing or not UTF-8)."""
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    with path.open("rb") as stream:
        return list(utf8_lines(stream, str(path)))


def clean(text: str) -> str:
    """One sentence on one line without surrounding whitespace."""
    if "\t" in text or "\n" in text or "\r" in text:  # rare; translate is slow on 300k strings
        text = text.translate(_FLATTEN_WS)
    return text.strip()


# -- Tatoeba ---------------------------------------------------------------------------------------
def _tatoeba_bytes(path: Path) -> tuple[bytes, str]:
    """Raw bytes of fra.txt, or of the member of a zip that holds it, and a name for messages."""
    if not path.is_file():
        raise DataError(f"{path} does not exist; put fra-eng.zip (or fra.txt) there "
                        f"(from {ANKI_PAGE}) or set dataset.path=<file>")
    if not zipfile.is_zipfile(path):
        return path.read_bytes(), str(path)
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        member = next((n for n in names if n.endswith("fra.txt")), None)
        if member is None:
            texts = [n for n in names if n.endswith(".txt") and not n.endswith("_about.txt")]
            if len(texts) != 1:
                raise DataError(f"{path} holds no fra.txt (members: {', '.join(names) or 'none'}); "
                                f"use the fra-eng.zip from {ANKI_PAGE}")
            member = texts[0]
        return zf.read(member), f"{path}:{member}"


def read_tatoeba(path: Path) -> tuple[list[str], list[str], int]:
    """English and French sentences of fra.txt (or its zip) and the count of malformed lines."""
    data, name = _tatoeba_bytes(Path(path))
    english: list[str] = []
    french: list[str] = []
    skipped = 0
    for line in decode_utf8(data, name).split("\n"):
        if not line.strip():
            continue
        parts = line.split("\t")
        en, fr = (clean(parts[0]), clean(parts[1])) if len(parts) in (2, 3) else ("", "")
        if not en or not fr:  # column 3, when present, is the attribution of newer releases
            skipped += 1
            continue
        english.append(en)
        french.append(fr)
    if not english:
        raise DataError(f"{name} holds no English<TAB>French lines ({skipped} malformed); "
                        f"use the fra.txt from {ANKI_PAGE}")
    return english, french, skipped


def ensure_tatoeba(cfg: DatasetConfig) -> Path:
    """The local Tatoeba file: dataset.path if it exists, else a one-time download of url."""
    path = resolve_path(cfg.path)
    if path.is_file():
        return path
    what = f"put fra-eng.zip at {path} (from {ANKI_PAGE}) or set dataset.path=<your fra.txt or fra-eng.zip>"
    if not cfg.url:
        raise DataError(f"{path} does not exist; {what}")
    target = resolve_path(cfg.cache_dir) / (Path(urlparse(cfg.url).path).name or "fra-eng.zip")
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s to %s", cfg.url, target)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".part")
    try:
        # manythings.org refuses urllib's default user agent.
        request = urllib.request.Request(cfg.url, headers={"User-Agent": "transformer_mt"})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=60) as response:
            shutil.copyfileobj(response, out)
        if not zipfile.is_zipfile(tmp_name):
            raise OSError("the server did not send a zip file")
        os.replace(tmp_name, target)
    except (OSError, ValueError) as e:  # URLError and timeouts are OSErrors; bad URLs ValueErrors
        Path(tmp_name).unlink(missing_ok=True)
        raise DataError(f"{path} does not exist and downloading {cfg.url} failed ({e}); {what}") from None
    return target


# -- Opus Books ------------------------------------------------------------------------------------
def _opus_files(cfg: DatasetConfig) -> list[Path]:
    """The local json/jsonl files named by dataset.hf_data_files (a path or a glob)."""
    pattern = str(resolve_path(cfg.hf_data_files))
    files = [Path(pattern)] if Path(pattern).is_file() else sorted(map(Path, glob.glob(pattern)))
    if not files:
        raise DataError(f"dataset.hf_data_files={cfg.hf_data_files} matches no file; point it to "
                        f"a .json/.jsonl with {OPUS_ROW} rows")
    return files


def _opus_rows(cfg: DatasetConfig, files: list[Path]) -> tuple[Any, str, str]:
    """The `translation` column of the hub dataset or of local json, its name, and a hint for errors."""
    import datasets  # slow to import, and only this dataset needs it

    if files:
        what = ", ".join(map(str, files))
        hint = "check that the file is JSON lines in the opus_books schema"
        loader: dict[str, Any] = {"path": "json", "data_files": [str(f) for f in files],
                                  "cache_dir": str(resolve_path(cfg.cache_dir) / "hf")}
    else:
        what = f"{cfg.hf_path} ({cfg.hf_name})"
        hint = ("offline? download it once with network access (it is then read from the HF cache, "
                "also with HF_DATASETS_OFFLINE=1) or set dataset.hf_data_files=<local .jsonl>")
        loader = {"path": cfg.hf_path, "name": cfg.hf_name}
    try:
        ds = datasets.load_dataset(**loader, split="train")
    except Exception as e:  # noqa: BLE001 - any library failure becomes one actionable line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"could not load {what}: {type(e).__name__}: {first}; {hint}") from None
    if "translation" not in ds.column_names:
        raise DataError(f"{what} has no 'translation' column (columns: {', '.join(ds.column_names)}); "
                        f"rows must look like {OPUS_ROW}")
    return ds["translation"], what, hint


def read_opus_books(cfg: DatasetConfig, files: list[Path]) -> tuple[list[str], list[str], int]:
    """English and French sentences of opus_books (hub, or local `files`) and the count of rows with
    an empty side."""
    rows, what, hint = _opus_rows(cfg, files)
    english: list[str] = []
    french: list[str] = []
    skipped = 0
    for i, row in enumerate(rows):
        missing = [lang for lang in LANGS if not isinstance(row, dict) or lang not in row]
        if missing:
            have = ", ".join(row) if isinstance(row, dict) else type(row).__name__
            raise DataError(f"{what}: row {i} has no {'/'.join(missing)} translation "
                            f"(has: {have}); use an en-fr dataset (dataset.hf_name=en-fr)")
        en, fr = clean(row["en"] or ""), clean(row["fr"] or "")
        if not en or not fr:
            skipped += 1
            continue
        english.append(en)
        french.append(fr)
    if not english:
        raise DataError(f"{what} holds no pair with both English and French text; {hint}")
    return english, french, skipped


# -- the configured corpus -------------------------------------------------------------------------
@dataclass
class Source:
    """Where the configured corpus is: a display name, its local files, and what the cache key hashes."""

    name: str
    files: list[Path]
    fingerprint: dict[str, Any] = field(default_factory=dict)


def locate(cfg: DatasetConfig) -> Source:
    """Find (or download) the corpus once; its files' sizes and times fingerprint the content."""
    if cfg.name == "tatoeba":
        files = [ensure_tatoeba(cfg)]
    elif cfg.hf_data_files:
        files = _opus_files(cfg)
    else:
        return Source(f"{cfg.hf_path}:{cfg.hf_name}", [], {"hf_path": cfg.hf_path, "hf_name": cfg.hf_name})
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return Source(", ".join(f.name for f in files), files, {"name": cfg.name, "files": stats})


def read_corpus(cfg: DatasetConfig, source: Source) -> tuple[list[str], list[str], int]:
    """(english, french, skipped) of the located corpus, logging one line about what was skipped."""
    if cfg.name == "tatoeba":
        english, french, skipped = read_tatoeba(source.files[0])
    else:
        english, french, skipped = read_opus_books(cfg, source.files)
    if skipped:
        log.warning("skipped %d malformed lines of %s", skipped, source.name)
    return english, french, skipped


def load_pairs(cfg: DatasetConfig) -> tuple[list[str], list[str]]:
    """(english, french) sentence lists of the configured dataset."""
    english, french, _ = read_corpus(cfg, locate(cfg))
    return english, french


def select_pairs(cfg: DatasetConfig, english: list[str], french: list[str]) -> tuple[list[str], list[str]]:
    """(source, target) after the `max_pairs` sample and the direction: what split_pairs takes.

    The sample is drawn uniformly (the corpus is sorted by length) and keeps corpus order.
    """
    if cfg.max_pairs is not None and cfg.max_pairs < len(english):
        keep = np.sort(np.random.default_rng(cfg.split_seed).choice(len(english), size=cfg.max_pairs,
                                                                    replace=False))
        english, french = [english[i] for i in keep], [french[i] for i in keep]
    return (english, french) if cfg.src_lang == "en" else (french, english)
