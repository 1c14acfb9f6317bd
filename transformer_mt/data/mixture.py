"""Several corpora in one run (`dataset.mix`): one tokenizer for all of them, each corpus encoded in a
cache of its own, and each epoch's training pairs drawn by weight.

The dataset's own corpus comes first and brings the held-out parts (its own, or its split); the corpora
of `dataset.mix` bring training pairs only, less any that share a sentence with those held-out parts.
A corpus of weight w is in an epoch floor(w) times, plus a fraction w - floor(w) of its pairs drawn anew
each epoch (fairseq's upsampling, Marian's data weighting): with every weight 1, an epoch is every pair
once. A tag (`dataset.tag`, `dataset.mix[k].tag`) is text put before each source sentence of a corpus,
as in tagged back-translation (Caswell et al., 2019); the corpora's training ids are held in memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from transformer_mt.config import DatasetConfig, TokenizerConfig, resolve_path
from transformer_mt.data.cache import CACHE_FORMAT, cached, training_sample
from transformer_mt.data.corpora import locate
from transformer_mt.data.encode import (
    EncodedSplit,
    PreparedData,
    apply_length_limits,
    prepare_corpus,
    write_summary,
)
from transformer_mt.data.languages import add_tokens, token_languages, write_split_files
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.text_variants import tokenizer_cases, tokenizer_pairs
from transformer_mt.data.tokenizer import Vocabulary, train_tokenizers
from transformer_mt.errors import ConfigError, DataError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Part:
    """One corpus's rows [start, stop) of the joint training split, and its weight."""

    name: str
    start: int
    stop: int
    weight: float
    # Which of the run's corpora the rows are of (0: dataset, k: dataset.mix[k-1]), whose variants, tag and
    # language they take; None: the part's own position. Distillation's original targets (training/
    # distill.py) are a second part of each corpus.
    corpus: int | None = None

    def share(self) -> tuple[int, int]:
        """(whole times, pairs drawn) of this corpus in each epoch: floor(weight) times all its pairs,
        plus round(fraction * pairs) drawn anew."""
        whole, fraction = divmod(self.weight, 1)
        return int(whole), round(fraction * (self.stop - self.start))


@dataclass(frozen=True)
class Mixture:
    """The corpora of a joint training split, and which of its rows each epoch holds."""

    parts: tuple[Part, ...]
    seed: int

    def corpora(self) -> list[int]:
        """The run's corpus (0: dataset, k: dataset.mix[k-1]) of each part."""
        return [k if p.corpus is None else p.corpus for k, p in enumerate(self.parts)]

    @property
    def varies(self) -> bool:
        """True when some weight has a fraction, so each epoch draws other rows."""
        return any(p.weight % 1 for p in self.parts)

    def rows(self, epoch: int) -> np.ndarray:
        """The rows of the joint split that `epoch` trains on (the batch sampler shuffles them)."""
        rng = np.random.default_rng([self.seed, epoch])
        rows = []
        for p in self.parts:
            whole, drawn = p.share()
            rows += [np.arange(p.start, p.stop)] * whole
            if drawn:
                rows.append(p.start + np.sort(rng.choice(p.stop - p.start, drawn, replace=False)))
        return np.concatenate(rows)

    def describe(self, rows: np.ndarray) -> str:
        """How many of `rows` each corpus gives, e.g. '29000 of train.en.gz (weight 1), ...'."""
        counts = [int(((rows >= p.start) & (rows < p.stop)).sum()) for p in self.parts]
        return ", ".join(f"{n} of {p.name} (weight {p.weight:g})" for n, p in zip(counts, self.parts))


def check_share(key: str, part: Part) -> None:
    """A corpus must give an epoch at least one pair: a weight below 1 / its pairs gives none (the
    fraction drawn rounds to 0), so the corpus would never be trained on."""
    if part.share() == (0, 0):
        pairs = part.stop - part.start
        raise ConfigError(f"{key}={part.weight:g} gives an epoch none of the {pairs} training pairs of "
                          f"{part.name} ({part.weight:g} x {pairs} rounds to 0 pairs); raise it to at least "
                          f"{1 / pairs:.2g}, or leave the corpus out")


def corpus_configs(cfg: DatasetConfig) -> list[DatasetConfig]:
    """The dataset section of each corpus: the dataset's own first, then those of dataset.mix."""
    return [dataclasses.replace(cfg, mix=[]), *(corpus.dataset(cfg) for corpus in cfg.mix)]


def _vocab_key(cfgs: list[DatasetConfig], tok_cfg: TokenizerConfig) -> str:
    """What decides a mixture's tokenizer: the corpora (their files' sizes and times too), their weights,
    the tokenizer settings."""
    tokenizer = {k: v for k, v in dataclasses.asdict(tok_cfg).items() if k not in ("dropout", "alpha")}
    unrelated = ("cache_dir", "mix", "variants")
    corpora = [{"files": locate(c).fingerprint, "cased": tokenizer_cases(c.variants),
                **{k: v for k, v in dataclasses.asdict(c).items() if k not in unrelated}} for c in cfgs]
    text = json.dumps({"format": CACHE_FORMAT, "tokenizer": tokenizer, "corpora": corpora}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def mixture_vocab(cfgs: list[DatasetConfig], tok_cfg: TokenizerConfig, languages: list[str]) -> Vocabulary:
    """One tokenizer for all the corpora, trained on a sample of their training pairs in the shares an
    epoch holds them, with a token for each of several target `languages` (cached by what decides it,
    so that a second run reuses it)."""
    path = resolve_path(cfgs[0].cache_dir) / "mixtures" / f"{_vocab_key(cfgs, tok_cfg)}.json"
    if path.is_file():
        return Vocabulary.from_json(json.loads(path.read_text(encoding="utf-8")))
    samples = [training_sample(c, tok_cfg.max_sentences) for c in cfgs]
    shares = np.array([n * c.weight for (_, n), c in zip(samples, cfgs)])
    wanted = min(tok_cfg.max_sentences, shares.sum()) * shares / shares.sum()
    rng = np.random.default_rng(cfgs[0].split_seed)
    pairs = []
    for (sample, _), n, c in zip(samples, wanted, cfgs):
        keep = rng.choice(len(sample), min(len(sample), round(n)), replace=False)
        pairs += tokenizer_pairs([sample[i] for i in np.sort(keep)], c.variants, c.split_seed)
    vocab = train_tokenizers(tok_cfg, [s for s, _ in pairs], [t for _, t in pairs], languages)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(vocab.to_json(), out)
    os.replace(tmp, path)
    return vocab


def _id_keys(encoded: list[list[int]]) -> set[bytes]:
    """Each sentence's int32 ids as bytes: equal sentences, encoded alike, give equal keys."""
    return {np.asarray(ids, dtype=np.int32).tobytes() for ids in encoded}


def _leak_free(train: EncodedSplit, held_out: list[EncodedSplit],
               vocab: Vocabulary) -> tuple[EncodedSplit, int]:
    """The training pairs that share no sentence with the held-out parts, and how many were left out."""
    src = _id_keys(vocab.encode_src([s for h in held_out for s in h.src_text or []]))
    tgt = _id_keys(vocab.encode_tgt([t for h in held_out for t in h.tgt_text or []]))
    keep = np.fromiter((s.tobytes() not in src and t.tobytes() not in tgt
                        for s, t in zip(train.src_ids, train.tgt_ids)), dtype=bool, count=len(train))
    return train.subset(np.flatnonzero(keep)), int((~keep).sum())


Encoded = tuple[EncodedSplit, str, bool]  # a corpus's training pairs, its name, whether its cache was hit


def _encode_corpora(cfgs: list[DatasetConfig], tok_cfg: TokenizerConfig, run_dir: Path | None,
                    vocab: Vocabulary) -> tuple[dict[str, PreparedData], list[Encoded]]:
    """Each target language's first corpus prepared as a run of its own (the dataset's with the run's
    split files), by language; and every corpus's (training pairs, name, cache hit)."""
    first = prepare_corpus(cfgs[0], tok_cfg, run_dir, vocab)
    own = {cfgs[0].tgt_lang: first}
    trains = [(first.train, first.stats["source"], first.stats["cache_hit"])]
    for corpus_cfg in cfgs[1:]:
        if corpus_cfg.tgt_lang not in own:
            data = own[corpus_cfg.tgt_lang] = prepare_corpus(corpus_cfg, tok_cfg, None, vocab)
            trains.append((data.train, data.stats["source"], data.stats["cache_hit"]))
            continue
        content, hit, _ = cached(corpus_cfg, tok_cfg, vocab)
        train, _ = apply_length_limits(corpus_cfg, EncodedSplit(*content.train), {})
        trains.append((train, content.meta["source"], hit))
    return own, trains


def prepare_mixture(cfg: DatasetConfig, tok_cfg: TokenizerConfig, run_dir: Path | None = None,
                    vocab: Vocabulary | None = None) -> PreparedData:
    """`prepare_corpus` for a dataset with `mix`: the first corpus prepared as a run of its own (held-out
    parts, split files, tokenizer), the others encoded with the same tokenizer and put after it. A
    corpus of a target language of its own is split as the first is (data/languages.py)."""
    cfgs = corpus_configs(cfg)
    languages = cfg.target_languages()
    vocab = vocab or mixture_vocab(cfgs, tok_cfg, languages if len(languages) > 1 else [])
    own, trains = _encode_corpora(cfgs, tok_cfg, run_dir, vocab)
    held_out = [part for data in own.values() for part in (data.valid, data.test)]
    splits, parts, corpora = [], [], []
    for k, ((train, name, hit), corpus_cfg) in enumerate(zip(trains, cfgs)):
        key, leaked = f"dataset.mix[{k - 1}]" if k else "dataset", 0
        if k or len(own) > 1:  # the first corpus's own split is leak-free already
            train, leaked = _leak_free(train, held_out, vocab)
            if not len(train):
                raise DataError(f"{key} ({name}) has no training pairs left once those sharing a sentence "
                                "with the valid and test pairs are left out; check its files")
        if k:
            tag = f", tag {corpus_cfg.tag!r}" if corpus_cfg.tag else ""
            log.info("mixed in %s: %d training pairs, weight %g%s (%d left out: in valid or test; cache %s)",
                     name, len(train), corpus_cfg.weight, tag, leaked, "hit" if hit else "miss")
        start = parts[-1].stop if parts else 0
        splits.append(train)
        parts.append(Part(name, start, start + len(train), corpus_cfg.weight))
        check_share(f"{key}.weight", parts[-1])
        corpora.append({"source": name, "train": len(train), "weight": corpus_cfg.weight,
                        "tag": corpus_cfg.tag, "tgt_lang": corpus_cfg.tgt_lang,
                        **({"left_out_as_held_out": leaked} if k else {})})
    joint = EncodedSplit(Ragged.concat([s.src_ids for s in splits]),
                         Ragged.concat([s.tgt_ids for s in splits]))
    first = own[cfg.tgt_lang]
    summary = {**first.summary, "mixture": corpora}
    directions = {lang: (data.valid, data.test) for lang, data in own.items()} if len(own) > 1 else {}
    if run_dir is not None:
        write_summary(run_dir, summary)
        if directions:
            write_split_files(run_dir, {lang: Path(data.stats["cache_dir"]) for lang, data in own.items()})
    return dataclasses.replace(first, train=joint, stats={**first.stats, "train_kept": len(joint),
                                                          "mixture": corpora},
                               summary=summary, mixture=Mixture(tuple(parts), cfg.split_seed),
                               directions=directions)


def prepare_data(cfg: DatasetConfig, tok_cfg: TokenizerConfig, run_dir: Path | None = None,
                 vocab: Vocabulary | None = None) -> PreparedData:
    """The data side of a run: its corpus (encode.prepare_corpus), or its corpora (prepare_mixture)."""
    cfg.check()
    if vocab is not None:
        token_languages(cfg, vocab)  # before any work: a given tokenizer must have the run's languages
    data = (prepare_mixture if cfg.mix else prepare_corpus)(cfg, tok_cfg, run_dir, vocab)
    return add_tokens(data, cfg)
