"""Teacher-forced passes over given pairs: how likely the model finds a target, and where it looked.

`score_pairs` is the training objective read back per pair: the log-probability of each target's pieces
and its <eos> given the source, summed, exactly what `loss.summed_nll` (without label smoothing) adds up
over a batch. `forced_attention` runs the same pass for the decoder's cross-attention, one layer averaged
over its heads: word alignments of any output (greedy, beam, sampled, n-best) come from it, one pass over
the chosen hypotheses rather than attention kept during the search. Both batch pairs by length like
decoding and return results in input order; an `Ensemble` works as a model (its averaged probabilities).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from transformer_mt.data import Batch, collate, length_sorted_batches
from transformer_mt.model import Ensemble, Transformer
from transformer_mt.runtime import autocast


@dataclass(frozen=True)
class PairScore:
    """A pair's log-probability: its sum over the target's tokens (pieces + <eos>), and their count."""

    log_prob: float
    tokens: int

    @property
    def mean(self) -> float:
        """The per-token log-probability: minus the pair's training loss (without label smoothing)."""
        return self.log_prob / self.tokens


def _forced(model: Transformer | Ensemble, src_ids: Sequence[Sequence[int]],
            tgt_ids: Sequence[Sequence[int]], device: torch.device, batch_tokens: int,
            amp: torch.dtype | None, need_attention: bool) -> Iterator[tuple[list[int], Batch, torch.Tensor,
                                                                          torch.Tensor | None]]:
    """(indices, batch, log-probs (B, T, V) float32, cross-attention (B, layers, H, T, S) or None) of
    length-grouped batches of the pairs, under autocast to `amp` when given."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    was_training = model.training
    model.eval()
    lengths = [max(len(s), len(t)) for s, t in zip(src_ids, tgt_ids)]
    try:
        with torch.inference_mode(), autocast(device, amp):
            for indices in length_sorted_batches(lengths, batch_tokens):
                batch = collate([src_ids[i] for i in indices], [tgt_ids[i] for i in indices]).to(device)
                memory, src_pad = model.encode(batch.src)
                out = model.decode(batch.tgt_in, memory, src_pad, need_attention=need_attention)
                logits, attention = out if need_attention else (out, None)
                # An ensemble's output is already log-probabilities; log_softmax leaves them as they are.
                yield indices, batch, torch.log_softmax(logits.float(), dim=-1), attention
    finally:
        model.train(was_training)


def score_pairs(model: Transformer | Ensemble, src_ids: Sequence[Sequence[int]],
                tgt_ids: Sequence[Sequence[int]], device: torch.device, batch_tokens: int,
                amp: torch.dtype | None = None) -> list[PairScore]:
    """Each pair's log-probability under teacher forcing (ids without bos/eos), input order kept."""
    scores: list[PairScore | None] = [None] * len(src_ids)
    for indices, batch, logp, _ in _forced(model, src_ids, tgt_ids, device, batch_tokens, amp, False):
        target = batch.tgt_out  # (B, T): y + <eos>, padded
        real = target != model.pad_id
        gained = logp.gather(2, target.unsqueeze(2)).squeeze(2).masked_fill(~real, 0.0)  # (B, T)
        sums, counts = gained.double().sum(1).tolist(), real.sum(1).tolist()
        for i, total, count in zip(indices, sums, counts, strict=True):
            scores[i] = PairScore(total, count)
    return scores  # type: ignore[return-value]


def forced_attention(model: Transformer | Ensemble, src_ids: Sequence[Sequence[int]],
                     tgt_ids: Sequence[Sequence[int]], device: torch.device, batch_tokens: int,
                     layer: int, amp: torch.dtype | None = None) -> list[torch.Tensor]:
    """Each pair's cross-attention in decoder layer `layer` (negative: from the last) averaged over
    heads: (target pieces + <eos>, source pieces + <eos>) float32 on the CPU, input order kept."""
    found: list[torch.Tensor | None] = [None] * len(src_ids)
    for indices, _, _, attention in _forced(model, src_ids, tgt_ids, device, batch_tokens, amp, True):
        assert attention is not None
        chosen = attention[:, layer].float().mean(1).cpu()  # (B, T, S)
        for row, i in enumerate(indices):
            found[i] = chosen[row, : len(tgt_ids[i]) + 1, : len(src_ids[i]) + 1]
    return found  # type: ignore[return-value]
