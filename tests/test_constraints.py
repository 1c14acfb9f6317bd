"""Tests of target terms as hard lexical constraints (decoding/constraints.py, decoding/constrained.py,
beam_search's `constraints`, bank_greedy_search, decode_ids' `terms`), each against an independent
reference: a naive substring check, teacher forcing, an exhaustive search, the unconstrained search, the
same sentences one by one, and the search without the KV cache."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import torch.nn as nn

from tests.test_search import BOS, EOS, PAD, TableModel, V, random_model, source_batch, table
from transformer_mt.config import DecodingConfig, ModelConfig
from transformer_mt.decoding.beam import bank_greedy_search, beam_search
from transformer_mt.decoding.constrained import _term_tokens
from transformer_mt.decoding.constraints import Constraints, TermState
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.search import Hypothesis, gnmt_penalty, greedy_search
from transformer_mt.model import Transformer

CPU = torch.device("cpu")
FIRST = 4  # the first ordinary token: <pad>, <bos>, <eos>, <unk> come before


def holds(tokens: list[int], term: list[list[int]]) -> bool:
    """Some variant of the term is a contiguous run of the tokens (the naive reference)."""
    return any(tokens[i:i + len(v)] == list(v) for v in term for i in range(len(tokens) - len(v) + 1))


def random_terms(rng: random.Random, n: int, tokens: list[int], longest: int = 3) -> list[list[list[int]]]:
    """n terms, each of 1-2 variants of 1-longest tokens."""
    return [[[rng.choice(tokens) for _ in range(rng.randint(1, longest))] for _ in range(rng.randint(1, 2))]
            for _ in range(n)]


def forced_score(model: nn.Module, src_row: torch.Tensor, tokens: list[int]) -> float:
    """Log-prob sum of tokens + eos by teacher forcing, without the cache: the search's score reference
    (log-probs in float32 as the searches take them; sums in float64)."""
    src = src_row[None, : int((src_row != PAD).sum())]
    with torch.no_grad():
        logp = torch.log_softmax(model(src, torch.tensor([[BOS, *tokens]])).float(), dim=-1)[0].double()
    return sum(float(logp[i, t]) for i, t in enumerate([*tokens, EOS]))


# -- the automaton ----------------------------------------------------------------------------------------
def test_met_and_need_follow_the_output_token_by_token() -> None:
    """met ⇔ a variant is a run of the output so far (overlaps, shared prefixes, terms inside terms);
    need is 0 exactly when all are met, never above cmin, and one of the constraint tokens the search
    offers lowers it by one: the property that lets the search always finish with every term."""
    rng = random.Random(0)
    alphabet = [4, 5, 6, 7]
    for _ in range(400):
        terms = random_terms(rng, rng.randint(1, 3), alphabet)
        distinct = list(dict.fromkeys(tuple(map(tuple, t)) for t in terms))
        c = Constraints.build([terms], CPU)
        state, out = TermState.start(c, 1), []
        for tok in [rng.choice(alphabet) for _ in range(14)]:
            state = state.advance(c, torch.tensor([[tok]]))
            out.append(tok)
            met = [holds(out, [list(v) for v in t]) for t in distinct]
            assert state.met[0, 0, :len(distinct)].tolist() == met, (terms, out)
            need = int(state.need(c)[0, 0])
            assert (need == 0) == all(met) and 0 <= need <= int(c.cmin[0])
            if need:
                offered, real = _term_tokens(state, c)
                options = offered[0, 0][real[0, 0]]
                after = [int(state.advance(c, torch.tensor([[int(o)]])).need(c)[0, 0]) for o in options]
                assert min(after) <= need - 1, (terms, out)


def test_least_never_exceeds_what_the_output_really_took() -> None:
    """least (what the pruning of hopeless hypotheses trusts) is a true lower bound: wherever a random
    output meets all its terms, no earlier step claimed more tokens were left than it took."""
    rng = random.Random(1)
    alphabet = [4, 5, 6]
    checked = 0
    for _ in range(400):
        terms = random_terms(rng, rng.randint(1, 3), alphabet)
        c = Constraints.build([terms], CPU)
        state, claims = TermState.start(c, 1), []
        for step in range(16):
            claims.append(int(state.least(c)[0, 0]))
            assert claims[-1] <= int(state.need(c)[0, 0])
            state = state.advance(c, torch.tensor([[rng.choice(alphabet)]]))
            if bool(state.met.all()):
                assert all(claim <= step + 1 - p for p, claim in enumerate(claims)), (terms, claims)
                checked += 1
                break
    assert checked > 200


def test_a_candidate_whose_terms_cannot_fit_before_the_limit_is_dropped() -> None:
    from transformer_mt.decoding.beam import _top_candidates
    from transformer_mt.decoding.constrained import TermSearch

    c = Constraints.build([[[[5, 6]]]], CPU)
    logp = torch.log_softmax(torch.randn(2, 12, generator=torch.Generator().manual_seed(0)), -1)
    logp[:, [PAD, BOS]] = float("-inf")
    scores = torch.tensor([[0.0, float("-inf")]], dtype=torch.float64)
    for room in (1, 2):  # room for one more token after this one: only 5 (then 6) can still make it
        search = TermSearch(c, 2, EOS)
        step = search.close_eos(logp.clone())
        top = _top_candidates(step, scores, 2)
        score, tok, _ = search.candidates(step, scores, top, torch.tensor([room]))
        finite = set(tok[torch.isfinite(score)].tolist())
        assert (finite == {5}) if room == 1 else (5 in finite and len(finite) == 4)


# -- an exhaustive reference -------------------------------------------------------------------------------
REAL = [4, 5, 6]


class Restricted(nn.Module):
    """A random model that writes only <eos> and the REAL tokens (every other token at -inf): small
    enough to enumerate, while its vocabulary stays wider than 2 * beam_size as beam search needs."""

    def __init__(self, seed: int, vocab: int = 170) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                          max_positions=64, tie_embeddings=False, tie_output=False)
        self.model = Transformer(cfg, vocab, vocab, PAD).double().eval()
        with torch.no_grad():
            self.model.output_projection.weight.mul_(3.0)
        self.config, self.pad_id = self.model.config, PAD
        self.mask = torch.full((vocab,), float("-inf"), dtype=torch.float64)
        self.mask[[EOS, *REAL]] = 0.0

    def encode(self, src):
        return self.model.encode(src)

    def new_cache(self):
        return self.model.new_cache()

    def decode(self, tgt, memory, src_pad_mask, cache=None, need_attention=False):
        if need_attention:
            logits, attn = self.model.decode(tgt, memory, src_pad_mask, cache, need_attention=True)
            return logits + self.mask, attn
        return self.model.decode(tgt, memory, src_pad_mask, cache) + self.mask

    def forward(self, src, tgt):
        memory, src_pad = self.encode(src)
        return self.decode(tgt, memory, src_pad)


def valid_outputs(terms: list[list[list[int]]], limit: int) -> list[list[int]]:
    """Every output of at most `limit` REAL tokens that holds every term."""
    outputs = [list(s) for n in range(limit + 1) for s in itertools.product(REAL, repeat=n)]
    return [s for s in outputs if all(holds(s, t) for t in terms)]


def brute_force(model: nn.Module, src_row: torch.Tensor, terms: list[list[list[int]]], limit: int,
                alpha: float) -> tuple[list[int], float]:
    """The best output of at most `limit` REAL tokens holding every term, and its score."""
    scored = [(forced_score(model, src_row, s) / gnmt_penalty(len(s) + 1, alpha), s)
              for s in valid_outputs(terms, limit)]
    score, best = max(scored)
    return best, score


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_beam_holding_every_prefix_finds_the_best_output_with_the_terms(alpha: float) -> None:
    model, rng, limit, K = Restricted(seed=0), random.Random(1), 4, 81  # 81 = 3 ** limit
    src = source_batch([5, 3, 7, 4, 6, 2, 8, 5, 3, 6, 4, 7], seed=11)
    terms = []
    while len(terms) < len(src):  # terms fewer than K outputs hold: no sentence stops for K finished ones
        drawn = random_terms(rng, rng.randint(1, 2), REAL, longest=2)
        if len(valid_outputs(drawn, limit)) < K:
            terms.append(drawn)
    found = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=K, length_penalty=alpha, max_len_a=0.0,
                        max_len_b=limit, exhaustive=True, constraints=Constraints.build(terms, CPU))
    for i, hyps in enumerate(found):
        best, score = brute_force(model, src[i], terms[i], limit, alpha)
        assert hyps[0].tokens == best
        assert hyps[0].score == pytest.approx(score, abs=1e-6)


def test_small_beams_and_bank_greedy_return_valid_truly_scored_outputs() -> None:
    model, rng, limit = Restricted(seed=2), random.Random(3), 4
    src = source_batch([6, 4, 5], seed=12)
    terms = [random_terms(rng, rng.randint(1, 2), REAL, longest=2) for _ in range(3)]
    c = Constraints.build(terms, CPU)
    ends = dict(bos_id=BOS, eos_id=EOS, max_len_a=0.0, max_len_b=limit)
    runs = [beam_search(model, src, beam_size=K, length_penalty=0.0, constraints=c, **ends)
            for K in range(1, 6)]
    runs.append(bank_greedy_search(model, src, c, **ends))
    optimum = [brute_force(model, src[i], terms[i], limit, 0.0)[1] for i in range(3)]
    for found in runs:
        for i, hyps in enumerate(found):
            h = hyps[0]
            assert all(holds(h.tokens, t) for t in terms[i]) and len(h.tokens) <= limit
            assert h.score == pytest.approx(forced_score(model, src[i], h.tokens), abs=1e-6)
            assert h.score <= optimum[i] + 1e-6


# -- random models and sentences ---------------------------------------------------------------------------
LENGTHS = [6, 3, 8, 5, 7, 4, 9, 2]


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_model(seed=0)


def mixed_terms(seed: int, n: int = len(LENGTHS)) -> list[list[list[list[int]]]]:
    """2-3 multi-token terms per sentence, every third sentence without any."""
    rng = random.Random(seed)
    return [[] if i % 3 == 1 else random_terms(rng, rng.randint(2, 3), list(range(FIRST, V)))
            for i in range(n)]


def searches(model: nn.Module, src: torch.Tensor, terms, **kw) -> dict[str, list[list[Hypothesis]]]:
    """Beam 2, beam 5 (n-best 3) and greedy, with the terms (None: without any)."""
    c = Constraints.build(terms, CPU) if terms is not None else None
    ends = dict(bos_id=BOS, eos_id=EOS, **kw)
    out = {"beam2": beam_search(model, src, beam_size=2, constraints=c, **ends),
           "beam5": beam_search(model, src, beam_size=5, n_best=3, constraints=c, **ends)}
    out["greedy"] = (bank_greedy_search(model, src, c, **ends) if c is not None
                     else greedy_search(model, src, **ends))
    return out


def test_every_finished_hypothesis_holds_every_term(model: Transformer) -> None:
    for seed in range(4):
        src, terms = source_batch(LENGTHS, seed=20 + seed), mixed_terms(seed)
        for name, found in searches(model, src, terms).items():
            for i, hyps in enumerate(found):
                assert hyps, (name, i)
                for h in hyps:
                    assert all(holds(h.tokens, t) for t in terms[i]), (name, i, h.tokens, terms[i])
                    assert not {PAD, BOS, EOS} & set(h.tokens)
            for i in (0, 2):  # scores are the model's own
                alpha = DecodingConfig().length_penalty if name != "greedy" else 0.0
                lp = gnmt_penalty(len(found[i][0].tokens) + 1, alpha)
                best = found[i][0]
                assert best.score * lp == pytest.approx(forced_score(model, src[i], best.tokens), abs=1e-6)


def test_sentences_without_terms_decode_as_without_constraints(model: Transformer) -> None:
    src, terms = source_batch(LENGTHS, seed=30), mixed_terms(5)
    plain, constrained = searches(model, src, None), searches(model, src, terms)
    nobody = searches(model, src, [[] for _ in LENGTHS])  # terms given, all empty: the terms path, no term
    for name in plain:
        for i in range(len(LENGTHS)):
            assert [h.tokens for h in nobody[name][i]] == [h.tokens for h in plain[name][i]]
            assert [h.score for h in nobody[name][i]] == [h.score for h in plain[name][i]]
            if not terms[i]:
                assert [h.tokens for h in constrained[name][i]] == [h.tokens for h in plain[name][i]]
                assert [h.score for h in constrained[name][i]] == pytest.approx(
                    [h.score for h in plain[name][i]], abs=1e-6)
        assert any(constrained[name][i][0].tokens != plain[name][i][0].tokens for i in range(len(LENGTHS)))


def test_batched_equals_one_by_one_with_terms(model: Transformer) -> None:
    src, terms = source_batch(LENGTHS, seed=40), mixed_terms(6)
    together = searches(model, src, terms)
    for i, n in enumerate(LENGTHS):
        alone = searches(model, src[i:i + 1, :n], [terms[i]])
        for name in together:
            assert [h.tokens for h in alone[name][0]] == [h.tokens for h in together[name][i]], (name, i)
            assert [h.score for h in alone[name][0]] == pytest.approx(
                [h.score for h in together[name][i]], abs=1e-6)


def test_cached_equals_uncached_with_and_without_terms(model: Transformer) -> None:
    src = source_batch(LENGTHS[:5], seed=50)
    for terms in (None, mixed_terms(7, 5)):
        cached, uncached = searches(model, src, terms), searches(model, src, terms, use_cache=False)
        for name in cached:
            for a, b in zip(cached[name], uncached[name], strict=True):
                assert [h.tokens for h in a] == [h.tokens for h in b], name
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)


def test_attention_comes_with_constrained_hypotheses(model: Transformer) -> None:
    src, terms = source_batch(LENGTHS[:4], seed=60), mixed_terms(8, 4)
    found = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, n_best=2, return_attention=True,
                        constraints=Constraints.build(terms, CPU))
    for hyps, n in zip(found, LENGTHS[:4], strict=True):
        for h in hyps:
            assert h.attention is not None and h.attention.shape[2:] == (len(h.tokens) + 1, n)


# -- lengths, prefixes, decode_ids -------------------------------------------------------------------------
def test_the_length_limit_grows_to_fit_the_terms(model: Transformer) -> None:
    src = source_batch([3, 3], seed=70)
    terms = [[[[7, 8, 9]], [[10, 11]]], [[[12, 13, 14, 15]]]]
    for name, found in searches(model, src, terms, max_len_a=0.0, max_len_b=1).items():
        for hyps, t in zip(found, terms, strict=True):
            assert hyps and all(holds(h.tokens, x) for h in hyps for x in t), name
            assert all(len(h.tokens) <= 5 for h in hyps)  # the limit is the terms' own length, no more


def test_terms_the_positions_cannot_hold_are_refused_not_dropped() -> None:
    short = random_model(seed=1, max_positions=8)  # writes at most 7 tokens
    src = source_batch([4, 4], seed=71)
    terms = [[[[5, 6, 7]]], [[[5, 6, 7, 8]], [[9, 10, 11, 12]]]]
    with pytest.raises(ValueError, match="sentence 1: its prefix and terms need 8 target tokens"):
        beam_search(short, src, bos_id=BOS, eos_id=EOS, constraints=Constraints.build(terms, CPU))
    with pytest.raises(ValueError, match="need 9 target tokens"):
        beam_search(short, src[:1], bos_id=BOS, eos_id=EOS, prefixes=[[20] * 6],
                    constraints=Constraints.build(terms[:1], CPU))


def test_prefix_and_terms_together(model: Transformer) -> None:
    src, terms = source_batch(LENGTHS[:4], seed=80), mixed_terms(9, 4)
    prefixes = [[5, 9], [], [7], [11, 12, 13]]
    for name, found in searches(model, src, terms, prefixes=prefixes).items():
        for hyps, t, p in zip(found, terms, prefixes, strict=True):
            assert hyps, name
            assert all(h.tokens[:len(p)] == p and all(holds(h.tokens, x) for x in t) for h in hyps), name
    inside = [[[[5, 9]]], [], [], []]  # a term the prefix writes is met by it: nothing more to force
    ends = dict(bos_id=BOS, eos_id=EOS, beam_size=3, prefixes=prefixes)
    found = beam_search(model, src, constraints=Constraints.build(inside, CPU), **ends)
    assert [h.tokens for h in found[0]] == [h.tokens for h in beam_search(model, src, **ends)[0]]


def test_decode_ids_threads_terms_to_greedy_and_beam(model: Transformer) -> None:
    src_ids = [list(range(3, 3 + n)) for n in (5, 2, 7)]
    terms = [[[[20, 21]], [[22]]], [], [[[30], [31, 32]]]]
    for decoding in (DecodingConfig(beam_size=1), DecodingConfig(beam_size=4, n_best=2)):
        plain = decode_ids(model, src_ids, decoding, CPU)
        found = decode_ids(model, src_ids, decoding, CPU, terms=terms)
        for hyps, t in zip(found, terms, strict=True):
            assert hyps and all(holds(h.tokens, x) for h in hyps for x in t)
        assert [h.tokens for h in found[1]] == [h.tokens for h in plain[1]]
        assert decode_ids(model, src_ids, decoding, CPU, terms=[[], [], []]) == plain
    with pytest.raises(ValueError, match="not sampling"):
        decode_ids(model, src_ids, DecodingConfig(sampling=True), CPU, terms=terms)


def test_bank_greedy_places_a_term_where_the_model_wants_it() -> None:
    """bos → X .7 | T .3;  X → T .9 | eos .1;  T → eos.  The term is T. One beam (K=1) gives the slot to
    the fullest bank and writes T first (T eos, p .3); the best of each bank finds X T (p .63)."""
    X, T = 4, 5
    stub = TableModel(table({BOS: {X: 0.7, T: 0.3}, X: {T: 0.9, EOS: 0.1}, T: {EOS: 1.0}}))
    src, c = torch.tensor([[7, 7, EOS]]), Constraints.build([[[[T]]]], CPU)
    assert greedy_search(stub, src, bos_id=BOS, eos_id=EOS)[0][0].tokens == [X, T]
    one = beam_search(stub, src, bos_id=BOS, eos_id=EOS, beam_size=1, length_penalty=0.0, constraints=c)[0][0]
    assert one.tokens == [T] and one.score == pytest.approx(math.log(0.3), abs=1e-6)
    best = bank_greedy_search(stub, src, c, bos_id=BOS, eos_id=EOS)[0][0]
    assert best.tokens == [X, T] and best.score == pytest.approx(math.log(0.63), abs=1e-6)


def test_the_search_stops_only_when_no_beam_can_win() -> None:
    """Beams are in bank turns, not in score order: beam 0 is the fullest bank's best. Here, after A eos
    (p .3) finished, beam 0 is X Y A (p .007) while X Y W (p .69) is live and goes on to X Y W A eos
    (p .68): judging by beam 0 would stop with A."""
    A, X, Y, W = 4, 5, 6, 7
    stub = TableModel(table({BOS: {A: 0.3, X: 0.7}, A: {EOS: 1.0}, X: {Y: 0.999, A: 0.001},
                             Y: {W: 0.99, A: 0.01}, W: {A: 0.99, EOS: 0.01}}))
    best = beam_search(stub, torch.tensor([[7, 7, EOS]]), bos_id=BOS, eos_id=EOS, beam_size=4,
                       length_penalty=0.0, constraints=Constraints.build([[[[A]]]], CPU))[0][0]
    assert best.tokens == [X, Y, W, A]
    assert best.score == pytest.approx(math.log(0.7 * 0.999 * 0.99 * 0.99), abs=1e-6)
