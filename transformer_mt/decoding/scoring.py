"""Teacher-forced passes over given pairs: how likely the model finds a target, and where it looked.

`score_pairs` is the training objective read back per pair: the log-probability of each target's pieces
and its <eos> given the source, summed, exactly what `loss.summed_nll` (without label smoothing) adds up
over a batch; `token_log_probs` gives those log-probabilities one by one (what confidence.py rates).
`forced_attention` runs the same pass for the decoder's cross-attention, one layer averaged over its
heads: word alignments of any output (greedy, beam, sampled, n-best) come from it, one pass over the
chosen hypotheses rather than attention kept during the search. They batch pairs by length like decoding
and return results in input order; an `Ensemble` works as a model (its averaged probabilities).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from transformer_mt.data import Batch, collate, length_sorted_batches
from transformer_mt.decoding.search import DecodingStopped
from transformer_mt.model import Ensemble, Transformer
from transformer_mt.runtime.device import autocast


@dataclass(frozen=True)
class PairScore:
    """A pair's log-probability: its sum over the target's tokens (pieces + <eos>), and their count."""

    log_prob: float
    tokens: int

    @property
    def mean(self) -> float:
        """The per-token log-probability: minus the pair's training loss (without label smoothing)."""
        return self.log_prob / self.tokens


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """The model in eval mode (no dropout) for the block, its own mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _batches(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
             batch_tokens: int) -> Iterator[tuple[list[int], Batch]]:
    """Pairs grouped by length as decoding groups sentences: (indices, collated batch) of each group."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    lengths = [max(len(s), len(t)) for s, t in zip(src_ids, tgt_ids)]
    for indices in length_sorted_batches(lengths, batch_tokens):
        yield indices, collate([src_ids[i] for i in indices], [tgt_ids[i] for i in indices])


def _teacher_forced(model: Transformer | Ensemble, batch: Batch, amp: torch.dtype | None,
                    need_attention: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The decoder's output (B, T, V) for a batch already on the model's device, and its cross-attention
    (B, layers, H, T, S) when asked; call under inference mode."""
    with autocast(batch.src.device, amp):
        memory, src_pad = model.encode(batch.src)
        out = model.decode(batch.tgt_in, memory, src_pad, need_attention=need_attention)
    return out if need_attention else (out, None)


def score_pairs(model: Transformer | Ensemble, src_ids: Sequence[Sequence[int]],
                tgt_ids: Sequence[Sequence[int]], device: torch.device, batch_tokens: int,
                amp: torch.dtype | None = None) -> list[PairScore]:
    """Each pair's log-probability under teacher forcing (ids without bos/eos), input order kept."""
    return [PairScore(float(gained.double().sum()), len(gained))
            for gained in token_log_probs(model, src_ids, tgt_ids, device, batch_tokens, amp)]


def token_log_probs(model: Transformer | Ensemble, src_ids: Sequence[Sequence[int]],
                    tgt_ids: Sequence[Sequence[int]], device: torch.device, batch_tokens: int,
                    amp: torch.dtype | None = None,
                    should_stop: Callable[[], bool] | None = None) -> list[torch.Tensor]:
    """Each pair's log-probability of each of its target's tokens under teacher forcing: (target pieces +
    <eos>,) float32 on the CPU, input order kept. `should_stop`, asked before each batch, ends the pass
    with DecodingStopped when it says True."""
    found: list[torch.Tensor | None] = [None] * len(src_ids)
    with _evaluating(model), torch.inference_mode():
        for indices, batch in _batches(src_ids, tgt_ids, batch_tokens):
            if should_stop is not None and should_stop():
                raise DecodingStopped("the forced pass over the translations was stopped")
            batch = batch.to(device)
            out, _ = _teacher_forced(model, batch, amp, need_attention=False)
            # An ensemble's output is already log-probabilities; log_softmax leaves them as they are.
            logp = torch.log_softmax(out.float(), dim=-1)
            target = batch.tgt_out  # (B, T): y + <eos>, padded
            gained = logp.gather(2, target.unsqueeze(2)).squeeze(2).cpu()  # (B, T)
            for row, i in enumerate(indices):
                found[i] = gained[row, : len(tgt_ids[i]) + 1].clone()
    return found  # type: ignore[return-value]


def forced_attention(model: Transformer | Ensemble, src_ids: Sequence[Sequence[int]],
                     tgt_ids: Sequence[Sequence[int]], device: torch.device, batch_tokens: int,
                     layer: int | None, amp: torch.dtype | None = None,
                     should_stop: Callable[[], bool] | None = None) -> list[torch.Tensor]:
    """Each pair's cross-attention in decoder layer `layer` (negative: from the last) averaged over
    heads: (target pieces + <eos>, source pieces + <eos>) float32 on the CPU, input order kept; with
    layer None, every layer's and head's: (layers, heads, target pieces + <eos>, source pieces + <eos>).
    `should_stop`, asked before each batch, ends the pass with DecodingStopped when it says True."""
    found: list[torch.Tensor | None] = [None] * len(src_ids)
    with _evaluating(model), torch.inference_mode():
        for indices, batch in _batches(src_ids, tgt_ids, batch_tokens):
            if should_stop is not None and should_stop():
                raise DecodingStopped("the forced pass of word alignments was stopped")
            _, attention = _teacher_forced(model, batch.to(device), amp, need_attention=True)
            assert attention is not None
            # (B, L, H, T, S) whole, or (B, T, S): one layer, its heads averaged
            chosen = attention.float().cpu() if layer is None else attention[:, layer].float().mean(1).cpu()
            for row, i in enumerate(indices):
                found[i] = chosen[row, ..., : len(tgt_ids[i]) + 1, : len(src_ids[i]) + 1].clone()
    return found  # type: ignore[return-value]
