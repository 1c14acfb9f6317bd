"""Input as people type it: training pairs shown now and then in a form their corpus rarely holds.

Five variants (`dataset.variants`, or `dataset.mix[k].variants` for one corpus of a mix), each drawn
for each training pair with its own probability, anew each epoch from the run's seed (a resumed run
draws the same), on the text, before subword segmentation:

- `caps` ALL CAPS, `title` Title Case, `lower` all lowercase: the source and the target together, so
  that the output's case follows the input's; at most one of the three for a pair;
- `no_punct`: the source's final punctuation left out (the target keeps its own);
- `typos`: the source's longer words misspelt (`add_typos`), the target spelt right;
- `substitute`: of the pairs with a name or a number written the same on both sides, the share whose
  names and numbers are replaced, on both sides alike, by new ones (substitution.py), so that the model
  learns to copy what it has never seen. Which pairs have them is found once, for the first epoch built.

Validation and test pairs are never varied; `transformer-mt evaluate robustness=true` scores a model on
the same variants of its test split (decoding/robustness.py). How each variant writes a text is
data/text_variants.py's, which also gives the tokenizer the cased forms (data/cache.py). Pairs joined
into longer examples (`join`) are joining.py's: that changes which examples an epoch holds, not a
pair's text.
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
from transformer_mt.data.substitution import shared_spans, substitute
from transformer_mt.data.text_variants import CASES, NAMES, add_typos, drop_final_punct, pick_case
from transformer_mt.data.tokenizer import UNK_ID, Vocabulary

CHUNK = 4096  # pairs decoded at once when looking for the names and numbers to substitute


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
        self._copies: np.ndarray | None = None  # the rows `substitute` may draw (found at the first epoch)

    def apply(self, split: EncodedSplit, epoch: int) -> tuple[EncodedSplit, dict[str, int]]:
        """`epoch`'s pairs, and how many pairs show each variant. A pair whose ids hold <unk> (its text
        cannot be recovered), or whose varied ids would pass dataset.max_len or hold <unk>, is left as
        it is."""
        rng = random.Random(f"input-variants:{self.seed}:{epoch}")  # string seeds are stable everywhere
        drawn = {row: (d, corpus.tag) for corpus in self.corpora for row in range(corpus.start, corpus.stop)
                 if (d := draw(corpus.variants, rng)) is not None}
        drawn = {row: dt for row, dt in drawn.items()
                 if UNK_ID not in split.src_ids[row] and UNK_ID not in split.tgt_ids[row]}
        swapped = self._substituted(split, epoch)
        rows = sorted(drawn.keys() | swapped)
        if not rows:
            return split, {}
        firsts = [int(split.src_ids[r][0]) if len(split.src_ids[r]) else -1 for r in rows]
        leads = [[first] if first in self.language_ids else [] for first in firsts]
        sources = self.vocab.decode_src([split.src_ids[r].tolist() for r in rows])
        targets = self.vocab.decode_tgt([split.tgt_ids[r].tolist() for r in rows])
        for i, row in enumerate(rows):  # in the rows' order: the typos draw from `rng` as they always did
            if row in swapped:
                prefix, source = split_tag(sources[i], swapped[row])
                source, targets[i] = self._substitute(source, targets[i], row, epoch)
                sources[i] = prefix + source
            if row in drawn:
                d, tag = drawn[row]
                sources[i] = _tagged(lambda s, d=d: d.source(s, rng), sources[i], tag)
                targets[i] = d.target(targets[i])
        src_new = [lead + ids for lead, ids in zip(leads, self.vocab.encode_src(sources))]
        tgt_new = self.vocab.encode_tgt(targets)
        kept = [i for i, (s, t, lead) in enumerate(zip(src_new, tgt_new, leads))
                if len(s) - len(lead) <= self.max_len and len(t) <= self.max_len
                and UNK_ID not in s and UNK_ID not in t]
        where = np.arange(len(split))
        where[[rows[i] for i in kept]] = len(split) + np.arange(len(kept))
        varied = EncodedSplit(_replaced(split.src_ids, [src_new[i] for i in kept], where),
                              _replaced(split.tgt_ids, [tgt_new[i] for i in kept], where),
                              split.src_text, split.tgt_text)
        counts = {name: sum(1 for i in kept if rows[i] in drawn and shows(drawn[rows[i]][0], name))
                  for name in NAMES}
        counts["substitute"] = sum(1 for i in kept if rows[i] in swapped)
        return varied, {name: n for name, n in counts.items() if n}

    def _substituted(self, split: EncodedSplit, epoch: int) -> dict[int, str | None]:
        """The rows whose names and numbers `epoch` replaces (each row with some, by its corpus's
        probability), with their corpus's tag."""
        wanted = [c for c in self.corpora if c.variants.substitute > 0]
        if not wanted:
            return {}
        if self._copies is None:
            self._copies = self._with_copies(split, wanted)
        rng = random.Random(f"substitute:{self.seed}:{epoch}")
        copies = self._copies
        return {int(row): c.tag for c in wanted for row in copies[(copies >= c.start) & (copies < c.stop)]
                if rng.random() < c.variants.substitute}

    def _with_copies(self, split: EncodedSplit, corpora: list[CorpusVariants]) -> np.ndarray:
        """The rows of `corpora` with a name or number written the same on both sides (and no <unk>)."""
        found = []
        for c in corpora:
            for first in range(c.start, c.stop, CHUNK):
                src = split.src_ids[first:min(first + CHUNK, c.stop)].tolist()
                tgt = split.tgt_ids[first:min(first + CHUNK, c.stop)].tolist()
                texts = zip(self.vocab.decode_src(src), self.vocab.decode_tgt(tgt), src, tgt, strict=True)
                found += [first + i for i, (s, t, s_ids, t_ids) in enumerate(texts)
                          if UNK_ID not in s_ids and UNK_ID not in t_ids and shared_spans(s, t)]
        return np.array(found, dtype=np.int64)

    def _substitute(self, source: str, target: str, row: int, epoch: int) -> tuple[str, str]:
        """The pair with its names and numbers replaced, drawn from the pair's own generator (Faker's
        draws too), which its row, the epoch and the run's seed alone decide."""
        pair_rng = random.Random(f"substitute:{self.seed}:{epoch}:{row}")
        return substitute(source, target, shared_spans(source, target), pair_rng)


def split_tag(source: str, tag: str | None) -> tuple[str, str]:
    """(the tag its corpus puts before a source, with its space, or ""; the rest of the source)."""
    prefix = f"{tag.strip()} " if tag else ""
    return (prefix, source[len(prefix):]) if prefix and source.startswith(prefix) else ("", source)


def _tagged(vary: Callable[[str], str], source: str, tag: str | None) -> str:
    """`vary` applied to a source without the tag its corpus puts before it (mixture.py)."""
    prefix, rest = split_tag(source, tag)
    return prefix + vary(rest)


def shows(d: Draw, name: str) -> bool:
    """Whether a pair drawn `d` shows the variant `name`."""
    return d.case == name if name in CASES else getattr(d, name)


def _replaced(ids: Ragged, new: list[list[int]], where: np.ndarray) -> Ragged:
    """`ids` with the rows `where` points past its end replaced by `new`, in that order."""
    return Ragged.concat([ids, Ragged.from_lists(new)]).take(where)


def corpus_variants(cfg: DatasetConfig, mixture: Mixture | None, rows: int) -> list[CorpusVariants]:
    """Each corpus's rows of the run's `rows` training pairs, with its variants and tag. Corpora of a mix
    take their own `variants`, or the dataset's when they give none."""
    if mixture is None:
        return [CorpusVariants(0, rows, cfg.variants, cfg.tag)]
    settings = [(cfg.variants, cfg.tag), *((m.variants or cfg.variants, m.tag) for m in cfg.mix)]
    return [CorpusVariants(part.start, part.stop, *settings[k])
            for part, k in zip(mixture.parts, mixture.corpora())]


def build(vocab: Vocabulary, cfg: DatasetConfig, mixture: Mixture | None, seed: int,
          rows: int) -> InputVariants | None:
    """The run's variants over its `rows` training pairs, or None when no corpus asks for any."""
    wanted = [c for c in corpus_variants(cfg, mixture, rows)
              if any(getattr(c.variants, name) > 0 for name in (*NAMES, "substitute"))]
    return InputVariants(vocab, wanted, seed, cfg.max_len) if wanted else None
