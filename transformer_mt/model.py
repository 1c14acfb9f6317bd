"""The Transformer encoder-decoder of "Attention Is All You Need" (Vaswani et al., 2017).

Everything is written out explicitly (no nn.Transformer / nn.MultiheadAttention) so that each
module maps onto a box of the paper's Figure 1. Tensors are batch-first throughout:
B = batch, S = source length, T = target length, D = d_model, H = heads, hd = D // H, V = vocab.

Masks follow the convention of F.scaled_dot_product_attention: a boolean `attn_mask` is True where
a query MAY attend to a key. Padding masks returned by `encode` are the opposite (True at pad),
because that is what callers naturally have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, overload

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from transformer_mt.dropout import Dropout


@dataclass
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder Transformer."""

    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int = 0
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1  # sub-layer outputs and embeddings+positions sum (the paper's P_drop)
    attention_dropout: float = 0.0  # on attention probabilities
    activation_dropout: float = 0.0  # inside the FFN after the activation
    activation: str = "relu"  # "relu" | "gelu"
    norm_first: bool = False  # False = post-norm (paper); True = pre-norm + final LayerNorms
    positional: str = "sinusoidal"  # "sinusoidal" | "learned"
    max_positions: int = 512
    tie_embeddings: bool = True  # share src embedding, tgt embedding and output projection
    tie_output: bool = True  # tie tgt embedding with output projection (if not tie_embeddings)
    layer_norm_eps: float = 1e-5


def validate_config(c: TransformerConfig) -> None:
    """Raise ValueError (one line) for hyper-parameters the model cannot be built with."""
    checks = [
        (c.src_vocab_size > 0 and c.tgt_vocab_size > 0, "vocabulary sizes must be positive"),
        (0 <= c.pad_id < min(c.src_vocab_size, c.tgt_vocab_size), "pad_id must be a valid id"),
        (c.d_model > 0 and c.n_heads > 0 and c.d_ff > 0, "d_model, n_heads, d_ff must be > 0"),
        (c.d_model % max(c.n_heads, 1) == 0,
         f"d_model ({c.d_model}) must be divisible by n_heads ({c.n_heads})"),
        (c.encoder_layers >= 1 and c.decoder_layers >= 1, "need at least one layer per stack"),
        (all(0.0 <= p < 1.0 for p in (c.dropout, c.attention_dropout, c.activation_dropout)),
         "dropout probabilities must be in [0, 1)"),
        (c.activation in ("relu", "gelu"), f"activation must be 'relu' or 'gelu', "
                                           f"got {c.activation!r}"),
        (c.positional in ("sinusoidal", "learned"),
         f"positional must be 'sinusoidal' or 'learned', got {c.positional!r}"),
        (c.positional != "sinusoidal" or c.d_model % 2 == 0,
         "sinusoidal positions need an even d_model"),
        (c.max_positions >= 1, "max_positions must be >= 1"),
        (c.layer_norm_eps > 0, "layer_norm_eps must be > 0"),
        (not c.tie_embeddings or c.src_vocab_size == c.tgt_vocab_size,
         f"tie_embeddings needs src_vocab_size == tgt_vocab_size "
         f"({c.src_vocab_size} != {c.tgt_vocab_size})"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"invalid TransformerConfig: {message}")


# --------------------------------------------------------------------------------------------
# Masks


def padding_attn_mask(pad_mask: Tensor) -> Tensor | None:
    """(B, S) bool True-at-pad → (B, 1, 1, S) SDPA mask (True = attend), or None if no padding."""
    if not bool(pad_mask.any()):
        return None  # lets SDPA take its mask-free fast path
    allowed = ~pad_mask
    # Guard: a row made only of padding would leave a query with no key at all (NaN softmax in
    # some kernels); let such rows attend everywhere - their outputs are never used anyway.
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return allowed[:, None, None, :]


def _ensure_some_key(allowed: Tensor) -> Tensor:
    """Let any query row with no attendable key attend to all keys, so softmax never yields NaN."""
    return allowed | ~allowed.any(dim=-1, keepdim=True)


# --------------------------------------------------------------------------------------------
# Incremental decoding state


class DecoderCache:
    """Per-layer self-attention K/V (N, H, t, hd) and cross-attention K/V for incremental decode.

    Cross-attention K/V depend only on the source, so beam search keeps ONE row per sentence
    (A, H, S, hd) while the decoder runs K consecutive rows per sentence (N = A*K): the K queries
    of a sentence then attend to its keys together, with no copies of memory or of its K/V.
    """

    def __init__(self, num_layers: int) -> None:
        self.length: int = 0  # number of target positions already processed
        self.beams: int = 1  # decoder rows per cross-attention row (set by beam search)
        self.self_kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers
        self.cross_kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers

    def reorder(self, index: Tensor, cross_index: Tensor | None = None) -> None:
        """Keep decoder rows `index` (beam reordering, batch shrinking), in place.

        Cross-attention rows follow `cross_index` when given; otherwise `index` when beams == 1,
        and they stay as they are when beams > 1 (beams only moved within their sentences).
        """
        if cross_index is None and self.beams == 1:
            cross_index = index
        for kvs, idx in ((self.self_kv, index), (self.cross_kv, cross_index)):
            if idx is None:
                continue
            for i, kv in enumerate(kvs):
                if kv is not None:
                    kvs[i] = (kv[0].index_select(0, idx), kv[1].index_select(0, idx))


# --------------------------------------------------------------------------------------------
# Building blocks


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (§3.2.2), self- or encoder-decoder (cross-)."""

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float = 0.0,
                 cross: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.attention_dropout = attention_dropout
        self.cross = cross
        # Fused projections: one GEMM instead of three (self) or two (cross).
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """(B, L, n*D) → n views of shape (B, H, L, hd), no copies."""
        B, L, _ = x.shape
        return x.view(B, L, n, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        cache: DecoderCache | None = None,
        layer_idx: int = 0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) [, memory (A, S, D)] → (output (B, T, D), head-averaged weights or None).

        Cross-attention allows B = A·G: G consecutive rows of x (beams) share one memory row.

        attn_mask: bool, broadcastable to (B, H, T, S), True = may attend.
        key_padding_mask: (B, S) bool, True = padding key (convenience; merged into attn_mask).
        is_causal: query i sees keys <= i; with a cache the queries are the LAST T positions.
        cache: self-attention appends its K/V; cross-attention computes K/V from memory once.
        """
        B, T, D = x.shape
        if self.cross:
            kv = cache.cross_kv[layer_idx] if cache is not None else None
            if kv is None:
                assert memory is not None, "cross-attention needs memory"
                kv = self._heads(self.kv_proj(memory), 2)  # 2 × (A, H, S, hd)
                if cache is not None:
                    cache.cross_kv[layer_idx] = kv
            k, v = kv
            # G consecutive query rows per source row (beams): attend as G*T queries of one row.
            A = k.size(0)
            assert B % A == 0, f"{B} decoder rows cannot share {A} source rows"
            G = B // A
            q = self.q_proj(x).view(A, G * T, self.n_heads, self.head_dim).transpose(1, 2)
        else:
            q, k, v = self._heads(self.qkv_proj(x), 3)  # 3 × (B, H, T, hd)
            if cache is not None:
                past = cache.self_kv[layer_idx]
                if past is not None:
                    k = torch.cat((past[0], k), dim=2)  # (B, H, t+T, hd)
                    v = torch.cat((past[1], v), dim=2)
                cache.self_kv[layer_idx] = (k, v)
        S = k.size(2)

        combined = False  # masks passed in are trusted to be guarded already (built once)
        if key_padding_mask is not None:
            kp = (~key_padding_mask)[:, None, None, :]
            attn_mask = kp if attn_mask is None else attn_mask & kp
            combined = True
        if is_causal and (T == 1 or attn_mask is not None or T != S):
            # SDPA's is_causal aligns top-left and excludes attn_mask, so spell the mask out,
            # aligned bottom-right (queries are the last T of S positions). One query at the
            # end of the sequence may see everything: no mask at all.
            if T > 1:
                causal = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
                attn_mask = causal if attn_mask is None else attn_mask & causal
                combined = True
            is_causal = False
        if combined and attn_mask is not None:
            attn_mask = _ensure_some_key(attn_mask)

        dropout_p = self.attention_dropout if self.training else 0.0
        weights = None
        if need_weights:
            # SDPA does not expose the probabilities, so compute them explicitly (slow path).
            scores = (q @ k.transpose(-2, -1)) * (self.head_dim ** -0.5)  # (B, H, T, S)
            if is_causal:
                attn_mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            probs = scores.softmax(dim=-1)
            weights = probs.mean(dim=1).reshape(B, T, S)  # (B, T, S)
            y = F.dropout(probs, dropout_p, self.training) @ v  # (B, H, T, hd)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
            )  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, D)  # re-assemble heads side by side (and groups)
        return self.out_proj(y), weights


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

    def __init__(self, c: TransformerConfig) -> None:
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

    def __init__(self, c: TransformerConfig) -> None:
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
        """x (B, T, D), memory (B, S, D) → (B, T, D) and cross-attention weights (B, T, S)|None.

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

    def __init__(self, c: TransformerConfig, embed_tokens: nn.Embedding) -> None:
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

    def __init__(self, c: TransformerConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.pad_id = c.pad_id
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
        """tgt (B, T) ids → hidden states (B, T, D) and last layer's cross-attn weights|None."""
        T = tgt.size(1)
        offset = cache.length if cache is not None else 0
        x = self.embed_tokens(tgt) * self.embed_scale + self.positional(T, offset)
        x = self.dropout(x)

        self_mask = None  # None = plain causal
        if cache is None:
            tgt_pad = tgt == self.pad_id
            if bool(tgt_pad.any()):
                causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).tril()
                self_mask = _ensure_some_key(causal & ~tgt_pad[:, None, None, :])  # (B,1,T,T)
        # With a cache the caller feeds only real tokens of live hypotheses, so target padding
        # is not tracked there (rows that are already finished are ignored by the search).
        cross_mask = padding_attn_mask(src_pad_mask)

        weights = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, memory, self_mask, cross_mask, cache, i,
                               need_weights and i == last)
        if cache is not None:
            cache.length += T
        return (self.final_norm(x) if self.final_norm is not None else x), weights


# --------------------------------------------------------------------------------------------
# The full model


class Transformer(nn.Module):
    """Encoder-decoder Transformer with (optionally) shared embeddings and output projection."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        validate_config(config)
        c = self.config = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        if c.tie_embeddings:
            self.tgt_embed = self.src_embed  # same module: one weight matrix (§3.4)
        else:
            self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.encoder = Encoder(c, self.src_embed)
        self.decoder = Decoder(c, self.tgt_embed)
        self.output_projection = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings or c.tie_output:
            self.output_projection.weight = self.tgt_embed.weight
        self._weight_t: Tensor | None = None  # see _project
        self._weight_t_key: tuple | None = None

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
        src_pad_mask = src == self.config.pad_id
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
        """tgt (B, T) ids → logits (B, T, V) [, last layer's head-mean cross-attention (B, T, S)].

        With a cache, tgt holds only the NEW tokens (usually T=1); positions continue from
        cache.length; self-attention K/V are appended to the cache; cross-attention K/V are
        computed from memory on first use and reused afterwards (memory is then ignored).
        tgt may hold G consecutive rows per row of memory and src_pad_mask (beam search).
        """
        h, weights = self.decoder(tgt, memory, src_pad_mask, cache, need_attention)
        logits = self._project(h)  # (B, T, V)
        if need_attention:
            assert weights is not None
            return logits, weights
        return logits

    def _project(self, h: Tensor) -> Tensor:
        """Output projection. CPU inference multiplies by a cached (D, V) copy of the weight:
        the BLAS runs 7-25% faster on it than on the (V, D) layout that training updates."""
        w = self.output_projection.weight
        if torch.is_grad_enabled() or w.device.type != "cpu":
            return self.output_projection(h)
        key = (w.data_ptr(), w._version, w.dtype)  # changes when the weight is updated or moved
        if self._weight_t_key != key:
            self._weight_t, self._weight_t_key = w.detach().t().contiguous(), key
        return h @ self._weight_t

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V); pad_id in tgt_in is masked as a self-attention key."""
        memory, src_pad_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_pad_mask)

    def new_cache(self) -> DecoderCache:
        """An empty incremental-decoding cache for this model's decoder."""
        return DecoderCache(self.config.decoder_layers)

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (shared weights counted once)."""
        return sum(p.numel() for p in self.parameters())
