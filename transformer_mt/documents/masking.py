"""Spans replaced by stand-ins before the model, and put back in its translation.

Each protected span of a sentence gets a stand-in that the sentence does not already hold, and the model
translates the masked sentence. Afterwards each stand-in found in the translation, as a whole word and in
any case, is replaced by its span. A stand-in the model dropped is first retried with the next stand-in;
if that is dropped too, the span is placed at the end of the translation, before its final punctuation,
and counted: a span is never lost silently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from transformer_mt.documents.rewrite import Edit, Rewrite
from transformer_mt.documents.spans import Span

# The stand-ins, the most reliably copied first (scripts/measure_stand_ins.py; docs/documents.md): names
# a corpus writes the same on both sides of a pair, which models copy far more often than a number, for
# numbers too; none a name that translations respell (Mary, Marie, Maria).
STAND_INS: tuple[str, ...] = ("Boston", "Tokyo", "Tom", "Paris", "John", "Chicago", "Kyoto", "Berlin")
FINAL = re.compile(r"[\s\u00a0\u202f]*[.!?…。！？]*[\s\u00a0\u202f]*$")
WORDS = re.compile(r"\w+")
# A stand-in counts as found only as a whole word: not inside an address, a path or a longer number.
AROUND_STAND_IN = (r"(?<![\w@/.-])", r"(?![\w@/-])")


def _word(stand_in: str) -> re.Pattern[str]:
    before, after = AROUND_STAND_IN
    return re.compile(before + re.escape(stand_in) + after, re.IGNORECASE)


@dataclass(frozen=True)
class Masked:
    """A sentence with its spans replaced: `rewrite.old` the sentence (folded to sentence case when it was
    typed in one case), `rewrite.new` what the model gets; the `spans`, their text as typed (`originals`)
    and the `stand_ins` that replaced them, in order; `avoid`: words no stand-in may be (a glossary's target
    terms, which the translation will hold)."""

    rewrite: Rewrite
    spans: tuple[Span, ...]
    originals: tuple[str, ...]
    stand_ins: tuple[str, ...]
    avoid: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return self.rewrite.new


def mask(sentence: str, spans: Sequence[Span], attempt: int = 0, typed: str | None = None,
         avoid: Sequence[str] = ()) -> Masked:
    """The sentence with each span replaced by a stand-in (the `attempt`-th free one, so that a retry uses
    others); no stand-in is one the sentence holds elsewhere or one of the words of `avoid`, and no two
    spans share one. `typed`: the sentence as typed, where `sentence` is it folded (its spans are restored
    as typed)."""
    edits, used = [], set()
    present = {w.lower() for w in WORDS.findall(" ".join([blanked(sentence, spans), *avoid]))}
    for span in spans:
        free = [s for s in STAND_INS if s.lower() not in present and s not in used]
        choice = free[attempt % len(free)] if free else f"{STAND_INS[0]}{len(used)}"
        used.add(choice)
        edits.append(Edit(span.start, span.end, choice))
    rewrite = Rewrite.of(sentence, edits)
    originals = tuple(s.of(typed if typed is not None else sentence) for s in spans)
    return Masked(rewrite, tuple(spans), originals, tuple(e.new for e in edits), tuple(avoid))


def blanked(sentence: str, spans: Sequence[Span]) -> str:
    """The sentence with its spans blanked out: what case it is written in, and which words it holds."""
    chars = list(sentence)
    for s in spans:
        chars[s.start:s.end] = " " * (s.end - s.start)
    return "".join(chars)


def missing(masked: Masked, translation: str) -> list[int]:
    """The spans whose stand-in the translation does not hold."""
    return [i for i, s in enumerate(masked.stand_ins) if not _word(s).search(translation)]


def unmask(masked: Masked, translation: str) -> tuple[Rewrite, int]:
    """The translation with each stand-in replaced by its span (each of its occurrences), and a span whose
    stand-in is missing placed before the final punctuation; the rewrite, and how many were so placed."""
    edits: list[Edit] = []
    placed = []
    for original, stand_in in zip(masked.originals, masked.stand_ins):
        found = [m for m in _word(stand_in).finditer(translation)
                 if not any(e.start < m.end() and m.start() < e.end for e in edits)]
        if found:
            edits += [Edit(m.start(), m.end(), original) for m in found]
        else:
            placed.append(original)
    if placed:
        edits.append(_before_final(translation, " ".join(placed)))
    return Rewrite.of(translation, edits), len(placed)


def _before_final(translation: str, text: str) -> Edit:
    """The edit that writes `text` after the translation's last word, before its final punctuation
    (a space before a full stop dropped, one before ? or ! kept, as French writes it)."""
    tail = FINAL.search(translation)
    end = tail.start() if tail else len(translation)  # type: ignore[union-attr]
    space = len(translation[end:]) - len(translation[end:].lstrip())
    keep = translation[end:end + space] if translation[end + space:end + space + 1] not in (".", "…") else ""
    lead = " " if end and not translation[end - 1].isspace() else ""
    return Edit(end, end + space, lead + text + keep)
