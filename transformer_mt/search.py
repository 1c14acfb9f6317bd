"""Batched decoding for `transformer_mt.model.Transformer`: greedy, beam search and sampling.

All searches take src (B, S) right- or left-padded with model.config.pad_id and return, per
sentence, a list of `Hypothesis` (best first). They run under torch.inference_mode() and use the
decoder's KV cache: every step feeds only the newest token.

Lengths: a sentence of n non-pad source tokens may produce at most
max_len = floor(max_len_a * n + max_len_b) tokens (capped at max_positions - 1, because the
decoder also needs a position for bos); eos is then forced. `tokens` never include bos/eos.
The search never emits pad or bos.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.model import DecoderCache, Transformer


@dataclass
class Hypothesis:
    """One decoded sentence.

    score: greedy/sample = sum of token log-probs (eos included); beam = that sum divided by the
    GNMT length penalty ((5 + L) / 6) ** length_penalty, with L = len(tokens) + 1 (eos counted).
    attention: (len(tokens) + 1, n_src) head-averaged cross-attention of the last decoder layer,
    one row per produced token (eos included) over the non-pad source positions, if requested.
    """

    tokens: list[int]  # without bos and eos
    score: float
    attention: Tensor | None = None


def _max_lengths(model: Transformer, src: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Per-sentence output length limit (B,) long, excluding eos."""
    src_len = (src != model.config.pad_id).sum(dim=1).double()
    max_len = torch.floor(max_len_a * src_len + max_len_b).long()
    return max_len.clamp(min=0, max=model.config.max_positions - 1)


def _step_log_probs(logits: Tensor, bos_id: int, eos_id: int, pad_id: int) -> Tensor:
    """Last-position logits (N, V) → float log-probs with pad and bos made impossible."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    for banned in {pad_id, bos_id} - {eos_id}:
        logp[:, banned] = float("-inf")
    return logp


def _force_eos(logp: Tensor, rows: Tensor, eos_id: int) -> None:
    """In place: rows (N,) bool may only produce eos (their log-prob of eos is kept as is)."""
    if bool(rows.any()):
        eos_logp = logp[:, eos_id].clone()
        logp.masked_fill_(rows[:, None], float("-inf"))
        logp[:, eos_id] = torch.where(rows, eos_logp, logp[:, eos_id])


def _src_attention(attn: Tensor, src_pad: Tensor) -> Tensor:
    """(T_out, S) attention of one sentence → (T_out, n_src) over its non-pad positions."""
    return attn[:, ~src_pad].float().cpu()


def _decode_step(model: Transformer, tokens: Tensor, memory: Tensor, src_pad: Tensor,
                 cache: DecoderCache | None, need_attention: bool) -> tuple[Tensor, Tensor | None]:
    """Run the decoder; return last-position logits (N, V) and attention (N, S) or None."""
    if need_attention:
        logits, attn = model.decode(tokens, memory, src_pad, cache, need_attention=True)
        return logits[:, -1], attn[:, -1]
    return model.decode(tokens, memory, src_pad, cache)[:, -1], None


def _left_to_right(
    model: Transformer,
    src: Tensor,
    choose: Callable[[Tensor], Tensor],
    *,
    bos_id: int,
    eos_id: int,
    max_len_a: float,
    max_len_b: int,
    use_cache: bool,
    return_attention: bool,
) -> list[list[Hypothesis]]:
    """Shared loop of greedy search and sampling: one hypothesis per sentence.

    `choose` maps log-probs (N, V) to next tokens (N,). Finished sentences are dropped from the
    batch (and from the cache) so that later steps only pay for the live ones.
    """
    pad_id = model.config.pad_id
    B = src.size(0)
    memory, src_pad = model.encode(src)
    max_len = _max_lengths(model, src, max_len_a, max_len_b)  # (B,)
    cache = model.new_cache() if use_cache else None

    alive = torch.arange(B, device=src.device)  # original index of each live row
    prefix = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (N, 1 + t)
    scores = torch.zeros(B, dtype=torch.float64, device=src.device)
    hyps: list[Hypothesis | None] = [None] * B
    pending_attn: dict[int, list[Tensor]] = {i: [] for i in range(B)} if return_attention else {}

    t = 0
    while alive.numel() > 0:
        inp = prefix[:, -1:] if use_cache else prefix
        logits, attn = _decode_step(model, inp, memory, src_pad, cache, return_attention)
        logp = _step_log_probs(logits, bos_id, eos_id, pad_id)  # (N, V)
        _force_eos(logp, t >= max_len, eos_id)
        nxt = choose(logp)  # (N,)
        scores += logp.gather(1, nxt[:, None]).squeeze(1).double()
        prefix = torch.cat((prefix, nxt[:, None]), dim=1)
        if return_attention:
            for row, i in enumerate(alive.tolist()):
                pending_attn[i].append(attn[row])
        t += 1

        done = nxt == eos_id
        if bool(done.any()):
            for row in done.nonzero().squeeze(1).tolist():
                i = int(alive[row])
                hyps[i] = Hypothesis(
                    tokens=prefix[row, 1:-1].tolist(),
                    score=float(scores[row]),
                    attention=_src_attention(torch.stack(pending_attn[i]), src_pad[row])
                    if return_attention else None,
                )
            keep = (~done).nonzero().squeeze(1)
            alive, prefix, scores, max_len = alive[keep], prefix[keep], scores[keep], max_len[keep]
            memory, src_pad = memory[keep], src_pad[keep]
            if cache is not None:
                cache.reorder(keep)
    return [[h] for h in hyps if h is not None]


def greedy_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    use_cache: bool = True,
    return_attention: bool = False,
) -> list[list[Hypothesis]]:
    """Arg-max decoding; use_cache=False recomputes the whole prefix each step (slow reference)."""
    with torch.inference_mode():
        return _left_to_right(
            model, src, lambda logp: logp.argmax(dim=-1), bos_id=bos_id, eos_id=eos_id,
            max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache,
            return_attention=return_attention,
        )


def sample(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """Ancestral sampling with temperature, top-k and nucleus (top-p) filtering.

    score is the sum of the model's own log-probs of the sampled tokens (before temperature and
    filtering), so it is comparable with greedy scores. top_k=1 reproduces greedy search.
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (use greedy_search for arg-max decoding)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError("top_p must be in (0, 1]")

    def choose(logp: Tensor) -> Tensor:
        logits = logp / temperature
        if top_k > 0 and top_k < logits.size(-1):
            kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            # drop a token when the mass BEFORE it already reaches top_p (keeps >= 1 token)
            drop = (probs.cumsum(dim=-1) - probs) >= top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        probs = logits.softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    with torch.inference_mode():
        return _left_to_right(
            model, src, choose, bos_id=bos_id, eos_id=eos_id, max_len_a=max_len_a,
            max_len_b=max_len_b, use_cache=True, return_attention=False,
        )


def _length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT length penalty lp(L) = ((5 + L) / 6) ** alpha (Wu et al., 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 5,
    length_penalty: float = 0.6,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    n_best: int = 1,
    return_attention: bool = False,
    exhaustive: bool = False,
) -> list[list[Hypothesis]]:
    """Batched beam search (fairseq-style) returning the n_best hypotheses per sentence.

    The batch is flattened to (A * K) rows, A live sentences × K beams. Each step takes the top
    2K continuations per sentence; eos among the top K are finalised with score
    logprob_sum / lp(len(tokens) + 1), the first K non-eos ones become the new beams. A sentence is
    done when it has K finished hypotheses (so K=1 is exactly greedy), or when it has n_best and
    its best live beam, scored as if it ended now, cannot beat the n_best-th finished one (with
    exhaustive=True: as if it ended at the most favourable length still possible, which is exact
    but rarely stops early when length_penalty > 0), or at max length (eos forced). Done
    sentences leave the batch and the cache.
    """
    if beam_size < 1 or not 1 <= n_best <= beam_size:
        raise ValueError("need beam_size >= 1 and 1 <= n_best <= beam_size")
    K = beam_size
    pad_id = model.config.pad_id
    with torch.inference_mode():
        device = src.device
        B = src.size(0)
        memory, src_pad = model.encode(src)  # once per sentence: (A, S, d), (A, S)
        max_len = _max_lengths(model, src, max_len_a, max_len_b)  # (A,)
        max_len_list = max_len.tolist()
        cache = model.new_cache()

        sent_ids = list(range(B))  # original index of each live sentence
        scores = torch.zeros(B, K, dtype=torch.float64, device=device)
        scores[:, 1:] = float("-inf")  # all beams start identical: expand only beam 0 at first
        prefix = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)  # (A*K, 1+t)
        attn_hist: Tensor | None = None  # (A*K, t, S)
        finished: list[list[Hypothesis]] = [[] for _ in range(B)]

        t = 0
        while sent_ids:
            A = len(sent_ids)
            if t == 0:
                # The K beams of a sentence are identical before the first token: decode one row
                # per sentence, then give each of its beams a copy of the self-attention state.
                # Memory and cross-attention K/V keep one row per sentence, shared by its beams.
                logits, attn = _decode_step(model, prefix[::K, -1:], memory, src_pad, cache,
                                            return_attention)
                expand = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,)
                logits = logits[expand]
                attn = attn[expand] if attn is not None else None
                cache.beams = K
                cache.reorder(expand)
            else:
                logits, attn = _decode_step(model, prefix[:, -1:], memory, src_pad, cache,
                                            return_attention)
            logp = _step_log_probs(logits, bos_id, eos_id, pad_id)  # (A*K, V)
            V = logp.size(-1)
            at_max = torch.tensor([t >= m for m in max_len_list], device=device)  # (A,)
            _force_eos(logp, at_max.repeat_interleave(K), eos_id)

            # The best 2K continuations of a sentence are among the best 2K of each of its beams:
            # pick those per row first, so the sum and topk run over K*2K values, not K*V.
            n_cand = min(2 * K, V)
            row_top, row_tok = logp.topk(n_cand, dim=1)  # (A*K, 2K)
            cand = (scores.view(A * K, 1) + row_top).view(A, K * n_cand)
            top_scores, top_pos = cand.topk(n_cand, dim=1)  # (A, 2K), sorted desc
            top_beam = torch.div(top_pos, n_cand, rounding_mode="floor")
            top_tok = row_tok.view(A, K * n_cand).gather(1, top_pos)
            top_row = top_beam + torch.arange(A, device=device)[:, None] * K  # rows of A*K
            is_eos = top_tok == eos_id

            if attn is not None:
                step_attn = attn[:, None, :]  # (A*K, 1, S)
                attn_hist = step_attn if attn_hist is None else torch.cat((attn_hist, step_attn), 1)

            # Finalise eos candidates ranked within the top K (and reachable: finite score).
            fin = is_eos[:, :K] & torch.isfinite(top_scores[:, :K])
            if bool(fin.any()):
                lp = _length_penalty(t + 1, length_penalty)
                for a, r in fin.nonzero().tolist():
                    row = int(top_row[a, r])
                    hist_attn = None
                    if attn_hist is not None:
                        hist_attn = _src_attention(attn_hist[row], src_pad[a])
                    finished[sent_ids[a]].append(Hypothesis(
                        tokens=prefix[row, 1:].tolist(),
                        score=float(top_scores[a, r]) / lp,
                        attention=hist_attn,
                    ))

            # New beams: the K best non-eos candidates, in score order (eos ranks pushed last).
            rank = is_eos.long() * n_cand + torch.arange(n_cand, device=device)
            pick = rank.topk(K, dim=1, largest=False).indices  # (A, K)
            scores = top_scores.gather(1, pick)
            rows = top_row.gather(1, pick)  # (A, K) source row of each new beam
            toks = top_tok.gather(1, pick)
            t += 1

            # Which sentences are done?
            done = []
            best_live = scores[:, 0].tolist()
            for a, i in enumerate(sent_ids):
                fins = finished[i]
                if len(fins) >= K or t > max_len_list[a]:
                    done.append(True)
                    continue
                if len(fins) >= n_best:
                    nth = sorted((h.score for h in fins), reverse=True)[n_best - 1]
                    if exhaustive:
                        # a live beam ends at a length in [t + 1, max_len + 1]; lp is monotone
                        lp = max(_length_penalty(t + 1, length_penalty),
                                 _length_penalty(max_len_list[a] + 1, length_penalty))
                    else:
                        # the usual heuristic (Hugging Face's early_stopping=False): judge the
                        # best live beam as if it ended now; far fewer steps, same n-best in practice
                        lp = _length_penalty(t + 1, length_penalty)
                    done.append(best_live[a] / lp <= nth)
                else:
                    done.append(False)

            flat = rows.view(-1)
            if any(done):
                keep = [a for a, d in enumerate(done) if not d]
                keep_t = torch.tensor(keep, dtype=torch.long, device=device)
                flat = rows[keep_t].view(-1)
                scores, toks = scores[keep_t], toks[keep_t]
                sent_ids = [sent_ids[a] for a in keep]
                max_len_list = [max_len_list[a] for a in keep]
                memory, src_pad = memory[keep_t], src_pad[keep_t]
                cache.reorder(flat, cross_index=keep_t)
            else:
                # Beams only move within their sentence: cross-attention K/V stay as they are.
                cache.reorder(flat)
            prefix = torch.cat((prefix[flat], toks.reshape(-1, 1)), dim=1)
            if attn_hist is not None:
                attn_hist = attn_hist[flat]

        out = []
        for fins in finished:
            fins.sort(key=lambda h: h.score, reverse=True)
            out.append(fins[:n_best])
        return out

