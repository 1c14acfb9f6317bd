"""Target terms as hard lexical constraints: their token variants, and the state a search carries.

A target term is written by any of its *variants* (the token ids it takes after a space, glued to what
precedes, capitalised at a sentence start), and is *met* once one variant occurs as a contiguous run of the
output's tokens. Terms are unordered: the model places them.

The state is tensors, so a search step costs no host read:
- per sentence (`Constraints`, built once per batch): each variant's tokens and its KMP automaton (so
  `a a b` is found in `a a a b`), the term it writes, and each term's shortest variant (`minlen`);
- per hypothesis (`TermState`): each variant's progress (tokens of it just written) and each term's met
  flag. `need` is the tokens of one way to complete them (all unmet terms written apart, less what the
  most advanced partial match saves): 0 exactly when every term is met, and more than the cheapest way
  when terms can overlap (`a b` and `b c` both fit in `a b c`). Writing the next token of the partial
  match that gives the saving (or the first token of a shortest unmet variant) lowers it by at least
  one: that is what lets the search guarantee each sentence meets its terms before its length limit
  (`decoding/constrained.py`). `least` bounds the cheapest way from below, so pruning by it never drops
  a hypothesis that could still finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.data.tokenizer import SPECIAL_TOKENS, Vocabulary
from transformer_mt.decoding.glossary import Entry, TermUse, holds_term

TermIds = Sequence[Sequence[int]]  # the variants of one target term, each its token ids


def _minimal(variants: list[list[int]]) -> list[list[int]]:
    """Distinct, non-empty variants without special tokens, minus those holding another as a run (a
    character tokenizer's " term" holds "term": any output with the first has the second)."""
    usable = [v for v in dict.fromkeys(map(tuple, variants)) if v and min(v) >= len(SPECIAL_TOKENS)]

    def holds(long: tuple[int, ...], short: tuple[int, ...]) -> bool:
        return len(long) > len(short) and any(long[i:i + len(short)] == short
                                              for i in range(len(long) - len(short) + 1))

    return [list(v) for v in usable if not any(holds(v, w) for w in usable)]


def term_variants(vocab: Vocabulary, target: str) -> list[list[int]]:
    """The token ids a target term can take in an output: after a space, glued to what precedes (or at
    the start), and both with a capital first letter when the term starts lower-case (a sentence start).
    Empty when the vocabulary cannot write the term (its tokens unknown to a word-level vocabulary)."""
    texts = [target]
    if target[:1].islower():
        texts.append(target[0].upper() + target[1:])
    anchor = vocab.encode_tgt(["a"])[0]
    variants = []
    for text in texts:
        glued, spaced = vocab.encode_tgt([text, "a " + text])
        variants.append(glued)
        if spaced[:len(anchor)] == anchor:  # "a" tokenised alone: the rest is the term after a space
            variants.append(spaced[len(anchor):])
    return _minimal(variants)


@dataclass(frozen=True)
class TermRefusal:
    """A term a sentence cannot be decoded with: its index in the sentence's terms, and why."""

    index: int
    reason: str


def shortest(term: TermIds) -> int:
    """Tokens the shortest variant of a term takes."""
    return min(map(len, term))


def fit_terms(terms: Sequence[TermIds], room: int) -> tuple[list[int], list[TermRefusal]]:
    """Which of a sentence's terms (in order) the search can take when `room` output tokens are free (the
    model's positions less one for <bos>, less the forced prefix), and a refusal for each other one: a
    term with no variant, or one whose tokens no longer fit. A caller reports the refusals; the search
    refuses (ValueError) terms that do not fit rather than drop them."""
    kept, refused, used = [], [], 0
    for i, term in enumerate(terms):
        if not term:
            refused.append(TermRefusal(i, "this model's vocabulary cannot write it"))
        elif used + shortest(term) > room:
            refused.append(TermRefusal(i, f"the terms of this sentence need {used + shortest(term)} target "
                                          f"tokens; this model writes at most {room} here"))
        else:
            kept.append(i)
            used += shortest(term)
    return kept, refused


def sentence_terms(entries: Sequence[Entry], variants: Callable[[str], list[list[int]]],
                   room: int) -> tuple[list[TermIds], list[TermUse]]:
    """The terms one sentence is searched with (its entries' target terms, each once, as `variants` gives
    their ids; at most what `room` output tokens hold, `fit_terms`), and the refusal of each other entry."""
    targets = list(dict.fromkeys(e.target for e in entries))
    ids = [variants(t) for t in targets]
    kept, refused = fit_terms(ids, room)
    why = {targets[r.index]: r.reason for r in refused}
    uses = [TermUse(e.source, e.target, "refused", why[e.target]) for e in entries if e.target in why]
    return [ids[k] for k in kept], uses


def terms_used(entries: Sequence[Entry], refused: Sequence[TermUse], text: str) -> list[TermUse]:
    """How each of a sentence's entries fared in its translation `text`: refused as `refused` says, else
    met when the text holds its target term, else missing."""
    out = {u.source: u for u in refused}
    for e in entries:
        if e.source not in out:
            out[e.source] = (TermUse(e.source, e.target, "met") if holds_term(text, e.target) else
                             TermUse(e.source, e.target, "missing", "the search wrote it, but it is not in "
                                     "the text as written out (as whole words)"))
    return [out[e.source] for e in entries]


def _automaton(variant: Sequence[int]) -> list[list[int]]:
    """KMP transitions of one variant: [k][p] = progress after reading token variant[p] in progress k
    (0 <= k < len; a token that is not in the variant sends progress to 0)."""
    fail = [0] * len(variant)  # longest proper border of variant[:i + 1]
    for i in range(1, len(variant)):
        k = fail[i - 1]
        while k and variant[i] != variant[k]:
            k = fail[k - 1]
        fail[i] = k + (variant[i] == variant[k])
    table = []
    for k in range(len(variant)):
        row = []
        for token in variant:
            j = k
            while j and variant[j] != token:
                j = fail[j - 1]
            row.append(j + (variant[j] == token))
        table.append(row)
    return table


@dataclass(frozen=True)
class WordEdges:
    """Where each target token stands against words: `glues` (V,) its text continues a word written
    before it (no space or mark of its own, as `imante` after `impr`), `ends` (V,) its text ends inside a
    word (a letter, digit or _ last). With them a term is written as whole words: a variant whose first
    token glues does not start right after a token that ends a word (`que` + `lorsque`), and the token
    after a term just written does not glue to it (`serpent` + `ie`)."""

    glues: Tensor
    ends: Tensor

    @classmethod
    def of(cls, vocab: Vocabulary, device: torch.device | str = "cpu") -> WordEdges:
        """Each token's edges, read from its text as the tokenizer decodes it, alone and after `a`."""
        anchor = vocab.encode_tgt(["a"])[0]
        lead = len(vocab.decode_tgt([anchor])[0])
        ids = range(vocab.tgt_vocab_size)
        after = vocab.decode_tgt([[*anchor, v] for v in ids])
        alone = vocab.decode_tgt([[v] for v in ids])
        glues = [len(text) > lead and (text[lead].isalnum() or text[lead] == "_") for text in after]
        ends = [bool(text) and (text[-1].isalnum() or text[-1] == "_") for text in alone]
        special = len(SPECIAL_TOKENS)
        glues[:special], ends[:special] = [False] * special, [False] * special
        return cls(torch.tensor(glues, device=device), torch.tensor(ends, device=device))

    def to(self, device: torch.device) -> WordEdges:
        return WordEdges(self.glues.to(device), self.ends.to(device))


@dataclass
class Constraints:
    """The terms of a batch as padded tensors (A sentences, M variants, L longest variant, J terms)."""

    seq: Tensor  # (A, M, L) long: each variant's tokens, -1 padded
    length: Tensor  # (A, M) long: tokens of each variant, 0 for padding
    term: Tensor  # (A, M) long: the term each variant writes
    minlen: Tensor  # (A, J) long: each term's shortest variant, 0 for padding
    dfa: Tensor  # (A, M, L, L) long: `_automaton` of each variant
    glued: Tensor  # (A, M) bool: the variant's first token glues to a word before it (WordEdges)
    edges: WordEdges | None = None  # None: terms are runs of tokens, whatever surrounds them

    @classmethod
    def build(cls, terms: Sequence[Sequence[TermIds]], device: torch.device,
              edges: WordEdges | None = None) -> Constraints:
        """The tensors of each sentence's terms (each term: its variants' ids). Terms with the same
        variants are one term; a term with no variant, or a variant holding a special token, is an
        error (`fit_terms` refuses the first, `term_variants` never makes the second)."""
        sentences = []
        for i, sentence in enumerate(terms):
            distinct = list(dict.fromkeys(tuple(map(tuple, term)) for term in sentence))
            for term in distinct:
                if not term or min(map(len, term)) == 0 or min(min(v) for v in term) < len(SPECIAL_TOKENS):
                    raise ValueError(f"sentence {i}: a term needs variants of ordinary tokens, got {term}")
            sentences.append(distinct)
        A = len(sentences)
        M = max([sum(map(len, s)) for s in sentences] + [1])
        L = max([len(v) for s in sentences for t in s for v in t] + [1])
        J = max([len(s) for s in sentences] + [1])
        seq, length = torch.full((A, M, L), -1), torch.zeros(A, M, dtype=torch.long)
        term, minlen = torch.zeros(A, M, dtype=torch.long), torch.zeros(A, J, dtype=torch.long)
        dfa = torch.zeros(A, M, L, L, dtype=torch.long)
        for a, sentence in enumerate(sentences):
            variants = [(j, v) for j, t in enumerate(sentence) for v in t]
            for m, (j, v) in enumerate(variants):
                seq[a, m, :len(v)], length[a, m], term[a, m] = torch.tensor(v), len(v), j
                dfa[a, m, :len(v), :len(v)] = torch.tensor(_automaton(v))
            for j, t in enumerate(sentence):
                minlen[a, j] = shortest(t)
        tensors = [x.to(device) for x in (seq, length, term, minlen, dfa)]
        if edges is None:
            return cls(*tensors, torch.zeros(A, M, dtype=torch.bool, device=device))
        edges = edges.to(device)
        glued = edges.glues[tensors[0][..., 0].clamp(min=0)] & (tensors[1] > 0)
        return cls(*tensors, glued, edges)

    @property
    def cmin(self) -> Tensor:
        """(A,) tokens all of a sentence's terms take at least (their shortest variants): 0 without terms."""
        return self.minlen.sum(1)

    def kept(self, index: Tensor) -> Constraints:
        """The sentences `index` (A',), as the search drops finished ones."""
        return Constraints(*(x[index] for x in (self.seq, self.length, self.term, self.minlen, self.dfa,
                                                self.glued)), self.edges)


@dataclass
class TermState:
    """Per hypothesis: how far each variant is written, and which terms are met. Shapes (A, R, M) and
    (A, R, J): R hypotheses (beams or candidates) of each of A sentences."""

    prog: Tensor  # (A, R, M) long, in 0..length-1
    met: Tensor  # (A, R, J) bool; a padding term counts as met
    in_word: Tensor  # (A, R) bool: the last token ends inside a word (WordEdges.ends)
    fresh: Tensor  # (A, R) bool: the last token finished writing a variant

    @classmethod
    def start(cls, c: Constraints, rows: int) -> TermState:
        """Nothing written yet, for `rows` hypotheses of each sentence."""
        A, M = c.length.shape
        met = (c.minlen == 0)[:, None].expand(A, rows, -1).clone()
        none = torch.zeros(A, rows, dtype=torch.bool, device=c.seq.device)
        return cls(torch.zeros(A, rows, M, dtype=torch.long, device=c.seq.device), met, none, none)

    def need(self, c: Constraints) -> Tensor:
        """(A, R) tokens a completion takes writing the unmet terms apart (the module docstring)."""
        unmet = ~self.met
        total = (c.minlen[:, None] * unmet).sum(-1)
        open_variant = unmet.gather(-1, c.term[:, None].expand_as(self.prog)) & (c.length > 0)[:, None]
        saved = c.minlen.gather(1, c.term)[:, None] - (c.length[:, None] - self.prog)  # (A, R, M)
        credit = saved.masked_fill(~open_variant, 0).amax(-1).clamp(min=0)
        return total - credit

    def least(self, c: Constraints) -> Tensor:
        """(A, R) tokens any completion takes at least: for the unmet term furthest from being written,
        the rest of its most advanced variant (KMP progress is the longest suffix of the output that
        starts the variant, so no placement of it ends sooner). `need` can overstate what terms that
        overlap take (`a b` and `b c` are both in `a b c`); this never does."""
        J = c.minlen.size(1)
        writes = (c.term[..., None] == torch.arange(J, device=c.term.device)) & (c.length > 0)[..., None]
        rest = (c.length[:, None] - self.prog)[..., None]  # (A, R, M, 1)
        fewest = torch.where(writes[:, None], rest, c.seq.size(2)).amin(2)  # (A, R, J) per term
        return fewest.masked_fill(self.met, 0).amax(-1)

    def select(self, index: Tensor) -> TermState:
        """The hypotheses index (A, R') of each sentence."""
        return TermState(self.prog.gather(1, index[..., None].expand(-1, -1, self.prog.size(2))),
                         self.met.gather(1, index[..., None].expand(-1, -1, self.met.size(2))),
                         self.in_word.gather(1, index), self.fresh.gather(1, index))

    def sentences(self, index: Tensor) -> TermState:
        """The sentences `index` (A',)."""
        return TermState(self.prog[index], self.met[index], self.in_word[index], self.fresh[index])

    def advance(self, c: Constraints, tokens: Tensor) -> TermState:
        """The state after each hypothesis writes its token (A, R): KMP steps of every variant; a variant
        written in full meets its term (and its progress restarts: the term is met for good)."""
        A = tokens.size(0)
        eq = c.seq[:, None] == tokens[:, :, None, None]  # (A, R, M, L)
        at = eq.long().argmax(-1)  # a position holding the token: the step depends on the token only
        a = torch.arange(A, device=tokens.device)[:, None, None]
        m = torch.arange(c.seq.size(1), device=tokens.device)[None, None, :]
        prog = torch.where(eq.any(-1), c.dfa[a, m, self.prog, at], 0)  # (A, R, M)
        prog = prog.masked_fill((prog == 1) & c.glued[:, None] & self.in_word[..., None], 0)  # mid-word
        done = (prog == c.length[:, None]) & (c.length > 0)[:, None]
        writes = c.term[:, :, None] == torch.arange(c.minlen.size(1), device=tokens.device)  # (A, M, J)
        met = self.met | (done[..., None] & writes[:, None]).any(2)
        in_word = c.edges.ends[tokens] if c.edges is not None else self.in_word
        return TermState(prog.masked_fill(done, 0), met, in_word, done.any(-1))
