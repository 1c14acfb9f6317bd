"""Where parallel text comes from: Tatoeba files of any language pair (downloaded once), plain parallel
files or a TSV, any Hugging Face dataset in the `translation` schema.

A `Corpus` streams (source, target) pairs in the configured direction, one part at a time (train, and
valid/test when the corpus brings its own), so that no reader holds a whole corpus in memory. Tabs and
line breaks inside a sentence become spaces (they would break the split's TSV files); pairs with an
empty side are skipped and counted. Lines are read as `data/text_files.py` reads every text file.
"""

from __future__ import annotations

import glob
import itertools
import logging
import os
import re
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from transformer_mt.config import DatasetConfig, resolve_path
from transformer_mt.data.text_files import LINE_ENDS, clean, no_file, open_binary, utf8_lines
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)

ANKI_PAGE = "https://www.manythings.org/anki/"
HF_ROW = '{"translation": {"<src_lang>": ..., "<tgt_lang>": ...}}'
_TATOEBA_FILE = re.compile(r"([a-z]{3})-eng\.zip|([a-z]{3})\.txt")
# The manythings files are named by ISO 639-3 codes, configs use ISO 639-1 where one exists: the codes
# below are checked against the file name (other codes are taken as they are).
ISO_639_3 = {"ar": "ara", "bg": "bul", "ca": "cat", "cs": "ces", "da": "dan", "de": "deu", "el": "ell",
             "eo": "epo", "es": "spa", "fi": "fin", "fr": "fra", "he": "heb", "hi": "hin", "hu": "hun",
             "id": "ind", "it": "ita", "ja": "jpn", "ko": "kor", "lt": "lit", "nl": "nld", "pl": "pol",
             "pt": "por", "ro": "ron", "ru": "rus", "sv": "swe", "tr": "tur", "uk": "ukr", "vi": "vie",
             "zh": "cmn"}


@dataclass
class Skipped:
    """Lines or rows a reader passed over (an empty side, a malformed Tatoeba line)."""

    count: int = 0


# -- the readers -----------------------------------------------------------------------------------
def _tatoeba_member(zf: zipfile.ZipFile, path: Path, lang: str) -> str:
    """The zip member holding the pairs: <lang>.txt (deu.txt in deu-eng.zip), else the one .txt."""
    names = [n for n in zf.namelist() if not n.endswith("/")]
    texts = [n for n in names if n.endswith(".txt") and not n.endswith("_about.txt")]
    preferred = [n for n in texts if Path(n).stem == Path(path).stem.split("-")[0]]
    if preferred or len(texts) == 1:
        return (preferred or texts)[0]
    raise DataError(f"{path} holds no pairs file for {lang} (members: {', '.join(names) or 'none'}); use a "
                    f"<lang>-eng.zip from {ANKI_PAGE}")


def tatoeba_lines(path: Path, lang: str) -> Iterator[tuple[str, str]]:
    """(English, other language) of a Tatoeba file (fra.txt, deu.txt ...) or the zip holding it: English
    first, then its translation, then (in newer releases) an attribution."""
    name = str(path)
    with open_binary(path) as raw:
        if zipfile.is_zipfile(raw):
            raw.seek(0)
            with zipfile.ZipFile(raw) as zf:
                member = _tatoeba_member(zf, path, lang)
                with zf.open(member) as stream:
                    yield from _tatoeba_columns(utf8_lines(stream, f"{name}:{member}"))
                return
        raw.seek(0)
        yield from _tatoeba_columns(utf8_lines(raw, name))


def _tatoeba_columns(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """The two first columns; a malformed line comes out empty (then skipped and counted), a blank one not."""
    for line in lines:
        if line.strip():
            parts = line.split("\t")
            yield (parts[0], parts[1]) if len(parts) in (2, 3) else ("", "")


def file_lines(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Aligned lines of two plain text files (.gz too); they must have as many lines."""
    with open_binary(src_path) as src_raw, open_binary(tgt_path) as tgt_raw:
        src, tgt = utf8_lines(src_raw, str(src_path)), utf8_lines(tgt_raw, str(tgt_path))
        for number, (s, t) in enumerate(itertools.zip_longest(src, tgt), start=1):
            if s is None or t is None:
                shorter, longer = (src_path, tgt_path) if s is None else (tgt_path, src_path)
                raise DataError(f"{shorter} has {number - 1} lines but {longer} has more; the two files must "
                                f"hold one sentence per line each, aligned ({LINE_ENDS})")
            yield s, t


def tsv_lines(path: Path) -> Iterator[tuple[str, str]]:
    """source<TAB>target lines of a TSV file (.gz too); every line has exactly the two columns."""
    with open_binary(path) as raw:
        for number, line in enumerate(utf8_lines(raw, str(path)), start=1):
            parts = line.split("\t")
            if len(parts) != 2:
                if not line.strip():
                    continue
                raise DataError(f"{path}: line {number} has {len(parts)} tab-separated columns, expected 2 "
                                "(source<TAB>target)")
            yield parts[0], parts[1]


def _hf_dataset(cfg: DatasetConfig) -> tuple[Any, str]:
    """The dataset (all its splits) from local json files, a directory saved with save_to_disk, or the
    hub; and its name for messages."""
    import datasets  # slow to import, and only these sources need it

    if cfg.hf_data_files:
        files = hf_files(cfg)
        loader: dict[str, Any] = {"path": "json", "data_files": {"train": [str(f) for f in files]},
                                  "cache_dir": str(resolve_path(cfg.cache_dir) / "hf")}
        what, load = ", ".join(map(str, files)), datasets.load_dataset
    elif Path(cfg.hf_path or "").expanduser().is_dir():
        loader, what = {"dataset_path": str(resolve_path(cfg.hf_path))}, str(cfg.hf_path)
        load = datasets.load_from_disk
    else:
        loader, what, load = {"path": cfg.hf_path, "name": cfg.hf_name}, f"{cfg.hf_path} ({cfg.hf_name})", \
            datasets.load_dataset
    try:
        found = load(**loader)
    except Exception as e:  # noqa: BLE001 - any library failure becomes one actionable line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        hint = ("check that the file is JSON lines in the translation schema" if cfg.hf_data_files else
                "offline? download it once with network access (it is then read from the HF cache, also "
                "with HF_DATASETS_OFFLINE=1), save it with save_to_disk, or set "
                "dataset.hf_data_files=<.jsonl>")
        raise DataError(f"could not load {what}: {type(e).__name__}: {first}; {hint}") from None
    return found if isinstance(found, datasets.DatasetDict) else {"train": found}, what


_HF_SPLITS = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


def hf_rows(cfg: DatasetConfig, dataset: Any, what: str, part: str) -> Iterator[tuple[str, str]]:
    """(source, target) of one part of a Hugging Face dataset in the translation schema."""
    split = next((s for s in _HF_SPLITS[part] if s in dataset), None)
    if split is None:
        return
    ds = dataset[split]
    if "translation" not in ds.column_names:
        raise DataError(f"{what} has no 'translation' column (columns: {', '.join(ds.column_names)}); "
                        f"rows must look like {HF_ROW}")
    index = 0
    for batch in ds.iter(batch_size=10_000):
        for row in batch["translation"]:
            missing = [lang for lang in (cfg.src_lang, cfg.tgt_lang)
                       if not isinstance(row, dict) or lang not in row]
            if missing:
                have = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                raise DataError(f"{what}: {split} row {index} has no {'/'.join(missing)} translation (has: "
                                f"{have}); set dataset.src_lang/tgt_lang to languages it has")
            yield row[cfg.src_lang] or "", row[cfg.tgt_lang] or ""
            index += 1


def hf_files(cfg: DatasetConfig) -> list[Path]:
    """The local json/jsonl files named by dataset.hf_data_files (a path or a glob)."""
    pattern = str(resolve_path(cfg.hf_data_files))
    files = [Path(pattern)] if Path(pattern).is_file() else sorted(map(Path, glob.glob(pattern)))
    if not files:
        raise DataError(f"dataset.hf_data_files={cfg.hf_data_files} matches no file; point it to "
                        f"a .json/.jsonl with {HF_ROW} rows")
    return files


def ensure_tatoeba(cfg: DatasetConfig) -> Path:
    """The local Tatoeba file: dataset.path if it exists, else a one-time download of url (whose file name
    must be the path's: deu-eng.zip is not fetched as fra-eng.zip)."""
    path = resolve_path(cfg.path or "")
    if path.is_file():
        return path
    name = Path(urlparse(cfg.url).path).name if cfg.url else ""
    what = f"put it at {path} (from {ANKI_PAGE}) or set dataset.path=<your file>"
    if not cfg.url:
        raise DataError(f"{path} does not exist; {what}")
    if _TATOEBA_FILE.fullmatch(name) and _TATOEBA_FILE.fullmatch(path.name) and name != path.name:
        raise DataError(f"{path} does not exist, and dataset.url={cfg.url} is another file; set "
                        f"dataset.url={ANKI_PAGE}{path.name} to download it")
    target = resolve_path(cfg.cache_dir) / name
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


# -- the configured corpus -------------------------------------------------------------------------
@dataclass
class Corpus:
    """The configured corpus, located: a name for logs, its local files (their sizes and times key the
    cache), and whether it brings its own valid part (and perhaps test part: else the test split is
    drawn from the training pairs)."""

    cfg: DatasetConfig
    name: str
    files: list[Path]
    held_out: bool = False
    fingerprint: dict[str, Any] = field(default_factory=dict)
    hf: tuple[Any, str] | None = None  # a Hugging Face dataset, loaded once, and its name

    def pairs(self, part: str = "train", skipped: Skipped | None = None) -> Iterator[tuple[str, str]]:
        """(source, target) pairs of a part, cleaned, in the configured direction, each source after the
        corpus's tag (dataset.tag); pairs with an empty side are passed over (counted in `skipped`)."""
        skipped = skipped if skipped is not None else Skipped()
        tag = f"{self.cfg.tag.strip()} " if self.cfg.tag else ""
        for s, t in self._raw(part):
            s, t = clean(s), clean(t)
            if s and t:
                yield tag + s, t
            else:
                skipped.count += 1

    def _raw(self, part: str) -> Iterator[tuple[str, str]]:
        cfg = self.cfg
        if cfg.name == "tatoeba":  # English first in every Tatoeba file
            other = cfg.tgt_lang if cfg.src_lang == "en" else cfg.src_lang
            lines = tatoeba_lines(self.files[0], other)
            return lines if cfg.src_lang == "en" else ((o, e) for e, o in lines)
        if cfg.name == "parallel":
            files = {"train": (cfg.src_path, cfg.tgt_path, cfg.path),
                     "valid": (cfg.valid_src_path, cfg.valid_tgt_path, cfg.valid_path),
                     "test": (cfg.test_src_path, cfg.test_tgt_path, cfg.test_path)}[part]
            if files[0] and files[1]:
                return file_lines(resolve_path(files[0]), resolve_path(files[1]))
            return tsv_lines(resolve_path(files[2])) if files[2] else iter(())
        if self.hf is None:
            self.hf = _hf_dataset(cfg)
        return hf_rows(cfg, *self.hf, part)


def _check_tatoeba_language(cfg: DatasetConfig, path: Path) -> None:
    """A Tatoeba file named for one language (deu-eng.zip, fra.txt) must be the configured pair's."""
    found = _TATOEBA_FILE.fullmatch(path.name)
    # any file may be called x.txt; only a known language's code names the pair (fra.txt, not two.txt)
    have = found and (found.group(1) or (found.group(2) if found.group(2) in ISO_639_3.values() else None))
    other = cfg.tgt_lang if cfg.src_lang == "en" else cfg.src_lang
    code = ISO_639_3.get(other, other)
    if have and len(code) == 3 and code != have:
        raise DataError(f"{path.name} holds English-{have} pairs, but the config asks for {cfg.src_lang}->"
                        f"{cfg.tgt_lang}; set dataset.path=<{code}-eng.zip from {ANKI_PAGE}> or the "
                        "languages of this file")


def locate(cfg: DatasetConfig) -> Corpus:
    """Find (or download) the configured corpus once."""
    if cfg.name == "tatoeba":
        files = [ensure_tatoeba(cfg)]
        _check_tatoeba_language(cfg, files[0])
        held_out = False
    elif cfg.name == "parallel":
        named = [cfg.src_path, cfg.tgt_path, cfg.path, cfg.valid_src_path, cfg.valid_tgt_path, cfg.valid_path,
                 cfg.test_src_path, cfg.test_tgt_path, cfg.test_path]
        files = [resolve_path(f) for f in named if f]
        for file in files:
            if not file.is_file():
                raise no_file(file, "; check the dataset.*path settings")
        held_out = bool(cfg.valid_src_path or cfg.valid_path)
    elif cfg.hf_data_files:
        files, held_out = hf_files(cfg), False
    else:
        hf = _hf_dataset(cfg)
        held_out = any(s in hf[0] for s in _HF_SPLITS["valid"])
        local = Path(cfg.hf_path or "").expanduser()
        files = sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else []
        stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        # On the hub, its name stands for its content; on disk, its files do.
        fingerprint = {"name": cfg.name, "files": stats} if files else {"hf_path": cfg.hf_path,
                                                                       "hf_name": cfg.hf_name}
        return Corpus(cfg, f"{cfg.hf_path}:{cfg.hf_name}" if not files else local.name, files, held_out,
                      fingerprint, hf)
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return Corpus(cfg, ", ".join(f.name for f in files[:3]) + (" ..." if len(files) > 3 else ""), files,
                  held_out, {"name": cfg.name, "files": stats})


def load_pairs(cfg: DatasetConfig, part: str = "train") -> tuple[list[str], list[str]]:
    """(sources, targets) of a part of the configured corpus, in memory: for small corpora and tests."""
    skipped = Skipped()
    pairs = list(locate(cfg).pairs(part, skipped))
    if skipped.count:
        log.warning("skipped %d malformed lines or pairs with an empty side", skipped.count)
    return [s for s, _ in pairs], [t for _, t in pairs]
