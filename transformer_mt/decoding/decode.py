"""The one decoding path: token ids in, each sentence's n-best hypotheses out, in input order.

`decode_ids` decodes in length-sorted batches budgeted by `decoding.batch_tokens`; which search runs
(greedy, beam, sampling) is decided by a `DecodingConfig`. Validation during training, `evaluate`,
`translate` and `serve` all decode through it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.data import length_sorted_batches, pad_sources
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.search import Hypothesis, StopCheck, greedy_search, sample
from transformer_mt.model import Transformer
from transformer_mt.runtime.device import autocast


def decode_ids(
    model: Transformer,
    src_ids: Sequence[Sequence[int]],
    decoding: DecodingConfig,
    device: torch.device,
    return_attention: bool = False,
    generator: torch.Generator | None = None,
    amp: torch.dtype | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    should_stop: StopCheck | None = None,
) -> list[list[Hypothesis]]:
    """Decode token-id sources (without eos) and return each sentence's n-best list, input order kept;
    under autocast to `amp` when given (the searches score in float32 and float64 all the same). With
    prefixes (target token ids per sentence), each output starts with its own. should_stop is asked
    once per decoding step; True ends the decoding with `DecodingStopped`."""
    was_training = model.training
    model.eval()
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    try:
        with autocast(device, amp):
            for batch in decoding_batches([len(s) for s in src_ids], decoding, device):
                src = pad_sources([list(src_ids[i]) for i in batch], PAD_ID).to(device)
                forced = [prefixes[i] for i in batch] if prefixes else None
                found = _search(model, src, decoding, return_attention, generator, forced, should_stop)
                for i, hyps in zip(batch, found):
                    results[i] = hyps
    finally:
        model.train(was_training)
    return results


def decoding_batches(lengths: Sequence[int], decoding: DecodingConfig,
                     device: torch.device) -> list[list[int]]:
    """The batches `decode_ids` decodes sentences of these source lengths in (indices, shortest first)."""
    # Beam search holds beam_size rows per sentence: budget the batch by what is really computed.
    budget = max(1, decoding.batch_tokens_on(device) // (1 if decoding.sampling else decoding.beam_size))
    return length_sorted_batches(lengths, budget)


def _search(model: Transformer, src: torch.Tensor, decoding: DecodingConfig, return_attention: bool,
            generator: torch.Generator | None, prefixes: Sequence[Sequence[int]] | None,
            should_stop: StopCheck | None) -> list[list[Hypothesis]]:
    """The search `decoding` asks for: sampling, greedy (beam 1) or beam search."""
    ends = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=decoding.max_len_a, max_len_b=decoding.max_len_b,
                prefixes=prefixes, should_stop=should_stop)
    if decoding.sampling:
        return sample(model, src, temperature=decoding.temperature, top_k=decoding.top_k,
                      top_p=decoding.top_p, generator=generator, **ends)
    if decoding.beam_size == 1:
        return greedy_search(model, src, use_cache=decoding.use_cache, return_attention=return_attention,
                             **ends)
    return beam_search(model, src, beam_size=decoding.beam_size, length_penalty=decoding.length_penalty,
                       n_best=decoding.n_best, return_attention=return_attention, **ends)
