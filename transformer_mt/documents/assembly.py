"""A text's translation put back together from its parts': each part's translation where the part was,
the text's own separators (spaces, line breaks, blank lines) between them, and every word alignment and
word confidence carried from the words the model saw and wrote to the words of the text and of its
translation."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from transformer_mt.decoding.confidence import WordConfidences
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.documents.rewrite import Rewrite

_WORD = re.compile(r"\S+")  # a word as alignments count them (decoding/alignment.py)


@dataclass(frozen=True)
class PartTranslation:
    """One part of a text: where it is ([start, end) of the text), how its spans were masked (`source`:
    from the part to what the model got), its n-best list as the model wrote it, and for each hypothesis
    the rewrite that restored its spans."""

    start: int
    end: int
    source: Rewrite
    nbest: list[Translation]
    restored: list[Rewrite]


def words(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each word of `text`."""
    return [m.span() for m in _WORD.finditer(text)]


def _owners(spans: Sequence[tuple[int, int]], of: Sequence[tuple[int, int]]) -> list[list[int]]:
    """For each character range of `spans`, the indices of the words of `of` it touches."""
    return [[w for w, (a, b) in enumerate(of) if a < end and start < b] or
            [w for w, (a, b) in enumerate(of) if a <= start < b or (start == end and a <= start <= b)]
            for start, end in spans]


def joined(text: str, parts: Sequence[PartTranslation]) -> list[Translation]:
    """The text's n-best list: rank k joins each part's k-th hypothesis (its last, where it has fewer),
    between the text's separators; scores add up; alignments join when every part has one, and so do
    the best's confidences; the parts' glossary terms are the text's."""
    if not text.strip():  # what the engine made of an empty text (its prefix, or nothing)
        return [dataclasses.replace(h, text=r.new) for h, r in zip(parts[0].nbest, parts[0].restored)]
    depth = max(len(p.nbest) for p in parts)
    return [_rank(text, parts, k) for k in range(depth)]


def _rank(text: str, parts: Sequence[PartTranslation], k: int) -> Translation:
    """The k-th hypothesis of the whole text."""
    out, placed, score = [text[: parts[0].start]], [], 0.0
    at = len(out[0])
    for i, part in enumerate(parts):
        j = min(k, len(part.nbest) - 1)
        piece = part.restored[j].new
        placed.append(at)
        gap = text[part.end: parts[i + 1].start] if i + 1 < len(parts) else text[part.end:]
        out += [piece, gap]
        at += len(piece) + len(gap)
        score += part.nbest[j].score
    translation = "".join(out)
    hyps = [p.nbest[min(k, len(p.nbest) - 1)] for p in parts]
    alignment = None
    if all(h.alignment is not None for h in hyps):
        alignment = _alignment(text, translation, parts, placed, k)
    terms = [u for h in hyps for u in h.terms or ()] if any(h.terms is not None for h in hyps) else None
    confidence, words_rated = None, None
    if k == 0 and all(h.confidence is not None and h.word_confidences is not None for h in hyps):
        confidence, words_rated = _confidences(translation, parts, placed)
    return Translation(translation, score, alignment=alignment, terms=terms, confidence=confidence,
                       word_confidences=words_rated)


def _confidences(translation: str, parts: Sequence[PartTranslation],
                 placed: Sequence[int]) -> tuple[float, WordConfidences]:
    """The best translation's confidence: its parts', weighted by the length of their translations (the
    chrF a calibrated one predicts counts characters); and each of its words', from the words of the parts
    it came from (the least confident, where several; a word of none takes the one before it)."""
    tgt_words = words(translation)
    found: list[float | None] = [None] * len(tgt_words)
    total = weight = 0.0
    for part, at in zip(parts, placed):
        best, restored = part.nbest[0], part.restored[0]
        size = max(1, len(restored.new))
        total, weight = total + size * (best.confidence or 0.0), weight + size
        written = [restored.forward(a, b) for a, b in words(restored.old)]
        owned = _owners([(at + a, at + b) for a, b in written], tgt_words)
        for (_, value), owners in zip(best.word_confidences or [], owned):
            for w in owners:
                found[w] = value if found[w] is None else min(value, found[w])  # type: ignore[type-var]
    rated, last = [], 1.0
    for (a, b), value in zip(tgt_words, found):
        last = value if value is not None else last
        rated.append((translation[a:b], last))
    return total / weight, rated


def _alignment(text: str, translation: str, parts: Sequence[PartTranslation], placed: Sequence[int],
               k: int) -> list[tuple[int, int]]:
    """The parts' links as links between the words of the text and of its translation: a word the model
    saw stands for the text's words it came from (a stand-in for all of its span's), and likewise on the
    translation's side."""
    src_words, tgt_words = words(text), words(translation)
    links: set[tuple[int, int]] = set()
    for part, at in zip(parts, placed):
        j = min(k, len(part.nbest) - 1)
        restored = part.restored[j]
        seen = [part.source.backward(a, b) for a, b in words(part.source.new)]
        src = _owners([(part.start + a, part.start + b) for a, b in seen], src_words)
        written = [restored.forward(a, b) for a, b in words(restored.old)]
        tgt = _owners([(at + a, at + b) for a, b in written], tgt_words)
        for s, t in part.nbest[j].alignment or []:
            if s < len(src) and t < len(tgt):
                links |= {(a, b) for a in src[s] for b in tgt[t]}
    return sorted(links)
