"""Our model under Hugging Face's names (interop/hf_weights.py): the reordered positions are HF's sinusoids,
the mapping goes there and back bit for bit, and a MarianMTModel (post-norm) or
PegasusForConditionalGeneration (pre-norm) holding the mapped weights computes our logits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.conftest import require
from transformer_mt.config import ModelConfig
from transformer_mt.interop.hf_weights import from_hf, residual_order, to_hf
from transformer_mt.model import Transformer

VOCAB = 97
SHAPES = {"post-norm": ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                                   dropout=0.0, norm_first=False),
          "pre-norm": ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                                  dropout=0.0, norm_first=True, activation="gelu"),
          "untied": ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=1, decoder_layers=2,
                                dropout=0.0, tie_embeddings=False, tie_output=False)}


def _model(name: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(SHAPES[name], VOCAB, VOCAB).eval()
    with torch.no_grad():  # biases and norms away from their initial 0 and 1, so that each is checked
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_the_reordered_positions_are_hfs_sinusoids() -> None:
    """HF's table (Marian's _init_weight, written out here with numpy): sines in the first half."""
    d, n = 32, 50
    angle = np.array([[pos / np.power(10000, 2 * (j // 2) / d) for j in range(d)] for pos in range(n)])
    theirs = np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)
    ours = _model("post-norm").encoder.positional.pe[:n, residual_order(d)]
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-5)


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_weights_go_there_and_back_bit_for_bit(name: str) -> None:
    model, fresh = _model(name), _model(name, seed=1)
    from_hf(to_hf(model), fresh)
    for (key, want), (_, got) in zip(model.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(want, got), key


@pytest.mark.parametrize("name", ["post-norm", "pre-norm"])
def test_the_hf_model_computes_our_logits(name: str) -> None:
    transformers = require("transformers")
    model = _model(name)
    c = model.config
    common = dict(vocab_size=VOCAB, d_model=c.d_model, encoder_layers=c.encoder_layers,
                  decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads,
                  decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
                  activation_function=c.activation, dropout=0.0, attention_dropout=0.0,
                  activation_dropout=0.0,
                  max_position_embeddings=c.max_positions, scale_embedding=True, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    if c.norm_first:
        hf = transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(**common))
    else:
        hf = transformers.MarianMTModel(transformers.MarianConfig(**common, decoder_vocab_size=VOCAB,
                                                                  share_encoder_decoder_embeddings=True))
    missing, unexpected = hf.load_state_dict(to_hf(model), strict=False)
    assert not unexpected and all("embed_positions" in k or "final_logits_bias" in k or "embed_tokens" in k
                                  for k in missing), missing
    hf.eval()
    src = torch.tensor([[5, 17, 40, 8, 2], [9, 33, 2, 0, 0]])
    tgt = torch.tensor([[1, 12, 60, 7], [1, 70, 3, 2]])
    with torch.no_grad():
        ours = model(src, tgt).log_softmax(-1)
        logits = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt).logits
    theirs = logits.log_softmax(-1)
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    assert math.isclose(float(model.encoder.embed_scale), c.d_model ** 0.5)
