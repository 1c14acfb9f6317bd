"""Tests of transformer_mt.decoding.search and decoding.beam: greedy, beam search and sampling."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from transformer_mt.config import ModelConfig
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.search import Hypothesis, greedy_search, sample
from transformer_mt.model import Transformer

PAD, BOS, EOS = 0, 1, 2
V = 40


def random_model(seed: int = 0, **overrides) -> Transformer:
    """An untrained float64 tiny model (float64 keeps near-ties from flipping between runs)."""
    torch.manual_seed(seed)
    kw = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
              max_positions=64, tie_embeddings=False, tie_output=False)  # tied+untrained mostly copies
    kw.update(overrides)
    model = Transformer(ModelConfig(**kw), V, V, PAD).double().eval()
    with torch.no_grad():  # sharper distributions: varied outputs, some stopping early on eos
        model.output_projection.weight.mul_(3.0)
    return model


def source_batch(lengths: list[int], seed: int = 0) -> torch.Tensor:
    """Right-padded (B, S) sources ending in eos."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n - 1] = torch.randint(3, V, (n - 1,), generator=g)
        src[i, n - 1] = EOS
    return src


LENGTHS = [6, 3, 8, 5]


def tokens(result: list[list[Hypothesis]]) -> list[list[int]]:
    """The best hypothesis' tokens of every sentence."""
    return [hyps[0].tokens for hyps in result]


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_model()


def test_greedy_cached_equals_uncached(model: Transformer) -> None:
    src = source_batch(LENGTHS)
    cached = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    uncached = greedy_search(model, src, bos_id=BOS, eos_id=EOS, use_cache=False)
    assert tokens(cached) == tokens(uncached)
    for a, b in zip(cached, uncached, strict=True):
        assert a[0].score == pytest.approx(b[0].score, abs=1e-6)
    assert len({len(t) for t in tokens(cached)}) > 1  # sentences really stop at different steps


def test_greedy_score_is_sum_of_log_probs(model: Transformer) -> None:
    src = source_batch([5])
    hyp = greedy_search(model, src, bos_id=BOS, eos_id=EOS)[0][0]
    tgt = torch.tensor([[BOS, *hyp.tokens, EOS]])
    with torch.no_grad():
        logp = model(src, tgt[:, :-1]).log_softmax(-1)
    expected = logp[0].gather(1, tgt[0, 1:, None]).sum().item()
    assert hyp.score == pytest.approx(expected, abs=1e-6)


def test_beam_size_one_equals_greedy(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=1)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1)
    assert tokens(beam) == tokens(greedy)


def test_batched_equals_one_by_one(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=2)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=2)
    for i, n in enumerate(LENGTHS):
        alone = src[i:i + 1, :n]
        g = greedy_search(model, alone, bos_id=BOS, eos_id=EOS)[0]
        b = beam_search(model, alone, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=2)[0]
        assert g[0].tokens == greedy[i][0].tokens
        assert g[0].score == pytest.approx(greedy[i][0].score, abs=1e-6)
        assert [h.tokens for h in b] == [h.tokens for h in beam[i]]
        assert [h.score for h in b] == pytest.approx([h.score for h in beam[i]], abs=1e-6)


def test_n_best_sorted_and_complete(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=3)
    result = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=5, n_best=3)
    assert len(result) == len(LENGTHS)
    for hyps in result:
        assert len(hyps) == 3
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 3  # distinct hypotheses
        assert all(PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens
                   for h in hyps)


def test_beam_score_is_length_normalised(model: Transformer) -> None:
    src = source_batch([7], seed=4)
    alpha = 0.6
    hyp = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, length_penalty=alpha)[0][0]
    tgt = torch.tensor([[BOS, *hyp.tokens, EOS]])
    with torch.no_grad():
        logp = model(src, tgt[:, :-1]).log_softmax(-1)
    total = logp[0].gather(1, tgt[0, 1:, None]).sum().item()
    lp = ((5 + len(hyp.tokens) + 1) / 6) ** alpha
    assert hyp.score == pytest.approx(total / lp, abs=1e-6)


def test_beam_is_never_worse_than_greedy(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=5)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=5, length_penalty=0.0)
    for g, b in zip(greedy, beam, strict=True):
        assert b[0].score >= g[0].score - 1e-9


# ---------------------------------------------------------------------------------------------
# A hand-built model on which greedy search is sub-optimal


class TableModel(nn.Module):
    """Stub with Transformer's encode/decode/new_cache interface: next-token log-probs depend
    only on the previous token, read from a fixed table."""

    def __init__(self, table: torch.Tensor, max_positions: int = 64) -> None:
        super().__init__()
        self.config = SimpleNamespace(max_positions=max_positions)
        self.pad_id = PAD
        self.table = table.log()  # (V, V): row = previous token
        self.calls = 0

    def encode(self, src):
        return torch.zeros(*src.shape, 1), src == PAD

    def decode(self, tgt, memory, src_pad_mask, cache=None, need_attention=False):
        self.calls += 1
        logits = self.table[tgt]  # (B, T, V)
        if cache is not None:
            cache.length += tgt.size(1)
        if need_attention:
            return logits, torch.ones(tgt.size(0), 1, 1, tgt.size(1), src_pad_mask.size(1))
        return logits

    def new_cache(self):
        cache = SimpleNamespace(length=0, beams=1)
        cache.reorder = lambda index, cross_index=None: None
        return cache


def trap_table() -> torch.Tensor:
    """bos → A .55 | B .44 | C .01;  A → C .35 | eos .33 | A .32;  B → eos .9 | C .1;
    C → eos 1.  Greedy: A C eos (p = .1925). Best: B eos (p = .396)."""
    A, B, C = 3, 4, 5
    t = torch.full((6, 6), 1e-9)
    t[BOS, A], t[BOS, B], t[BOS, C] = 0.55, 0.44, 0.01
    t[A, C], t[A, EOS], t[A, A] = 0.35, 0.33, 0.32
    t[B, EOS], t[B, C] = 0.9, 0.1
    t[C, EOS] = 1.0
    t[EOS, EOS] = t[PAD, EOS] = 1.0
    return t / t.sum(-1, keepdim=True)


def test_beam_finds_better_sequence_than_greedy() -> None:
    stub = TableModel(trap_table())
    src = torch.tensor([[7, 7, EOS]])
    greedy = greedy_search(stub, src, bos_id=BOS, eos_id=EOS)[0][0]
    assert greedy.tokens == [3, 5]
    assert greedy.score == pytest.approx(math.log(0.55 * 0.35), abs=1e-6)
    for alpha in (0.0, 0.6, 1.0):
        best = beam_search(stub, src, bos_id=BOS, eos_id=EOS, beam_size=2,
                           length_penalty=alpha)[0][0]
        assert best.tokens == [4]
        assert best.score == pytest.approx(math.log(0.44 * 0.9) / (7 / 6) ** alpha, abs=1e-6)
    assert beam_search(stub, src, bos_id=BOS, eos_id=EOS, beam_size=1)[0][0].tokens == [3, 5]


def table(rows: dict[int, dict[int, float]], size: int = 8) -> torch.Tensor:
    """(size, size) next-token probabilities from {prev: {next: p}}, tiny floor elsewhere."""
    t = torch.full((size, size), 1e-9)
    for prev, row in rows.items():
        for nxt, p in row.items():
            t[prev, nxt] = p
    return t / t.sum(-1, keepdim=True)


def test_beam_keeps_going_while_a_live_beam_can_still_win() -> None:
    A, B, D, E = 3, 4, 5, 6
    stub = TableModel(table({BOS: {A: 0.6, B: 0.4}, A: {EOS: 0.55, D: 0.45}, B: {E: 1.0},
                             D: {EOS: 1.0}, E: {EOS: 1.0}}))
    src = torch.tensor([[7, 7, EOS]])
    assert greedy_search(stub, src, bos_id=BOS, eos_id=EOS)[0][0].tokens == [A]
    for alpha in (0.0, 1.0):
        # after step 2, "A eos" is finished (p .33) but the live "B E" (p .4) can still win
        best = beam_search(stub, src, bos_id=BOS, eos_id=EOS, beam_size=2,
                           length_penalty=alpha)[0][0]
        assert best.tokens == [B, E]


def test_beam_stops_once_no_live_beam_can_win() -> None:
    A, B = 3, 4
    stub = TableModel(table({BOS: {EOS: 0.9, A: 0.05, B: 0.05}, A: {A: 1.0}, B: {B: 1.0}}))
    best = beam_search(stub, torch.tensor([[7, EOS]]), bos_id=BOS, eos_id=EOS, beam_size=3,
                       length_penalty=0.0)[0][0]
    assert best.tokens == [] and best.score == pytest.approx(math.log(0.9), abs=1e-6)
    assert stub.calls == 1  # without the bound it would decode A A A ... up to max length


def test_stub_n_best_lists_all_finished() -> None:
    stub = TableModel(trap_table())
    src = torch.tensor([[7, EOS]])
    hyps = beam_search(stub, src, bos_id=BOS, eos_id=EOS, beam_size=3, n_best=3,
                       length_penalty=0.0)[0]
    assert [h.tokens for h in hyps] == [[4], [3, 5], [3]]
    expected = [math.log(0.44 * 0.9), math.log(0.55 * 0.35), math.log(0.55 * 0.33)]
    assert [h.score for h in hyps] == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Lengths, sampling, attention, degenerate input


def test_max_length_respected() -> None:
    m = random_model(seed=1)
    with torch.no_grad():  # make eos impossible-ish: every sentence must be cut at max length
        m.output_projection.weight[EOS] = -10 * m.output_projection.weight[EOS].abs().sum()
    src = source_batch(LENGTHS, seed=6)
    a, b = 0.5, 2
    for result in (
        greedy_search(m, src, bos_id=BOS, eos_id=EOS, max_len_a=a, max_len_b=b),
        greedy_search(m, src, bos_id=BOS, eos_id=EOS, max_len_a=a, max_len_b=b, use_cache=False),
        beam_search(m, src, bos_id=BOS, eos_id=EOS, beam_size=3, max_len_a=a, max_len_b=b),
        sample(m, src, bos_id=BOS, eos_id=EOS, max_len_a=a, max_len_b=b),
    ):
        assert [len(h[0].tokens) for h in result] == [math.floor(a * n + b) for n in LENGTHS]

    short = random_model(seed=1, max_positions=5)  # decoder positions also cap the length
    out = greedy_search(short, source_batch([4]), bos_id=BOS, eos_id=EOS, max_len_b=100)
    assert len(out[0][0].tokens) <= 4
    out = beam_search(short, source_batch([4]), bos_id=BOS, eos_id=EOS, max_len_b=100)
    assert len(out[0][0].tokens) <= 4


def test_sample_top_k_one_equals_greedy(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=7)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    g = torch.Generator().manual_seed(0)
    assert tokens(sample(model, src, bos_id=BOS, eos_id=EOS, top_k=1, generator=g)) \
        == tokens(greedy)
    assert tokens(sample(model, src, bos_id=BOS, eos_id=EOS, top_p=1e-6, generator=g)) \
        == tokens(greedy)


def test_sample_is_reproducible_and_varied(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=8)

    def run(seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        out = sample(model, src, bos_id=BOS, eos_id=EOS, temperature=1.5, top_k=10, top_p=0.9,
                     generator=g)
        return tokens(out)

    assert run(0) == run(0)
    assert any(run(0) != run(s) for s in (1, 2, 3))
    for hyp in run(0):
        assert PAD not in hyp and BOS not in hyp


def test_return_attention_shapes(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=9)
    for result in (
        greedy_search(model, src, bos_id=BOS, eos_id=EOS, return_attention=True),
        greedy_search(model, src, bos_id=BOS, eos_id=EOS, return_attention=True, use_cache=False),
        beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, n_best=2,
                    return_attention=True),
    ):
        for hyps, n in zip(result, LENGTHS, strict=True):
            for h in hyps:
                assert h.attention is not None
                layers, heads = model.config.decoder_layers, model.config.n_heads
                assert h.attention.shape == (layers, heads, len(h.tokens) + 1, n)
                assert torch.allclose(h.attention.sum(-1), torch.ones(layers, heads, len(h.tokens) + 1))
    plain = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    with_attention = greedy_search(model, src, bos_id=BOS, eos_id=EOS, return_attention=True)
    assert tokens(plain) == tokens(with_attention)


def test_degenerate_source_does_not_crash() -> None:
    m = random_model(seed=3, tie_embeddings=True, norm_first=True)
    m.float()
    src = torch.tensor([[EOS], [PAD]])  # just eos, and an empty (all-pad) row
    for result in (
        greedy_search(m, src, bos_id=BOS, eos_id=EOS),
        greedy_search(m, src, bos_id=BOS, eos_id=EOS, use_cache=False),
        beam_search(m, src, bos_id=BOS, eos_id=EOS, n_best=2, return_attention=True),
        sample(m, src, bos_id=BOS, eos_id=EOS),
    ):
        assert len(result) == 2
        for hyps in result:
            assert hyps and all(math.isfinite(h.score) for h in hyps)
            assert all(len(h.tokens) <= 10 + math.floor(1.5 * 1) for h in hyps)  # the default limit


def test_invalid_arguments() -> None:
    m = random_model()
    src = source_batch([3])
    with pytest.raises(ValueError):
        beam_search(m, src, bos_id=BOS, eos_id=EOS, beam_size=2, n_best=3)
    with pytest.raises(ValueError):
        sample(m, src, bos_id=BOS, eos_id=EOS, temperature=0.0)


# -- prefix (forced) decoding -------------------------------------------------------------------------
PREFIXES = [[5, 9], [], [7], [11, 12, 13]]


def test_outputs_start_with_their_prefix(model: Transformer) -> None:
    src = source_batch(LENGTHS)
    for result in (greedy_search(model, src, bos_id=BOS, eos_id=EOS, prefixes=PREFIXES),
                   greedy_search(model, src, bos_id=BOS, eos_id=EOS, prefixes=PREFIXES, use_cache=False),
                   beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=3, prefixes=PREFIXES),
                   sample(model, src, bos_id=BOS, eos_id=EOS, prefixes=PREFIXES,
                          generator=torch.Generator().manual_seed(0))):
        for hyps, prefix in zip(result, PREFIXES, strict=True):
            for h in hyps:
                assert h.tokens[: len(prefix)] == prefix


def test_empty_prefixes_equal_no_prefix_and_beam_one_equals_greedy(model: Transformer) -> None:
    src = source_batch(LENGTHS)
    plain = greedy_search(model, src, bos_id=BOS, eos_id=EOS)
    assert tokens(greedy_search(model, src, bos_id=BOS, eos_id=EOS, prefixes=[[]] * 4)) == tokens(plain)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, prefixes=PREFIXES)
    beam1 = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, length_penalty=0.0,
                        prefixes=PREFIXES)
    assert tokens(beam1) == tokens(greedy)
    for g, b in zip(greedy, beam1, strict=True):
        assert g[0].score == pytest.approx(b[0].score, abs=1e-9)


def test_prefix_scores_are_the_model_log_probs(model: Transformer) -> None:
    """A forced token costs what the model gives it: the score of the prefixed output equals teacher
    forcing of the whole output."""
    src = source_batch(LENGTHS[:1])
    hyp = greedy_search(model, src, bos_id=BOS, eos_id=EOS, prefixes=[[5, 9]])[0][0]
    out = torch.tensor([[BOS, *hyp.tokens]])
    with torch.no_grad():
        logp = torch.log_softmax(model(src, out).double(), dim=-1)[0]
    target = [*hyp.tokens, EOS]
    assert hyp.score == pytest.approx(sum(float(logp[i, t]) for i, t in enumerate(target)), abs=1e-4)


def test_a_prefix_longer_than_the_length_limit_is_still_forced(model: Transformer) -> None:
    src = source_batch([2])
    long = list(range(3, 20))
    hyp = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_a=0.0, max_len_b=2, prefixes=[long])[0][0]
    assert hyp.tokens == long  # the limit grows to the prefix, then eos is forced


# -- ensembles ------------------------------------------------------------------------------------------
def test_an_ensemble_of_one_equals_the_model(model: Transformer) -> None:
    from transformer_mt.model import Ensemble

    src = source_batch(LENGTHS)
    ensemble = Ensemble([model]).eval()
    for search in (lambda m: greedy_search(m, src, bos_id=BOS, eos_id=EOS),
                   lambda m: beam_search(m, src, bos_id=BOS, eos_id=EOS, beam_size=3, n_best=2)):
        alone, together = search(model), search(ensemble)
        assert [[h.tokens for h in n] for n in alone] == [[h.tokens for h in n] for n in together]
        for a, b in zip(alone, together, strict=True):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-9)


def test_an_ensemble_averages_the_models_probabilities(model: Transformer) -> None:
    from transformer_mt.model import Ensemble

    other = random_model(seed=5, encoder_layers=3, decoder_layers=1)  # another shape: a student's stacks
    src = source_batch(LENGTHS)
    tgt = torch.tensor([[BOS, 5, 6, 7]] * len(LENGTHS))
    twins = Ensemble([model, model]).eval()
    pair = Ensemble([model, other]).eval()
    with torch.no_grad():
        memory, src_pad = twins.encode(src)
        alone = torch.log_softmax(model(src, tgt).float(), dim=-1)
        assert torch.allclose(twins.decode(tgt, memory, src_pad), alone, atol=1e-6)
        memory, src_pad = pair.encode(src)
        expected = torch.log((alone.exp() + torch.softmax(other(src, tgt).float(), dim=-1)) / 2)
        assert torch.allclose(pair.decode(tgt, memory, src_pad), expected, atol=1e-6)
        # cached step by step equals the full decode, for the pair too
        cache = pair.new_cache()
        steps = [pair.decode(tgt[:, t:t + 1], memory, src_pad, cache) for t in range(tgt.size(1))]
        assert torch.allclose(torch.cat(steps, dim=1), expected, atol=1e-5)
    for result in (greedy_search(pair, src, bos_id=BOS, eos_id=EOS),
                   beam_search(pair, src, bos_id=BOS, eos_id=EOS, beam_size=3, return_attention=True)):
        assert len(result) == len(LENGTHS) and all(hyps for hyps in result)
