"""The encoded corpus on disk: built in three streaming passes over the corpus, memory-mapped when loaded.

1. Keys: one hash per sentence, 16 bytes a pair, from which the leak-free split is decided.
2. Text: the valid and test pairs, and a bounded sample of training pairs for the tokenizer.
3. Ids: the training pairs tokenized in chunks and appended to a flat int32 file, then laid out in the
   split's order (a chunk at a time) in the file later runs memory-map.

A cache directory `<cache_dir>/encoded/<key>/` holds train.{src,tgt}.bin with their offsets, the split
order, the valid/test text and ids, the vocabulary and meta.json. It is written under a temporary name
and renamed, so a crash never leaves half a cache behind.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from transformer_mt.config import DatasetConfig, TokenizerConfig, resolve_path
from transformer_mt.data.corpora import Corpus, Skipped, locate
from transformer_mt.data.memory import index_type, release_freed_memory
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.split import TEST, TRAIN, VALID, assign, sentence_key
from transformer_mt.data.text_variants import tokenizer_cases, tokenizer_pairs
from transformer_mt.data.tokenizer import Vocabulary, train_tokenizers
from transformer_mt.errors import DataError

log = logging.getLogger(__name__)
CACHE_FORMAT = 4  # bump when the cached content or its layout changes (4: a lone \r ends a line)
CHUNK = 50_000  # pairs tokenized at a time
GATHER = 65_536  # training pairs put in split order at a time


def _sha256_json(value: Any) -> str:
    """Stable digest of JSON-able data (sorted keys)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def cache_key(cfg: DatasetConfig, tok_cfg: TokenizerConfig, fingerprint: dict[str, Any],
              vocab: Vocabulary | None = None) -> str:
    """sha256 of what decides the cached content (not min_len/max_len: they are applied after)."""
    fields = ("name", "src_lang", "tgt_lang", "max_pairs", "valid_size", "test_size", "split_seed", "tag")
    sampling = ("dropout", "alpha")  # how training re-segments each epoch, not what is cached
    tokenizer = ({k: v for k, v in dataclasses.asdict(tok_cfg).items() if k not in sampling} if vocab is None
                 else {"vocab_sha256": _sha256_json(vocab.to_json())})
    if vocab is None and (cased := tokenizer_cases(cfg.variants)):
        tokenizer["cased"] = cased  # the tokenizer's sample shows them (text_variants.tokenizer_pairs)
    return _sha256_json({"format": CACHE_FORMAT, "source": fingerprint, "tokenizer": tokenizer,
                         "dataset": {f: getattr(cfg, f) for f in fields}})


@dataclass
class SplitPlan:
    """Which pairs of the corpus go where: corpus indices of train (in split order), valid and test
    (in split order; empty when the corpus brings its own)."""

    count: int
    skipped: int
    used: int
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    valid_size: int
    test_size: int


def _keys(corpus: Corpus) -> tuple[np.ndarray, np.ndarray, int]:
    """Pass 1: the key of every training pair's source and target sentence."""
    skipped = Skipped()
    src, tgt = array.array("q"), array.array("q")  # 8 bytes a key, not a Python int each
    for s, t in corpus.pairs("train", skipped):
        src.append(sentence_key(s))
        tgt.append(sentence_key(t))
    if not src:
        raise DataError(f"{corpus.name} holds no pairs with text on both sides ({skipped.count} skipped); "
                        "check the dataset settings and the file's format")
    return np.frombuffer(src, dtype=np.int64), np.frombuffer(tgt, dtype=np.int64), skipped.count


def sample_indices(n: int, max_pairs: int | None, seed: int) -> np.ndarray:
    """The pairs dataset.max_pairs keeps, in corpus order: drawn uniformly, since corpora are often
    sorted (Tatoeba by length); all of them without a limit."""
    if max_pairs is None or max_pairs >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_pairs, replace=False))


def _plan(cfg: DatasetConfig, corpus: Corpus, held_out: dict[str, list[tuple[str, str]]]) -> SplitPlan:
    """The split: drawn from the training pairs, or around the corpus's own valid/test parts, leaving out
    training pairs that share a sentence with them."""
    src_keys, tgt_keys, skipped = _keys(corpus)
    if skipped:
        log.warning("skipped %d malformed lines or pairs with an empty side of %s", skipped, corpus.name)
    n = len(src_keys)
    chosen = sample_indices(n, cfg.max_pairs, cfg.split_seed)
    empty = np.zeros(0, dtype=np.int64)
    used, valid_size = len(chosen), cfg.valid_size
    if corpus.held_out:
        seen = [np.fromiter({sentence_key(p[side]) for pairs in held_out.values() for p in pairs}, np.int64)
                for side in (0, 1)]
        clean = ~np.isin(src_keys[chosen], seen[0]) & ~np.isin(tgt_keys[chosen], seen[1])
        if not clean.all():
            log.info("left out %d training pairs that share a sentence with valid or test", (~clean).sum())
        chosen, valid_size = chosen[clean], 0
        if held_out["test"] or not cfg.test_size:  # its own test part, or none wanted (test_size=0)
            return SplitPlan(n, skipped, used, chosen, empty, empty, len(held_out["valid"]),
                             len(held_out["test"]))
        # a valid part but no test part: the test split is drawn from the training pairs
    split = assign(src_keys[chosen], tgt_keys[chosen], valid_size, cfg.test_size, cfg.split_seed)
    release_freed_memory()
    return SplitPlan(n, skipped, used, chosen[split.orders[TRAIN]], chosen[split.orders[VALID]],
                chosen[split.orders[TEST]], len(held_out["valid"]) if held_out else split.valid_size,
                split.test_size)


def _texts(corpus: Corpus, plan: SplitPlan, limit: int,
           seed: int) -> tuple[dict[str, list], list[tuple[str, str]]]:
    """Pass 2: the valid and test pairs (split order), and the tokenizer's training pairs: all of them
    in split order, or `limit` drawn at random when there are more."""
    # where a pair goes: its place in one of the lists
    slot = np.full(plan.count, -1, dtype=index_type(plan.count))
    home = np.full(plan.count, -1, dtype=np.int8)
    sample = plan.train
    if len(sample) > limit:
        drawn = np.random.default_rng(seed).choice(len(plan.train), limit, replace=False)
        sample = plan.train[np.sort(drawn)]
    for part, indices in ((VALID, plan.valid), (TEST, plan.test), (TRAIN, sample)):
        slot[indices], home[indices] = np.arange(len(indices)), part
    lists: dict[int, list] = {VALID: [None] * len(plan.valid), TEST: [None] * len(plan.test),
                              TRAIN: [None] * len(sample)}
    for i, pair in enumerate(corpus.pairs("train")):
        if home[i] >= 0:
            lists[int(home[i])][int(slot[i])] = pair
    return {"valid": lists[VALID], "test": lists[TEST]}, lists[TRAIN]


def _encode_side(encode: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths) of texts, each distinct text encoded once (Tatoeba repeats a third of its English)."""
    first: dict[str, int] = {}
    rows = [first.setdefault(t, len(first)) for t in texts]
    unique = encode(list(first))
    lengths = np.fromiter((len(unique[r]) for r in rows), dtype=np.int32, count=len(rows))
    ids = np.fromiter((i for r in rows for i in unique[r]), dtype=np.int32, count=int(lengths.sum()))
    return ids, lengths


def _encode_train(corpus: Corpus, plan: SplitPlan, vocab: Vocabulary, folder: Path) -> str:
    """Pass 3: the training pairs' ids, tokenized chunk by chunk in corpus order, then laid out in split
    order in train.{src,tgt}.bin with their offsets; returns the sha256 of the training pairs (in corpus
    order)."""
    is_train = np.zeros(plan.count, dtype=bool)
    is_train[plan.train] = True
    lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    digest = hashlib.sha256()
    scratch = {side: folder / f"corpus_order.{side}.bin" for side in ("src", "tgt")}
    with scratch["src"].open("wb") as src_file, scratch["tgt"].open("wb") as tgt_file:
        def flush(chunk: list[tuple[str, str]]) -> None:
            for column, (side, file, encode) in enumerate((("src", src_file, vocab.encode_src),
                                                          ("tgt", tgt_file, vocab.encode_tgt))):
                ids, lens = _encode_side(encode, [p[column] for p in chunk])
                ids.tofile(file)
                lengths[side].append(lens)
            release_freed_memory()

        chunk: list[tuple[str, str]] = []
        for i, pair in enumerate(corpus.pairs("train")):
            if is_train[i]:
                chunk.append(pair)
                digest.update(f"{pair[0]}\t{pair[1]}\n".encode())
                if len(chunk) == CHUNK:
                    flush(chunk)
                    chunk = []
        if chunk:
            flush(chunk)
    # plan.train is in split order; the scratch files are in corpus order: where each split position lies.
    position = np.searchsorted(np.sort(plan.train), plan.train).astype(index_type(len(plan.train)))
    del is_train
    for side in ("src", "tgt"):
        lens = np.concatenate(lengths.pop(side) or [np.zeros(0, np.int32)])
        _write_in_order(scratch[side], lens, position, folder / f"train.{side}")
        scratch[side].unlink()
    return digest.hexdigest()


def _ids(path: Path) -> np.ndarray:
    """The int32 ids of a .bin file, memory-mapped (an empty file maps to an empty array)."""
    return np.memmap(path, dtype=np.int32, mode="r") if path.stat().st_size else np.zeros(0, np.int32)


def _write_in_order(path: Path, lengths: np.ndarray, order: np.ndarray, stem: Path) -> None:
    """The sequences of the flat int32 file `path` (lengths in file order) written to stem.bin in `order`,
    with their offsets in stem.offsets.npy. The rows are read with pread, GATHER at a time: a memory
    map would do for the jumps all over the file, but the kernel maps whole blocks around each row read
    (fault-around, large folios), so the process would hold the whole file resident."""
    starts = np.zeros(len(lengths) + 1, dtype=index_type(int(lengths.sum(dtype=np.int64))))
    np.cumsum(lengths, out=starts[1:])
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths[order], out=offsets[1:])
    with path.open("rb") as src, Path(f"{stem}.bin").open("wb") as out:
        fd = src.fileno()
        for first in range(0, len(order), GATHER):
            rows = order[first:first + GATHER]
            where, size = (4 * starts[rows].astype(np.int64)).tolist(), (4 * lengths[rows]).tolist()
            out.write(b"".join(os.pread(fd, n, at) for at, n in zip(where, size)))
    np.save(Path(f"{stem}.offsets.npy"), offsets)


def _write_part(folder: Path, name: str, pairs: list[tuple[str, str]], vocab: Vocabulary) -> None:
    """A held-out part: its text (name.tsv, also the run's split file) and ids (name.npz)."""
    lines = []
    for s, t in pairs:
        lines.append(f"{s}\t{t}\n")
    (folder / f"{name}.tsv").write_text("".join(lines), encoding="utf-8")
    arrays = {}
    for side, encode, texts in (("src", vocab.encode_src, [p[0] for p in pairs]),
                                ("tgt", vocab.encode_tgt, [p[1] for p in pairs])):
        ids, lengths = _encode_side(encode, texts)
        arrays[f"{side}_ids"], arrays[f"{side}_offsets"] = ids, np.r_[0, np.cumsum(lengths, dtype=np.int64)]
    np.savez(folder / f"{name}.npz", **arrays)


def build(cfg: DatasetConfig, tok_cfg: TokenizerConfig, corpus: Corpus, vocab: Vocabulary | None,
          folder: Path) -> None:
    """Read, split, train the tokenizer (unless given) and encode into folder (renamed into place)."""
    held_out = {p: list(corpus.pairs(p)) for p in ("valid", "test")} if corpus.held_out else {}
    plan = _plan(cfg, corpus, held_out)
    texts, sample = _texts(corpus, plan, tok_cfg.max_sentences, cfg.split_seed)
    texts = {part: held_out.get(part) or texts[part] for part in ("valid", "test")}
    started = time.perf_counter()
    if vocab is None:
        sample = tokenizer_pairs(sample, cfg.variants, cfg.split_seed)
        vocab = train_tokenizers(tok_cfg, [p[0] for p in sample], [p[1] for p in sample])
    sample_size = len(sample)
    del sample  # up to tokenizer.max_sentences pairs of text: not kept while the corpus is encoded
    release_freed_memory()
    train_seconds = time.perf_counter() - started
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        digest = _encode_train(corpus, plan, vocab, tmp)
        for name in ("valid", "test"):
            _write_part(tmp, name, texts[name], vocab)
        (tmp / "vocab.json").write_text(json.dumps(vocab.to_json()), encoding="utf-8")
        meta = {"format": CACHE_FORMAT, "source": corpus.name, "pairs_read": plan.count,
                "skipped_lines": plan.skipped, "pairs_used": plan.used, "tokenizer_pairs": sample_size,
                "tokenizer_train_seconds": round(train_seconds, 3), "summary": {
                    "source": corpus.name, "src_lang": cfg.src_lang, "tgt_lang": cfg.tgt_lang,
                    "seed": cfg.split_seed, "valid_size": plan.valid_size, "test_size": plan.test_size,
                    "held_out_given": corpus.held_out,
                    "counts": {"train": len(plan.train), "valid": len(texts["valid"]),
                               "test": len(texts["test"])},
                    "train_sha256": digest}}  # of the training pairs in corpus order
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        if folder.exists() and load(folder) is None:  # a damaged cache of the same key: replace it
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process wrote the same cache meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@dataclass
class Cached:
    """A cache directory's content: memory-mapped training ids, held-out parts in memory."""

    vocab: Vocabulary
    meta: dict[str, Any]
    train: tuple[Ragged, Ragged]  # (src, tgt), in split order
    held_out: dict[str, tuple[Ragged, Ragged, list[str], list[str]]]  # part -> (src, tgt, src/tgt text)


def load(folder: Path) -> Cached | None:
    """The cache in folder, or None when it is absent, of another format or damaged."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != CACHE_FORMAT:
            return None
        vocab = Vocabulary.from_json(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
        train = tuple(Ragged.from_offsets(_ids(folder / f"train.{side}.bin"),
                                          np.load(folder / f"train.{side}.offsets.npy", mmap_mode="r"))
                      for side in ("src", "tgt"))
        held_out = {}
        for name in ("valid", "test"):
            with np.load(folder / f"{name}.npz") as arrays:
                src = Ragged.from_offsets(arrays["src_ids"], arrays["src_offsets"])
                tgt = Ragged.from_offsets(arrays["tgt_ids"], arrays["tgt_offsets"])
            lines = [line.split("\t") for line in (folder / f"{name}.tsv").read_text(encoding="utf-8")
                     .split("\n") if line]
            held_out[name] = (src, tgt, [p[0] for p in lines], [p[1] for p in lines])
    except Exception as e:  # noqa: BLE001 - missing, truncated or of another version: rebuilt
        if folder.exists():
            log.warning("ignoring unreadable cache %s (%s)", folder, type(e).__name__)
        return None
    return Cached(vocab, meta, train, held_out)  # type: ignore[arg-type]


def cached(cfg: DatasetConfig, tok_cfg: TokenizerConfig,
           vocab: Vocabulary | None) -> tuple[Cached, bool, Path]:
    """(content, cache hit?, cache folder): reuse a cache whose vocabulary fits, else build one."""
    corpus = locate(cfg)
    root = resolve_path(cfg.cache_dir) / "encoded"
    # A given vocabulary (resuming, fine-tuning) reuses the regular cache when that holds the same tokenizer.
    keys = [cache_key(cfg, tok_cfg, corpus.fingerprint)]
    if vocab is not None:
        keys.append(cache_key(cfg, tok_cfg, corpus.fingerprint, vocab))
    for key in keys:
        content = load(root / key)
        if content is not None and (vocab is None or content.vocab.to_json() == vocab.to_json()):
            return content, True, root / key
    build(cfg, tok_cfg, corpus, vocab, root / keys[-1])
    content = load(root / keys[-1])
    assert content is not None, f"the cache just written to {root / keys[-1]} does not load"
    return content, False, root / keys[-1]


def training_sample(cfg: DatasetConfig, limit: int) -> tuple[list[tuple[str, str]], int]:
    """Up to `limit` of the corpus's training pairs drawn at random, as the tokenizer's sample is, and how
    many training pairs it has."""
    corpus = locate(cfg)
    given = {p: list(corpus.pairs(p)) for p in ("valid", "test")} if corpus.held_out else {}
    plan = _plan(cfg, corpus, given)
    return _texts(corpus, plan, limit, cfg.split_seed)[1], len(plan.train)


def training_pairs(cfg: DatasetConfig) -> Iterator[tuple[str, str]]:
    """The corpus's training pairs as its split leaves them (dataset.max_pairs drawn, the held-out parts
    and their sentences left out), streamed in corpus order: nothing the size of the corpus is held."""
    corpus = locate(cfg)
    given = {p: list(corpus.pairs(p)) for p in ("valid", "test")} if corpus.held_out else {}
    plan = _plan(cfg, corpus, given)
    is_train = np.zeros(plan.count, dtype=bool)
    is_train[plan.train] = True
    del plan
    for i, pair in enumerate(corpus.pairs("train")):
        if is_train[i]:
            yield pair


def held_out_pairs(cfg: DatasetConfig, part: str) -> list[tuple[str, str]]:
    """A run's valid or test pairs, drawn again from its dataset config (as prepare_data drew them)."""
    corpus = locate(cfg)
    given = {p: list(corpus.pairs(p)) for p in ("valid", "test")} if corpus.held_out else {}
    if given.get(part) or (given and part == "valid"):
        return given[part]
    return _texts(corpus, _plan(cfg, corpus, given), 0, cfg.split_seed)[0][part]
