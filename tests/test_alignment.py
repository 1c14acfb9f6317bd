"""Word alignments (`decoding.alignment`): pieces mapped to whole words for every tokenizer kind, links from
attention, the forced-decoding pass against the searches' own attention, and the alignments `translate`
and `serve` give on the trained tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import held_out_pairs, require
from transformer_mt.config import DecodingConfig, TokenizerConfig
from transformer_mt.data.tokenizer import train_tokenizers
from transformer_mt.decoding.alignment import pharaoh, source_words, target_words, word_alignment
from transformer_mt.decoding.scoring import forced_attention
from transformer_mt.decoding.translator import Translator, decode_ids

ODD = ["He is sleeping.", "Where is  the station?", "Tom\u00a0ate  an   apple, didn't he?", " café au lait "]


@pytest.mark.parametrize("kind", ["bpe", "wordlevel", "unigram", "char"])
def test_pieces_map_to_the_whitespace_words_of_the_text(kind: str) -> None:
    cfg = TokenizerConfig(kind=kind, vocab_size=300 if kind == "bpe" else 60, min_frequency=1)
    vocab = train_tokenizers(cfg, ODD * 3, ODD * 3)
    for text in ODD:
        ids = vocab.encode_src([text])[0]
        words = source_words(vocab.src, text, len(ids))
        assert len(words) == len(ids)
        # Every word of the text owns a piece, in order, and only spaces own none.
        assert sorted({w for w in words if w is not None}) == list(range(len(text.split())))
        assert [w for w in words if w is not None] == sorted(w for w in words if w is not None)
        # The output side, from decoding alone, finds the same words (every piece is in the vocabulary).
        assert target_words(vocab.tgt, ids) == words


def test_links_follow_the_most_attended_source_word_and_skip_eos_and_spaces() -> None:
    # target pieces: w0 w0 w1 <eos>; source pieces: w0, space, w1, w1, <eos>
    attention = torch.tensor([[0.1, 0.0, 0.2, 0.0, 0.7],   # eos column is the largest: ignored
                              [0.6, 0.0, 0.1, 0.1, 0.2],
                              [0.0, 0.9, 0.0, 0.1, 0.0],   # the space piece is the largest: ignored
                              [0.0, 0.0, 0.0, 0.0, 1.0]])
    links = word_alignment(attention, [0, None, 1, 1], [0, 0, 1])
    assert links == [(0, 0), (1, 0), (1, 1)]
    assert pharaoh(links) == "0-0 1-0 1-1"
    assert word_alignment(attention, [None, None, None, None], [0, 0, 1]) == []


@pytest.fixture(scope="module")
def held_out(tiny_run: Path) -> tuple[list[str], list[str]]:
    return held_out_pairs(tiny_run, 12)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_forced_pass_sees_the_attention_the_search_saw(tiny_engine: Translator, held_out,
                                                           beam_size: int) -> None:
    src_ids = tiny_engine.vocab.encode_src(held_out[0])
    found = decode_ids(tiny_engine.model, src_ids, DecodingConfig(beam_size=beam_size), tiny_engine.device,
                       return_attention=True)
    best = [nbest[0] for nbest in found]
    for layer in (-1, 0):
        forced = forced_attention(tiny_engine.model, src_ids, [h.tokens for h in best], tiny_engine.device,
                                  6000, layer)
        for h, weights in zip(best, forced):
            assert weights.shape == h.attention.shape[-2:]
            torch.testing.assert_close(weights, h.attention[layer].mean(0), atol=1e-4, rtol=0)


def test_the_forced_pass_stops_when_nobody_waits(tiny_engine: Translator, held_out) -> None:
    from transformer_mt.decoding.search import DecodingStopped

    src_ids = tiny_engine.vocab.encode_src(held_out[0])
    with pytest.raises(DecodingStopped):
        forced_attention(tiny_engine.model, src_ids, src_ids, tiny_engine.device, 6000, -1,
                         should_stop=lambda: True)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_every_target_word_is_aligned_within_range(tiny_engine: Translator, held_out, beam_size: int) -> None:
    sources, references = held_out
    # The tiny model's own outputs are short: start each with the first words of its reference.
    prefixes = [" ".join(r.split()[:3]) for r in references]
    results = tiny_engine.translate_nbest(sources, prefixes=prefixes, beam_size=beam_size,
                                     n_best=min(2, beam_size), alignment=True)
    checked = 0
    for source, nbest in zip(sources, results):
        for t in nbest:
            assert t.alignment is not None
            n_src, n_tgt = len(source.split()), len(t.text.split())
            assert all(0 <= s < n_src and 0 <= w < n_tgt for s, w in t.alignment), (source, t.text)
            assert {w for _, w in t.alignment} == set(range(n_tgt)), (t.text, t.alignment)
            checked += n_tgt
    assert checked >= 2 * len(sources)  # real words checked, not empty outputs
    assert tiny_engine.translate_nbest(sources[:2])[0][0].alignment is None  # only when asked
    best = tiny_engine.translate_nbest(sources, prefixes=prefixes, beam_size=beam_size,
                                       n_best=min(2, beam_size), alignment=True, aligned=1)
    assert [[t.alignment for t in nbest] for nbest in best] == \
        [[t.alignment if k == 0 else None for k, t in enumerate(nbest)] for nbest in results]
    with pytest.raises(tmt.config.ConfigError, match="alignment_layer=5 is out of range"):
        tiny_engine.translate_nbest(sources[:1], alignment=True, alignment_layer=5)


def test_translate_prints_alignments_as_a_second_column(tiny_run: Path, tiny_engine: Translator,
                                                        run_cli_here) -> None:
    done = run_cli_here("translate", f"checkpoint={tiny_run}", "device=cpu", "device.amp=off",
                        "decoding.beam_size=1", "decoding.alignment=true", "decoding.prefix=Il est",
                        input="He is sleeping.\n\nI am cold.\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")[:-1]
    expected = tiny_engine.translate_nbest(["He is sleeping.", "", "I am cold."], beam_size=1,
                                           prefix="Il est", alignment=True)
    assert lines == [f"{n[0].text}\t{pharaoh(n[0].alignment)}" for n in expected]
    assert lines[0].split("\t")[1].split() and lines[1] == "Il est\t"


def test_serve_returns_alignments_when_asked(tiny_run: Path, tiny_engine: Translator) -> None:
    require("fastapi")
    from fastapi.testclient import TestClient

    from transformer_mt.serve.app import create_app

    cfg = tmt.compose("serve", [f"checkpoint={tiny_run}", "device=cpu", "allowed_hosts=[testserver]"])
    texts, prefix = ["He is sleeping.", "I am cold."], ["Il est", "Il est"]
    with TestClient(create_app(tiny_engine, cfg)) as client:
        plain = client.post("/translate", json={"text": texts, "prefix": prefix}).json()
        asked = client.post("/translate", json={"text": texts, "prefix": prefix, "alignment": True}).json()
    expected = tiny_engine.translate_nbest(texts, prefixes=["Il est"] * 2, alignment=True)
    assert "alignments" not in plain
    assert asked["translations"] == plain["translations"]
    assert asked["alignments"] == [pharaoh(n[0].alignment) for n in expected]


@pytest.mark.parametrize("command, overrides, says", [
    ("evaluate", ["checkpoint=run"], "is for translate and serve"),
    ("translate", ["engine=ctranslate2", "model_dir=x"], "runs on engine=pytorch"),
    ("serve", ["engine=ctranslate2", "model_dir=x"], "runs on engine=pytorch"),
])
def test_alignment_where_it_cannot_run_is_a_config_error(command: str, overrides: list[str],
                                                         says: str) -> None:
    with pytest.raises(tmt.config.ConfigError, match=says):
        tmt.compose(command, [*overrides, "decoding.alignment=true"])
    tmt.compose(command, overrides)  # fine without it
