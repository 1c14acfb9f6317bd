"""The leak-free split into train, valid and test, and the split files a run directory keeps.

Pairs that share a source or a target sentence (Tatoeba translates many sentences several ways) are
one group, and a group lands in one split whole, so no held-out sentence was seen in training. The
split does not depend on the direction (groups are ordered by their first pair), so en->fr and fr->en
runs with the same seed hold out the same pairs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_mt.data.corpora import read_utf8
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)
SPLIT_DIR = "split"


@dataclass
class Parallel:
    """Aligned source and target sentences."""

    src: list[str]
    tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)


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


def _sizes(n: int, valid_size: int, test_size: int) -> tuple[int, int]:
    """The held-out sizes to use: a small corpus (e.g. dataset.max_pairs=3000) keeps most pairs for
    training, so valid and test shrink to 10% each when they would take more than a fifth."""
    if valid_size + test_size > n // 5:
        limit = max(1, n // 10)
        shrunk = min(valid_size, limit), min(test_size, limit)
        log.warning("%d pairs: valid/test sizes %d/%d shrunk to %d/%d (10%% each)", n, valid_size,
                    test_size, *shrunk)
        return shrunk
    return valid_size, test_size


def split_pairs(src: list[str], tgt: list[str], valid_size: int, test_size: int, seed: int) -> Split:
    """Split so that pairs sharing a source or a target sentence never straddle two splits."""
    valid_size, test_size = _sizes(len(src), valid_size, test_size)
    too_small = DataError(f"only {len(src)} pairs: dataset.valid_size={valid_size} + dataset.test_size="
                          f"{test_size} leave nothing to train on; lower them or use more data")
    if valid_size + test_size >= len(src):
        raise too_small
    groups = _components(src, tgt)
    parts: dict[str, list[int]] = {"valid": [], "test": [], "train": []}
    for g in np.random.default_rng(seed).permutation(len(groups)):
        # Fill valid, then test, each until it reaches its size (a group may overshoot a little).
        name = ("valid" if len(parts["valid"]) < valid_size
                else "test" if len(parts["test"]) < test_size else "train")
        parts[name].extend(groups[g])
    if not parts["train"]:
        raise too_small

    def take(idx: list[int]) -> Parallel:
        return Parallel([src[i] for i in idx], [tgt[i] for i in idx])

    return Split(train=take(parts["train"]), valid=take(parts["valid"]), test=take(parts["test"]),
                 seed=seed, valid_size=valid_size, test_size=test_size)


def split_summary(split: Split) -> dict[str, Any]:
    """What train_summary.json records: counts, seed, sizes, source, a hash of the train pairs."""
    digest = hashlib.sha256()
    for s, t in zip(split.train.src, split.train.tgt, strict=True):
        digest.update(f"{s}\t{t}\n".encode())
    return {
        "source": split.source, "src_lang": split.src_lang, "tgt_lang": split.tgt_lang,
        "seed": split.seed, "valid_size": split.valid_size, "test_size": split.test_size,
        "counts": {"train": len(split.train), "valid": len(split.valid), "test": len(split.test)},
        "train_sha256": digest.hexdigest(),
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
    src: list[str] = []
    tgt: list[str] = []
    for n, line in enumerate(read_utf8(path).split("\n"), start=1):
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
