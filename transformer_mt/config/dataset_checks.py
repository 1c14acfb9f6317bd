"""The rules between a dataset's keys: its corpus and files, the corpora of a mix, their input variants and
target languages. (Each key's own range is in checks.py, which applies these with the other sections'.)"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING

from transformer_mt.config.problems import Rule, out_of_range

if TYPE_CHECKING:  # types only: the schemas import this module
    from transformer_mt.config import schema

# What a target language may be called in a model of several: it names a token, <2fr> (data/tokenizer.py).
LANGUAGE_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")

# How many times an epoch holds a corpus's pairs (data/mixture.py): inf or nan would make no epoch.
MIX_WEIGHT: Rule = (lambda v: math.isfinite(v) and v > 0,
                    "a finite number > 0 (leave a corpus out of dataset.mix rather than weigh it 0)")

def dataset_relations(d: schema.DatasetConfig) -> list[str]:
    """The rules between dataset keys, and those of each corpus of dataset.mix."""
    found = out_of_range("dataset.max_len", d.max_len, d.max_len >= max(1, d.min_len),
                         f">= dataset.min_len ({d.min_len}) and >= 1")
    if d.src_lang == d.tgt_lang:
        found.append(f"dataset.src_lang and dataset.tgt_lang are both {d.src_lang!r}; translate between two")
    if d.name == "tatoeba" and "en" not in (d.src_lang, d.tgt_lang):  # every Tatoeba file is <lang>-eng
        found.append(f"dataset=tatoeba pairs English with another language: set dataset.src_lang or "
                     f"dataset.tgt_lang to en (they are {d.src_lang!r}, {d.tgt_lang!r})")
    if d.name == "tatoeba" and not d.path:
        found.append("dataset=tatoeba needs dataset.path=<the <lang>-eng.zip or its .txt>")
    if d.name == "parallel":
        found += _parallel_files(d)
    if d.tag is not None and (not d.tag.strip() or any(c in d.tag for c in "\t\r\n")):
        found.append(f"dataset.tag={d.tag!r}: give a tag of visible text on one line, e.g. <bt>, or null")
    found += _variants_problems("dataset.variants", d.variants)
    languages = d.target_languages()
    if len(languages) > 1 and (bad := [lang for lang in languages if not LANGUAGE_CODE.fullmatch(lang)]):
        found.append(f"target language(s) {', '.join(map(repr, bad))} cannot name a language token (<2fr>): "
                     "use letters, digits, _ or -, starting with a letter (fr, de, pt_BR)")
    for k, corpus in enumerate(d.mix):
        found += _mixed_corpus(d, k, corpus)
    if d.name in ("hf", "opus_books") and not (d.hf_path or d.hf_data_files):
        found.append(f"dataset={d.name} needs dataset.hf_path=<a hub dataset or a save_to_disk directory> "
                     "(or dataset.hf_data_files=<.jsonl>)")
    return found


MIXABLE = ("tatoeba", "parallel", "hf")  # the corpora dataset.mix reads


def _mixed_corpus(d: schema.DatasetConfig, k: int, corpus: schema.MixedCorpus) -> list[str]:
    """A corpus of dataset.mix: its own keys, then the dataset rules of the section that reads it."""
    key = f"dataset.mix[{k}]"
    if corpus.name not in MIXABLE:
        return [f"{key}.name={corpus.name!r} is not allowed; choose one of: {', '.join(MIXABLE)}"]
    found = out_of_range(f"{key}.weight", corpus.weight, MIX_WEIGHT[0](corpus.weight), MIX_WEIGHT[1])
    pairs = corpus.max_pairs
    found += out_of_range(f"{key}.max_pairs", pairs, pairs is None or pairs >= 10, ">= 10 or null")
    if corpus.variants is not None:
        found += _variants_problems(f"{key}.variants", corpus.variants)
    shared = ("dataset.max_len", "dataset.variants", "target language")  # the dataset's: reported once
    if not (corpus.src_lang or corpus.tgt_lang):
        shared += ("dataset.src_lang and",)
    return found + [f"{key}: " + p.replace("dataset.", f"{key}.") for p in
                    dataset_relations(corpus.dataset(d)) if not p.startswith(shared)]


def _variants_problems(key: str, v: schema.VariantsConfig) -> list[str]:
    """Each variant's probability in [0, 1]; the three cases, of which a pair shows one, at most 1 in all."""
    found = []
    for name, p in dataclasses.asdict(v).items():
        found += out_of_range(f"{key}.{name}", p, 0.0 <= p <= 1.0, "in [0, 1]")
    if (cases := v.caps + v.title + v.lower) > 1.0:
        found.append(f"{key}.caps + {key}.title + {key}.lower = {cases:g}: a pair shows one case at most, "
                     "so the three must add up to 1 or less")
    return found


def _parallel_files(d: schema.DatasetConfig) -> list[str]:
    """Each part as two files (its src_path and tgt_path) or one TSV; training data is required."""
    found = []
    for part, pair, tsv in (("", (d.src_path, d.tgt_path), d.path),
                            ("valid_", (d.valid_src_path, d.valid_tgt_path), d.valid_path),
                            ("test_", (d.test_src_path, d.test_tgt_path), d.test_path)):
        if bool(pair[0]) != bool(pair[1]):
            found.append(f"dataset.{part}src_path and dataset.{part}tgt_path go together; give both")
        elif pair[0] and tsv:
            found.append(f"dataset.{part}path (a TSV) and dataset.{part}src_path/tgt_path are two ways "
                         "to give the same pairs; keep one")
    if not (d.src_path or d.path):
        found.append("dataset=parallel needs its training pairs: dataset.src_path=<file> "
                     "dataset.tgt_path=<file>, or dataset.path=<source<TAB>target file>")
    if (d.test_src_path or d.test_path) and not (d.valid_src_path or d.valid_path):
        found.append("dataset=parallel takes test pairs with valid pairs of their own: add dataset."
                     "valid_src_path/valid_tgt_path (or valid_path), or leave both to the split")
    return found
