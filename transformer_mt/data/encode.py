"""From text to token ids: the encoded splits, their cache, and `prepare_corpus`, the data side of a run
of one corpus (`data.prepare_data` also prepares several: mixture.py).

`prepare_corpus` locates the corpus, splits it without leaks (or takes its own valid/test parts), trains
the tokenizer on (a bounded sample of) the training pairs unless one is given (a checkpoint being
resumed, or the parent of a fine-tuning run), and encodes everything. The corpus is read in a few
streaming passes and the training ids are written to flat files that later runs memory-map: memory
does not grow with the corpus, and a second run starts in seconds. The cache lives in
`<cache_dir>/encoded/<key>/`, keyed by what decides it (the corpus files, the split, and the tokenizer
settings or the given tokenizer itself).

Length limits are applied after the cache: training pairs with fewer than `dataset.min_len` or more than
`dataset.max_len` tokens on a side are left out; valid/test pairs never are, their ids are cut to
`max_len` while their full text stays the BLEU reference.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from transformer_mt.config import DatasetConfig, TokenizerConfig
from transformer_mt.data.batching import Batch, collate
from transformer_mt.data.cache import cached
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.errors import DataError

if TYPE_CHECKING:
    from transformer_mt.data.mixture import Mixture

log = logging.getLogger(__name__)


@dataclass
class EncodedSplit:
    """Token ids (without bos/eos) of one split, with its text (valid and test: the BLEU references;
    train: None, it may be larger than memory)."""

    src_ids: Ragged
    tgt_ids: Ragged
    src_text: list[str] | None = None
    tgt_text: list[str] | None = None

    def __len__(self) -> int:
        return len(self.src_ids)

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

    def batch(self, indices: Sequence[int]) -> Batch:
        """The examples at indices, collated into one padded batch."""
        return collate([self.src_ids[i] for i in indices], [self.tgt_ids[i] for i in indices])

    def subset(self, rows: Sequence[int] | np.ndarray) -> EncodedSplit:
        """The examples at rows, in that order."""
        texts = [None if t is None else [t[i] for i in rows] for t in (self.src_text, self.tgt_text)]
        return EncodedSplit(self.src_ids.take(rows), self.tgt_ids.take(rows), *texts)


@dataclass
class PreparedData:
    """Everything training needs from the data side (`stats` and `summary` are JSON-serialisable)."""

    vocab: Vocabulary
    train: EncodedSplit
    valid: EncodedSplit
    test: EncodedSplit
    stats: dict[str, Any]
    summary: dict[str, Any]  # what the run's split/train_summary.json records
    mixture: Mixture | None = None  # with dataset.mix: the corpora's rows of `train` (data/mixture.py)
    # sources led by language tokens (data/languages.py): each target language's (valid, test)
    directions: dict[str, tuple[EncodedSplit, EncodedSplit]] = field(default_factory=dict)

    def summary_line(self) -> str:
        """One line for the log."""
        s = self.stats
        return (f"{s['source']} {s['src_lang']}->{s['tgt_lang']}: {len(self.train)} train "
                f"({s['train_dropped_by_length']} dropped by length) / {len(self.valid)} valid / "
                f"{len(self.test)} test pairs; vocab {self.vocab.kind} {self.vocab.src_vocab_size}/"
                f"{self.vocab.tgt_vocab_size}{' joint' if self.vocab.joint else ''}")


def apply_length_limits(cfg: DatasetConfig, train: EncodedSplit,
                         held_out: dict[str, EncodedSplit]) -> tuple[EncodedSplit, dict[str, int]]:
    """Leave out training pairs outside min_len..max_len and cut held-out ids to max_len; the counts."""
    src, tgt = train.src_lens, train.tgt_lens
    keep = (src >= cfg.min_len) & (src <= cfg.max_len) & (tgt >= cfg.min_len) & (tgt <= cfg.max_len)
    if not keep.any():
        raise DataError(f"all {len(train)} training pairs fall outside dataset.min_len="
                        f"{cfg.min_len}..dataset.max_len={cfg.max_len} tokens; widen that range")
    counts = {"train_dropped_by_length": int((~keep).sum())}
    if counts["train_dropped_by_length"]:
        log.info("dropped %d of %d training pairs outside %d..%d tokens",
                 counts["train_dropped_by_length"], len(train), cfg.min_len, cfg.max_len)
        train = train.subset(np.flatnonzero(keep))
    for part, e in held_out.items():
        counts[f"{part}_truncated"] = int(((e.src_lens > cfg.max_len) | (e.tgt_lens > cfg.max_len)).sum())
        held_out[part] = EncodedSplit(e.src_ids.truncate(cfg.max_len), e.tgt_ids.truncate(cfg.max_len),
                                      e.src_text, e.tgt_text)
    return train, counts


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """The run's split/train_summary.json: where its pairs came from and how many went where."""
    text = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    (Path(run_dir) / SPLIT_DIR / "train_summary.json").write_text(text, encoding="utf-8")


def prepare_corpus(cfg: DatasetConfig, tok_cfg: TokenizerConfig, run_dir: Path | None = None,
                 vocab: Vocabulary | None = None) -> PreparedData:
    """The corpus split, tokenized and encoded (cached), length limits applied; with run_dir, the
    split's files (split/valid.tsv, test.tsv, train_summary.json) and the tokenizer are written there.

    `vocab` (from a checkpoint being resumed, or a fine-tuning run's parent) replaces training a
    tokenizer; the cache is then keyed by it.
    """
    start = time.perf_counter()
    cfg.check()
    content, hit, folder = cached(cfg, tok_cfg, vocab)
    held_out = {part: EncodedSplit(*content.held_out[part]) for part in ("valid", "test")}
    train, counts = apply_length_limits(cfg, EncodedSplit(*content.train), held_out)
    meta, vocab = content.meta, content.vocab
    if run_dir is not None:
        split_dir = Path(run_dir) / SPLIT_DIR
        split_dir.mkdir(parents=True, exist_ok=True)
        for part in ("valid", "test"):
            shutil.copyfile(folder / f"{part}.tsv", split_dir / f"{part}.tsv")
        write_summary(run_dir, meta["summary"])
        vocab.save(run_dir)
    summary = meta["summary"]
    stats = {
        **{k: meta[k] for k in ("source", "pairs_read", "skipped_lines", "pairs_used", "tokenizer_pairs",
                                "tokenizer_train_seconds")},
        "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang, "held_out_given": summary["held_out_given"],
        **{f"{part}_pairs": summary["counts"][part] for part in ("train", "valid", "test")},
        **counts, "train_kept": len(train), "src_vocab_size": vocab.src_vocab_size,
        "tgt_vocab_size": vocab.tgt_vocab_size, "cache_hit": hit, "cache_dir": str(folder),
        "seconds": round(time.perf_counter() - start, 3),
    }
    data = PreparedData(vocab=vocab, train=train, valid=held_out["valid"], test=held_out["test"],
                        stats=stats, summary=summary)
    log.info("data: %s (cache %s, %.2fs)", data.summary_line(), "hit" if hit else "miss", stats["seconds"])
    return data
