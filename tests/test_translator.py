"""The Translator on a small untrained model: any text in, aligned text out, never a crash."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_mt.checkpoints.store import build_model
from transformer_mt.config import DecodingConfig, ModelConfig, TokenizerConfig
from transformer_mt.data.tokenizer import train_tokenizers
from transformer_mt.decoding.translator import Translator

SENTENCES = ["He is sleeping.", "I am cold.", "Where is the station?", "Il dort.", "J'ai froid.",
             "Où est la gare ?", "Nous allons à la plage demain.", "Ça coûte 5 € ; c'est « cher » !"]


@pytest.fixture(scope="module")
def engine() -> Translator:
    torch.manual_seed(0)
    vocab = train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1),
                             SENTENCES, SENTENCES)
    model = build_model(ModelConfig(d_model=32, n_heads=2, d_ff=64, encoder_layers=1, decoder_layers=1,
                                    max_positions=64), vocab)
    decoding = DecodingConfig(beam_size=2, max_len_a=0.0, max_len_b=5)
    return Translator(model, vocab, torch.device("cpu"), decoding)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(max_size=40), st.just(""), st.text(min_size=300, max_size=600)),
                max_size=6))
def test_any_text_keeps_line_alignment(engine: Translator, lines: list[str]) -> None:
    out = engine.translate(lines)
    assert isinstance(out, list) and len(out) == len(lines)
    for line, text in zip(lines, out):
        assert isinstance(text, str) and "\n" not in text
        if not line.strip():
            assert text == ""


def test_long_input_is_cut_with_a_warning(engine: Translator, caplog: pytest.LogCaptureFixture) -> None:
    engine.translate(["word " * 500])
    assert engine.truncated >= 1 and "the model's limit" in caplog.text


def test_decoding_options_are_validated(engine: Translator) -> None:
    from transformer_mt.config import ConfigError

    with pytest.raises(ConfigError, match="decoding.beam_size=0"):
        engine.translate("Hello", beam_size=0)
