"""Parallel text: read the corpus, split it without leaks, encode it (cached), batch it by tokens.

Conventions shared with the model and the decoders:

- The encoder input is a sentence's token ids followed by <eos> (no <bos>), in training and in
  decoding alike (`collate` and `pad_sources` both do this).
- The decoder input is <bos> + y and its target is y + <eos>; padding uses PAD_ID everywhere.
- Training pairs with fewer than `dataset.min_len` or more than `dataset.max_len` tokens on either
  side (bos/eos not counted) are dropped. Valid/test pairs are never dropped; their ids are
  truncated to `max_len` for the model, while their full text is kept as the BLEU reference.
- The split does not depend on the direction (groups are ordered by their first pair), so en->fr
  and fr->en runs with the same seed hold out the same pairs.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch

from transformer_mt.config import ConfigError, DatasetConfig, TokenizerConfig, resolve_path
from transformer_mt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Vocabulary, train_tokenizers

log = logging.getLogger(__name__)

LANGS = ("en", "fr")
ANKI_PAGE = "https://www.manythings.org/anki/"
CACHE_FORMAT = 2  # bump when the cached content or its layout changes
SPLIT_DIR = "split"
OPUS_ROW = '{"translation": {"en": ..., "fr": ...}}'
# Tabs and line breaks inside a sentence would break the TSV files and the cache's line-joined text.
_FLATTEN_WS = str.maketrans({"\t": " ", "\r": " ", "\n": " "})


class DataError(ValueError):
    """A data problem a user can fix; the message is one line saying what to do."""


# ----------------------------------------------------------------------------------------------
# Reading corpora


def _clean(text: str) -> str:
    """One sentence on one line without surrounding whitespace."""
    if "\t" in text or "\n" in text or "\r" in text:  # rare; translate is slow on 300k strings
        text = text.translate(_FLATTEN_WS)
    return text.strip()


def _read_bytes(path: Path) -> tuple[bytes, str]:
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
    data, name = _read_bytes(Path(path))
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{name}: line {line} is not valid UTF-8 (byte 0x{data[e.start]:02x}); "
                        "re-save the file as UTF-8") from None
    english: list[str] = []
    french: list[str] = []
    skipped = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        parts = line.split("\t")
        # Column 3, when present, is the attribution of newer releases.
        if len(parts) not in (2, 3):
            skipped += 1
            continue
        en, fr = _clean(parts[0]), _clean(parts[1])
        if not en or not fr:
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
    what = (f"put fra-eng.zip at {path} (from {ANKI_PAGE}) "
            "or set dataset.path=<your fra.txt or fra-eng.zip>")
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
        raise DataError(f"{path} does not exist and downloading {cfg.url} failed ({e}); "
                        f"{what}") from None
    return target


def _opus_files(cfg: DatasetConfig) -> list[Path]:
    """The local json/jsonl files named by dataset.hf_data_files (a path or a glob)."""
    pattern = str(resolve_path(cfg.hf_data_files))
    files = [Path(pattern)] if Path(pattern).is_file() else sorted(map(Path, glob.glob(pattern)))
    if not files:
        raise DataError(f"dataset.hf_data_files={cfg.hf_data_files} matches no file; point it to "
                        f"a .json/.jsonl with {OPUS_ROW} rows")
    return files


def _opus_rows(cfg: DatasetConfig) -> tuple[list[str], list[str], int]:
    """English, French and the count of rows with an empty side, from the hub or local json."""
    import datasets  # slow to import, and only this dataset needs it

    if cfg.hf_data_files:
        files = _opus_files(cfg)
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
        columns = ", ".join(ds.column_names)
        raise DataError(f"{what} has no 'translation' column (columns: {columns}); "
                        f"rows must look like {OPUS_ROW}")
    english: list[str] = []
    french: list[str] = []
    skipped = 0
    for i, row in enumerate(ds["translation"]):
        missing = [lang for lang in LANGS if not isinstance(row, dict) or lang not in row]
        if missing:
            have = ", ".join(row) if isinstance(row, dict) else type(row).__name__
            raise DataError(f"{what}: row {i} has no {'/'.join(missing)} translation "
                            f"(has: {have}); use an en-fr dataset (dataset.hf_name=en-fr)")
        en, fr = _clean(row["en"] or ""), _clean(row["fr"] or "")
        if not en or not fr:
            skipped += 1
            continue
        english.append(en)
        french.append(fr)
    if not english:
        raise DataError(f"{what} holds no pair with both English and French text; {hint}")
    return english, french, skipped


def load_opus_books(cfg: DatasetConfig) -> tuple[list[str], list[str]]:
    """English and French sentences of opus_books (hub) or of local json in its schema."""
    english, french, skipped = _opus_rows(cfg)
    if skipped:
        log.warning("skipped %d opus_books rows with an empty side", skipped)
    return english, french


@dataclass
class _Corpus:
    """Everything loading produced: the pairs, the malformed count and where they came from."""

    english: list[str]
    french: list[str]
    skipped: int
    source: str


def _check_langs(cfg: DatasetConfig) -> None:
    """Only en->fr and fr->en exist in these corpora."""
    if {cfg.src_lang, cfg.tgt_lang} != set(LANGS):
        raise ConfigError(f"dataset.src_lang={cfg.src_lang!r}, dataset.tgt_lang={cfg.tgt_lang!r}: "
                          "use en and fr (either order)")


def _source(cfg: DatasetConfig) -> tuple[str, dict[str, Any]]:
    """A display name of the data and a fingerprint of its content for the cache key."""
    if cfg.name == "tatoeba":
        files = [ensure_tatoeba(cfg)]
        name = files[0].name
    elif cfg.name == "opus_books":
        if not cfg.hf_data_files:
            return f"{cfg.hf_path}:{cfg.hf_name}", {"hf_path": cfg.hf_path, "hf_name": cfg.hf_name}
        files = _opus_files(cfg)
        name = ", ".join(f.name for f in files)
    else:
        raise ConfigError(f"dataset.name={cfg.name!r} is not allowed; "
                          "choose one of: tatoeba, opus_books")
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return name, {"name": cfg.name, "files": stats}


def _load(cfg: DatasetConfig) -> _Corpus:
    """Read the configured corpus, logging one line about malformed lines."""
    source, _ = _source(cfg)
    if cfg.name == "tatoeba":
        english, french, skipped = read_tatoeba(ensure_tatoeba(cfg))
    else:
        english, french, skipped = _opus_rows(cfg)
    if skipped:
        log.warning("skipped %d malformed lines of %s", skipped, source)
    return _Corpus(english, french, skipped, source)


def load_pairs(cfg: DatasetConfig) -> tuple[list[str], list[str]]:
    """(english, french) sentence lists of the configured dataset."""
    corpus = _load(cfg)
    return corpus.english, corpus.french


def orient(english: list[str], french: list[str],
           cfg: DatasetConfig) -> tuple[list[str], list[str]]:
    """(source, target) for the configured direction."""
    _check_langs(cfg)
    return (english, french) if cfg.src_lang == "en" else (french, english)


def sample_pairs(src: list[str], tgt: list[str], max_pairs: int | None,
                 seed: int) -> tuple[list[str], list[str]]:
    """Keep max_pairs pairs drawn uniformly (the corpus is sorted by length), in corpus order."""
    if max_pairs is None or max_pairs >= len(src):
        return src, tgt
    if max_pairs < 1:
        raise ConfigError(f"dataset.max_pairs={max_pairs} must be >= 1 or null")
    keep = np.sort(np.random.default_rng(seed).choice(len(src), size=max_pairs, replace=False))
    return [src[i] for i in keep], [tgt[i] for i in keep]


def select_pairs(cfg: DatasetConfig, english: list[str],
                 french: list[str]) -> tuple[list[str], list[str]]:
    """(source, target) after the max_pairs sample and the direction: what split_pairs takes."""
    english, french = sample_pairs(english, french, cfg.max_pairs, cfg.split_seed)
    return orient(english, french, cfg)


# ----------------------------------------------------------------------------------------------
# Leak-free split


@dataclass
class Parallel:
    """Aligned source and target sentences."""

    src: list[str]
    tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)

    def swapped(self) -> Parallel:
        """The same pairs with source and target exchanged."""
        return Parallel(self.tgt, self.src)


@dataclass
class Split:
    """Train/valid/test pairs and how they were drawn."""

    train: Parallel
    valid: Parallel
    test: Parallel
    seed: int
    valid_size: int
    test_size: int
    source: str = ""
    src_lang: str = "src"
    tgt_lang: str = "tgt"


def _components(src: Sequence[str], tgt: Sequence[str]) -> list[list[int]]:
    """Groups of pair indices linked by a shared source or target sentence, by smallest index."""
    parent = list(range(len(src)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving keeps the trees flat
            i = parent[i]
        return i

    for side in (src, tgt):
        first: dict[str, int] = {}
        for i, sentence in enumerate(side):
            j = first.setdefault(sentence.strip(), i)
            if j != i:
                a, b = find(i), find(j)
                if a != b:
                    # The smaller index becomes the root, so roots are each group's first pair.
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(src)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())  # insertion order = order of first pairs: no hash() involved


def split_pairs(src: list[str], tgt: list[str], valid_size: int, test_size: int,
                seed: int) -> Split:
    """Split so that pairs sharing a source or a target sentence never straddle two splits."""
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
    if valid_size < 0 or test_size < 0:
        raise ConfigError(f"dataset.valid_size={valid_size} and dataset.test_size={test_size} "
                          "must be >= 0")
    too_small = (f"only {len(src)} pairs: dataset.valid_size={valid_size} + dataset.test_size="
                 f"{test_size} leave nothing to train on; lower them or use more data")
    if valid_size + test_size > len(src) // 5:
        # A small corpus (e.g. dataset.max_pairs=3000) keeps most pairs for training.
        limit = max(1, len(src) // 10)
        shrunk = min(valid_size, limit), min(test_size, limit)
        log.warning("%d pairs: valid/test sizes %d/%d shrunk to %d/%d (10%% each)", len(src),
                    valid_size, test_size, *shrunk)
        valid_size, test_size = shrunk
    if valid_size + test_size >= len(src):
        raise DataError(too_small)
    groups = _components(src, tgt)
    order = np.random.default_rng(seed).permutation(len(groups))
    parts: dict[str, list[int]] = {"valid": [], "test": [], "train": []}
    for g in order:
        # Fill valid, then test, each until it reaches its size (a group may overshoot a little).
        name = ("valid" if len(parts["valid"]) < valid_size
                else "test" if len(parts["test"]) < test_size else "train")
        parts[name].extend(groups[g])
    if not parts["train"]:
        raise DataError(too_small)

    def take(idx: list[int]) -> Parallel:
        return Parallel([src[i] for i in idx], [tgt[i] for i in idx])

    return Split(train=take(parts["train"]), valid=take(parts["valid"]), test=take(parts["test"]),
                 seed=seed, valid_size=valid_size, test_size=test_size)


def _sha256_pairs(pairs: Parallel) -> str:
    """Fingerprint of a split's text, in order."""
    h = hashlib.sha256()
    for s, t in zip(pairs.src, pairs.tgt, strict=True):
        h.update(f"{s}\t{t}\n".encode())
    return h.hexdigest()


def split_summary(split: Split) -> dict[str, Any]:
    """What train_summary.json records: counts, seed, sizes, source, a hash of the train pairs."""
    return {
        "source": split.source, "src_lang": split.src_lang, "tgt_lang": split.tgt_lang,
        "seed": split.seed, "valid_size": split.valid_size, "test_size": split.test_size,
        "counts": {"train": len(split.train), "valid": len(split.valid), "test": len(split.test)},
        "train_sha256": _sha256_pairs(split.train),
    }


def _write_tsv(path: Path, pairs: Parallel) -> None:
    """source<TAB>target per line, UTF-8."""
    lines = []
    for s, t in zip(pairs.src, pairs.tgt, strict=True):
        if any(c in s or c in t for c in "\t\r\n"):  # loaders flatten these; guard the format
            raise ValueError(f"tab or line break inside a sentence: {s!r} / {t!r}")
        lines.append(f"{s}\t{t}\n")
    path.write_text("".join(lines), encoding="utf-8")


def save_split(split: Split, run_dir: str | Path) -> Path:
    """Write <run_dir>/split/{valid,test}.tsv and train_summary.json; return the split folder."""
    folder = Path(run_dir) / SPLIT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    _write_tsv(folder / "valid.tsv", split.valid)
    _write_tsv(folder / "test.tsv", split.test)
    summary = json.dumps(split_summary(split), indent=2, ensure_ascii=False)
    (folder / "train_summary.json").write_text(summary + "\n", encoding="utf-8")
    return folder


def load_split_tsv(path: str | Path) -> tuple[list[str], list[str]]:
    """(sources, targets) of a source<TAB>target file as save_split writes; blank lines ignored."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; give a source<TAB>reference file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not valid UTF-8 (byte {e.start}); "
                        "re-save it as UTF-8") from None
    src: list[str] = []
    tgt: list[str] = []
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(f"{path}: line {n} has {len(parts)} tab-separated columns, "
                            "expected 2 (source<TAB>reference)")
        src.append(parts[0])
        tgt.append(parts[1])
    return src, tgt


# ----------------------------------------------------------------------------------------------
# Encoded corpora


@dataclass(frozen=True)
class Ragged:
    """Variable-length id sequences as one flat int32 array plus int64 offsets (n + 1 of them).

    Indexing with an int gives that sequence (a read-only int32 view), with a slice a Ragged.
    """

    flat: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int | slice) -> np.ndarray | Ragged:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} sequences")
        i %= len(self)
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        for a, b in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist(), strict=True):
            yield self.flat[a:b]

    @property
    def lengths(self) -> np.ndarray:
        """Length of every sequence (int64)."""
        return np.diff(self.offsets)

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> Ragged:
        """Pack lists of ids."""
        lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32,
                           count=int(offsets[-1]))
        return cls(flat, offsets)

    def _gather(self, rows: np.ndarray, lengths: np.ndarray) -> Ragged:
        """The first lengths[k] ids of each rows[k], vectorised."""
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        shift = np.repeat(self.offsets[rows] - offsets[:-1], lengths)
        return Ragged(self.flat[np.arange(offsets[-1], dtype=np.int64) + shift], offsets)

    def take(self, rows: Sequence[int] | np.ndarray) -> Ragged:
        """The sequences at rows, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return self._gather(rows, self.lengths[rows])

    def truncate(self, max_len: int) -> Ragged:
        """Every sequence cut to at most max_len ids."""
        return self._gather(np.arange(len(self)), np.minimum(self.lengths, max_len))

    def tolist(self) -> list[list[int]]:
        """Plain Python lists."""
        return [a.tolist() for a in self]

    def state(self) -> dict[str, torch.Tensor]:
        """Tensors for torch.save (loadable with weights_only=True)."""
        return {"flat": torch.from_numpy(self.flat), "offsets": torch.from_numpy(self.offsets)}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> Ragged:
        """Inverse of state."""
        return cls(state["flat"].numpy(), state["offsets"].numpy())


@dataclass
class EncodedSplit:
    """Token ids (without bos/eos) and raw text of one split, aligned."""

    src_ids: Ragged
    tgt_ids: Ragged
    src_text: list[str]
    tgt_text: list[str]

    def __len__(self) -> int:
        return len(self.src_text)

    @property
    def src_lens(self) -> np.ndarray:
        """Source lengths in tokens (no eos)."""
        return self.src_ids.lengths

    @property
    def tgt_lens(self) -> np.ndarray:
        """Target lengths in tokens (no bos/eos)."""
        return self.tgt_ids.lengths

    def lengths(self) -> np.ndarray:
        """(N, 2) int64 array of (source, target) lengths: what TokenBatchSampler takes."""
        return np.stack([self.src_lens, self.tgt_lens], axis=1)

    def select(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(source ids, target ids) of the examples at indices: collate(*split.select(batch))."""
        return [self.src_ids[i] for i in indices], [self.tgt_ids[i] for i in indices]

    def batch(self, indices: Sequence[int]) -> Batch:
        """Collate the examples at indices."""
        return collate(*self.select(indices))

    def subset(self, rows: Sequence[int] | np.ndarray) -> EncodedSplit:
        """A new split of the examples at rows, in that order."""
        return EncodedSplit(self.src_ids.take(rows), self.tgt_ids.take(rows),
                            [self.src_text[i] for i in rows], [self.tgt_text[i] for i in rows])


@dataclass
class PreparedData:
    """Everything training needs from the data side (`stats` is JSON-serialisable)."""

    vocab: Vocabulary
    train: EncodedSplit
    valid: EncodedSplit
    test: EncodedSplit
    stats: dict[str, Any]
    split: Split

    def summary(self) -> str:
        """One line for the log."""
        s = self.stats
        return (f"{s['source']} {self.split.src_lang}->{self.split.tgt_lang}: "
                f"{len(self.train)} train ({s['train_dropped_by_length']} dropped by length) / "
                f"{len(self.valid)} valid / {len(self.test)} test pairs; vocab "
                f"{self.vocab.kind} {self.vocab.src_vocab_size}/{self.vocab.tgt_vocab_size}"
                f"{' joint' if self.vocab.joint else ''}")


def length_mask(src_lens: np.ndarray, tgt_lens: np.ndarray, min_len: int,
                max_len: int) -> np.ndarray:
    """True for pairs with min_len..max_len tokens on both sides."""
    return ((src_lens >= min_len) & (src_lens <= max_len)
            & (tgt_lens >= min_len) & (tgt_lens <= max_len))


def _sha256_json(value: Any) -> str:
    """Stable digest of JSON-able data (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def cache_key(cfg: DatasetConfig, tok_cfg: TokenizerConfig | None, fingerprint: dict[str, Any],
              vocab: Vocabulary | None = None) -> str:
    """sha256 of what decides the cached content (not min_len/max_len: they are applied after)."""
    fields = ("name", "src_lang", "tgt_lang", "max_pairs", "valid_size", "test_size", "split_seed")
    tokenizer = (dataclasses.asdict(tok_cfg) if vocab is None
                 else {"vocab_sha256": _sha256_json(vocab.to_json())})
    return _sha256_json({"format": CACHE_FORMAT, "source": fingerprint, "tokenizer": tokenizer,
                         "dataset": {f: getattr(cfg, f) for f in fields}})


def _join(texts: list[str]) -> str:
    """Line-joined text: one pickled string loads far faster than 100k small ones."""
    return "\n".join(texts)


def _unjoin(text: str, n: int) -> list[str]:
    """Inverse of _join for n lines."""
    return text.split("\n") if n else []


_PARTS = ("train", "valid", "test")


def _encode_unique(encode: Callable[[list[str]], list[list[int]]], texts: list[str]) -> Ragged:
    """Encode each distinct text once (Tatoeba repeats a third of its English sentences)."""
    first: dict[str, int] = {}
    rows = [first.setdefault(t, len(first)) for t in texts]
    return Ragged.from_lists(encode(list(first))).take(rows)


def _build(cfg: DatasetConfig, tok_cfg: TokenizerConfig, source: str,
           vocab: Vocabulary | None) -> dict[str, Any]:
    """Load, sample, split, train the tokenizer (unless given) and encode: the cache's content."""
    corpus = _load(cfg)
    src, tgt = select_pairs(cfg, corpus.english, corpus.french)
    split = split_pairs(src, tgt, cfg.valid_size, cfg.test_size, cfg.split_seed)
    start = time.perf_counter()
    if vocab is None:
        vocab = train_tokenizers(tok_cfg, split.train.src, split.train.tgt)
    train_seconds = time.perf_counter() - start
    content: dict[str, Any] = {"format": CACHE_FORMAT, "vocab": vocab.to_json(), "text": {},
                               "ids": {}}
    for part in _PARTS:
        pairs: Parallel = getattr(split, part)
        content["text"][part] = {"src": _join(pairs.src), "tgt": _join(pairs.tgt), "n": len(pairs)}
        content["ids"][part] = {"src": _encode_unique(vocab.encode_src, pairs.src).state(),
                                "tgt": _encode_unique(vocab.encode_tgt, pairs.tgt).state()}
    content["meta"] = json.dumps({
        "source": source, "pairs_read": len(corpus.english), "skipped_lines": corpus.skipped,
        "pairs_used": len(src), "tokenizer_train_seconds": round(train_seconds, 3),
        # split_pairs may shrink valid/test on small corpora: keep the sizes it really used.
        "valid_size": split.valid_size, "test_size": split.test_size})
    return content


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cached content, or None if absent, unreadable or of another format."""
    if not path.is_file():
        return None
    try:
        content = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged cache is rebuilt, never fatal
        log.warning("ignoring unreadable cache %s (%s)", path, type(e).__name__)
        return None
    return content if isinstance(content, dict) and content.get("format") == CACHE_FORMAT else None


def _write_cache(path: Path, content: dict[str, Any]) -> None:
    """torch.save to a temporary file then rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(content, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _unpack(content: dict[str, Any],
            cfg: DatasetConfig) -> tuple[Vocabulary, Split, dict[str, EncodedSplit]]:
    """Cache content back into a vocabulary, the text split and the encoded splits."""
    texts = {}
    encoded = {}
    for part in _PARTS:
        t = content["text"][part]
        texts[part] = Parallel(_unjoin(t["src"], t["n"]), _unjoin(t["tgt"], t["n"]))
        ids = content["ids"][part]
        encoded[part] = EncodedSplit(Ragged.from_state(ids["src"]), Ragged.from_state(ids["tgt"]),
                                     texts[part].src, texts[part].tgt)
    meta = json.loads(content["meta"])
    split = Split(train=texts["train"], valid=texts["valid"], test=texts["test"],
                  seed=cfg.split_seed, valid_size=meta["valid_size"], test_size=meta["test_size"],
                  source=meta["source"], src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang)
    return Vocabulary.from_json(content["vocab"]), split, encoded


def _cached_content(cfg: DatasetConfig, tok_cfg: TokenizerConfig,
                    vocab: Vocabulary | None) -> tuple[dict[str, Any], bool, Path]:
    """(content, cache hit?, cache file): reuse a cache whose vocabulary fits, else build one."""
    source, fingerprint = _source(cfg)
    folder = resolve_path(cfg.cache_dir) / "encoded"
    # A given vocabulary (resuming) reuses the regular cache when that holds the same tokenizer.
    keys = [cache_key(cfg, tok_cfg, fingerprint)]
    if vocab is not None:
        keys.append(cache_key(cfg, tok_cfg, fingerprint, vocab))
    for key in keys:
        content = _read_cache(folder / f"{key}.pt")
        if content is not None and (vocab is None or content["vocab"] == vocab.to_json()):
            return content, True, folder / f"{key}.pt"
    content = _build(cfg, tok_cfg, source, vocab)
    _write_cache(folder / f"{keys[-1]}.pt", content)
    return content, False, folder / f"{keys[-1]}.pt"


def prepare_data(cfg: DatasetConfig, tok_cfg: TokenizerConfig, run_dir: Path | None = None,
                 vocab: Vocabulary | None = None) -> PreparedData:
    """Pairs -> split -> tokenizer -> ids (cached), then length filtering; writes run_dir's split.

    `vocab` (e.g. from a checkpoint being resumed) replaces training a tokenizer. With run_dir, the
    split (see save_split) and the tokenizer JSON are written there.
    """
    start = time.perf_counter()
    _check_langs(cfg)
    content, hit, cache_file = _cached_content(cfg, tok_cfg, vocab)
    vocab, split, encoded = _unpack(content, cfg)
    meta = json.loads(content["meta"])

    train = encoded["train"]
    keep = length_mask(train.src_lens, train.tgt_lens, cfg.min_len, cfg.max_len)
    dropped = int((~keep).sum())
    if not keep.any():
        raise DataError(f"all {len(train)} training pairs fall outside dataset.min_len="
                        f"{cfg.min_len}..dataset.max_len={cfg.max_len} tokens; widen that range")
    if dropped:
        log.info("dropped %d of %d training pairs outside %d..%d tokens",
                 dropped, len(train), cfg.min_len, cfg.max_len)
        train = train.subset(np.flatnonzero(keep))
    truncated = {}
    for part in ("valid", "test"):
        e = encoded[part]
        truncated[part] = int(((e.src_lens > cfg.max_len) | (e.tgt_lens > cfg.max_len)).sum())
        encoded[part] = EncodedSplit(e.src_ids.truncate(cfg.max_len),
                                     e.tgt_ids.truncate(cfg.max_len), e.src_text, e.tgt_text)

    if run_dir is not None:
        save_split(split, run_dir)
        vocab.save(run_dir)
    stats = {
        **{k: meta[k] for k in ("source", "pairs_read", "skipped_lines", "pairs_used",
                                "tokenizer_train_seconds")},
        "train_pairs": len(split.train), "valid_pairs": len(split.valid),
        "test_pairs": len(split.test), "train_dropped_by_length": dropped,
        "train_kept": len(train), "valid_truncated": truncated["valid"],
        "test_truncated": truncated["test"], "src_vocab_size": vocab.src_vocab_size,
        "tgt_vocab_size": vocab.tgt_vocab_size, "cache_hit": hit, "cache_file": str(cache_file),
        "seconds": round(time.perf_counter() - start, 3),
    }
    data = PreparedData(vocab=vocab, train=train, valid=encoded["valid"], test=encoded["test"],
                        stats=stats, split=split)
    log.info("data: %s (cache %s, %.2fs)", data.summary(), "hit" if hit else "miss",
             stats["seconds"])
    return data


# ----------------------------------------------------------------------------------------------
# Batching


@dataclass
class Batch:
    """Padded tensors for one step: src = x + eos, tgt_in = bos + y, tgt_out = y + eos."""

    src: torch.Tensor  # (B, S) long
    tgt_in: torch.Tensor  # (B, T) long
    tgt_out: torch.Tensor  # (B, T) long
    n_tgt_tokens: int  # non-pad positions of tgt_out (the loss normaliser)
    n_src_tokens: int  # non-pad positions of src

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on device."""
        return dataclasses.replace(
            self, src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking))


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, prefix: int | None,
         suffix: int | None) -> tuple[np.ndarray, int]:
    """(B, width) int64 array of each seq wrapped in prefix/suffix, and its non-pad count."""
    if not len(seqs):
        raise ValueError("cannot pad an empty batch")
    lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    total = int(lengths.sum())
    if all(isinstance(s, np.ndarray) for s in seqs):
        flat = np.concatenate(seqs) if total else np.zeros(0, dtype=np.int64)
    else:
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)
    first = int(prefix is not None)
    extra = first + int(suffix is not None)
    out = np.full((len(seqs), int(lengths.max()) + extra), pad_id, dtype=np.int64)
    cols = np.arange(out.shape[1])
    # Row-major boolean assignment fills each row left to right, matching the flat order.
    out[(cols >= first) & (cols < first + lengths[:, None])] = flat
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(seqs)), first + lengths] = suffix
    return out, total + extra * len(seqs)


def pad_sources(src_ids: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    """Encoder input (B, S) long: each source's ids followed by <eos>, right-padded."""
    return torch.from_numpy(_pad(src_ids, pad_id, None, EOS_ID)[0])


def collate(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
            pad_id: int = PAD_ID) -> Batch:
    """A training batch from id lists or int arrays (without bos/eos)."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    src, n_src = _pad(src_ids, pad_id, None, EOS_ID)
    tgt_in, _ = _pad(tgt_ids, pad_id, BOS_ID, None)
    tgt_out, n_tgt = _pad(tgt_ids, pad_id, None, EOS_ID)
    return Batch(src=torch.from_numpy(src), tgt_in=torch.from_numpy(tgt_in),
                 tgt_out=torch.from_numpy(tgt_out), n_tgt_tokens=n_tgt, n_src_tokens=n_src)


class TokenBatchSampler:
    """Length-grouped batches of example indices whose padded size fits in batch_tokens.

    A batch of n examples costs n * max(longest source + 1, longest target + 1) (the +1 is the
    source's <eos> and the target's <bos>/<eos>). Examples are sorted by (target, source) length and
    cut greedily; an example that alone exceeds batch_tokens gets a batch of its own. Each epoch
    shuffles examples of identical lengths and the order of the batches, deterministically from
    (seed, epoch), so the batch count is the same every epoch and a resumed run can skip exactly
    the batches it already trained on. Without shuffle, batches come shortest first.
    """

    def __init__(self, lengths: Sequence[Sequence[int]] | np.ndarray, batch_tokens: int,
                 shuffle: bool = True, seed: int = 0) -> None:
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
        self.src_lens, self.tgt_lens = lengths[:, 0].copy(), lengths[:, 1].copy()
        if batch_tokens < 1:
            raise ConfigError(f"batch_tokens={batch_tokens} must be >= 1")
        self.batch_tokens = batch_tokens
        self.shuffle = shuffle
        self.seed = seed
        self._bounds = self._cut(np.lexsort((self.src_lens, self.tgt_lens)))

    def _cut(self, order: np.ndarray) -> list[int]:
        """Start offsets (and the end) of greedy batches over examples in length order.

        Only lengths matter here, and the sorted lengths are the same every epoch, so the cut is
        computed once.
        """
        sizes = np.maximum(self.src_lens[order], self.tgt_lens[order]) + 1
        bounds = [0]
        longest = 0
        for pos, size in enumerate(sizes.tolist()):
            grown = max(longest, size)
            if pos > bounds[-1] and grown * (pos - bounds[-1] + 1) > self.batch_tokens:
                bounds.append(pos)
                grown = size
            longest = grown
        if len(sizes):
            bounds.append(len(sizes))
        return bounds

    def __len__(self) -> int:
        return max(len(self._bounds) - 1, 0)

    def num_batches(self, world_size: int = 1) -> int:
        """Batches each rank gets per epoch."""
        return len(self) // world_size

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
        """This rank's batches of epoch: fixed by (seed, epoch), disjoint across ranks."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        n = len(self.src_lens)
        rng = np.random.default_rng([self.seed, epoch])
        ties = rng.random(n) if self.shuffle else np.arange(n)
        index = np.lexsort((ties, self.src_lens, self.tgt_lens)).tolist()
        out = [index[a:b] for a, b in zip(self._bounds[:-1], self._bounds[1:], strict=True)]
        if self.shuffle:
            out = [out[i] for i in rng.permutation(len(out))]
        # Every rank must take the same number of steps, so the remainder is dropped.
        usable = self.num_batches(world_size) * world_size
        return out[:usable][rank::world_size]
