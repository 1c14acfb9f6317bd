"""Tests of decoding/shortlist.py and the searches over a shortlist's columns: against the full-vocabulary
search of the same model with every other token's logit at -inf (one sentence at a time), cached against
uncached, batched against one by one, int8 and ensembles, the file's checks, and the run's own list."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from tests.test_search import BOS, EOS, PAD, V, random_model, source_batch
from transformer_mt.data.ragged import Ragged
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.search import Columns, Hypothesis, greedy_search
from transformer_mt.decoding.shortlist import (
    COLUMN_MULTIPLE,
    SHORTLIST_FILE,
    Shortlist,
    build_shortlist,
    read_shortlist,
    write_shortlist,
)
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Ensemble, Transformer

LENGTHS = [6, 3, 8, 5, 7]


def toy_shortlist(per_token: int = 3, seed: int = 0) -> Shortlist:
    """Each source id's `per_token` random target ids, two frequent ones, the joint identity."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(3, V, (V, per_token), generator=g)
    table[5, 1:] = -1  # a source token seen with one target token only
    return Shortlist(table, torch.tensor([3, 4]), torch.arange(V), V)


class Masked(nn.Module):
    """A model whose logits outside `allowed` are -inf: its full-vocabulary search is what the search over
    a shortlist's columns must give."""

    def __init__(self, model: nn.Module, allowed: torch.Tensor) -> None:
        super().__init__()
        self.model, self.allowed = model, allowed
        self.config, self.pad_id = model.config, model.pad_id

    def encode(self, src: torch.Tensor):
        return self.model.encode(src)

    def decode(self, tgt, memory, src_pad_mask, cache=None, need_attention=False):
        out = self.model.decode(tgt, memory, src_pad_mask, cache, need_attention=need_attention)
        logits, attn = out if need_attention else (out, None)
        logits = logits.masked_fill(~self.allowed, float("-inf"))
        return (logits, attn) if need_attention else logits

    def new_cache(self, *columns):
        return self.model.new_cache(*columns)


def allowed_of(columns: Columns, row: int) -> torch.Tensor:
    """(V,) True at the target ids sentence `row` may write."""
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[columns.ids[columns.own[row]]] = True
    return allowed


def searches(beam: int, **kw):
    if beam == 1:
        return lambda m, src, **more: greedy_search(m, src, bos_id=BOS, eos_id=EOS, **kw, **more)
    return lambda m, src, **more: beam_search(m, src, bos_id=BOS, eos_id=EOS, beam_size=beam, n_best=2, **kw,
                                              **more)


def assert_same(got: list[list[Hypothesis]], expected: list[list[Hypothesis]]) -> None:
    assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in expected]
    for a, b in zip(got, expected, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)  # float32 log-softmax


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_model()


@pytest.mark.parametrize("beam", [1, 4])
def test_the_columns_search_equals_the_full_search_with_other_tokens_masked(model: Transformer,
                                                                            beam: int) -> None:
    src = source_batch(LENGTHS)
    shortlist = toy_shortlist()
    columns = shortlist.columns(src)
    search = searches(beam)
    got = search(model, src, columns=columns)
    expected = []
    for i, n in enumerate(LENGTHS):
        expected += search(Masked(model, allowed_of(columns, i)), src[i:i + 1, :n])
    assert_same(got, expected)
    for hyps, i in zip(got, range(len(LENGTHS))):  # every token is one of the sentence's own
        assert all(allowed_of(columns, i)[t] for h in hyps for t in h.tokens)


@pytest.mark.parametrize("beam", [1, 4])
def test_cached_equals_uncached_and_batched_equals_one_by_one_over_columns(model: Transformer,
                                                                           beam: int) -> None:
    src = source_batch(LENGTHS, seed=3)
    shortlist = toy_shortlist(seed=1)
    cached = searches(beam)(model, src, columns=shortlist.columns(src))
    uncached = searches(beam, use_cache=False)(model, src, columns=shortlist.columns(src))
    assert_same(cached, uncached)
    alone = []
    for i, n in enumerate(LENGTHS):  # each sentence's own columns alone: no batch mate's
        one = src[i:i + 1, :n]
        alone += searches(beam)(model, one, columns=shortlist.columns(one))
    assert_same(cached, alone)


def test_a_shortlist_of_every_token_gives_the_full_searchs_translations(model: Transformer) -> None:
    src = source_batch(LENGTHS, seed=2)
    everything = Shortlist(torch.full((V, 1), -1), torch.arange(V), torch.full((V,), -1), V)
    written = torch.ones(V, dtype=torch.bool)
    written[[PAD, BOS]] = False  # never in a shortlist: its log-probs are normalised without them
    greedy = searches(1)(model, src, columns=everything.columns(src))
    assert [h[0].tokens for h in greedy] == [h[0].tokens for h in searches(1)(model, src)]
    for beam in (1, 3):  # (an untrained model gives pad and bos mass enough to reorder beams)
        assert_same(searches(beam)(model, src, columns=everything.columns(src)),
                    searches(beam)(Masked(model, written), src))


def test_prefixes_are_forced_through_the_columns(model: Transformer) -> None:
    src = source_batch(LENGTHS[:3], seed=4)
    prefixes = [[7, 8], [], [30, 31, 32]]
    forced = torch.tensor([[7, 8, -1], [-1, -1, -1], [30, 31, 32]])
    shortlist = Shortlist(torch.full((V, 1), 3), torch.tensor([4]), torch.full((V,), -1), V)  # holds none
    columns = shortlist.columns(src, forced)
    for beam in (1, 3):
        got = searches(beam)(model, src, columns=columns, prefixes=prefixes)
        for hyps, prefix in zip(got, prefixes, strict=True):
            assert all(h.tokens[:len(prefix)] == prefix for h in hyps)
        expected = []
        for i, n in enumerate(LENGTHS[:3]):
            expected += searches(beam)(Masked(model, allowed_of(columns, i)), src[i:i + 1, :n],
                                       prefixes=[prefixes[i]])
        assert_same(got, expected)


def test_an_ensemble_searches_each_models_columns(model: Transformer) -> None:
    other = random_model(seed=5, encoder_layers=3, decoder_layers=1)
    src = source_batch(LENGTHS, seed=6)
    columns = toy_shortlist(seed=2).columns(src)
    got = searches(3)(Ensemble([model, other]).eval(), src, columns=columns)
    expected = []
    for i, n in enumerate(LENGTHS):  # each model's probabilities over the sentence's columns, then mixed
        allowed = allowed_of(columns, i)
        pair = Ensemble([Masked(model, allowed), Masked(other, allowed)]).eval()
        expected += searches(3)(pair, src[i:i + 1, :n])
    assert_same(got, expected)


def test_an_int8_model_projects_its_columns_with_its_own_weights() -> None:
    from transformer_mt.runtime.quantize import quantized

    float_model = random_model(seed=7).float()
    int8 = quantized(float_model)
    src = source_batch(LENGTHS, seed=8)
    columns = toy_shortlist(seed=3).columns(src)
    tgt = torch.tensor([[BOS, 5, 9]] * len(LENGTHS))
    with torch.inference_mode():
        memory, src_pad = int8.encode(src)
        full = int8.decode(tgt, memory, src_pad)
        cache = int8.new_cache(columns.ids, columns.own)
        shortlisted = int8.decode(tgt, memory, src_pad, cache)
    own = columns.own[:, None, :].expand(-1, tgt.size(1), -1)
    picked = full[:, :, columns.ids]
    assert torch.isinf(shortlisted[~own]).all()
    # the columns' int8 product: the same int8 weights, scales and input quantization as the full one's
    torch.testing.assert_close(shortlisted[own], picked[own], rtol=1e-6, atol=1e-6)
    for beam in (1, 3):
        assert len(searches(beam)(int8, src, columns=columns)) == len(LENGTHS)


def test_columns_hold_each_sentences_own_ids_eos_first() -> None:
    shortlist = toy_shortlist()
    src = source_batch([4, 2], seed=9)
    columns = shortlist.columns(src)
    assert columns.ids[0] == EOS and columns.own[:, 0].all()
    assert not {PAD, BOS} & set(columns.ids.tolist())
    assert columns.ids.numel() % COLUMN_MULTIPLE == 0  # the spare columns: <eos> again, nobody's
    assert not columns.own[:, 1:][:, columns.ids[1:] == EOS].any()
    real = columns.ids[columns.own.any(0)].tolist()
    assert len(set(real)) == len(real)
    for i in range(2):
        tokens = [t for t in src[i].tolist() if t != PAD]
        want = {EOS, 3, 4} | {t for s in tokens for t in shortlist.table[s].tolist() if t >= 0} | set(tokens)
        want -= {PAD, BOS}
        assert set(columns.ids[columns.own[i]].tolist()) == want


def ragged(rows: list[list[int]]) -> Ragged:
    return Ragged.from_lists(rows)


def test_the_table_ranks_a_source_tokens_translations_above_frequent_words() -> None:
    # source 10 ("cat") comes with target 20 ("chat") three times; target 4 ("le") is in every pair
    src = ragged([[10, 11], [10, 12], [10, 13], [11, 12], [13, 11]])
    tgt = ragged([[20, 4, 21], [20, 4, 22], [20, 4, 23], [4, 21, 22], [4, 23, 21]])
    vocab = SimpleNamespace(src_vocab_size=30, tgt_vocab_size=30, joint=True)
    shortlist = build_shortlist(src, tgt, vocab, per_token=2, frequent=1)
    assert shortlist.table[10].tolist() == [20, 4]  # Dice: 2·3/(3+3) for "chat", 2·3/(3+5) for "le"
    assert shortlist.frequent.tolist() == [4]
    assert shortlist.table[29].tolist() == [-1, -1]  # never seen
    assert shortlist.identity.tolist() == list(range(30))


def test_a_separate_vocabulary_maps_identical_tokens() -> None:
    class Tok:
        def __init__(self, words: list[str]) -> None:
            self.words = words

        def get_vocab(self) -> dict[str, int]:
            return {w: i for i, w in enumerate(self.words)}

    vocab = SimpleNamespace(src_vocab_size=3, tgt_vocab_size=4, joint=False,
                            src=Tok(["<pad>", "Paris", "cat"]), tgt=Tok(["<pad>", "chat", "x", "Paris"]))
    shortlist = build_shortlist(ragged([[1, 2]]), ragged([[3, 1]]), vocab)
    assert shortlist.identity.tolist() == [0, 3, -1]


def test_the_file_round_trips_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    vocab = SimpleNamespace(src_vocab_size=V, tgt_vocab_size=V, joint=True)
    src = ragged([[5, 6, 7], [8, 9]])
    path = write_shortlist(tmp_path, src, ragged([[10, 11], [12]]), vocab)
    assert path == tmp_path / SHORTLIST_FILE
    read = read_shortlist(tmp_path, vocab)
    built = build_shortlist(src, ragged([[10, 11], [12]]), vocab)
    batch = source_batch(LENGTHS)
    assert torch.equal(read.columns(batch).ids, built.columns(batch).ids)
    assert torch.equal(read.columns(batch).own, built.columns(batch).own)
    data = json.loads(path.read_text())
    for broken, says in ((dict(data, tgt_vocab_size=V + 1), "target tokens"),
                         (dict(data, frequent=[V]), "outside"),
                         (dict(data, table=data["table"][:-1]), "one row per source token"),
                         (dict(data, identity=["x"] * V), "token ids"),
                         (dict(data, format="other"), "format")):
        path.write_text(json.dumps(broken))
        with pytest.raises(CheckpointError, match=says) as e:
            read_shortlist(tmp_path, vocab)
        assert "\n" not in str(e.value)
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="not a shortlist"):
        read_shortlist(tmp_path, vocab)
    path.unlink()
    with pytest.raises(CheckpointError, match="no shortlist.json"):
        read_shortlist(tmp_path, vocab)


def test_a_trained_run_translates_over_its_shortlist(tiny_run: Path, run_cli_here) -> None:
    from transformer_mt.config import DecodingConfig
    from transformer_mt.decoding.translator import Translator

    assert (tiny_run / SHORTLIST_FILE).is_file()  # train wrote it
    engine = Translator.from_checkpoint(tiny_run, device="cpu", amp="off",
                                        decoding=DecodingConfig(shortlist=True, confidence=False))
    assert engine.shortlist is not None
    sentences = ["I am cold.", "Where is the station?", "Tom likes cats."]
    for beam in (1, 4):
        got = engine.translate_nbest(sentences, beam_size=beam)
        alone = [engine.translate_nbest([s], beam_size=beam)[0] for s in sentences]
        assert [[t.text for t in n] for n in got] == [[t.text for t in n] for n in alone]
    result = run_cli_here("translate", f"checkpoint={tiny_run}", "decoding.shortlist=true", "text=I am cold.")
    assert result.returncode == 0 and result.stdout.count("\n") == 1, result.stderr  # (a tiny model's line)
    refused = run_cli_here("translate", f"checkpoint={tiny_run}", "decoding.shortlist=true",
                           "decoding.sampling=true", "text=I am cold.")
    assert refused.returncode != 0 and "decoding.shortlist=true is for beam and greedy" in refused.stderr


def test_a_run_without_a_shortlist_says_how_to_count_one(tiny_run_copy: Path, run_cli_here) -> None:
    (tiny_run_copy / SHORTLIST_FILE).unlink()
    result = run_cli_here("translate", f"checkpoint={tiny_run_copy}", "decoding.shortlist=true", "text=Hi.")
    assert result.returncode != 0
    assert "scripts/build_shortlist.py" in result.stderr and "Traceback" not in result.stderr
