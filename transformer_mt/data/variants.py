"""Input as people type it: training pairs shown now and then in a form their corpus rarely holds.

Five variants (`dataset.variants`, or `dataset.mix[k].variants` for one corpus of a mix), each drawn
for each training pair with its own probability, anew each epoch from the run's seed (a resumed run
draws the same), on the text, before subword segmentation:

- `caps` ALL CAPS, `title` Title Case, `lower` all lowercase: the source and the target together, so
  that the output's case follows the input's; at most one of the three for a pair;
- `no_punct`: the source's final punctuation left out (the target keeps its own);
- `typos`: the source's longer words misspelt (`add_typos`), the target spelt right.

Validation and test pairs are never varied; `transformer-mt evaluate robustness=true` scores a model on
the same variants of its test split (decoding/robustness.py). How each variant writes a text is
data/text_variants.py's, which also gives the tokenizer the cased forms (data/cache.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from transformer_mt.config import DatasetConfig, VariantsConfig
from transformer_mt.data.encode import EncodedSplit
from transformer_mt.data.mixture import Mixture
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.text_variants import CASES, NAMES, add_typos, drop_final_punct, pick_case
from transformer_mt.data.tokenizer import UNK_ID, Vocabulary


@dataclass(frozen=True)
class Draw:
    """What one pair shows in one epoch."""

    case: str | None
    no_punct: bool
    typos: bool

    def source(self, text: str, rng: random.Random) -> str:
        if self.case:
            text = CASES[self.case](text)
        if self.no_punct:
            text = drop_final_punct(text)
        return add_typos(text, rng) if self.typos else text

    def target(self, text: str) -> str:
        return CASES[self.case](text) if self.case else text


def draw(cfg: VariantsConfig, rng: random.Random) -> Draw | None:
    """One pair's variants for one epoch (three numbers drawn, whatever the probabilities)."""
    u_case, u_punct, u_typos = rng.random(), rng.random(), rng.random()
    picked = Draw(pick_case(cfg, u_case), u_punct < cfg.no_punct, u_typos < cfg.typos)
    return picked if picked != Draw(None, False, False) else None


@dataclass(frozen=True)
class CorpusVariants:
    """Rows [start, stop) of the training split, their variants' probabilities and their tag."""

    start: int
    stop: int
    variants: VariantsConfig
    tag: str | None


class InputVariants:
    """Gives each epoch the training pairs with the variants drawn for it."""

    def __init__(self, vocab: Vocabulary, corpora: Sequence[CorpusVariants], seed: int, max_len: int) -> None:
        self.vocab = vocab
        self.corpora = tuple(corpora)
        self.seed = seed
        self.max_len = max_len
        # a source's target-language token (data/languages.py) is kept as it is, before the varied text
        self.language_ids = {vocab.language_id(lang) for lang in vocab.target_languages}

    def apply(self, split: EncodedSplit, epoch: int) -> tuple[EncodedSplit, dict[str, int]]:
        """`epoch`'s pairs, and how many pairs show each variant. A pair whose ids hold <unk> (its text
        cannot be recovered), or whose varied ids would pass dataset.max_len, is left as it is."""
        rng = random.Random(f"input-variants:{self.seed}:{epoch}")  # string seeds are stable everywhere
        drawn = [(row, d, corpus.tag) for corpus in self.corpora for row in range(corpus.start, corpus.stop)
                 if (d := draw(corpus.variants, rng)) is not None]
        drawn = [(row, d, tag) for row, d, tag in drawn
                 if UNK_ID not in split.src_ids[row] and UNK_ID not in split.tgt_ids[row]]
        if not drawn:
            return split, {}
        rows = [row for row, _, _ in drawn]
        sources = self.vocab.decode_src([split.src_ids[r].tolist() for r in rows])
        targets = self.vocab.decode_tgt([split.tgt_ids[r].tolist() for r in rows])
        sources = [_tagged(lambda s, d=d: d.source(s, rng), s, tag) for (_, d, tag), s in zip(drawn, sources)]
        targets = [d.target(t) for (_, d, _), t in zip(drawn, targets)]
        firsts = [int(split.src_ids[r][0]) if len(split.src_ids[r]) else -1 for r in rows]
        leads = [[first] if first in self.language_ids else [] for first in firsts]
        src_new = [lead + ids for lead, ids in zip(leads, self.vocab.encode_src(sources))]
        tgt_new = self.vocab.encode_tgt(targets)
        fits = [len(s) - len(lead) <= self.max_len and len(t) <= self.max_len
                for s, t, lead in zip(src_new, tgt_new, leads)]
        kept = [i for i, ok in enumerate(fits) if ok]
        where = np.arange(len(split))
        where[[rows[i] for i in kept]] = len(split) + np.arange(len(kept))
        varied = EncodedSplit(_replaced(split.src_ids, [src_new[i] for i in kept], where),
                              _replaced(split.tgt_ids, [tgt_new[i] for i in kept], where),
                              split.src_text, split.tgt_text)
        counts = {name: sum(1 for i in kept if shows(drawn[i][1], name)) for name in NAMES}
        return varied, {name: n for name, n in counts.items() if n}


def _tagged(vary: Callable[[str], str], source: str, tag: str | None) -> str:
    """`vary` applied to a source without the tag its corpus puts before it (corpora.py)."""
    prefix = f"{tag.strip()} " if tag else ""
    if prefix and source.startswith(prefix):
        return prefix + vary(source[len(prefix):])
    return vary(source)


def shows(d: Draw, name: str) -> bool:
    """Whether a pair drawn `d` shows the variant `name`."""
    return d.case == name if name in CASES else getattr(d, name)


def _replaced(ids: Ragged, new: list[list[int]], where: np.ndarray) -> Ragged:
    """`ids` with the rows `where` points past its end replaced by `new`, in that order."""
    lengths = np.array([len(n) for n in new], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.fromiter((i for n in new for i in n), dtype=np.int32, count=int(offsets[-1]))
    return Ragged.concat([ids, Ragged.from_offsets(flat, offsets)]).take(where)


def build(vocab: Vocabulary, cfg: DatasetConfig, mixture: Mixture | None, seed: int,
          rows: int) -> InputVariants | None:
    """The run's variants over its `rows` training pairs, or None when no corpus asks for any.
    Corpora of a mix take their own `variants`, or the dataset's when they give none."""
    if mixture is None:
        corpora = [CorpusVariants(0, rows, cfg.variants, cfg.tag)]
    else:
        settings = [(cfg.variants, cfg.tag), *((m.variants or cfg.variants, m.tag) for m in cfg.mix)]
        corpora = [CorpusVariants(part.start, part.stop, variants, tag)
                   for part, (variants, tag) in zip(mixture.parts, settings, strict=True)]
    wanted = [c for c in corpora if any(getattr(c.variants, name) > 0 for name in NAMES)]
    return InputVariants(vocab, wanted, seed, cfg.max_len) if wanted else None
