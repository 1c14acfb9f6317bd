"""One decoding path for validation, `evaluate` and `translate`: length-sorted batches in, hypotheses
out in input order. Which search runs (greedy, beam, sampling) is decided by `DecodingConfig`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.data import pad_sources
from transformer_mt.model import Transformer
from transformer_mt.search import Hypothesis, beam_search, greedy_search, sample
from transformer_mt.tokenizer import BOS_ID, EOS_ID, PAD_ID


def length_sorted_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices grouped by similar length so each padded batch stays within `max_tokens`."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, lengths[i] + 1)
        if batch and longest_if_added * (len(batch) + 1) > max_tokens:
            yield batch
            batch, longest_if_added = [], lengths[i] + 1
        batch.append(i)
        longest = longest_if_added
    if batch:
        yield batch


def decode_ids(
    model: Transformer,
    src_ids: Sequence[Sequence[int]],
    decoding: DecodingConfig,
    device: torch.device,
    return_attention: bool = False,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """Decode token-id sources (without eos) and return each sentence's n-best list, input order kept."""
    was_training = model.training
    model.eval()
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    # Beam search holds beam_size rows per sentence: budget the batch by what is really computed.
    budget = max(1, decoding.batch_tokens // (1 if decoding.sampling else decoding.beam_size))
    common = dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=decoding.max_len_a,
                  max_len_b=decoding.max_len_b)
    try:
        for batch in length_sorted_batches([len(s) for s in src_ids], budget):
            src = pad_sources([list(src_ids[i]) for i in batch], PAD_ID).to(device)
            if decoding.sampling:
                found = sample(model, src, temperature=decoding.temperature, top_k=decoding.top_k,
                               top_p=decoding.top_p, generator=generator, **common)
            elif decoding.beam_size == 1:
                found = greedy_search(model, src, use_cache=decoding.use_cache,
                                      return_attention=return_attention, **common)
            else:
                found = beam_search(model, src, beam_size=decoding.beam_size,
                                    length_penalty=decoding.length_penalty, n_best=decoding.n_best,
                                    return_attention=return_attention, **common)
            for i, hyps in zip(batch, found):
                results[i] = hyps
    finally:
        model.train(was_training)
    return results
