"""Subword regularisation: a new random segmentation of the training pairs at every epoch.

Training on sampled segmentations instead of the one best segmentation (BPE-dropout, Provilkov et al.
2020; SentencePiece sampling, Kudo 2018) makes a model robust to how words are split, a known gain on
small corpora. `tokenizer.dropout` turns it on for `bpe` (each merge is left out with that probability)
and `tokenizer.alpha` for `unigram` (a segmentation is drawn with probability ∝ P(segmentation)^alpha).
Validation, evaluation and translation always use the deterministic segmentation.

The sampling draws from the run's seed and the epoch number alone (not from torch's generators, whose
state a checkpoint restores), so an epoch's segmentation is the same in an uninterrupted run, a resumed
one and on every DDP rank. `tokenizers` samples BPE-dropout with an unseeded generator, and not unigram
segmentations at all; the two samplers below follow its models' own merges and scores (tests compare
them with it).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator

import numpy as np
from tokenizers import Tokenizer

from transformer_mt.config import TokenizerConfig
from transformer_mt.data.encode import EncodedSplit
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.tokenizer import UNK_ID, Vocabulary

CHUNK = 4096  # sentences decoded at once


class BpeDropout:
    """BPE-dropout over a byte-level BPE model's merges: at every step the applicable merges are tried
    in rank order and each is skipped with probability p; the word is done when every one was skipped.
    With p = 0 this is plain BPE (what `tokenizers` computes)."""

    def __init__(self, spec: dict, p: float) -> None:
        self.p, self.ids = p, spec["vocab"]
        merges = (m.split(" ") if isinstance(m, str) else m for m in spec["merges"])
        self.ranks = {(a, b): rank for rank, (a, b) in enumerate(merges)}

    def pieces(self, word: str, rng: random.Random) -> list[str]:
        """One sampled segmentation of a pre-tokenized (byte-level) word."""
        symbols, ranks, p = list(word), self.ranks, self.p
        while len(symbols) > 1:
            best, at = None, -1
            for i in range(len(symbols) - 1):
                rank = ranks.get((symbols[i], symbols[i + 1]))
                # Only a merge that would win needs its coin: skipping a worse one changes nothing.
                if rank is not None and (best is None or rank < best) and rng.random() >= p:
                    best, at = rank, i
            if best is None:
                break
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
        return symbols


class UnigramSampling:
    """A segmentation drawn from a unigram model's lattice with probability ∝ P(segmentation)^alpha
    (forward filtering, backward sampling: SentencePiece's sampling with nbest_size=-1). A large alpha
    approaches the Viterbi segmentation that `tokenizers` computes."""

    def __init__(self, spec: dict, alpha: float) -> None:
        self.ids = {piece: i for i, (piece, _) in enumerate(spec["vocab"])}
        self.scores = {piece: score * alpha for i, (piece, score) in enumerate(spec["vocab"])
                       if i != spec["unk_id"] and not (piece.startswith("<") and piece.endswith(">"))}
        self.longest = max(map(len, self.scores))

    def pieces(self, word: str, rng: random.Random) -> list[str]:
        """One sampled segmentation of a pre-tokenized word (every character known to the model)."""
        n = len(word)
        forward = [0.0] + [-math.inf] * n  # log of the summed weight of all segmentations of word[:end]
        for end in range(1, n + 1):
            total = -math.inf
            for start, score in self._ending_at(word, end):
                total = _log_add(total, forward[start] + score)
            forward[end] = total
        out, end = [], n
        while end > 0:
            starts = list(self._ending_at(word, end))
            weights = [math.exp(forward[start] + score - forward[end]) for start, score in starts]
            start = rng.choices(starts, weights)[0][0]
            out.append(word[start:end])
            end = start
        return out[::-1]

    def _ending_at(self, word: str, end: int) -> Iterator[tuple[int, float]]:
        """(start, alpha * log-probability) of each piece of the vocabulary that ends at `end`."""
        for start in range(max(0, end - self.longest), end):
            score = self.scores.get(word[start:end])
            if score is not None:
                yield start, score


def _log_add(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    return a if b == -math.inf else a + math.log1p(math.exp(b - a))


def _sampler(tok: Tokenizer, cfg: TokenizerConfig) -> BpeDropout | UnigramSampling:
    spec = json.loads(tok.to_str())["model"]
    return BpeDropout(spec, cfg.dropout) if cfg.kind == "bpe" else UnigramSampling(spec, cfg.alpha)


class SubwordSampler:
    """Re-segments the training split once per epoch; `None` from `build` when regularisation is off."""

    def __init__(self, vocab: Vocabulary, cfg: TokenizerConfig, seed: int, max_len: int) -> None:
        self.vocab, self.seed, self.max_len = vocab, seed, max_len
        self.src = _sampler(vocab.src, cfg)
        self.tgt = self.src if vocab.joint else _sampler(vocab.tgt, cfg)

    def resegment(self, split: EncodedSplit, epoch: int) -> EncodedSplit:
        """The split with every sentence segmented anew for `epoch`; a sentence keeps its deterministic
        segmentation when it holds <unk> or when the sampled one is longer than dataset.max_len."""
        rng = random.Random(f"subword-sampling:{self.seed}:{epoch}")  # string seeds are stable everywhere
        src = self._side(split.src_ids, self.vocab.src, self.src, rng)
        tgt = self._side(split.tgt_ids, self.vocab.tgt, self.tgt, rng)
        return EncodedSplit(src, tgt, split.src_text, split.tgt_text)

    def _side(self, ids: Ragged, tok: Tokenizer, sampler: BpeDropout | UnigramSampling,
              rng: random.Random) -> Ragged:
        parts = [np.zeros(0, dtype=ids.flat.dtype)]  # one array per chunk: Python ints only for a chunk
        lengths = np.zeros(len(ids), dtype=np.int64)
        normalize, pre_tokenize = tok.normalizer.normalize_str, tok.pre_tokenizer.pre_tokenize_str
        for first in range(0, len(ids), CHUNK):
            chunk = ids[first:first + CHUNK].tolist()
            texts = tok.decode_batch(chunk, skip_special_tokens=False)
            out: list[int] = []
            for row, (old, text) in enumerate(zip(chunk, texts, strict=True), start=first):
                new = old
                if UNK_ID not in old:
                    new = [sampler.ids[piece] for word, _ in pre_tokenize(normalize(text))
                           for piece in sampler.pieces(word, rng)]
                    if len(new) > self.max_len:
                        new = old
                out.extend(new)
                lengths[row] = len(new)
            parts.append(np.asarray(out, dtype=ids.flat.dtype))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return Ragged.from_offsets(np.concatenate(parts), offsets)


def build(vocab: Vocabulary, cfg: TokenizerConfig, seed: int, max_len: int) -> SubwordSampler | None:
    """The run's subword sampler, or None when tokenizer.dropout and tokenizer.alpha are 0."""
    return SubwordSampler(vocab, cfg, seed, max_len) if cfg.dropout > 0 or cfg.alpha > 0 else None
