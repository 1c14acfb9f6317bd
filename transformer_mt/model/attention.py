"""Multi-head scaled dot-product attention (§3.2), its masks, and the decoder's key/value cache.

Tensors are batch-first: B = batch, S = source length, T = target length, D = d_model, H = heads,
hd = D // H. Masks follow F.scaled_dot_product_attention: a boolean `attn_mask` is True where a query
MAY attend to a key. Padding masks (`src_pad_mask`) are the opposite, True at pad, because that is
what callers naturally have.

On a GPU the host never reads a tensor on these paths (`free_to_read`), and `scaled_dot_product_attention`
runs under `sdpa_kernel` with the kernels `use_attention_backends` chose (`device.attention_backends`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

# Device types whose tensors the host reads for free. Elsewhere (a GPU) a read such as bool(t) waits for
# every queued kernel: a host synchronisation, which the hot paths avoid there. Tests empty this tuple to
# run a GPU's code paths on the CPU.
FREE_READS: tuple[str, ...] = ("cpu",)


def free_to_read(t: Tensor) -> bool:
    """Whether reading t on the host costs no synchronisation with its device."""
    return t.device.type in FREE_READS


def has_padding(pad_mask: Tensor) -> bool:
    """Whether a True-at-pad mask has any padding; assumed so where finding out would need a host sync."""
    return not free_to_read(pad_mask) or bool(pad_mask.any())


# --------------------------------------------------------------------------------------------
# Attention kernels on CUDA

# `device.attention_backends`' names. PyTorch prefers cuDNN's kernel on recent GPUs, which builds a plan
# for each new shape (docs/performance.md, GPU): the default prefers memory-efficient, then flash.
BACKENDS = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
KERNEL_CHOICE_DEVICES: tuple[str, ...] = ("cuda",)  # where sdpa_kernel applies (tests add "cpu")
_cuda_backends: list[SDPBackend] = [BACKENDS["efficient"], BACKENDS["flash"]]


def use_attention_backends(names: Sequence[str]) -> None:
    """The SDPA kernels CUDA may use, in order of preference (an empty list leaves it to PyTorch); the
    process's setting, like torch.backends' flags. A name not in BACKENDS raises ValueError."""
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown attention backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    global _cuda_backends
    _cuda_backends = [BACKENDS[n] for n in names]


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
              is_causal: bool) -> Tensor:
    """F.scaled_dot_product_attention; on CUDA under sdpa_kernel with the chosen kernels (a mask rules
    out flash, so PyTorch then takes the next one)."""
    if q.device.type not in KERNEL_CHOICE_DEVICES or not _cuda_backends:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal)
    with sdpa_kernel(_cuda_backends, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal)

# --------------------------------------------------------------------------------------------
# Masks


def padding_attn_mask(pad_mask: Tensor) -> Tensor | None:
    """(B, S) bool True-at-pad → (B, 1, 1, S) SDPA mask (True = attend), or None if no padding (known
    only where reading the mask is free: see `has_padding`)."""
    if not has_padding(pad_mask):
        return None  # lets SDPA take its mask-free fast path
    allowed = ~pad_mask
    # Guard: a row made only of padding would leave a query with no key at all (NaN softmax in
    # some kernels); let such rows attend everywhere - their outputs are never used anyway.
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return allowed[:, None, None, :]


def ensure_some_key(allowed: Tensor) -> Tensor:
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

    def __init__(self, num_layers: int, columns: Tensor | None = None, own: Tensor | None = None) -> None:
        self.length: int = 0  # number of target positions already processed
        self.beams: int = 1  # decoder rows per cross-attention row (set by beam search)
        self.self_kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers
        self.cross_kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers
        # A shortlist: the target ids (U,) the logits are computed for (None: the whole vocabulary), and
        # own (A, U), which of them each sentence may write (one row per sentence, as cross-attention K/V)
        self.columns, self.own = columns, own
        # For this search (Transformer._project): a (D, V) copy of the output weight, or (D, U) of its
        # columns; with them, an (A, 1, U) bias: -inf where a column is not the sentence's own
        self.output_weight: Tensor | None = None
        self.output_bias: Tensor | None = None
        self.output_rows: nn.Module | None = None  # an int8 projection's columns (RowsLinear.rows)

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
        if cross_index is not None and self.own is not None:
            self.own = self.own.index_select(0, cross_index)
            if self.output_bias is not None:
                self.output_bias = self.output_bias.index_select(0, cross_index)


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
        """x (B, T, D) [, memory (A, S, D)] → (output (B, T, D), weights (B, H, T, S) or None).

        Cross-attention allows B = A·G: G consecutive rows of x (beams) share one memory row.

        attn_mask: bool, broadcastable to (B, H, T, S), True = may attend.
        key_padding_mask: (B, S) bool, True = padding key (convenience; merged into attn_mask).
        is_causal: query i sees keys <= i; with a cache the queries are the LAST T positions.
        cache: self-attention appends its K/V; cross-attention computes K/V from memory once.
        """
        B, T, D = x.shape
        if self.cross:
            q, k, v = self._cross_qkv(x, memory, cache, layer_idx)
        else:
            q, k, v = self._self_qkv(x, cache, layer_idx)
        S = k.size(2)
        attn_mask, is_causal = _merge_masks(attn_mask, key_padding_mask, is_causal, T, S, x.device)
        dropout_p = self.attention_dropout if self.training else 0.0
        weights = None
        if need_weights:
            # SDPA does not expose the probabilities, so compute them explicitly (slow path).
            scores = (q @ k.transpose(-2, -1)) * (self.head_dim ** -0.5)  # (B, H, T, S)
            if is_causal:
                attn_mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            probs = scores.softmax(dim=-1)  # (A, H, G*T, S): G decoder rows per memory row
            A = probs.size(0)
            weights = probs.view(A, self.n_heads, B // A, T, S).transpose(1, 2).reshape(B, -1, T, S)
            y = F.dropout(probs, dropout_p, self.training) @ v  # (B, H, T, hd)
        elif x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # torch's CPU attention kernels are slower in bf16 than in float32, forward and backward:
            # the small score matrices are computed in float32, outside autocast, while the
            # projections around them stay in bf16.
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                                   dropout_p=dropout_p, is_causal=is_causal)
        else:
            y = attention(q, k, v, attn_mask, dropout_p, is_causal)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, D)  # re-assemble heads side by side (and groups)
        return self.out_proj(y), weights

    def _self_qkv(self, x: Tensor, cache: DecoderCache | None, layer_idx: int) -> tuple[Tensor, ...]:
        """q, k, v (B, H, T or t+T, hd) from x; with a cache, k and v follow the past positions'."""
        q, k, v = self._heads(self.qkv_proj(x), 3)  # 3 × (B, H, T, hd)
        if cache is not None:
            past = cache.self_kv[layer_idx]
            if past is not None:
                k = torch.cat((past[0], k), dim=2)  # (B, H, t+T, hd)
                v = torch.cat((past[1], v), dim=2)
            cache.self_kv[layer_idx] = (k, v)
        return q, k, v

    def _cross_qkv(self, x: Tensor, memory: Tensor | None, cache: DecoderCache | None,
                   layer_idx: int) -> tuple[Tensor, ...]:
        """q from x, k and v from memory (computed once per sentence with a cache). With G decoder rows
        per memory row (beams), q is (A, H, G*T, hd): the G*T queries of a sentence attend together."""
        B, T, _ = x.shape
        kv = cache.cross_kv[layer_idx] if cache is not None else None
        if kv is None:
            assert memory is not None, "cross-attention needs memory"
            kv = self._heads(self.kv_proj(memory), 2)  # 2 × (A, H, S, hd)
            if cache is not None:
                cache.cross_kv[layer_idx] = kv
        k, v = kv
        A = k.size(0)
        assert B % A == 0, f"{B} decoder rows cannot share {A} source rows"
        q = self.q_proj(x).view(A, B // A * T, self.n_heads, self.head_dim).transpose(1, 2)
        return q, k, v


def _merge_masks(attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool, T: int, S: int,
                 device: torch.device) -> tuple[Tensor | None, bool]:
    """One SDPA mask (True = may attend) and is_causal from the caller's masks.

    A mask passed in is trusted to be guarded already (built once per batch); one combined here gets
    `ensure_some_key`. SDPA's is_causal aligns top-left and excludes attn_mask, so a causal mask is
    spelt out when needed, aligned bottom-right (the queries are the last T of S positions); one query
    at the end of the sequence may see everything: no mask at all.
    """
    combined = False
    if key_padding_mask is not None:
        kp = (~key_padding_mask)[:, None, None, :]
        attn_mask = kp if attn_mask is None else attn_mask & kp
        combined = True
    if is_causal and (T == 1 or attn_mask is not None or T != S):
        if T > 1:
            causal = torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)
            attn_mask = causal if attn_mask is None else attn_mask & causal
            combined = True
        is_causal = False
    if combined and attn_mask is not None:
        attn_mask = ensure_some_key(attn_mask)
    return attn_mask, is_causal
