"""From text to token ids: the encoded splits, their cache, and `prepare_data`, the data side of a run.

`prepare_data` reads the corpus, samples and splits it, trains the tokenizer on the training split
(unless one is given, e.g. by a checkpoint being resumed) and encodes all three splits. That content is
cached in `<cache_dir>/encoded/<key>.pt`, keyed by what decides it (the corpus files, the split and
tokenizer settings), so a second run starts in seconds. Length limits are applied after the cache:
training pairs with fewer than `dataset.min_len` or more than `dataset.max_len` tokens on a side are
dropped; valid/test pairs are never dropped, their ids are cut to `max_len` while their full text stays
the BLEU reference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_mt.config import DatasetConfig, TokenizerConfig, resolve_path
from transformer_mt.data.batching import Batch, collate
from transformer_mt.data.corpora import Source, locate, read_corpus, select_pairs
from transformer_mt.data.split import Parallel, Split, save_split, split_pairs
from transformer_mt.errors import DataError
from transformer_mt.runtime import atomic_write
from transformer_mt.tokenizer import Vocabulary, train_tokenizers

log = logging.getLogger(__name__)
CACHE_FORMAT = 2  # bump when the cached content or its layout changes
_PARTS = ("train", "valid", "test")


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
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1]))
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

    def batch(self, indices: Sequence[int]) -> Batch:
        """The examples at indices, collated into one padded batch."""
        return collate([self.src_ids[i] for i in indices], [self.tgt_ids[i] for i in indices])

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


# -- the cache -------------------------------------------------------------------------------------
def _sha256_json(value: Any) -> str:
    """Stable digest of JSON-able data (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def cache_key(cfg: DatasetConfig, tok_cfg: TokenizerConfig, fingerprint: dict[str, Any],
              vocab: Vocabulary | None = None) -> str:
    """sha256 of what decides the cached content (not min_len/max_len: they are applied after)."""
    fields = ("name", "src_lang", "tgt_lang", "max_pairs", "valid_size", "test_size", "split_seed")
    tokenizer = (dataclasses.asdict(tok_cfg) if vocab is None
                 else {"vocab_sha256": _sha256_json(vocab.to_json())})
    return _sha256_json({"format": CACHE_FORMAT, "source": fingerprint, "tokenizer": tokenizer,
                         "dataset": {f: getattr(cfg, f) for f in fields}})


def _encode_unique(encode: Callable[[list[str]], list[list[int]]], texts: list[str]) -> Ragged:
    """Encode each distinct text once (Tatoeba repeats a third of its English sentences)."""
    first: dict[str, int] = {}
    rows = [first.setdefault(t, len(first)) for t in texts]
    return Ragged.from_lists(encode(list(first))).take(rows)


def _build(cfg: DatasetConfig, tok_cfg: TokenizerConfig, source: Source,
           vocab: Vocabulary | None) -> dict[str, Any]:
    """Read, sample, split, train the tokenizer (unless given) and encode: the cache's content.

    Texts are stored line-joined: one pickled string loads far faster than 100k small ones.
    """
    english, french, skipped = read_corpus(cfg, source)
    src, tgt = select_pairs(cfg, english, french)
    split = split_pairs(src, tgt, cfg.valid_size, cfg.test_size, cfg.split_seed)
    start = time.perf_counter()
    if vocab is None:
        vocab = train_tokenizers(tok_cfg, split.train.src, split.train.tgt)
    train_seconds = time.perf_counter() - start
    content: dict[str, Any] = {"format": CACHE_FORMAT, "vocab": vocab.to_json(), "text": {}, "ids": {}}
    for part in _PARTS:
        pairs: Parallel = getattr(split, part)
        content["text"][part] = {"src": "\n".join(pairs.src), "tgt": "\n".join(pairs.tgt), "n": len(pairs)}
        content["ids"][part] = {"src": _encode_unique(vocab.encode_src, pairs.src).state(),
                                "tgt": _encode_unique(vocab.encode_tgt, pairs.tgt).state()}
    content["meta"] = json.dumps({
        "source": source.name, "pairs_read": len(english), "skipped_lines": skipped,
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


def _cached_content(cfg: DatasetConfig, tok_cfg: TokenizerConfig,
                    vocab: Vocabulary | None) -> tuple[dict[str, Any], bool, Path]:
    """(content, cache hit?, cache file): reuse a cache whose vocabulary fits, else build one."""
    source = locate(cfg)
    folder = resolve_path(cfg.cache_dir) / "encoded"
    # A given vocabulary (resuming) reuses the regular cache when that holds the same tokenizer.
    keys = [cache_key(cfg, tok_cfg, source.fingerprint)]
    if vocab is not None:
        keys.append(cache_key(cfg, tok_cfg, source.fingerprint, vocab))
    for key in keys:
        content = _read_cache(folder / f"{key}.pt")
        if content is not None and (vocab is None or content["vocab"] == vocab.to_json()):
            return content, True, folder / f"{key}.pt"
    content = _build(cfg, tok_cfg, source, vocab)
    atomic_write(folder / f"{keys[-1]}.pt", lambda f: torch.save(content, f))
    return content, False, folder / f"{keys[-1]}.pt"


def _unpack(content: dict[str, Any], cfg: DatasetConfig) -> tuple[Split, dict[str, EncodedSplit]]:
    """Cache content back into the text split and the encoded splits."""
    texts, encoded = {}, {}
    for part in _PARTS:
        t, ids = content["text"][part], content["ids"][part]
        src, tgt = (t["src"].split("\n"), t["tgt"].split("\n")) if t["n"] else ([], [])
        texts[part] = Parallel(src, tgt)
        encoded[part] = EncodedSplit(Ragged.from_state(ids["src"]), Ragged.from_state(ids["tgt"]), src, tgt)
    meta = json.loads(content["meta"])
    split = Split(train=texts["train"], valid=texts["valid"], test=texts["test"], seed=cfg.split_seed,
                  valid_size=meta["valid_size"], test_size=meta["test_size"], source=meta["source"],
                  src_lang=cfg.src_lang, tgt_lang=cfg.tgt_lang)
    return split, encoded


def _apply_length_limits(cfg: DatasetConfig, encoded: dict[str, EncodedSplit]) -> dict[str, int]:
    """Drop training pairs outside min_len..max_len and cut held-out ids to max_len, in place; counts."""
    train = encoded["train"]
    src, tgt = train.src_lens, train.tgt_lens
    keep = (src >= cfg.min_len) & (src <= cfg.max_len) & (tgt >= cfg.min_len) & (tgt <= cfg.max_len)
    if not keep.any():
        raise DataError(f"all {len(train)} training pairs fall outside dataset.min_len="
                        f"{cfg.min_len}..dataset.max_len={cfg.max_len} tokens; widen that range")
    counts = {"train_dropped_by_length": int((~keep).sum())}
    if counts["train_dropped_by_length"]:
        log.info("dropped %d of %d training pairs outside %d..%d tokens",
                 counts["train_dropped_by_length"], len(train), cfg.min_len, cfg.max_len)
        encoded["train"] = train.subset(np.flatnonzero(keep))
    for part in ("valid", "test"):
        e = encoded[part]
        counts[f"{part}_truncated"] = int(((e.src_lens > cfg.max_len) | (e.tgt_lens > cfg.max_len)).sum())
        encoded[part] = EncodedSplit(e.src_ids.truncate(cfg.max_len), e.tgt_ids.truncate(cfg.max_len),
                                     e.src_text, e.tgt_text)
    return counts


def prepare_data(cfg: DatasetConfig, tok_cfg: TokenizerConfig, run_dir: Path | None = None,
                 vocab: Vocabulary | None = None) -> PreparedData:
    """Pairs -> split -> tokenizer -> ids (cached), then length limits; writes run_dir's split.

    `vocab` (e.g. from a checkpoint being resumed) replaces training a tokenizer. With run_dir, the
    split (see save_split) and the tokenizer JSON are written there.
    """
    start = time.perf_counter()
    cfg.check()
    content, hit, cache_file = _cached_content(cfg, tok_cfg, vocab)
    vocab = Vocabulary.from_json(content["vocab"])
    split, encoded = _unpack(content, cfg)
    counts = _apply_length_limits(cfg, encoded)
    if run_dir is not None:
        save_split(split, run_dir)
        vocab.save(run_dir)
    meta = json.loads(content["meta"])
    stats = {
        **{k: meta[k] for k in ("source", "pairs_read", "skipped_lines", "pairs_used",
                                "tokenizer_train_seconds")},
        "train_pairs": len(split.train), "valid_pairs": len(split.valid), "test_pairs": len(split.test),
        **counts, "train_kept": len(encoded["train"]), "src_vocab_size": vocab.src_vocab_size,
        "tgt_vocab_size": vocab.tgt_vocab_size, "cache_hit": hit, "cache_file": str(cache_file),
        "seconds": round(time.perf_counter() - start, 3),
    }
    data = PreparedData(vocab=vocab, train=encoded["train"], valid=encoded["valid"], test=encoded["test"],
                        stats=stats, split=split)
    log.info("data: %s (cache %s, %.2fs)", data.summary(), "hit" if hit else "miss", stats["seconds"])
    return data
