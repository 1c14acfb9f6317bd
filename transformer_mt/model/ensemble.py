"""Several trained models decoding as one: the searches see the `Transformer` decoding interface.

At every step each model runs its own decoder with its own key/value cache, and the ensemble's
log-probabilities are the log of the models' averaged probabilities (fairseq's rule); the searches'
log-softmax leaves them as they are (up to rounding). An ensemble of one passes its model's logits on.
The models must share the vocabularies (the caller checks).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from transformer_mt.model.attention import DecoderCache
from transformer_mt.model.transformer import Transformer


class EnsembleMemory:
    """Each model's encoder output; indexing selects the same sentences in all of them."""

    def __init__(self, parts: list[Tensor]) -> None:
        self.parts = parts

    def __getitem__(self, index: Tensor) -> EnsembleMemory:
        return EnsembleMemory([m[index] for m in self.parts])


class EnsembleCache:
    """Each model's decoder cache, reordered together."""

    def __init__(self, caches: list[DecoderCache]) -> None:
        self.caches = caches

    @property
    def length(self) -> int:
        return self.caches[0].length

    @property
    def beams(self) -> int:
        return self.caches[0].beams

    @beams.setter
    def beams(self, value: int) -> None:
        for cache in self.caches:
            cache.beams = value

    def reorder(self, index: Tensor, cross_index: Tensor | None = None) -> None:
        for cache in self.caches:
            cache.reorder(index, cross_index)


class Ensemble(nn.Module):
    """Models whose averaged next-token probabilities drive one search."""

    def __init__(self, models: Sequence[Transformer]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)
        self.pad_id = models[0].pad_id
        # Output lengths are limited by the model with the fewest positions.
        self.config = dataclasses.replace(models[0].config,
                                          max_positions=min(m.config.max_positions for m in models))

    def encode(self, src: Tensor) -> tuple[EnsembleMemory, Tensor]:
        outs = [m.encode(src) for m in self.models]
        return EnsembleMemory([memory for memory, _ in outs]), outs[0][1]

    def decode(self, tgt: Tensor, memory: EnsembleMemory, src_pad_mask: Tensor,
               cache: EnsembleCache | None = None,
               need_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """log of the mean of the models' probabilities (B, T, V) [, their mean cross-attention when the
        models have the same layers and heads, else the first model's]. One model: its own output, so
        that the searches' log-softmax rounds exactly as for the model alone."""
        if len(self.models) == 1:
            own_cache = cache.caches[0] if cache is not None else None
            return self.models[0].decode(tgt, memory.parts[0], src_pad_mask, own_cache,
                                         need_attention=need_attention)
        caches = cache.caches if cache is not None else [None] * len(self.models)
        log_probs, attention = [], []
        for model, mem, c in zip(self.models, memory.parts, caches):
            out = model.decode(tgt, mem, src_pad_mask, c, need_attention=need_attention)
            logits, attn = out if need_attention else (out, None)
            log_probs.append(torch.log_softmax(logits.float(), dim=-1))
            attention.append(attn)
        mixed = torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))
        if not need_attention:
            return mixed
        same = all(a.shape == attention[0].shape for a in attention)
        return mixed, torch.stack(attention).mean(0) if same else attention[0]

    def new_cache(self, columns: Tensor | None = None, own: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache([m.new_cache(columns, own) for m in self.models])
