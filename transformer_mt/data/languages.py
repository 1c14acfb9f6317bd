"""Several target languages in one model: a token before each source says which language to translate
into (`<2fr>`, `<2de>`; Johnson et al., 2017, as fairseq's `--encoder-langtok tgt` and Marian's
`>>fra<<`).

A run has several when a corpus of `dataset.mix` names a target language of its own
(`dataset.mix[k].tgt_lang`). The tokenizer then reserves a token for each language (data/tokenizer.py),
each such corpus brings held-out parts of its own (drawn from its pairs as the dataset's are), no
training pair of any corpus shares a sentence with any held-out part, and every source, held-out ones
included, starts with its target language's token. The run validates each language as a direction of
its own (training/validation.py); `translate`, `serve` and `evaluate` take `tgt_lang=`. A run of one
target language (several sources into it included) has no token. So does a fine-tuning run's data
when its parent has tokens: its sources get them too.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np

from transformer_mt.config import DatasetConfig
from transformer_mt.data.encode import EncodedSplit, PreparedData
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.errors import ConfigError

PARTS = ("valid", "test")


def split_file(run_dir: Path, part: str, lang: str | None = None) -> Path:
    """A run's held-out file: split/valid.tsv (its first target language's), or split/valid.<lang>.tsv
    (each language's, in a run of several)."""
    return Path(run_dir) / SPLIT_DIR / (f"{part}.{lang}.tsv" if lang else f"{part}.tsv")


def prefixed(ids: Ragged, token_id: int) -> Ragged:
    """Each sequence with `token_id` put before it (a new flat array)."""
    lengths = ids.lengths + 1
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.empty(int(offsets[-1]), dtype=np.int32)
    rest = np.ones(len(flat), dtype=bool)
    rest[offsets[:-1]] = False
    flat[offsets[:-1]] = token_id
    flat[rest] = Ragged.concat([ids]).flat
    return Ragged.from_offsets(flat, offsets)


def with_token(split: EncodedSplit, token_id: int) -> EncodedSplit:
    """The split with its target language's token before each source (its text unchanged)."""
    return dataclasses.replace(split, src_ids=prefixed(split.src_ids, token_id))


def token_languages(cfg: DatasetConfig, vocab: Vocabulary) -> list[str]:
    """The run's target languages if its sources carry language tokens (several, or a tokenizer that has
    them), else []. ConfigError when the tokenizer lacks one of them."""
    languages = cfg.target_languages()
    if len(languages) == 1 and not vocab.target_languages:
        return []
    missing = [lang for lang in languages if lang not in vocab.target_languages]
    if missing:
        there = ", ".join(vocab.target_languages) or "none"
        raise ConfigError(f"the tokenizer this run starts from has no token for target language(s) "
                          f"{', '.join(missing)} (it has: {there}); a model of several target languages is "
                          "trained with all of them from the start: leave init= out, or those corpora")
    return languages


def add_tokens(data: PreparedData, cfg: DatasetConfig) -> PreparedData:
    """`data` with each source led by its target language's token, where the run has tokens: the
    training rows by the corpus they come from, the held-out parts by their language."""
    languages = token_languages(cfg, data.vocab)
    if not languages:
        return data
    ids = {lang: data.vocab.language_id(lang) for lang in languages}
    corpus_langs = [cfg.tgt_lang, *(corpus.tgt_lang or cfg.tgt_lang for corpus in cfg.mix)]
    if data.mixture is None:
        train = with_token(data.train, ids[cfg.tgt_lang])
    else:
        pieces = [with_token(data.train.subset(range(part.start, part.stop)), ids[corpus_langs[k]])
                  for part, k in zip(data.mixture.parts, data.mixture.corpora())]
        train = EncodedSplit(Ragged.concat([p.src_ids for p in pieces]), data.train.tgt_ids)
    directions = data.directions or {cfg.tgt_lang: (data.valid, data.test)}
    directions = {lang: (with_token(valid, ids[lang]), with_token(test, ids[lang]))
                  for lang, (valid, test) in directions.items()}
    valid, test = directions[cfg.tgt_lang]
    return dataclasses.replace(data, train=train, valid=valid, test=test, directions=directions)


def write_split_files(run_dir: Path, folders: dict[str, Path]) -> None:
    """Each language's held-out files, split/valid.<lang>.tsv and test.<lang>.tsv, from the cache
    folder its corpus was split in."""
    for lang, folder in folders.items():
        for part in PARTS:
            shutil.copyfile(folder / f"{part}.tsv", split_file(run_dir, part, lang))
