"""torch.nn.Transformer dressed as our model: the independent reference of the tests and benchmarks.

The tests load our weights into it and compare outputs (tests/test_model.py); `scripts/benchmark.py`
times it against ours on the same batches. Embeddings, positions and the tied output projection are
the paper's, written here without any of our code: it imports only torch, like the model.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch import Tensor

if TYPE_CHECKING:  # types only: the reference shares no code with the model it checks
    from transformer_mt.config import ModelConfig
    from transformer_mt.model import Transformer


def sinusoid_table(length: int, d: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), element by element."""
    pe = torch.zeros(length, d, dtype=torch.float64)
    for pos in range(length):
        for i in range(0, d, 2):
            angle = pos / (10000 ** (i / d))
            pe[pos, i], pe[pos, i + 1] = math.sin(angle), math.cos(angle)
    return pe.to(dtype)


class TorchReference(nn.Module):
    """`nn.Transformer` with a tied embedding, sinusoidal positions and a tied output projection."""

    def __init__(self, c: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.d_model, self.pad_id = c.d_model, pad_id
        self.embed = nn.Embedding(vocab_size, c.d_model, padding_idx=pad_id)
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." for pre-norm
            warnings.simplefilter("ignore", UserWarning)
            self.core = nn.Transformer(c.d_model, c.n_heads, c.encoder_layers, c.decoder_layers, c.d_ff,
                                       c.dropout, activation=c.activation, batch_first=True,
                                       norm_first=c.norm_first, layer_norm_eps=c.layer_norm_eps)
        self.core.encoder.enable_nested_tensor = self.core.encoder.use_nested_tensor = False  # dense path
        if not c.norm_first:  # nn.Transformer always adds final norms; the post-norm paper model has none
            self.core.encoder.norm = nn.Identity()
            self.core.decoder.norm = nn.Identity()
        self.register_buffer("positions", sinusoid_table(c.max_positions, c.d_model), persistent=False)
        self.drop = nn.Dropout(c.dropout)

    def _embed(self, ids: Tensor) -> Tensor:
        x = self.embed(ids) * math.sqrt(self.d_model) + self.positions[: ids.size(1)].to(self.embed.weight)
        return self.drop(x)

    def encode(self, src: Tensor) -> Tensor:
        """Encoder output (B, S, D)."""
        return self.core.encoder(self._embed(src), src_key_padding_mask=src.eq(self.pad_id))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V)."""
        src_pad, tgt_pad = src.eq(self.pad_id), tgt_in.eq(self.pad_id)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), tgt_in.device, torch.bool)
        out = self.core(self._embed(src), self._embed(tgt_in), tgt_mask=causal,
                        src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                        memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return out @ self.embed.weight.t()

    @classmethod
    @torch.no_grad()
    def from_model(cls, model: Transformer) -> TorchReference:
        """A reference holding `model`'s weights (tied embeddings), in its dtype, in eval mode."""
        assert model.config.tie_embeddings, "the reference ties its embeddings"
        ref = cls(model.config, model.src_vocab_size, model.pad_id).to(model.src_embed.weight.dtype).eval()
        ref.embed.weight.copy_(model.src_embed.weight)
        for dst, src in zip(ref.core.encoder.layers, model.encoder.layers, strict=True):
            _copy_attention(dst.self_attn, src.self_attn.qkv_proj, src.self_attn.out_proj)
            _copy_ffn(dst, src)
            _copy_norms([dst.norm1, dst.norm2], [src.self_attn_norm, src.ff_norm])
        for dst, src in zip(ref.core.decoder.layers, model.decoder.layers, strict=True):
            _copy_attention(dst.self_attn, src.self_attn.qkv_proj, src.self_attn.out_proj)
            ca = src.cross_attn
            fused = nn.Linear(ca.q_proj.in_features, 3 * ca.q_proj.in_features).to(ca.q_proj.weight)
            fused.weight.copy_(torch.cat([ca.q_proj.weight, ca.kv_proj.weight]))
            fused.bias.copy_(torch.cat([ca.q_proj.bias, ca.kv_proj.bias]))
            _copy_attention(dst.multihead_attn, fused, ca.out_proj)
            _copy_ffn(dst, src)
            _copy_norms([dst.norm1, dst.norm2, dst.norm3],
                        [src.self_attn_norm, src.cross_attn_norm, src.ff_norm])
        if model.config.norm_first:
            _copy_norms([ref.core.encoder.norm, ref.core.decoder.norm],
                        [model.encoder.final_norm, model.decoder.final_norm])
        return ref


def _copy_attention(dst: nn.MultiheadAttention, in_proj: nn.Linear, out_proj: nn.Linear) -> None:
    dst.in_proj_weight.copy_(in_proj.weight)
    dst.in_proj_bias.copy_(in_proj.bias)
    dst.out_proj.weight.copy_(out_proj.weight)
    dst.out_proj.bias.copy_(out_proj.bias)


def _copy_ffn(dst: nn.Module, src: nn.Module) -> None:
    for name in ("linear1", "linear2"):
        getattr(dst, name).weight.copy_(getattr(src.feed_forward, name).weight)
        getattr(dst, name).bias.copy_(getattr(src.feed_forward, name).bias)


def _copy_norms(dsts: list[nn.LayerNorm], srcs: list[nn.LayerNorm]) -> None:
    for dst, src in zip(dsts, srcs, strict=True):
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)
