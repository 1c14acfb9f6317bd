"""The words a run's training pairs hold: what tells a name the model never met from one it has, for the
documents layer (a capitalised word it never met is copied as written, documents/spans.py) and for the
documents report's unseen names (documents/report.py).

The pairs are those the run's split trained on, drawn again from its dataset config (the run directory
keeps only the held-out text, and the cache only token ids), every corpus of `dataset.mix` included.
Both sides count and case is ignored: a name the model met on either side, or met as a word ("Will",
"Rose"), is not unseen. Pairs that the length limits left out of training count as seen, so a word
called unseen surely is. The data cache keeps each corpus's words, so a run reads its corpus for them
once; a checkpoint keeps the list (checkpoints/store.py), so translation needs no corpus.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

from transformer_mt.config import DatasetConfig, resolve_path
from transformer_mt.data.cache import training_pairs
from transformer_mt.data.corpora import locate
from transformer_mt.data.mixture import corpus_configs
from transformer_mt.runtime.files import atomic_write

_WORD = re.compile(r"\w+")
WORDS_FORMAT = 1  # bump when what a words file holds changes


def words_of(text: str) -> set[str]:
    """The words of a text, case folded."""
    return set(_WORD.findall(text.casefold()))


def training_words(cfg: DatasetConfig) -> frozenset[str]:
    """The words (case folded) of the training pairs of the run whose dataset section is `cfg`: each
    corpus's streamed from it once, then read from the data cache."""
    known: set[str] = set()
    for corpus in corpus_configs(cfg):
        known |= corpus_words(corpus)
    return frozenset(known)


def corpus_words(cfg: DatasetConfig) -> frozenset[str]:
    """The words of one corpus's training pairs, kept in `<cache_dir>/words/<key>.txt` (one a line), keyed
    as the encoded corpus is by the corpus's files and the settings that decide its split."""
    split = {f: getattr(cfg, f) for f in ("name", "src_lang", "tgt_lang", "max_pairs", "valid_size",
                                          "test_size", "split_seed")}
    key = json.dumps({"format": WORDS_FORMAT, "source": locate(cfg).fingerprint, **split}, sort_keys=True)
    path = resolve_path(cfg.cache_dir) / "words" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.txt"
    if path.is_file():
        return frozenset(path.read_text(encoding="utf-8").split("\n")) - {""}
    known: set[str] = set()
    for source, target in training_pairs(cfg):
        known.update(_WORD.findall(f"{source}\n{target}".casefold()))
    atomic_write(path, lambda f: f.write("\n".join(sorted(known)).encode("utf-8")))
    return frozenset(known)


def seen_words(known: frozenset[str]) -> Callable[[str], bool]:
    """Whether a text has a word (case ignored) among `known`."""
    return lambda text: not words_of(text).isdisjoint(known)
