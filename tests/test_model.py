"""Tests of transformer_mt.model against independent references (plain formulas, nn.Transformer)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_mt.config import ModelConfig
from transformer_mt.model import MultiHeadAttention, Transformer
from transformer_mt.model.reference import TorchReference

PAD, BOS, EOS = 0, 1, 2
V, D, H, FF = 50, 32, 4, 64
TOL = dict(atol=1e-5, rtol=1e-5)


def make_model(**overrides) -> Transformer:
    """The small configuration every test uses (dropout off so eval/train agree); vocabulary sizes and
    pad id may be overridden like the hyper-parameters."""
    kw = dict(d_model=D, n_heads=H, d_ff=FF, encoder_layers=2, decoder_layers=2, dropout=0.0,
              max_positions=64)
    kw.update(overrides)
    vocab = {k: kw.pop(k) for k in ("src_vocab_size", "tgt_vocab_size", "pad_id") if k in kw}
    return Transformer(ModelConfig(**kw), vocab.get("src_vocab_size", V), vocab.get("tgt_vocab_size", V),
                       vocab.get("pad_id", PAD))


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    """A float64 eval-mode tiny model with non-trivial LayerNorm parameters and biases."""
    torch.manual_seed(seed)
    model = make_model(**overrides).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))  # default 1/0 would hide mix-ups
    return model


def padded_batch(lengths: list[int], seed: int, first: int | None = None) -> torch.Tensor:
    """Right-padded (B, max(lengths)) batch of random non-special tokens."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, V, (len(lengths), max(lengths)), generator=g)
    for i, n in enumerate(lengths):
        x[i, n:] = PAD
    if first is not None:
        x[:, 0] = first
    return x


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention


def plain_attention(q, k, v, allowed):
    """softmax(Q K^T / sqrt(d) + mask) V on (B, H, L, hd) tensors; allowed is bool or None."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs @ v, probs


def split(x, h):
    """(B, L, D) → (B, H, L, hd)."""
    b, n, d = x.shape
    return x.view(b, n, h, d // h).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_matches_plain_formula_and_sdpa(causal: bool) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H).double().eval()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 3:] = True

    out, weights = mha(x, key_padding_mask=pad, is_causal=causal, need_weights=True)
    out_fast, none = mha(x, key_padding_mask=pad, is_causal=causal)
    assert none is None

    q, k, v = (split(t, H) for t in (x @ mha.qkv_proj.weight.T + mha.qkv_proj.bias).chunk(3, -1))
    allowed = (~pad)[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(7, 7, dtype=torch.bool).tril()
    y, probs = plain_attention(q, k, v, allowed)
    expected = mha.out_proj(y.transpose(1, 2).reshape(3, 7, D))
    y_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    expected_sdpa = mha.out_proj(y_sdpa.transpose(1, 2).reshape(3, 7, D))

    real = ~pad  # padded query rows are garbage by design
    if causal:  # rows whose keys would all be masked do not occur with right padding
        assert torch.allclose(out[real], expected[real], **TOL)
    else:
        assert torch.allclose(out, expected, **TOL)
    assert torch.allclose(out_fast[real], expected_sdpa[real], **TOL)
    assert torch.allclose(out_fast, out, **TOL)
    assert torch.allclose(weights, probs, **TOL)  # every head's probabilities


def test_self_attention_matches_nn_multihead_attention() -> None:
    torch.manual_seed(1)
    mha = MultiHeadAttention(D, H).double().eval()
    ref = nn.MultiheadAttention(D, H, batch_first=True).double().eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(mha.qkv_proj.weight)
        ref.in_proj_bias.copy_(mha.qkv_proj.bias)
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        ref.out_proj.bias.copy_(mha.out_proj.bias)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)  # nn convention: True = masked
    expected, _ = ref(x, x, x, key_padding_mask=pad, attn_mask=causal)
    out, _ = mha(x, key_padding_mask=pad, is_causal=True)
    assert torch.allclose(out[~pad], expected[~pad], **TOL)


def test_cross_attention_matches_plain_formula() -> None:
    torch.manual_seed(2)
    mha = MultiHeadAttention(D, H, cross=True).double().eval()
    x = torch.randn(2, 4, D, dtype=torch.float64)
    mem = torch.randn(2, 6, D, dtype=torch.float64)
    pad = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])

    out, weights = mha(x, mem, key_padding_mask=pad, need_weights=True)
    out_fast, _ = mha(x, mem, key_padding_mask=pad)
    q = split(mha.q_proj(x), H)
    k, v = (split(t, H) for t in mha.kv_proj(mem).chunk(2, -1))
    y, probs = plain_attention(q, k, v, (~pad)[:, None, None, :])
    expected = mha.out_proj(y.transpose(1, 2).reshape(2, 4, D))
    assert torch.allclose(out, expected, **TOL)
    assert torch.allclose(out_fast, expected, **TOL)
    assert torch.allclose(weights, probs, **TOL)  # every head's probabilities
    assert weights[1, ..., 3:].abs().max() == 0  # no attention on padding


def test_fully_masked_rows_give_no_nan() -> None:
    torch.manual_seed(3)
    mha = MultiHeadAttention(D, H).double().eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    pad = torch.tensor([[True] * 5, [True, True, False, False, False]])  # all-pad / left-pad
    for causal in (False, True):
        for need in (False, True):
            out, _ = mha(x, key_padding_mask=pad, is_causal=causal, need_weights=need)
            assert torch.isfinite(out).all()


# ---------------------------------------------------------------------------------------------
# Whole model vs nn.Transformer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_model_matches_nn_transformer(norm_first: bool, activation: str) -> None:
    model = tiny_model(norm_first=norm_first, activation=activation)
    ref = TorchReference.from_model(model)  # embeddings, positions and output outside nn.Transformer
    src = padded_batch([7, 4, 6], seed=1)
    tgt = padded_batch([5, 6, 2], seed=2, first=BOS)
    src_pad, tgt_pad = src == PAD, tgt == PAD
    with torch.no_grad():
        expected = ref(src, tgt)
        logits = model(src, tgt)
        memory, _ = model.encode(src)
        ref_memory = ref.encode(src)

    real = ~tgt_pad
    assert torch.allclose(logits[real], expected[real], **TOL)
    assert torch.allclose(memory[~src_pad], ref_memory[~src_pad], **TOL)


def test_model_matches_nn_transformer_without_padding() -> None:
    """The mask-free SDPA fast paths (attn_mask=None, is_causal=True) give the same result."""
    model = tiny_model(seed=4)
    ref = TorchReference.from_model(model)
    src, tgt = padded_batch([6, 6], seed=3), padded_batch([5, 5], seed=4, first=BOS)
    with torch.no_grad():
        assert torch.allclose(model(src, tgt), ref(src, tgt), **TOL)


# ---------------------------------------------------------------------------------------------
# Incremental decoding, padding, attention weights


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_matches_full_decode(norm_first: bool) -> None:
    model = tiny_model(seed=5, norm_first=norm_first)
    src = padded_batch([6, 3], seed=5)
    tgt = padded_batch([7, 7], seed=6, first=BOS)
    with torch.no_grad():
        memory, src_pad = model.encode(src)
        full, full_attn = model.decode(tgt, memory, src_pad, need_attention=True)

        cache = model.new_cache()
        steps = [model.decode(tgt[:, t:t + 1], memory, src_pad, cache) for t in range(7)]
        assert cache.length == 7
        assert torch.allclose(torch.cat(steps, dim=1), full, **TOL)

        # chunks of several tokens exercise the bottom-right-aligned causal mask
        cache = model.new_cache()
        chunks = [model.decode(tgt[:, a:b], memory, src_pad, cache, need_attention=True)
                  for a, b in ((0, 3), (3, 4), (4, 7))]
        assert torch.allclose(torch.cat([c[0] for c in chunks], 1), full, **TOL)
        assert torch.allclose(torch.cat([c[1] for c in chunks], 3), full_attn, **TOL)


def test_cache_reorder_selects_batch_rows() -> None:
    model = tiny_model(seed=6)
    src = padded_batch([5, 4, 3], seed=7)
    tgt = padded_batch([4, 4, 4], seed=8, first=BOS)
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        memory, src_pad = model.encode(src)
        full = model.decode(tgt[index], memory[index], src_pad[index])
        cache = model.new_cache()
        model.decode(tgt[:, :2], memory, src_pad, cache)
        cache.reorder(index)
        rest = model.decode(tgt[index, 2:], memory[index], src_pad[index], cache)
    assert torch.allclose(rest, full[:, 2:], **TOL)


def test_beams_share_one_row_of_memory_and_cross_attention() -> None:
    """G decoder rows per sentence over one memory row (beam search) equal G copies of memory."""
    model = tiny_model(seed=6)
    src = padded_batch([5, 3], seed=7)
    tgt = padded_batch([4, 4, 4, 4, 4, 4], seed=8, first=BOS)  # 3 beams per sentence
    copies = torch.tensor([0, 0, 0, 1, 1, 1])
    with torch.no_grad():
        memory, src_pad = model.encode(src)
        full, full_attn = model.decode(tgt, memory[copies], src_pad[copies], need_attention=True)
        cache = model.new_cache()
        cache.beams = 3
        shared = [model.decode(tgt[:, t:t + 1], memory, src_pad, cache, need_attention=True)
                  for t in range(4)]
        # reordering beams within sentences keeps the cross-attention rows as they are
        perm = torch.tensor([2, 0, 0, 4, 5, 3])
        cache_p, ref_p = model.new_cache(), model.new_cache()
        cache_p.beams = 3
        model.decode(tgt[:, :2], memory, src_pad, cache_p)
        model.decode(tgt[:, :2], memory[copies], src_pad[copies], ref_p)
        cache_p.reorder(perm)
        ref_p.reorder(perm)
        rest = model.decode(tgt[perm, 2:], memory, src_pad, cache_p)
        expected = model.decode(tgt[perm, 2:], memory[copies], src_pad[copies], ref_p)
    assert torch.allclose(torch.cat([s[0] for s in shared], 1), full, **TOL)
    assert torch.allclose(torch.cat([s[1] for s in shared], 3), full_attn, **TOL)
    assert torch.allclose(rest, expected, **TOL)


def _stepwise_logits(model: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """Logits of a search's incremental decoding (a new cache, one token a step); with gradients on,
    the output projection is the plain nn.Linear (the reference), without them its per-search copy."""
    memory, src_pad = model.encode(src)
    cache = model.new_cache()
    return torch.cat([model.decode(tgt[:, t:t + 1], memory, src_pad, cache) for t in range(tgt.size(1))], 1)


def test_inference_projection_follows_weight_updates() -> None:
    """The transposed output weight CPU decoding multiplies by is taken anew by each search."""
    model = tiny_model(seed=11).eval()
    src = padded_batch([5, 3], seed=12)
    tgt = padded_batch([4, 4], seed=13, first=BOS)
    with torch.no_grad():
        before = _stepwise_logits(model, src, tgt)
        model.output_projection.weight.mul_(0.5)  # an optimizer step, a loaded state dict...
        after = _stepwise_logits(model, src, tgt)
    with torch.enable_grad():
        reference = _stepwise_logits(model, src, tgt)
    assert not torch.allclose(before, after)
    assert torch.allclose(after, reference, **TOL)


def test_inference_projection_follows_fused_optimizer_steps() -> None:
    """Validation between training steps sees the updated weights, also after a fused AdamW step,
    which updates weights in place without bumping their version counter (the bug that once made
    validation use the first validation's output projection)."""
    model = tiny_model(seed=11)
    src = padded_batch([5, 3], seed=12)
    tgt = padded_batch([4, 4], seed=13, first=BOS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    for _ in range(2):
        with torch.no_grad():
            validated = _stepwise_logits(model.eval(), src, tgt)
        model.train()
        model(src, tgt).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        decoded = _stepwise_logits(model.eval(), src, tgt)
    with torch.enable_grad():
        reference = _stepwise_logits(model, src, tgt)
    assert not torch.allclose(validated, decoded)
    assert torch.allclose(decoded, reference, **TOL)


def test_padding_invariance() -> None:
    model = tiny_model(seed=7)
    src = padded_batch([8, 5, 3], seed=9)
    tgt = padded_batch([4, 6, 3], seed=10, first=BOS)
    with torch.no_grad():
        memory, _ = model.encode(src)
        logits = model(src, tgt)
        for i, (n, m) in enumerate(((8, 4), (5, 6), (3, 3))):
            alone_mem, _ = model.encode(src[i:i + 1, :n])
            alone = model(src[i:i + 1, :n], tgt[i:i + 1, :m])
            assert torch.allclose(memory[i, :n], alone_mem[0], **TOL)
            assert torch.allclose(logits[i, :m], alone[0], **TOL)


def test_attention_weights_are_distributions_over_real_source() -> None:
    model = tiny_model(seed=8)
    src = padded_batch([6, 2], seed=11)
    tgt = padded_batch([3, 3], seed=12, first=BOS)
    with torch.no_grad():
        memory, src_pad = model.encode(src)
        logits, attn = model.decode(tgt, memory, src_pad, need_attention=True)
        plain = model.decode(tgt, memory, src_pad)
    c = model.config
    assert attn.shape == (2, c.decoder_layers, c.n_heads, 3, 6)  # every layer and head
    assert torch.allclose(logits, plain, **TOL)
    assert torch.allclose(attn.sum(-1), torch.ones(attn.shape[:-1], dtype=torch.float64), **TOL)
    assert attn[1, ..., 2:].abs().max() == 0


def test_degenerate_padding_gives_finite_outputs() -> None:
    model = tiny_model(seed=9)
    src = torch.tensor([[5, 6, 7], [PAD, PAD, PAD]])  # an all-pad source row
    tgt = torch.tensor([[BOS, 4, 5], [PAD, BOS, 4]])  # a left-padded target row
    with torch.no_grad():
        assert torch.isfinite(model(src, tgt)).all()
        memory, src_pad = model.encode(src)
        logits, attn = model.decode(tgt, memory, src_pad, need_attention=True)  # explicit softmax
        assert torch.isfinite(logits).all() and torch.isfinite(attn).all()


def test_training_mode_backward() -> None:
    model = make_model(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
    src = padded_batch([6, 4], seed=13)
    tgt = padded_batch([5, 3], seed=14, first=BOS)
    logits = model.train()(src, tgt)
    loss = F.cross_entropy(logits.view(-1, V), tgt.reshape(-1), ignore_index=PAD)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# ---------------------------------------------------------------------------------------------
# Construction options


def test_initialisation() -> None:
    model = make_model()
    assert model.src_embed.weight[PAD].abs().max() == 0
    assert model.output_projection.weight is model.src_embed.weight
    assert model.tgt_embed is model.src_embed
    assert model.encoder.layers[0].self_attn.qkv_proj.bias.abs().max() == 0
    bound = math.sqrt(6 / (D + 3 * D))  # xavier over the fused (3D, D) in-projection
    assert model.decoder.layers[0].cross_attn.kv_proj.weight.abs().max() <= bound
    std = model.src_embed.weight[3:].std().item()
    assert 0.5 * D ** -0.5 < std < 1.5 * D ** -0.5


@pytest.mark.parametrize(
    "overrides",
    [
        dict(positional="learned"),
        dict(tie_embeddings=False, tie_output=True, tgt_vocab_size=40),
        dict(tie_embeddings=False, tie_output=False, tgt_vocab_size=40),
        dict(norm_first=True, activation="gelu", positional="learned"),
    ],
)
def test_options_construct_and_run(overrides: dict) -> None:
    model = make_model(**overrides).eval()
    tv = model.tgt_vocab_size
    src = padded_batch([5, 3], seed=15)
    tgt = padded_batch([4, 2], seed=16, first=BOS).clamp(max=tv - 1)
    with torch.no_grad():
        assert model(src, tgt).shape == (2, 4, tv)
    c = model.config
    assert (model.tgt_embed is model.src_embed) == c.tie_embeddings
    tied_out = model.output_projection.weight is model.tgt_embed.weight
    assert tied_out == (c.tie_embeddings or c.tie_output)
    n_emb = model.src_vocab_size * D + (0 if c.tie_embeddings else tv * D) + (0 if tied_out else tv * D)
    n_pos = 2 * c.max_positions * D if c.positional == "learned" else 0
    assert model.num_parameters() == n_emb + n_pos + sum(
        p.numel() for n, p in model.named_parameters() if "layers" in n or "final_norm" in n
    )


@pytest.mark.parametrize(
    "overrides",
    [
        dict(n_heads=5),
        dict(tgt_vocab_size=V + 1),  # tie_embeddings with different vocabularies
        dict(activation="swish"),
        dict(positional="rotary"),
        dict(dropout=1.0),
        dict(pad_id=V),
    ],
)
def test_constructor_rejects_impossible_configs(overrides: dict) -> None:
    with pytest.raises(ValueError):
        make_model(**overrides)


def test_too_long_input_is_rejected() -> None:
    model = make_model(max_positions=4).eval()
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(torch.full((1, 5), 7))
