"""The words a run's training pairs hold: what tells a name the model never met from one it has, for the
documents layer (a capitalised word it never met is copied as written, documents/spans.py) and for the
documents report's unseen names (documents/report.py).

The pairs are those the run's split trained on, drawn again from its dataset config (the run directory
keeps only the held-out text, and the cache only token ids), every corpus of `dataset.mix` included.
Both sides count and case is ignored: a name the model met on either side, or met as a word ("Will",
"Rose"), is not unseen. Pairs that the length limits left out of training count as seen, so a word
called unseen surely is. A checkpoint keeps the list (checkpoints/store.py), so translation needs no
corpus.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from transformer_mt.config import DatasetConfig
from transformer_mt.data.cache import training_pairs
from transformer_mt.data.mixture import corpus_configs

_WORD = re.compile(r"\w+")


def words_of(text: str) -> set[str]:
    """The words of a text, case folded."""
    return set(_WORD.findall(text.casefold()))


def training_words(cfg: DatasetConfig) -> frozenset[str]:
    """The words (case folded) of the training pairs of the run whose dataset section is `cfg`, streamed
    from its corpora."""
    known: set[str] = set()
    for corpus in corpus_configs(cfg):
        for source, target in training_pairs(corpus):
            known.update(_WORD.findall(f"{source}\n{target}".casefold()))
    return frozenset(known)


def seen_words(known: frozenset[str]) -> Callable[[str], bool]:
    """Whether a text has a word (case ignored) among `known`."""
    return lambda text: not words_of(text).isdisjoint(known)
