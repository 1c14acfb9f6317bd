"""The words a run's training pairs hold: what tells the documents report's unseen names from the names
the model has met (documents/report.py).

The pairs are those the run's split trained on, drawn again from its dataset config (the run directory
keeps only the held-out text, and the cache only token ids), every corpus of `dataset.mix` included.
Both sides count and case is ignored: a name the model met on either side, or met as a word ("Will",
"Rose"), is not unseen. Pairs that the length limits left out of training count as seen, so a word
called unseen surely is.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from transformer_mt.config import DatasetConfig
from transformer_mt.data.cache import training_pairs
from transformer_mt.data.mixture import corpus_configs

_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    """The words of a text, case folded."""
    return set(_WORD.findall(text.casefold()))


def seen_words(cfg: DatasetConfig) -> Callable[[str], bool]:
    """Whether a text has a word (case ignored) that occurs in the training pairs of the run whose
    dataset section is `cfg`; built once by streaming the corpora, then a set lookup per text."""
    known: set[str] = set()
    for corpus in corpus_configs(cfg):
        for source, target in training_pairs(corpus):
            known.update(_WORD.findall(f"{source}\n{target}".casefold()))
    return lambda text: not _words(text).isdisjoint(known)
