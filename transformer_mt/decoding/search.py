"""Batched decoding for `transformer_mt.model.Transformer`: greedy search and sampling, and the rules
every search shares (beam search: `decoding/beam.py`).

All searches take src (B, S) right- or left-padded with the model's pad id and return, per sentence, a
list of `Hypothesis` (best first). They run under torch.inference_mode() and use the decoder's KV cache:
every step feeds only the newest token.

Two rules are shared with the CTranslate2 engine (`transformer_mt.decoding.ct2`) and live here only:
- `max_output_length`: a sentence of n source tokens (its <eos> included) may produce at most
  floor(max_len_a * n + max_len_b) tokens, capped at max_positions - 1 (the decoder also needs a
  position for <bos>); <eos> is then forced.
- `gnmt_penalty`: beam hypotheses are ranked by their log-prob sum divided by the GNMT penalty.
`tokens` never include bos/eos, and the search never emits pad or bos. Arguments that are also
settings (`decoding.*`) default to the config's values and obey its rules (`DecodingConfig.check`).

Greedy and beam search may score a shortlist's target ids only (`Columns`: `decoding/shortlist.py`): the
logits' columns are then those ids, <eos> first (`EOS_COLUMN`), each sentence's log-probs over its own
columns alone, and the chosen columns become ids again before anything else sees them.

Every search asks `should_stop` (a host-side callable, no device read) once per step and raises
`DecodingStopped` when it answers True: a caller whose requester is gone frees the model within a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.config import DecodingConfig
from transformer_mt.model import DecoderCache, Transformer
from transformer_mt.model.attention import free_to_read

DEFAULT = DecodingConfig()  # the search arguments' defaults: `decoding`'s own
EOS_COLUMN = 0  # where a shortlist puts <eos> among each sentence's columns
StopCheck = Callable[[], bool]  # asked once per step: True stops the search (DecodingStopped)


@dataclass(frozen=True)
class Columns:
    """A batch's shortlist: the target ids (U,) the logits' columns stand for, <eos> at EOS_COLUMN, and
    own (A, U): which of them each sentence may write."""

    ids: Tensor
    own: Tensor

    def kept(self, rows: Tensor | list[int]) -> Columns:
        """The columns of the sentences at rows, in that order."""
        return Columns(self.ids, self.own[rows])


def new_cache(model: Transformer, columns: Columns | None) -> DecoderCache:
    """The model's decoding cache, computing the columns' logits alone where a shortlist is given."""
    return model.new_cache() if columns is None else model.new_cache(columns.ids, columns.own)


class DecodingStopped(Exception):
    """The caller's `should_stop` answered True: the search ended before its sentences did."""


@dataclass
class Hypothesis:
    """One decoded sentence.

    score: greedy/sample = sum of token log-probs (eos included); beam = that sum divided by
    `gnmt_penalty(len(tokens) + 1, length_penalty)` (eos counted).
    attention: (layers, heads, len(tokens) + 1, n_src) cross-attention of every decoder layer and
    head, one row per produced token (eos included) over the non-pad source positions, if requested.
    """

    tokens: list[int]  # without bos and eos
    score: float
    attention: Tensor | None = None


def alignment(attention: Tensor) -> Tensor:
    """(layers, heads, T, S) cross-attention → (T, S): the last layer's average over heads, the usual
    word-alignment view (attention_png, TensorBoard)."""
    return attention[-1].mean(0)


def max_output_length(src_tokens: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """Output tokens allowed (eos excluded) for a source of src_tokens tokens (its eos included)."""
    return max(0, min(math.floor(max_len_a * src_tokens + max_len_b), max_positions - 1))


def gnmt_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty lp(L) = ((5 + L) / 6) ** alpha (Wu et al., 2016); L counts the eos."""
    return ((5.0 + length) / 6.0) ** alpha


def gnmt_slope(length: int, alpha: float) -> float:
    """d ln lp / d ln L of the GNMT penalty at L = length: alpha * L / (5 + L). The exponent p of a
    plain length penalty (score / L ** p, CTranslate2's and Hugging Face's) that ranks hypotheses of
    about that length as GNMT does."""
    return alpha * length / (5.0 + length)


@dataclass(frozen=True)
class Ends:
    """Where a sentence starts and ends: the special ids, and the length limit's a and b."""

    bos_id: int
    eos_id: int
    max_len_a: float
    max_len_b: int

    def limits(self, model: Transformer, src: Tensor, forced: Tensor | None = None) -> list[int]:
        """Each sentence's `max_output_length`, and never shorter than its forced prefix."""
        lengths = (src != model.pad_id).sum(dim=1).tolist()
        limits = [max_output_length(n, self.max_len_a, self.max_len_b, model.config.max_positions)
                  for n in lengths]
        if forced is not None:
            limits = [max(m, p) for m, p in zip(limits, (forced >= 0).sum(dim=1).tolist())]
        return limits


def forced_tokens(prefixes: Sequence[Sequence[int]] | None, batch: int,
                  device: torch.device) -> Tensor | None:
    """(batch, longest prefix) ids each sentence's output must start with, -1 past its own prefix; None
    when no sentence has a prefix."""
    if not prefixes or not any(prefixes):
        return None
    if len(prefixes) != batch:
        raise ValueError(f"{len(prefixes)} prefixes for {batch} sentences")
    out = torch.full((batch, max(map(len, prefixes))), -1, dtype=torch.long)
    for i, p in enumerate(prefixes):
        out[i, : len(p)] = torch.tensor(list(p), dtype=torch.long)
    return out.to(device)


def _only(logp: Tensor, tokens: Tensor, rows: Tensor) -> Tensor:
    """logp where `rows` may produce only their `tokens` (N,), at the model's own log-prob."""
    if free_to_read(rows) and not bool(rows.any()):
        return logp
    out = logp.masked_fill(rows[:, None], float("-inf"))
    return out.scatter_(1, tokens[:, None], logp.gather(1, tokens[:, None]))


def step_log_probs(logits: Tensor, ends: Ends, pad_id: int, at_max: Tensor,
                    forced: Tensor | None = None, shortlisted: bool = False) -> Tensor:
    """Last-position logits (N, V) → float log-probs: pad and bos impossible, the prefix token forced
    where `forced` (N,) holds one (not -1), eos forced where at_max. Shortlisted: the logits are over
    each sentence's columns (N, k), which hold no pad or bos, <eos> at EOS_COLUMN; `forced` holds columns."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    for banned in set() if shortlisted else {pad_id, ends.bos_id} - {ends.eos_id}:
        logp[:, banned] = float("-inf")
    if forced is not None:
        logp = _only(logp, forced.clamp(min=0), forced >= 0)
    eos = EOS_COLUMN if shortlisted else ends.eos_id
    return _only(logp, torch.full_like(at_max, eos, dtype=torch.long), at_max)


def forced_columns(forced: Tensor | None, columns: Columns | None) -> Tensor | None:
    """Forced prefix ids (B, P) as columns (-1 stays -1); the ids themselves without a shortlist. A
    shortlist holds its sentences' prefixes (Shortlist.columns)."""
    if forced is None or columns is None:
        return forced
    found = columns.ids == forced[..., None]  # (B, P, U)
    return torch.where(forced >= 0, found.int().argmax(-1), -1)


def shortlisted_logits(logits: Tensor, columns: Columns) -> Tensor:
    """Whole-vocabulary logits (N, V), N = A sentences × G consecutive rows, → (N, U) over the columns,
    -inf where one is not the row's sentence's own: what a cache with columns computes directly."""
    own = columns.own.repeat_interleave(logits.size(0) // columns.own.size(0), dim=0)
    return logits[:, columns.ids].masked_fill(~own, float("-inf"))


def as_ids(chosen: Tensor, columns: Columns | None) -> Tensor:
    """Chosen columns as token ids (any shape); ids stay ids without a shortlist."""
    return chosen if columns is None else columns.ids[chosen]


def forced_at(forced: Tensor | None, rows: Tensor, t: int) -> Tensor | None:
    """The prefix tokens of step t for the given sentence rows, or None past every prefix."""
    return forced[rows, t] if forced is not None and t < forced.size(1) else None


def src_attention(attn: Tensor, src_pad: Tensor) -> Tensor:
    """(T_out, layers, H, S) attention of one sentence → (layers, H, T_out, n_src) over its
    non-pad positions."""
    return attn[..., ~src_pad].permute(1, 2, 0, 3).float().cpu()


def decode_step(model: Transformer, tokens: Tensor, memory: Tensor, src_pad: Tensor,
                 cache: DecoderCache | None, need_attention: bool,
                 columns: Columns | None = None) -> tuple[Tensor, Tensor | None]:
    """Run the decoder; return last-position logits (N, V) and attention (N, layers, H, S) or None. With
    columns, logits (N, U) over them (`shortlisted_logits`): a cache made with them computes those alone."""
    attn = None
    if need_attention:
        logits, attn = model.decode(tokens, memory, src_pad, cache, need_attention=True)
        attn = attn[:, :, :, -1]
    else:
        logits = model.decode(tokens, memory, src_pad, cache)
    logits = logits[:, -1]
    if columns is not None and cache is None:
        logits = shortlisted_logits(logits, columns)
    return logits, attn


# -- greedy search and sampling: one hypothesis per sentence, left to right ----------------------
# On a GPU they look for finished sentences every LOOK_EVERY steps, not at every step: a look reads the
# device (a host synchronisation), while a finished sentence only repeats <eos> until the next one. On
# the CPU, where reads are free, they look at every step (and the batch shrinks as soon as it can).
LOOK_EVERY = 8


@torch.inference_mode()
def _left_to_right(model: Transformer, src: Tensor, choose: Callable[[Tensor], Tensor], ends: Ends,
                   use_cache: bool, return_attention: bool, forced: Tensor | None = None,
                   should_stop: StopCheck | None = None,
                   columns: Columns | None = None) -> list[list[Hypothesis]]:
    """The loop greedy search and sampling share. `choose` maps log-probs (N, V) to next tokens (N,);
    `forced` (B, P) holds each sentence's prefix (-1 padded); `columns` the batch's shortlist.
    Finished sentences leave the batch (and the cache) at the next look, so later steps pay only for live
    ones; until then they repeat <eos>."""
    B = src.size(0)
    memory, src_pad = model.encode(src)
    limits = ends.limits(model, src, forced)
    max_len = torch.tensor(limits, device=src.device)  # (B,)
    horizon = max(limits, default=0) + 1  # every sentence has ended after this many steps
    every = 1 if return_attention or free_to_read(src) else LOOK_EVERY
    cache = new_cache(model, columns) if use_cache else None
    forced = forced_columns(forced, columns)
    alive = torch.arange(B, device=src.device)  # original index of each row
    prefix = torch.full((B, 1), ends.bos_id, dtype=torch.long, device=src.device)  # (N, 1 + t)
    scores = torch.zeros(B, dtype=torch.float64, device=src.device)
    ended = torch.zeros(B, dtype=torch.bool, device=src.device)  # rows that produced <eos>
    hyps: list[Hypothesis | None] = [None] * B
    pending_attn: dict[int, list[Tensor]] = {i: [] for i in range(B)} if return_attention else {}

    t = 0
    while alive.numel() > 0:
        if should_stop is not None and should_stop():
            raise DecodingStopped(f"greedy search stopped by its caller at step {t}")
        logits, attn = decode_step(model, prefix[:, -1:] if use_cache else prefix, memory, src_pad, cache,
                                    return_attention, columns)
        logp = step_log_probs(logits, ends, model.pad_id, t >= max_len, forced_at(forced, alive, t),
                              columns is not None)
        nxt = choose(logp)  # (N,)
        gained = logp.gather(1, nxt[:, None]).squeeze(1).double()
        nxt = as_ids(nxt, columns)
        if every > 1:  # rows that ended already repeat <eos> at no cost
            nxt, gained = nxt.masked_fill(ended, ends.eos_id), gained.masked_fill(ended, 0.0)
        scores += gained
        prefix = torch.cat((prefix, nxt[:, None]), dim=1)
        if return_attention:
            for row, i in enumerate(alive.tolist()):
                pending_attn[i].append(attn[row])
        t += 1
        ended |= nxt == ends.eos_id
        if t % every and t < horizon:
            continue
        done = ended.nonzero().squeeze(1).tolist()  # the look: one read of the device
        if not done:
            continue
        originals, tokens, totals = alive[done].tolist(), prefix[done, 1:].tolist(), scores[done].tolist()
        for row, i, seq, score in zip(done, originals, tokens, totals, strict=True):
            attention = (src_attention(torch.stack(pending_attn[i]), src_pad[row])
                         if return_attention else None)
            hyps[i] = Hypothesis(seq[:seq.index(ends.eos_id)], score, attention)
        keep = (~ended).nonzero().squeeze(1)
        alive, prefix, scores, max_len, ended = (x[keep] for x in (alive, prefix, scores, max_len, ended))
        memory, src_pad = memory[keep], src_pad[keep]
        if columns is not None and cache is None:  # (a cache keeps its own rows of them)
            columns = columns.kept(keep)
        if cache is not None:
            cache.reorder(keep)
    return [[h] for h in hyps if h is not None]


def greedy_search(model: Transformer, src: Tensor, *, bos_id: int, eos_id: int,
                  max_len_a: float = DEFAULT.max_len_a, max_len_b: int = DEFAULT.max_len_b,
                  use_cache: bool = DEFAULT.use_cache, return_attention: bool = False,
                  prefixes: Sequence[Sequence[int]] | None = None,
                  should_stop: StopCheck | None = None,
                  columns: Columns | None = None) -> list[list[Hypothesis]]:
    """Arg-max decoding; use_cache=False recomputes the whole prefix each step (slow reference).
    With prefixes, each output starts with its sentence's token ids, then continues freely. With columns
    (`Shortlist.columns`), each sentence chooses among its own target ids only."""
    DecodingConfig(max_len_a=max_len_a, max_len_b=max_len_b).check()
    return _left_to_right(model, src, lambda logp: logp.argmax(dim=-1),
                          Ends(bos_id, eos_id, max_len_a, max_len_b), use_cache, return_attention,
                          forced_tokens(prefixes, src.size(0), src.device), should_stop, columns)


def sample(model: Transformer, src: Tensor, *, bos_id: int, eos_id: int,
           temperature: float = DEFAULT.temperature, top_k: int = DEFAULT.top_k, top_p: float = DEFAULT.top_p,
           max_len_a: float = DEFAULT.max_len_a, max_len_b: int = DEFAULT.max_len_b,
           generator: torch.Generator | None = None, prefixes: Sequence[Sequence[int]] | None = None,
           should_stop: StopCheck | None = None) -> list[list[Hypothesis]]:
    """Ancestral sampling with temperature, top-k and nucleus (top-p) filtering.

    score is the sum of the model's own log-probs of the sampled tokens (before temperature and
    filtering), so it is comparable with greedy scores. top_k=1 reproduces greedy search.
    """
    DecodingConfig(temperature=temperature, top_k=top_k, top_p=top_p, max_len_a=max_len_a,
                   max_len_b=max_len_b).check()

    def choose(logp: Tensor) -> Tensor:
        logits = logp / temperature
        if 0 < top_k < logits.size(-1):
            kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            # drop a token when the mass BEFORE it already reaches top_p (keeps >= 1 token)
            drop = (probs.cumsum(dim=-1) - probs) >= top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)

    return _left_to_right(model, src, choose, Ends(bos_id, eos_id, max_len_a, max_len_b), True, False,
                          forced_tokens(prefixes, src.size(0), src.device), should_stop)
