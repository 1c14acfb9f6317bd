"""Joined pairs (`dataset.variants.join`): some of an epoch's training pairs shown two or three at a time,
as one longer example, so that lines of several sentences, and longer lines, are not foreign to a model
trained on a corpus of single short sentences.

Each pair of the epoch is drawn for joining with its corpus's probability, anew each epoch from the
run's seed (a resumed run draws the same). The drawn pairs of a corpus are put in a random order and
taken two or three at a time, as often one as the other: the two line shapes the documents report
scores (k sentences a line), with nothing measured yet to favour either. The sources are joined with
one space, the targets too, in the same order; the first source keeps its corpus's tag and language
token, the others lose theirs. Pairs are joined within their corpus only, so that a tag or a target
language never meets another's. A joined example that would pass dataset.max_len tokens on a side
(segmented as written), or holds <unk>, is not made: its pairs stay as they are.

This runs where the epoch's pairs are known (data/epochs.py): after the mixture's draw, so that only
the pairs an epoch holds are joined, and before the subword sampling, which then segments a joined
example like any other pair.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from transformer_mt.config import DatasetConfig
from transformer_mt.data.encode import EncodedSplit
from transformer_mt.data.mixture import Mixture
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.tokenizer import UNK_ID, Vocabulary
from transformer_mt.data.variants import CorpusVariants, corpus_variants, split_tag

JOIN_SIZES = (2, 3)  # pairs a joined example holds, drawn alike


class PairJoins:
    """Joins some of each epoch's training pairs into longer examples."""

    def __init__(self, vocab: Vocabulary, corpora: Sequence[CorpusVariants], seed: int, max_len: int) -> None:
        self.vocab = vocab
        self.corpora = tuple(corpora)
        self.seed = seed
        self.max_len = max_len
        self.language_ids = {vocab.language_id(lang) for lang in vocab.target_languages}

    def apply(self, split: EncodedSplit, rows: np.ndarray | None,
              epoch: int) -> tuple[EncodedSplit, int, int]:
        """`epoch`'s pairs with the joined examples in place of the pairs they join (after the others),
        the pairs joined and the examples they make. `rows`: each pair's row of the training split (the
        mixture's draw), None where the pairs are the split itself."""
        rows = np.arange(len(split)) if rows is None else rows
        rng = np.random.default_rng(random.Random(f"joined-pairs:{self.seed}:{epoch}").getrandbits(64))
        groups = [(group, corpus.tag) for corpus in self.corpora for group in self._groups(rows, corpus, rng)]
        groups = [(g, tag) for g, tag in groups
                  if all(UNK_ID not in split.src_ids[i] and UNK_ID not in split.tgt_ids[i] for i in g)]
        made, sources, targets = self._joined(split, groups)
        if not made:
            return split, 0, 0
        joined = np.concatenate([groups[k][0] for k in made])
        kept = np.setdiff1d(np.arange(len(split)), joined)  # in their order
        out = EncodedSplit(Ragged.concat([split.src_ids.take(kept), Ragged.from_lists(sources)]),
                           Ragged.concat([split.tgt_ids.take(kept), Ragged.from_lists(targets)]))
        return out, len(joined), len(made)

    def _groups(self, rows: np.ndarray, corpus: CorpusVariants, rng: np.random.Generator) -> list[np.ndarray]:
        """The corpus's pairs drawn for joining, in a random order, cut into groups of JOIN_SIZES (a last
        pair left alone stays as it is)."""
        positions = np.flatnonzero((rows >= corpus.start) & (rows < corpus.stop))
        drawn = rng.permutation(positions[rng.random(len(positions)) < corpus.variants.join])
        sizes = rng.choice(JOIN_SIZES, size=len(drawn) // min(JOIN_SIZES) + 1)
        ends = np.cumsum(sizes)
        ends = np.append(ends[ends < len(drawn)], len(drawn))
        return [g for g in np.split(drawn, ends[:-1]) if len(g) >= min(JOIN_SIZES)]

    def _joined(self, split: EncodedSplit, groups: list[tuple[np.ndarray, str | None]]
                ) -> tuple[list[int], list[list[int]], list[list[int]]]:
        """The groups (positions, their corpus's tag) whose joined example fits (their indices), and its
        source and target ids."""
        members = [int(i) for g, _ in groups for i in g]
        sources = self.vocab.decode_src([split.src_ids[i].tolist() for i in members])
        targets = self.vocab.decode_tgt([split.tgt_ids[i].tolist() for i in members])
        src_text, tgt_text, leads, at = [], [], [], 0
        for g, tag in groups:
            texts = sources[at:at + len(g)]
            src_text.append(" ".join([texts[0], *(split_tag(s, tag)[1] for s in texts[1:])]))
            tgt_text.append(" ".join(targets[at:at + len(g)]))
            at += len(g)
            first_id = int(split.src_ids[int(g[0])][0]) if len(split.src_ids[int(g[0])]) else -1
            leads.append([first_id] if first_id in self.language_ids else [])
        src_ids = [lead + ids for lead, ids in zip(leads, self.vocab.encode_src(src_text))]
        tgt_ids = self.vocab.encode_tgt(tgt_text)
        made = [k for k, (s, t, lead) in enumerate(zip(src_ids, tgt_ids, leads))
                if len(s) - len(lead) <= self.max_len and len(t) <= self.max_len
                and UNK_ID not in s and UNK_ID not in t]
        return made, [src_ids[k] for k in made], [tgt_ids[k] for k in made]


def build(vocab: Vocabulary, cfg: DatasetConfig, mixture: Mixture | None, seed: int,
          rows: int) -> PairJoins | None:
    """The run's joined pairs over its `rows` training pairs, or None when no corpus asks for them."""
    wanted = [c for c in corpus_variants(cfg, mixture, rows) if c.variants.join > 0]
    return PairJoins(vocab, wanted, seed, cfg.max_len) if wanted else None
