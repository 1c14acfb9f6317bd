"""One step of beam search under hard lexical constraints: Dynamic Beam Allocation (Post & Vilar, 2018)
with Hu et al.'s (2019) round-robin bank striping, on the tensors of `decoding/constraints.py`.

Each step, for the sentences with terms:
1. <eos> is closed to hypotheses with terms unmet, so every finished hypothesis meets all its terms;
2. the candidates are beam search's usual best 2K, each beam's own best token (so hypotheses that have
   written less of the terms keep a continuation), and each beam's constraint tokens (the next token of
   every variant of an unmet term, and its first token, to start it over);
3. a candidate is dropped when even the fewest tokens its terms still take (`TermState.least`) no longer
   fit before the length limit forces <eos>: a hypothesis that cannot finish frees its slot;
4. the candidates are sorted into banks by how much of the terms they have written (cmin - need), and
   taken in turns: the best of the fullest bank, the best of the next, ..., then the second of each.
   `per_bank` keeps the best of each bank only: greedy search with terms.
Why every sentence ends with its terms met: the fullest bank's best candidate always comes first (a beam,
or a finished hypothesis if it is <eos>), and one of its beam's constraint tokens lowers `need` by one, so
the fullest bank rises by one a step until all terms are met, at most cmin steps after the prefix; the
limit leaves that room (`limits`).
Sentences without terms take beam search's own best 2K, untouched: their output is the unconstrained
one (per bank, the best candidate: greedy search's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_mt.decoding.constraints import Constraints, TermState

NEG_INF = float("-inf")


def limits(max_len: list[int], forced: Tensor | None, c: Constraints | None, max_positions: int) -> list[int]:
    """Each sentence's length limit, raised to its prefix plus the tokens its terms take (max_len as it is
    without terms); a ValueError when the model's positions cannot hold them (`constraints.fit_terms` says
    which terms fit)."""
    if c is None:
        return max_len
    prefix = (forced >= 0).sum(1).tolist() if forced is not None else [0] * len(max_len)
    # With word edges a term may need a token more (a space before it): one spare token a term.
    spare = (c.minlen > 0).sum(1).tolist() if c.edges is not None else [0] * len(max_len)
    out = []
    for i, (m, p, need, s) in enumerate(zip(max_len, prefix, c.cmin.tolist(), spare, strict=True)):
        if p + need > max_positions - 1:
            raise ValueError(f"sentence {i}: its prefix and terms need {p + need} target tokens, this "
                             f"model writes at most {max_positions - 1}; decode the terms "
                             "constraints.fit_terms keeps")
        out.append(max(m, min(p + need + s, max_positions - 1)))
    return out


def _term_tokens(state: TermState, c: Constraints) -> tuple[Tensor, Tensor]:
    """Each beam's constraint tokens (A, K, 2M) and which are real: per variant of an unmet term, its
    next token and (when started) its first; never a first token that would glue to the word before."""
    A, K, M = state.prog.shape
    seq = c.seq[:, None].expand(A, K, M, -1)
    following = seq.gather(-1, state.prog[..., None]).squeeze(-1)
    first = seq[..., 0]
    open_variant = (~state.met).gather(-1, c.term[:, None].expand(A, K, M)) & (c.length > 0)[:, None]
    startable = open_variant & ~(c.glued[:, None] & state.in_word[..., None])
    going = torch.where(state.prog > 0, open_variant, startable)
    return torch.cat((following, first), -1), torch.cat((going, startable & (state.prog > 0)), -1)


def _drop_duplicates(score: Tensor, row: Tensor, tok: Tensor, vocab: int) -> Tensor:
    """score with every repeat of an earlier (row, token) candidate at -inf (A, Q)."""
    key, order = (row * vocab + tok).sort(dim=1, stable=True)
    repeat = torch.zeros_like(key, dtype=torch.bool)
    repeat[:, 1:] = key[:, 1:] == key[:, :-1]
    return score.masked_fill(torch.zeros_like(repeat).scatter(1, order, repeat), NEG_INF)


def _stripe(score: Tensor, bank: Tensor, eos: Tensor, n_banks: int, per_bank: bool) -> tuple[Tensor, Tensor]:
    """Candidates (A, Q) in bank turns: best of the highest bank, best of the next ... then the second of
    each; -inf last (and with per_bank, all but each bank's best), <eos> ones (`eos`) after the others
    there. Returns the order and which are live."""
    by_score = score.argsort(dim=1, descending=True, stable=True)
    banks, by_bank = bank.gather(1, by_score).sort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, by_bank)  # by bank, best first within each
    Q = score.size(1)
    pos = torch.arange(Q, device=score.device).expand_as(banks)
    first = torch.ones_like(banks, dtype=torch.bool)
    first[:, 1:] = banks[:, 1:] != banks[:, :-1]
    rank = pos - torch.where(first, pos, 0).cummax(1).values  # place within its bank
    live = torch.isfinite(score.gather(1, order)) & ((rank == 0) if per_bank else True)
    # Dead <eos> candidates go last: beam search continues the first K non-eos candidates, and at most K
    # are live <eos> ones (one a beam), so the first 2K always hold K non-eos ones.
    key = torch.where(live, rank * n_banks + (n_banks - 1 - banks), Q * n_banks + eos.gather(1, order).long())
    turns = key.argsort(dim=1, stable=True)
    return order.gather(1, turns), live.gather(1, turns)


class TermSearch:
    """The terms of the live sentences and the state of their beams, carried through beam search."""

    def __init__(self, c: Constraints, beams: int, eos_id: int, per_bank: bool = False) -> None:
        self.c = c
        self.K = beams
        self.eos_id = eos_id
        self.per_bank = per_bank  # keep each bank's best only (bank_greedy_search)
        self.state = TermState.start(c, beams)
        self.chosen = self.state  # the states of the last step's candidates
        self.n_banks = int(c.cmin.max()) + 1  # read once: banks are 0..cmin

    def close_eos(self, logp: Tensor) -> Tensor:
        """logp (A*K, V) with <eos> impossible for beams whose terms are not all met, and (with word edges)
        no token gluing to a term just written."""
        unmet = self.state.need(self.c).view(-1) > 0
        logp[:, self.eos_id] = logp[:, self.eos_id].masked_fill(unmet, NEG_INF)
        if self.c.edges is not None:
            logp = logp.masked_fill(self.state.fresh.view(-1, 1) & self.c.edges.glues, NEG_INF)
        return logp

    def candidates(self, logp: Tensor, scores: Tensor, top: tuple[Tensor, Tensor, Tensor],
                   room: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The step's 2K candidates per sentence (module docstring, 2-4): top = beam search's own best
        (scores, tokens, rows), each (A, 2K); room (A,) = tokens a sentence may still write after this one
        before its limit forces <eos>."""
        A, K, V = scores.size(0), self.K, logp.size(1)
        best_tok = logp.argmax(1)  # (A*K,) each beam's own best token
        term_tok, real = _term_tokens(self.state, self.c)  # (A, K, 2M)
        term_tok = torch.where(real, term_tok, best_tok.view(A, K, 1))  # padding: a harmless repeat
        own_tok = torch.cat((best_tok.view(A, K, 1), term_tok), -1)  # (A, K, 1 + 2M)
        own_real = torch.cat((torch.ones_like(real[..., :1]), real), -1)
        own_score = (scores[..., None] + logp.gather(1, own_tok.view(A * K, -1)).view(own_tok.shape).double())
        own_score = own_score.masked_fill(~own_real, NEG_INF).view(A, -1)
        own_row = (torch.arange(A * K, device=logp.device).view(A, K, 1).expand_as(own_tok)).reshape(A, -1)
        score = torch.cat((top[0], own_score), 1)  # (A, Q)
        tok, row = torch.cat((top[1], own_tok.view(A, -1)), 1), torch.cat((top[2], own_row), 1)
        score = _drop_duplicates(score, row, tok, V)

        beam = row - torch.arange(A, device=row.device)[:, None] * K
        state = self.state.select(beam).advance(self.c, tok)
        eos = tok == self.eos_id
        score = score.masked_fill(~eos & (state.least(self.c) > room[:, None]), NEG_INF)
        bank = self.c.cmin[:, None] - state.need(self.c)
        order, live = _stripe(score, bank, eos, self.n_banks, self.per_bank)
        score = score.gather(1, order).masked_fill(~live, NEG_INF)
        n = top[0].size(1)
        # Sentences without terms: beam search's own choice (per bank: their one bank's best, i.e. greedy)
        plain = (self.c.cmin == 0)[:, None] & (not self.per_bank)
        order = torch.where(plain, torch.arange(n, device=order.device), order[:, :n])
        score = torch.where(plain, top[0], score[:, :n])
        self.chosen = state.select(order)
        return score, tok.gather(1, order), row.gather(1, order)

    def picked(self, pick: Tensor) -> None:
        """The new beams are the last step's candidates `pick` (A, K)."""
        self.state = self.chosen.select(pick)

    def kept(self, index: Tensor) -> None:
        """Only the sentences `index` go on."""
        self.c, self.state = self.c.kept(index), self.state.sentences(index)
