"""Lexical shortlists (`decoding.shortlist=true`): the target tokens a sentence's translation may hold, so
that the search scores a few hundred columns instead of the whole vocabulary (Marian's shortlists, as the
Bergamot students use them; docs/decoding.md#shortlist).

A run's shortlist is counted from its training pairs at the end of `train` (`shortlist.json` beside its
checkpoints): for each source token, the `PER_TOKEN` target tokens seen with it most often, ranked by Dice's
coefficient 2·c(s,t) / (c(s) + c(t)) over sentence pairs (a frequent target word is with every source
token and is no translation of any); and the `FREQUENT` most frequent target tokens, which every sentence
may use. A sentence's own list is those of its tokens, the frequent ones, its own tokens written on the
target side (names, numbers and codes are copied), its forced prefix and <eos>. A batch is searched over the
union of its sentences' lists, one matrix product for all (`Shortlist.columns`), each sentence's
log-probabilities over its own list alone: a sentence translates the same in any batch.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from transformer_mt.data.ragged import Ragged
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Vocabulary
from transformer_mt.decoding.search import Columns
from transformer_mt.errors import CheckpointError

log = logging.getLogger(__name__)

SHORTLIST_FILE = "shortlist.json"
PER_TOKEN = 100  # target tokens kept for each source token
FREQUENT = 100  # target tokens every sentence may use
FORMAT = "transformer-mt shortlist 1"
MAX_IDS = 1_000_000  # a vocabulary larger than this is no vocabulary this project trains
COLUMN_MULTIPLE = 64  # a batch's columns are padded to a multiple of this
MAX_PAIRS = 2_000_000  # a larger corpus is counted on this many pairs spread over it (memory stays bounded)


@dataclass(frozen=True)
class Shortlist:
    """table (V_src, PER_TOKEN): each source id's target ids, best first, -1 past its own; frequent (n,):
    the target ids every sentence may use; identity (V_src,): the target id written as the source token
    (joint vocabularies: the id itself), -1 where the target side has no such token."""

    table: Tensor
    frequent: Tensor
    identity: Tensor
    tgt_vocab_size: int

    def columns(self, src: Tensor, forced: Tensor | None = None) -> Columns:
        """The batch's columns for src (A, S) ids padded with PAD_ID [and forced (A, P) prefix ids, -1
        padded]: every sentence's own target ids together, <eos> first, and which are each sentence's."""
        A = src.size(0)
        own = torch.zeros(A, self.tgt_vocab_size, dtype=torch.bool, device=src.device)  # (A, V)
        rows = torch.arange(A, device=src.device)[:, None]
        seen = self.table.to(src.device)[src]  # (A, S, k)
        seen = torch.cat((seen, self.identity.to(src.device)[src][..., None]), dim=2)
        seen = seen.masked_fill((src == PAD_ID)[..., None], -1).flatten(1)  # (A, S * (k + 1))
        own[rows.expand_as(seen)[seen >= 0], seen[seen >= 0]] = True
        own[:, self.frequent.to(src.device)] = True
        if forced is not None:
            own[rows.expand_as(forced)[forced >= 0], forced[forced >= 0]] = True
        own[:, [PAD_ID, BOS_ID]] = False  # never written
        own[:, EOS_ID] = False  # put first below
        ids = own.any(0).nonzero().squeeze(1)
        spare = -(ids.numel() + 1) % COLUMN_MULTIPLE  # columns no sentence owns, for the kernels' blocks
        eos = torch.full((1,), EOS_ID, device=src.device)  # at EOS_COLUMN, 0
        padding = torch.full((spare,), EOS_ID, device=src.device)
        everyone = torch.ones(A, 1, dtype=torch.bool, device=src.device)
        nobody = torch.zeros(A, spare, dtype=torch.bool, device=src.device)
        return Columns(torch.cat((eos, ids, padding)), torch.cat((everyone, own[:, ids], nobody), dim=1))

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "tgt_vocab_size": self.tgt_vocab_size,
                "frequent": self.frequent.tolist(), "identity": self.identity.tolist(),
                "table": [[t for t in row if t >= 0] for row in self.table.tolist()]}


def build_shortlist(src: Ragged, tgt: Ragged, vocab: Vocabulary, per_token: int = PER_TOKEN,
                    frequent: int = FREQUENT) -> Shortlist:
    """The shortlist counted from training pairs of token ids (without bos/eos)."""
    V_s, V_t = vocab.src_vocab_size, vocab.tgt_vocab_size
    if len(src) > MAX_PAIRS:
        rows = np.linspace(0, len(src) - 1, MAX_PAIRS).astype(np.int64)
        src, tgt = src.take(rows), tgt.take(rows)
    pair_s, s_ids = _unique_per_pair(src)
    pair_t, t_ids = _unique_per_pair(tgt)
    c_s = np.bincount(s_ids, minlength=V_s)
    c_t = np.bincount(t_ids, minlength=V_t)
    # every (source token, target token) of a pair, each pair's tokens counted once
    t_start = np.searchsorted(pair_t, np.arange(len(src) + 1))
    per_s = (t_start[pair_s + 1] - t_start[pair_s]).astype(np.int64)  # targets beside each source token
    total = int(per_s.sum())
    first = np.repeat(t_start[pair_s] - (np.cumsum(per_s) - per_s), per_s) + np.arange(total)
    keys = np.repeat(s_ids.astype(np.int64), per_s) * V_t + t_ids[first]
    keys, c_st = np.unique(keys, return_counts=True)
    s, t = keys // V_t, keys % V_t
    dice = 2.0 * c_st / (c_s[s] + c_t[t])
    order = np.lexsort((-dice, s))  # by source id, best first within one
    s, t = s[order], t[order]
    rank = np.arange(len(s)) - np.searchsorted(s, s)
    keep = rank < per_token
    table = np.full((V_s, per_token), -1, dtype=np.int64)
    table[s[keep], rank[keep]] = t[keep]
    common = np.argsort(-c_t, kind="stable")[:frequent]
    return Shortlist(torch.from_numpy(table), torch.from_numpy(np.sort(common[c_t[common] > 0])),
                     _identity(vocab), V_t)


def _unique_per_pair(ids: Ragged) -> tuple[np.ndarray, np.ndarray]:
    """(pair index, token id) of each distinct token of each sequence, sorted by pair."""
    lengths = ids.lengths.astype(np.int64)
    starts = ids.starts.astype(np.int64)
    total = int(lengths.sum())
    where = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)
    pair = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    token = np.asarray(ids.flat[where], dtype=np.int64)
    both = np.unique(pair * MAX_IDS + token)
    return both // MAX_IDS, both % MAX_IDS


def _identity(vocab: Vocabulary) -> Tensor:
    """Each source id's target id for the same token string (-1: none); the id itself when joint."""
    if vocab.joint:
        return torch.arange(vocab.src_vocab_size)
    target = vocab.tgt.get_vocab()
    out = torch.full((vocab.src_vocab_size,), -1, dtype=torch.long)
    for token, i in vocab.src.get_vocab().items():
        out[i] = target.get(token, -1)
    return out


def vmap_lines(shortlist: Shortlist, vocab: Vocabulary) -> list[str]:
    """The shortlist as CTranslate2's vocabulary map (`vmap.txt`, its `use_vmap`): `<TAB>` then the tokens
    every sentence may use, then a line `source token<TAB>target tokens` for each source token; token
    strings, space-separated (none of a BPE or unigram vocabulary holds a space or a tab)."""
    def tgt(ids: list[int]) -> str:
        return " ".join(vocab.tgt.id_to_token(i) for i in ids if i >= 0)

    lines = [f"\t{tgt(shortlist.frequent.tolist())}"]
    for s, (row, same) in enumerate(zip(shortlist.table.tolist(), shortlist.identity.tolist(), strict=True)):
        if s not in (PAD_ID, BOS_ID, EOS_ID) and (row[0] >= 0 or same >= 0):
            lines.append(f"{vocab.src.id_to_token(s)}\t{tgt([same, *row])}")
    return lines


def write_shortlist(run_dir: Path, src: Ragged, tgt: Ragged, vocab: Vocabulary) -> Path:
    """Count the run's shortlist from its training pairs and write it beside its checkpoints."""
    took = time.perf_counter()
    shortlist = build_shortlist(src, tgt, vocab)
    path = Path(run_dir) / SHORTLIST_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(shortlist.to_json(), separators=(",", ":")), encoding="utf-8")
    tmp.replace(path)
    log.info("shortlist counted from %d training pairs (%.1fs): %s", len(src), time.perf_counter() - took,
             path)
    return path


def read_shortlist(run_dir: Path, vocab: Vocabulary) -> Shortlist:
    """The run's shortlist, checked against its vocabulary; CheckpointError saying what to do otherwise."""
    path = Path(run_dir) / SHORTLIST_FILE
    if not path.is_file():
        raise CheckpointError(f"decoding.shortlist=true: {run_dir} has no {SHORTLIST_FILE} (`train` writes "
                              "one at its end); count one with: python scripts/build_shortlist.py "
                              f"{run_dir}, or set decoding.shortlist=false")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return _checked(data, vocab)
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{path} is not a shortlist of this model ({e}); count it again with: python "
                              f"scripts/build_shortlist.py {run_dir}") from None


def _checked(data: dict[str, object], vocab: Vocabulary) -> Shortlist:
    """A shortlist from its JSON; ValueError naming the first field that does not fit the vocabulary."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"its format is not {FORMAT!r}")
    V_s, V_t = vocab.src_vocab_size, vocab.tgt_vocab_size
    if data["tgt_vocab_size"] != V_t:
        raise ValueError(f"{data['tgt_vocab_size']} target tokens, the model has {V_t}")
    rows, frequent, identity = data["table"], data["frequent"], data["identity"]
    if not (isinstance(rows, list) and isinstance(identity, list) and len(rows) == len(identity) == V_s):
        raise ValueError(f"its table and identity need one row per source token ({V_s})")
    width = max((len(r) for r in rows), default=0)
    if width > V_t:
        raise ValueError(f"a row of {width} ids, more than the {V_t} target tokens")
    table = np.full((V_s, max(width, 1)), -1, dtype=np.int64)
    for i, row in enumerate(rows):
        table[i, :len(row)] = _ids(row, V_t, "table")
    return Shortlist(torch.from_numpy(table), torch.from_numpy(_ids(frequent, V_t, "frequent")),
                     torch.from_numpy(_ids(identity, V_t, "identity", allow_none=True)), V_t)


def _ids(values: object, size: int, field: str, allow_none: bool = False) -> np.ndarray:
    """A list of target ids as an array; ValueError unless each is an int in [0, size) (or -1)."""
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError(f"{field} holds something other than token ids")
    out = np.asarray(values, dtype=np.int64).reshape(-1)
    low = -1 if allow_none else 0
    if out.size and (out.min() < low or out.max() >= size):
        raise ValueError(f"{field} holds an id outside the {size} target tokens")
    return out

