"""The Transformer encoder-decoder of "Attention Is All You Need" (Vaswani et al., 2017).

Everything is written out explicitly (no nn.Transformer / nn.MultiheadAttention) so that each module
maps onto a box of the paper's Figure 1. Tensors are batch-first throughout: B = batch, S = source
length, T = target length, D = d_model, V = vocabulary.

The model is built from a `config.ModelConfig` (its hyper-parameters) and the vocabulary sizes and pad
id, which come from the tokenizer; it knows nothing about Hydra, files or tokenizers, and this package
imports only torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, overload

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.model.attention import (
    DecoderCache,
    MultiHeadAttention,
    ensure_some_key,
    has_padding,
    padding_attn_mask,
)
from transformer_mt.model.dropout import Dropout

if TYPE_CHECKING:  # a type only: the model reads the config's attributes and imports nothing of ours
    from transformer_mt.config import ModelConfig


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W2 · act(W1 x + b1) + b2, applied to every position independently (§3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu",
                 activation_dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = F.gelu if activation == "gelu" else F.relu
        self.dropout = Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class PositionalEncoding(nn.Module):
    """Position signal added to the scaled embeddings: fixed sinusoids (§3.5) or learned."""

    def __init__(self, d_model: int, max_positions: int, learned: bool = False) -> None:
        super().__init__()
        self.learned = learned
        if learned:
            self.embedding = nn.Embedding(max_positions, d_model)
        else:
            position = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (P, 1)
            inv_freq = torch.exp(
                torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
            )  # 1 / 10000^(2i/d)
            pe = torch.zeros(max_positions, d_model)
            pe[:, 0::2] = torch.sin(position * inv_freq)
            pe[:, 1::2] = torch.cos(position * inv_freq)
            # Deterministic, so not saved in checkpoints (lets max_positions change on reload).
            self.register_buffer("pe", pe, persistent=False)
        self.max_positions = max_positions

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset+length-1, shape (length, D)."""
        if offset + length > self.max_positions:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_positions "
                f"({self.max_positions})"
            )
        table = self.embedding.weight if self.learned else self.pe
        return table[offset:offset + length]  # a slice: no index tensor, no copy


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in dropout + residual + LayerNorm (§3.1)."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation,
                                                    c.activation_dropout)
        self.self_attn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.ff_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None) -> Tensor:
        """x (B, S, D), attn_mask (B, 1, 1, S) or None → (B, S, D)."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.self_attn_norm(x), attn_mask=attn_mask)[0])
            x = x + self.dropout(self.feed_forward(self.ff_norm(x)))
        else:
            x = self.self_attn_norm(x + self.dropout(self.self_attn(x, attn_mask=attn_mask)[0]))
            x = self.ff_norm(x + self.dropout(self.feed_forward(x)))
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward; each Add & Norm (§3.1)."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout)
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout,
                                             cross=True)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation,
                                                    c.activation_dropout)
        self.self_attn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.cross_attn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.ff_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None,
        cross_mask: Tensor | None,
        cache: DecoderCache | None = None,
        layer_idx: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D), memory (B, S, D) → (B, T, D) and cross-attention weights (B, H, T, S)|None.

        self_mask None means "plain causal" (SDPA fast path); otherwise it already contains the
        causal structure.
        """
        causal = self_mask is None
        sa_kw = dict(attn_mask=self_mask, is_causal=causal, cache=cache, layer_idx=layer_idx)
        ca_kw = dict(attn_mask=cross_mask, cache=cache, layer_idx=layer_idx,
                     need_weights=need_weights)
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.self_attn_norm(x), **sa_kw)[0])
            h, weights = self.cross_attn(self.cross_attn_norm(x), memory, **ca_kw)
            x = x + self.dropout(h)
            x = x + self.dropout(self.feed_forward(self.ff_norm(x)))
        else:
            x = self.self_attn_norm(x + self.dropout(self.self_attn(x, **sa_kw)[0]))
            h, weights = self.cross_attn(x, memory, **ca_kw)
            x = self.cross_attn_norm(x + self.dropout(h))
            x = self.ff_norm(x + self.dropout(self.feed_forward(x)))
        return x, weights


class Encoder(nn.Module):
    """Input embedding + positional encoding followed by a stack of N encoder layers."""

    def __init__(self, c: ModelConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(c.d_model)
        self.positional = PositionalEncoding(c.d_model, c.max_positions,
                                             c.positional == "learned")
        self.dropout = Dropout(c.dropout)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        # Pre-norm leaves the residual stream un-normalised, hence a final LayerNorm.
        self.final_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else None

    def forward(self, src: Tensor, src_pad_mask: Tensor) -> Tensor:
        """src (B, S) ids, src_pad_mask (B, S) True at pad → memory (B, S, D)."""
        x = self.embed_tokens(src) * self.embed_scale + self.positional(src.size(1))
        x = self.dropout(x)
        attn_mask = padding_attn_mask(src_pad_mask)  # built once, shared by all layers
        for layer in self.layers:
            x = layer(x, attn_mask)
        return self.final_norm(x) if self.final_norm is not None else x


class Decoder(nn.Module):
    """Output embedding + positional encoding followed by a stack of N decoder layers."""

    def __init__(self, c: ModelConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.pad_id = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(c.d_model)
        self.positional = PositionalEncoding(c.d_model, c.max_positions,
                                             c.positional == "learned")
        self.dropout = Dropout(c.dropout)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        self.final_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else None

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """tgt (B, T) ids → hidden states (B, T, D) and, on request, every layer's and head's
        cross-attention weights (B, layers, H, T, S)."""
        T = tgt.size(1)
        offset = cache.length if cache is not None else 0
        x = self.embed_tokens(tgt) * self.embed_scale + self.positional(T, offset)
        x = self.dropout(x)

        self_mask = None  # None = plain causal
        if cache is None:
            tgt_pad = tgt == self.pad_id
            if has_padding(tgt_pad):  # (no host sync on a GPU: assumed there)
                causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()
                self_mask = ensure_some_key(causal & ~tgt_pad[:, None, None, :])  # (B,1,T,T)
        # With a cache the caller feeds only real tokens of live hypotheses, so target padding
        # is not tracked there (rows that are already finished are ignored by the search).
        cross_mask = padding_attn_mask(src_pad_mask)

        weights: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, memory, self_mask, cross_mask, cache, i, need_weights)
            if w is not None:
                weights.append(w)
        if cache is not None:
            cache.length += T
        x = self.final_norm(x) if self.final_norm is not None else x
        return x, torch.stack(weights, dim=1) if need_weights else None


# --------------------------------------------------------------------------------------------
# The full model


class Transformer(nn.Module):
    """Encoder-decoder Transformer with (optionally) shared embeddings and output projection."""

    def __init__(self, config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_id: int = 0) -> None:
        super().__init__()
        config.check()  # the rules live with the config; the ones below need the vocabulary
        if not 0 <= pad_id < min(src_vocab_size, tgt_vocab_size):
            raise ValueError(f"pad_id {pad_id} is not an id of vocabularies of {src_vocab_size} and "
                             f"{tgt_vocab_size} tokens")
        if config.tie_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"model.tie_embeddings needs one vocabulary for both sides, not "
                             f"{src_vocab_size} and {tgt_vocab_size} tokens; set it to false")
        c = self.config = config
        self.src_vocab_size, self.tgt_vocab_size, self.pad_id = src_vocab_size, tgt_vocab_size, pad_id
        self.src_embed = nn.Embedding(src_vocab_size, c.d_model, padding_idx=pad_id)
        if c.tie_embeddings:
            self.tgt_embed = self.src_embed  # same module: one weight matrix (§3.4)
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab_size, c.d_model, padding_idx=pad_id)
        self.encoder = Encoder(c, self.src_embed)
        self.decoder = Decoder(c, self.tgt_embed)
        self.output_projection = nn.Linear(c.d_model, tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings or c.tie_output:
            self.output_projection.weight = self.tgt_embed.weight

    @torch.no_grad()
    def _init_weights(self) -> None:
        """Xavier-uniform for sub-layer weights (as nn.Transformer), N(0, D^-1/2) for embeddings."""
        d = self.config.d_model
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                # nn.MultiheadAttention draws Q, K, V from one xavier over the fused (3D, D)
                # matrix; do exactly that for cross-attention's split q / kv projections too.
                w = torch.empty(3 * d, d)
                nn.init.xavier_uniform_(w)
                if module.cross:
                    module.q_proj.weight.copy_(w[:d])
                    module.kv_proj.weight.copy_(w[d:])
                    nn.init.zeros_(module.q_proj.bias)
                    nn.init.zeros_(module.kv_proj.bias)
                else:
                    module.qkv_proj.weight.copy_(w)
                    nn.init.zeros_(module.qkv_proj.bias)
                nn.init.xavier_uniform_(module.out_proj.weight)
                nn.init.zeros_(module.out_proj.bias)
            elif isinstance(module, PositionwiseFeedForward):
                for lin in (module.linear1, module.linear2):
                    nn.init.xavier_uniform_(lin.weight)
                    nn.init.zeros_(lin.bias)
            elif isinstance(module, nn.Embedding):
                # With the sqrt(D) scale this gives unit-variance inputs, like the sinusoids.
                nn.init.normal_(module.weight, mean=0.0, std=d ** -0.5)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
        # An untied output projection gets the embedding's scale so that tied/untied logits
        # start out alike (a tied one is overwritten by the embedding anyway).
        nn.init.normal_(self.output_projection.weight, mean=0.0, std=d ** -0.5)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids → (memory (B, S, D), src_pad_mask (B, S) bool, True at padding)."""
        src_pad_mask = src == self.pad_id
        return self.encoder(src, src_pad_mask), src_pad_mask

    @overload
    def decode(self, tgt: Tensor, memory: Tensor, src_pad_mask: Tensor,
               cache: DecoderCache | None = None,
               need_attention: Literal[False] = False) -> Tensor: ...

    @overload
    def decode(self, tgt: Tensor, memory: Tensor, src_pad_mask: Tensor,
               cache: DecoderCache | None = None, *,
               need_attention: Literal[True]) -> tuple[Tensor, Tensor]: ...

    @overload
    def decode(self, tgt: Tensor, memory: Tensor, src_pad_mask: Tensor,
               cache: DecoderCache | None = None,
               need_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]: ...

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor,
        cache: DecoderCache | None = None,
        need_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """tgt (B, T) ids → logits (B, T, V) [, cross-attention (B, layers, H, T, S)].

        With a cache, tgt holds only the NEW tokens (usually T=1); positions continue from
        cache.length; self-attention K/V are appended to the cache; cross-attention K/V are
        computed from memory on first use and reused afterwards (memory is then ignored).
        tgt may hold G consecutive rows per row of memory and src_pad_mask (beam search).
        """
        h, weights = self.decoder(tgt, memory, src_pad_mask, cache, need_attention)
        logits = self._project(h, cache)  # (B, T, V)
        if need_attention:
            assert weights is not None
            return logits, weights
        return logits

    def _project(self, h: Tensor, cache: DecoderCache | None = None) -> Tensor:
        """Output projection (B, T, D) → (B, T, V). Incremental decoding on the CPU multiplies by a
        (D, V) copy of the weight, made at a search's first step and kept in its cache: the CPU's
        matrix kernels are faster on that layout than on the (V, D) one training updates, and under
        autocast the copy is already in the autocast dtype. A cache lives for one search, so the copy
        never outlives the weights it was taken from. A projection swapped for another kind of module (an
        int8 one, runtime/quantize.py) keeps its weight packed for its own kernel: it is called as it is.
        A cache with columns (a shortlist) gets logits (B, T, U) over those columns."""
        if cache is not None and cache.columns is not None and not torch.is_grad_enabled():
            return self._project_columns(h, cache)
        if (cache is None or torch.is_grad_enabled() or not isinstance(self.output_projection, nn.Linear)
                or self.output_projection.weight.device.type != "cpu"):
            return self.output_projection(h)
        w = self.output_projection.weight
        if cache.output_weight is None:
            dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else w.dtype
            cache.output_weight = w.detach().t().contiguous().to(dtype)  # (D, V)
        return h @ cache.output_weight

    def _project_columns(self, h: Tensor, cache: DecoderCache) -> Tensor:
        """Output projection onto the cache's columns: (B, T, D) → (B, T, U), B = A sentences × G
        consecutive rows each, -inf where a column is not the sentence's own (cache.own). The columns'
        weight is copied at the search's first step: a (D, U) copy, or of an int8 projection that can give
        its rows (runtime/quantize.py::RowsLinear), a projection onto those rows alone."""
        assert cache.columns is not None and cache.own is not None
        where = h.device.type
        dtype = torch.get_autocast_dtype(where) if torch.is_autocast_enabled(where) else h.dtype
        proj = self.output_projection
        if cache.output_weight is None and cache.output_rows is None:
            if isinstance(proj, nn.Linear):
                cache.output_weight = proj.weight.detach()[cache.columns].t().contiguous().to(dtype)  # (D, U)
            else:
                cache.output_rows = proj.rows(cache.columns)  # type: ignore[operator]
        if cache.output_bias is None:
            cache.output_bias = torch.zeros(cache.own.shape, dtype=dtype, device=h.device).masked_fill(
                ~cache.own, float("-inf"))[:, None]  # (A, 1, U)
        B, T, _ = h.shape
        A, _, U = cache.output_bias.shape
        logits = h @ cache.output_weight if cache.output_rows is None else cache.output_rows(h)
        return (logits.view(A, B // A * T, U) + cache.output_bias).view(B, T, U)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V); pad_id in tgt_in is masked as a self-attention key."""
        memory, src_pad_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_pad_mask)

    def new_cache(self, columns: Tensor | None = None, own: Tensor | None = None) -> DecoderCache:
        """An empty incremental-decoding cache for this model's decoder; with columns (U,) target ids and
        own (A, U), logits over those ids alone, each sentence's own only (a shortlist:
        decoding/shortlist.py)."""
        return DecoderCache(self.config.decoder_layers, columns, own)

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (shared weights counted once)."""
        return sum(p.numel() for p in self.parameters())
