"""The one decoding path: token ids in, each sentence's n-best hypotheses out, in input order.

`decode_ids` decodes in length-sorted batches budgeted by `decoding.batch_tokens`; which search runs
(greedy, beam, sampling) is decided by a `DecodingConfig`. Validation during training, `evaluate`,
`translate` and `serve` all decode through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.data import length_sorted_batches, pad_sources
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding.beam import bank_greedy_search, beam_search
from transformer_mt.decoding.constraints import Constraints, TermIds, WordEdges, shortest
from transformer_mt.decoding.search import Hypothesis, StopCheck, forced_tokens, greedy_search, sample
from transformer_mt.decoding.shortlist import Shortlist
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
    terms: Sequence[Sequence[TermIds]] | None = None,
    edges: WordEdges | None = None,
    shortlist: Shortlist | None = None,
) -> list[list[Hypothesis]]:
    """Decode token-id sources (without eos) and return each sentence's n-best list, input order kept;
    under autocast to `amp` when given (the searches score in float32 and float64 all the same). With
    prefixes (target token ids per sentence), each output starts with its own. With terms (per
    sentence, its target terms, each the ids of its variants: `constraints.term_variants`, kept by
    `constraints.fit_terms`), every output holds each of its sentence's terms (as whole words, given the
    vocabulary's `edges`; a sentence that cannot have them so gets no hypothesis). With a shortlist, greedy
    and beam search score each sentence's own target ids only (not sampling, nor a batch with terms).
    should_stop is asked once per decoding step; True ends the decoding with `DecodingStopped`."""
    was_training = model.training
    model.eval()
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    try:
        with autocast(device, amp):
            rows = _widest(decoding, terms)
            for batch in decoding_batches([len(s) for s in src_ids], decoding, device, rows):
                src = pad_sources([list(src_ids[i]) for i in batch], PAD_ID).to(device)
                forced = [prefixes[i] for i in batch] if prefixes else None
                hard = [terms[i] for i in batch] if terms else None
                found = _search(model, src, decoding, return_attention, generator, forced, should_stop, hard,
                                edges, shortlist)
                for i, hyps in zip(batch, found):
                    results[i] = hyps
    finally:
        model.train(was_training)
    return results


def decoding_batches(lengths: Sequence[int], decoding: DecodingConfig, device: torch.device,
                     rows: int | None = None) -> list[list[int]]:
    """The batches `decode_ids` decodes sentences of these source lengths in (indices, shortest first),
    each sentence searched with `rows` hypotheses (None: 1 for sampling, else beam_size)."""
    # Beam search holds beam_size rows per sentence: budget the batch by what is really computed.
    rows = rows or (1 if decoding.sampling else decoding.beam_size)
    return length_sorted_batches(lengths, max(1, decoding.batch_tokens_on(device) // rows))


def _widest(decoding: DecodingConfig, terms: Sequence[Sequence[TermIds]] | None) -> int | None:
    """Rows per sentence where terms make greedy search wider: its C + 1 banks (C: the most tokens one
    sentence's terms take), else None (the search's own)."""
    if not terms or decoding.sampling or decoding.beam_size > 1:
        return None
    return 1 + max(sum(shortest(t) for t in sentence) for sentence in terms)


def _search(model: Transformer, src: torch.Tensor, decoding: DecodingConfig, return_attention: bool,
            generator: torch.Generator | None, prefixes: Sequence[Sequence[int]] | None,
            should_stop: StopCheck | None, terms: Sequence[Sequence[TermIds]] | None = None,
            edges: WordEdges | None = None, shortlist: Shortlist | None = None) -> list[list[Hypothesis]]:
    """The search `decoding` asks for: sampling, greedy (beam 1) or beam search."""
    ends = _ends(decoding, prefixes, should_stop)
    terms = terms if terms and any(terms) else None  # no term at all: the searches as they are without
    columns = None
    if shortlist is not None and terms is None and not decoding.sampling:
        columns = shortlist.columns(src, forced_tokens(prefixes, src.size(0), src.device))
    if decoding.sampling:
        if terms is not None:
            raise ValueError("target terms need beam or greedy search, not sampling")
        return sample(model, src, temperature=decoding.temperature, top_k=decoding.top_k,
                      top_p=decoding.top_p, generator=generator, **ends)
    if decoding.beam_size == 1 and terms is not None:
        return _greedy_with_terms(model, src, decoding, return_attention, prefixes, should_stop, terms, edges)
    if decoding.beam_size == 1:
        return greedy_search(model, src, use_cache=decoding.use_cache, return_attention=return_attention,
                             columns=columns, **ends)
    constraints = Constraints.build(terms, src.device, edges) if terms is not None else None
    return beam_search(model, src, beam_size=decoding.beam_size, length_penalty=decoding.length_penalty,
                       n_best=decoding.n_best, return_attention=return_attention, constraints=constraints,
                       columns=columns, **ends)


def _ends(decoding: DecodingConfig, prefixes: Sequence[Sequence[int]] | None,
          should_stop: StopCheck | None) -> dict[str, Any]:
    """The arguments every search takes alike: the special ids, the length limit, prefixes, the stop check."""
    return dict(bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=decoding.max_len_a, max_len_b=decoding.max_len_b,
                prefixes=prefixes, should_stop=should_stop)


def _greedy_with_terms(model: Transformer, src: torch.Tensor, decoding: DecodingConfig,
                       return_attention: bool, prefixes: Sequence[Sequence[int]] | None,
                       should_stop: StopCheck | None,
                       terms: Sequence[Sequence[TermIds]], edges: WordEdges | None) -> list[list[Hypothesis]]:
    """Greedy search of a batch where some sentences have terms: those without run `greedy_search` as
    they would without any, those with run `bank_greedy_search`, each group in a batch of its own."""
    found: list[list[Hypothesis]] = [[] for _ in terms]
    for with_terms in (False, True):
        rows = [i for i, t in enumerate(terms) if bool(t) == with_terms]
        if not rows:
            continue
        part = src[rows]
        part = part[:, : max(1, int((part != PAD_ID).sum(1).max()))]  # right-padded: drop the spare columns
        ends = dict(_ends(decoding, [prefixes[i] for i in rows] if prefixes else None, should_stop),
                    use_cache=decoding.use_cache, return_attention=return_attention)
        if with_terms:
            c = Constraints.build([terms[i] for i in rows], src.device, edges)
            hyps = bank_greedy_search(model, part, c, **ends)
        else:
            hyps = greedy_search(model, part, **ends)
        for i, h in zip(rows, hyps, strict=True):
            found[i] = h
    return found
