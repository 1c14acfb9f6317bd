"""The documents report: how text as people have it comes through translation, scored on a held-out set.

1. **k sentences a line** (k = 2, 3, 5): consecutive test sentences joined k at a time (the last
   incomplete group left out), translated by the pipeline as it is (sentences split) and with splitting
   off (what the model itself makes of several sentences), each against the same sentences translated
   one a line and joined the same way, so that both sides are scored at the same granularity: BLEU, its
   share of the one-a-line BLEU, and the length ratio (a dropped or fused sentence shows there first).
2. **Spans**: the exact-copy rate of each kind of span of documents/span_cases.py, with span protection
   on (the pipeline) and off (what the model itself copies).
3. **Unseen names**: the same for first names the training data does not hold: the pipeline copies
   them as capitalised words no training pair held (document.names), the model alone as it learned to.

The translators are callables (texts in, translations out), so the report is tested without a model;
each is called as few times as possible, with everything it translates, since the pipeline batches
sentences across texts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import faker

from transformer_mt.decoding.metrics import bleu_and_length
from transformer_mt.documents.span_cases import KINDS, Case, name_cases, span_cases
from transformer_mt.tables import markdown_table

KS = (2, 3, 5)
MISSES = 3  # the lines a span kind's JSON shows that the pipeline did not copy
LABELS = {"number": "numbers (separators, decimals, phone numbers)", "price": "prices", "time": "times",
          "year": "years", "email": "e-mail addresses", "url": "URLs", "code": "codes (letters and digits)",
          "path": "file paths (POSIX and Windows)", "name": "first names not in the training data"}
Translate = Callable[[list[str]], list[str]]


@dataclass(frozen=True)
class LinesScore:
    """k sentences a line: BLEU and length ratio of the pipeline (split), of the model alone (unsplit),
    and of the same sentences one a line, their translations joined as the sources are."""

    k: int
    lines: int
    one_a_line: tuple[float, float]  # (BLEU, length ratio)
    split: tuple[float, float]
    unsplit: tuple[float, float]

    def share(self, bleu: float) -> float:
        """A BLEU as a share of the one-a-line BLEU."""
        return bleu / self.one_a_line[0] if self.one_a_line[0] else 0.0


@dataclass(frozen=True)
class CopyRate:
    """How many of a kind's lines kept their value verbatim: with the pipeline, with protection off."""

    kind: str
    cases: int
    pipeline: float | None  # None: no lines (every name drawn was seen in training)
    unprotected: float | None
    misses: tuple[dict[str, str], ...]  # a few lines the pipeline did not copy, to read


@dataclass(frozen=True)
class DocumentsReport:
    """The report's rows and what decides them."""

    lines: list[LinesScore]
    spans: list[CopyRate]
    names: CopyRate
    seed: int
    cases: int
    bleu_signature: str


def copied(value: str, translation: str) -> bool:
    """Whether `value` is in the translation verbatim and whole: not inside a longer word or number
    ("42" is not copied in "1942", nor "12.5" in "12.50")."""
    whole = rf"(?<!\w)(?<!\w[.,:/-]){re.escape(value)}(?!\w)(?![.,:/-]\w)"
    return re.search(whole, translation) is not None


def _groups(texts: list[str], k: int) -> list[str]:
    """Each k consecutive texts joined by a space; an incomplete last group left out."""
    return [" ".join(texts[i:i + k]) for i in range(0, len(texts) - len(texts) % k, k)]


def _lines(translate: Translate, unsplit: Translate, sources: list[str], references: list[str],
           written: list[str]) -> tuple[list[LinesScore], str]:
    """The k-a-line rows (k with no complete group left out) and BLEU's signature; one call of each
    translator for every k."""
    ks = [k for k in KS if len(sources) >= k]
    if not ks:
        return [], ""
    joined = [line for k in ks for line in _groups(sources, k)]
    outputs = {"split": translate(joined), "unsplit": unsplit(joined)}
    rows, at, signature = [], 0, ""
    for k in ks:
        refs, n = _groups(references, k), len(sources) // k
        one_bleu, one_ratio, signature = bleu_and_length(_groups(written, k), refs)
        scored = {name: bleu_and_length(hyps[at:at + n], refs)[:2] for name, hyps in outputs.items()}
        rows.append(LinesScore(k, n, (one_bleu, one_ratio), scored["split"], scored["unsplit"]))
        at += n
    return rows, signature


def _rates(kind: str, cases: list[Case], pipeline: list[str], unprotected: list[str]) -> CopyRate:
    """A kind's exact-copy rates."""
    if not cases:
        return CopyRate(kind, 0, None, None, ())
    kept = [copied(c.value, t) for c, t in zip(cases, pipeline, strict=True)]
    alone = [copied(c.value, t) for c, t in zip(cases, unprotected, strict=True)]
    misses = tuple({"line": c.line, "value": c.value, "translation": t}
                   for c, t, ok in zip(cases, pipeline, kept, strict=True) if not ok)[:MISSES]
    return CopyRate(kind, len(cases), sum(kept) / len(cases), sum(alone) / len(cases), misses)


def documents_report(translate: Translate, unsplit: Translate, unprotected: Translate, sources: list[str],
                     references: list[str], written: list[str], seed: int, seen_words: Callable[[str], bool],
                     cases: int = 100) -> DocumentsReport:
    """The report on a held-out set: `translate` is the pipeline with its defaults, `unsplit` the same
    with sentence splitting off, `unprotected` with span protection off; `written` the translations of
    `sources` one a line; `seen_words(name)` whether the training data holds a name (data/words.py);
    `cases` lines per span kind and of names, drawn from `seed`."""
    if not len(sources) == len(references) == len(written):
        raise ValueError(f"{len(sources)} sources, {len(references)} references, {len(written)} translations")
    lines, signature = _lines(translate, unsplit, sources, references, written)
    every = span_cases(seed, cases, sources) + name_cases(seed, cases, sources, seen_words)
    texts = [c.line for c in every]
    pipeline, alone = (translate(texts), unprotected(texts)) if texts else ([], [])
    rates = {}
    for kind in (*KINDS, "name"):
        at = [i for i, c in enumerate(every) if c.kind == kind]
        rates[kind] = _rates(kind, [every[i] for i in at], [pipeline[i] for i in at], [alone[i] for i in at])
    return DocumentsReport(lines, [rates[kind] for kind in KINDS], rates["name"], seed, cases, signature)


def report_json(report: DocumentsReport) -> dict[str, object]:
    """The report as the evaluation's JSON keeps it, with what decides the input and the scores."""
    def rate(r: CopyRate) -> dict[str, object]:
        return {"kind": r.kind, "cases": r.cases, "exact": r.pipeline, "exact_unprotected": r.unprotected,
                "misses": list(r.misses)}

    return {"seed": report.seed, "cases": report.cases, "faker": faker.VERSION,
            "bleu_signature": report.bleu_signature,
            "lines": [{"k": s.k, "lines": s.lines,
                       "one_a_line": {"bleu": s.one_a_line[0], "length_ratio": s.one_a_line[1]},
                       **{name: {"bleu": bleu, "share": s.share(bleu), "length_ratio": ratio}
                          for name, (bleu, ratio) in (("split", s.split), ("unsplit", s.unsplit))}}
                      for s in report.lines],
            "spans": [rate(r) for r in report.spans], "names": rate(report.names)}


def _percent(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def table(report: DocumentsReport) -> str:
    """The report as one Markdown table: the k-a-line rows (BLEU with its share of one a line, and the
    length ratio), then each span kind's and the names' exact-copy rate."""
    header = ["input", "lines", "pipeline (split, spans protected)", "model alone (unsplit, unprotected)",
              "one a line"]
    rows: list[list[str]] = []
    for s in report.lines:
        rows.append([f"{s.k} sentences a line: BLEU", str(s.lines),
                     *(f"{b:.2f} ({100 * s.share(b):.0f}%)" for b in (s.split[0], s.unsplit[0])),
                     f"{s.one_a_line[0]:.2f}"])
        rows.append([f"{s.k} sentences a line: length ratio", str(s.lines),
                     *(f"{r:.3f}" for r in (s.split[1], s.unsplit[1], s.one_a_line[1]))])
    for r in [*report.spans, report.names]:
        rows.append([f"{LABELS[r.kind]}: exact", str(r.cases), _percent(r.pipeline), _percent(r.unprotected),
                     ""])
    return markdown_table(header, rows)
