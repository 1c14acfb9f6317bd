"""Batched beam search (fairseq-style) over `transformer_mt.model.Transformer`, with the KV cache.

The rules it shares with greedy search and the CTranslate2 engine (the length limit, the GNMT length
penalty, the per-step log-probs with forced prefixes and <eos>) are in `decoding/search.py`. With target
terms (a glossary), each step's candidates are chosen by `decoding/constrained.py`; greedy search with
terms is `bank_greedy_search`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from transformer_mt.config import DecodingConfig
from transformer_mt.decoding.attention_trail import AttentionTrail
from transformer_mt.decoding.constrained import TermSearch, limits
from transformer_mt.decoding.constraints import Constraints
from transformer_mt.decoding.search import (
    DEFAULT,
    Columns,
    DecodingStopped,
    Ends,
    Hypothesis,
    StopCheck,
    as_ids,
    decode_step,
    forced_at,
    forced_columns,
    forced_tokens,
    gnmt_penalty,
    new_cache,
    src_attention,
    step_log_probs,
)
from transformer_mt.model import DecoderCache, Transformer


def _first_or_next_step(model: Transformer, prefix: Tensor, memory: Tensor, src_pad: Tensor,
                        cache: DecoderCache | None, K: int, t: int, need_attention: bool,
                        columns: Columns | None) -> tuple[Tensor, Tensor | None]:
    """Logits (A*K, V) of every beam's next token. Before the first token the K beams of a sentence
    are identical: decode one row per sentence, then give each beam a copy of its self-attention
    state. Memory and cross-attention K/V keep one row per sentence, shared by its beams. Without a
    cache (the slow reference) every step decodes each beam's whole prefix."""
    if cache is None:
        return decode_step(model, prefix, memory, src_pad, None, need_attention, columns)
    if t > 0:
        return decode_step(model, prefix[:, -1:], memory, src_pad, cache, need_attention)
    logits, attn = decode_step(model, prefix[::K, -1:], memory, src_pad, cache, need_attention)
    expand = torch.arange(logits.size(0), device=logits.device).repeat_interleave(K)  # (B*K,)
    cache.beams = K
    cache.reorder(expand)
    return logits[expand], attn[expand] if attn is not None else None


def _top_candidates(logp: Tensor, scores: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2K continuations of each sentence: (scores, tokens, source rows of A*K), each (A, 2K),
    sorted by score. They are among the best 2K of each of its beams: picking those per row first
    makes the sum and the topk run over K*2K values, not K*V."""
    A = scores.size(0)
    n_cand = min(2 * K, logp.size(-1))
    row_top, row_tok = logp.topk(n_cand, dim=1)  # (A*K, 2K)
    cand = (scores.view(A * K, 1) + row_top).view(A, K * n_cand)
    top_scores, top_pos = cand.topk(n_cand, dim=1)  # (A, 2K), sorted desc
    top_tok = row_tok.view(A, K * n_cand).gather(1, top_pos)
    top_beam = torch.div(top_pos, n_cand, rounding_mode="floor")
    top_row = top_beam + torch.arange(A, device=logp.device)[:, None] * K
    return top_scores, top_tok, top_row


def _choose(logp: Tensor, scores: Tensor, K: int, terms: TermSearch | None,
            room: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The step's candidates (scores, tokens, rows of A*K), each (A, 2K): the best 2K, or with terms the
    constrained choice (`decoding/constrained.py`; room (A,): tokens each sentence may still write)."""
    if terms is None:
        return _top_candidates(logp, scores, K)
    logp = terms.close_eos(logp)
    return terms.candidates(logp, scores, _top_candidates(logp, scores, K), room)


def _new_beams(is_eos: Tensor, K: int) -> Tensor:
    """Which candidates (A, K) become the new beams: the first K non-eos ones, in candidate order."""
    n_cand = is_eos.size(1)
    rank = is_eos.long() * n_cand + torch.arange(n_cand, device=is_eos.device)
    return rank.topk(K, dim=1, largest=False).indices


def _sentence_done(finished: list[Hypothesis], best_live: float, t: int, max_len: int, K: int,
                   n_best: int, alpha: float, exhaustive: bool) -> bool:
    """Done when K hypotheses finished, at max length, or when the best live beam cannot beat the
    n_best-th finished one: judged as if it ended now (the usual heuristic, Hugging Face's
    early_stopping=False), or with exhaustive=True at the most favourable length still possible."""
    if len(finished) >= K or t > max_len:
        return True
    if len(finished) < n_best:
        return False
    nth = sorted((h.score for h in finished), reverse=True)[n_best - 1]
    lp = gnmt_penalty(t + 1, alpha)
    if exhaustive:  # a live beam ends at a length in [t + 1, max_len + 1]; lp is monotone
        lp = max(lp, gnmt_penalty(max_len + 1, alpha))
    return best_live / lp <= nth


def _still_searching(finished: list[list[Hypothesis]], sent_ids: list[int], scores: Tensor, t: int,
                     max_len: list[int], n_best: int, alpha: float, exhaustive: bool) -> list[int]:
    """The live sentences (rows of scores (A, K)) that are not done after step t (`_sentence_done`)."""
    K = scores.size(1)
    best_live = scores.max(1).values.tolist()  # with terms, beams are in bank turns, not score order
    return [a for a, i in enumerate(sent_ids)
            if not _sentence_done(finished[i], best_live[a], t, max_len[a], K, n_best, alpha, exhaustive)]


def _n_best(finished: list[list[Hypothesis]], n_best: int, trail: AttentionTrail | None,
            src_pad: Tensor) -> list[list[Hypothesis]]:
    """Each sentence's n_best finished hypotheses, best first, with their attention when it was kept."""
    best = [sorted(fins, key=lambda h: h.score, reverse=True)[:n_best] for fins in finished]
    if trail is not None:
        _attach_attention(best, trail, src_pad)
    return best


def _attach_attention(best: list[list[Hypothesis]], trail: AttentionTrail, src_pad: Tensor) -> None:
    """Give each returned hypothesis its attention, read back from the trail (sentence i's over the
    real positions of src_pad[i])."""
    chosen = [(i, h) for i, hyps in enumerate(best) for h in hyps]
    for (i, h), history in zip(chosen, trail.histories([h for _, h in chosen]), strict=True):
        h.attention = src_attention(history, src_pad[i])


def _finalise(is_eos: Tensor, top_scores: Tensor, top_row: Tensor, prefix: Tensor, t: int, alpha: float,
              finished: list[list[Hypothesis]], trail: AttentionTrail | None) -> None:
    """End the live sentences' <eos> candidates ranked within their top K (and reachable: a finite
    score), scored logprob_sum / lp(len(tokens) + 1); `finished[a]` is live sentence a's list."""
    K = prefix.size(0) // len(finished)
    for a, r in (is_eos[:, :K] & torch.isfinite(top_scores[:, :K])).nonzero().tolist():
        row = int(top_row[a, r])
        hyp = Hypothesis(prefix[row, 1:].tolist(), float(top_scores[a, r]) / gnmt_penalty(t + 1, alpha))
        finished[a].append(hyp)
        if trail is not None:
            trail.end(hyp, t, row)


def _check(settings: DecodingConfig, columns: Columns | None, constraints: Constraints | None) -> None:
    """The search's arguments obey the config's rules; a shortlist and target terms are not given together."""
    settings.check()
    if columns is not None and constraints is not None:
        raise ValueError("target terms search the whole vocabulary: give no shortlist columns with them")


@torch.inference_mode()
def beam_search(model: Transformer, src: Tensor, *, bos_id: int, eos_id: int,
                beam_size: int = DEFAULT.beam_size, length_penalty: float = DEFAULT.length_penalty,
                max_len_a: float = DEFAULT.max_len_a, max_len_b: int = DEFAULT.max_len_b,
                n_best: int = DEFAULT.n_best, return_attention: bool = False, exhaustive: bool = False,
                prefixes: Sequence[Sequence[int]] | None = None, use_cache: bool = True,
                constraints: Constraints | None = None, per_bank: bool = False,
                should_stop: StopCheck | None = None,
                columns: Columns | None = None) -> list[list[Hypothesis]]:
    """Batched beam search (fairseq-style) returning the n_best hypotheses per sentence.

    The batch is flattened to (A * K) rows, A live sentences × K beams. Each step takes the top 2K
    continuations per sentence; eos among the top K are finalised with score logprob_sum / lp(len(tokens)
    + 1), the first K non-eos ones become the new beams. K=1 is exactly greedy. Done sentences leave the
    batch and the cache. With prefixes, every beam of a sentence starts with its prefix's token ids. With
    constraints (target terms), every hypothesis holds its sentence's terms (per_bank: `bank_greedy_search`).
    With columns (a shortlist), beams extend with their sentence's own ids. use_cache=False: the reference."""
    _check(DecodingConfig(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a,
                          max_len_b=max_len_b, n_best=n_best), columns, constraints)
    K, alpha, ends, device = beam_size, length_penalty, Ends(bos_id, eos_id, max_len_a, max_len_b), src.device
    B = src.size(0)
    memory, src_pad = model.encode(src)  # once per sentence: (A, S, d), (A, S)
    sentence_pad = src_pad  # (B, S), kept for the attention of sentences that leave the batch
    forced = forced_tokens(prefixes, B, device)
    max_len = limits(ends.limits(model, src, forced), forced, constraints, model.config.max_positions)  # (A,)
    forced = forced_columns(forced, columns)  # (the limits above count its ids)
    terms = None if constraints is None else TermSearch(constraints, K, eos_id, per_bank)
    on_device = torch.tensor(max_len, device=device), torch.arange(B, device=device)  # max_len, sent_ids
    cache = new_cache(model, columns) if use_cache else None
    sent_ids = list(range(B))  # original index of each live sentence
    scores = torch.zeros(B, K, dtype=torch.float64, device=device)
    scores[:, 1:] = float("-inf")  # all beams start identical: expand only beam 0 at first
    prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)  # (A*K, 1+t)
    trail = AttentionTrail() if return_attention else None
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]

    t = 0
    while sent_ids:
        if should_stop is not None and should_stop():
            raise DecodingStopped(f"beam search stopped by its caller at step {t}")
        logits, attn = _first_or_next_step(model, prefix, memory, src_pad, cache, K, t, return_attention,
                                           columns)
        at_max = (t >= on_device[0]).repeat_interleave(K)  # (copies to a GPU would wait for it too)
        step = forced_at(forced, on_device[1], t)
        logp = step_log_probs(logits, ends, model.pad_id, at_max,
                               step.repeat_interleave(K) if step is not None else None, columns is not None)
        top_scores, top_tok, top_row = _choose(logp, scores, K, terms, on_device[0] - t - 1)
        top_tok = as_ids(top_tok, columns)
        is_eos = top_tok == eos_id
        if trail is not None and attn is not None:
            trail.add(attn)

        _finalise(is_eos, top_scores, top_row, prefix, t, alpha, [finished[i] for i in sent_ids], trail)

        pick = _new_beams(is_eos, K)
        scores, rows, toks = top_scores.gather(1, pick), top_row.gather(1, pick), top_tok.gather(1, pick)
        if terms is not None:
            terms.picked(pick)
        t += 1

        keep = _still_searching(finished, sent_ids, scores, t, max_len, n_best, alpha, exhaustive)
        if len(keep) < len(sent_ids):
            keep_t = torch.tensor(keep, dtype=torch.long, device=device)
            rows, scores, toks = rows[keep_t], scores[keep_t], toks[keep_t]
            sent_ids, max_len = [sent_ids[a] for a in keep], [max_len[a] for a in keep]
            on_device = on_device[0][keep_t], on_device[1][keep_t]
            memory, src_pad = memory[keep_t], src_pad[keep_t]
            columns = columns.kept(keep_t) if columns is not None and cache is None else columns
            if cache is not None:
                cache.reorder(rows.view(-1), cross_index=keep_t)
            if terms is not None:
                terms.kept(keep_t)
        elif cache is not None:  # beams only moved within their sentences: cross-attention K/V stay
            cache.reorder(rows.view(-1))
        prefix = torch.cat((prefix[rows.view(-1)], toks.reshape(-1, 1)), dim=1)
        if trail is not None:
            trail.moved(rows.view(-1))

    return _n_best(finished, n_best, trail, sentence_pad)


def bank_greedy_search(model: Transformer, src: Tensor, constraints: Constraints, *, bos_id: int,
                       eos_id: int, max_len_a: float = DEFAULT.max_len_a, max_len_b: int = DEFAULT.max_len_b,
                       return_attention: bool = False, prefixes: Sequence[Sequence[int]] | None = None,
                       use_cache: bool = True,
                       should_stop: StopCheck | None = None) -> list[list[Hypothesis]]:
    """Greedy search with target terms: the best hypothesis of each bank (each amount of the terms
    written), ranked by the log-prob sum as greedy's are. One beam would write the terms first, in
    order, whatever the model prefers (the fullest bank takes the only slot); greedy with <eos> closed
    would append them where the model wanted to stop. C+1 beams (C: the most tokens a sentence's terms
    take) is the smallest search where each bank holds a hypothesis; with C = 0 it is greedy search."""
    return beam_search(model, src, bos_id=bos_id, eos_id=eos_id, beam_size=int(constraints.cmin.max()) + 1,
                       length_penalty=0.0, max_len_a=max_len_a, max_len_b=max_len_b, n_best=1,
                       return_attention=return_attention, prefixes=prefixes, use_cache=use_cache,
                       constraints=constraints, per_bank=True, should_stop=should_stop)
