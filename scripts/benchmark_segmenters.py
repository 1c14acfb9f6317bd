"""Sentence segmenters compared on the languages we train (English, French, German): which one
transformer_mt/documents/sentences.py uses, and why.

    python scripts/benchmark_segmenters.py --corpora ../shared/data/fra-eng.zip ../shared/data/deu-eng.zip \
        [--lines 2000] [--rounds 3] [--out segmenters.json]

For each installed candidate and language:
- boundary recovery on Tatoeba: the distinct sentences of one side, shuffled (seed 0), joined k at a time
  (k = 2, 3, 5) with one space; the share of the joins found (recall), the share of lines split exactly
  at their joins, and the splits inside one Tatoeba entry (some entries hold two sentences, so these are
  not all errors: a few are printed);
- the hard cases of scripts/segmenter_cases.py (abbreviations, numbers, addresses, quotes, initials...):
  how many come out as exactly the sentences a reader sees;
- speed: sentences/s over the joined lines (best of a few rounds, each candidate in turn).
The English side comes from the first corpus. A candidate that is not installed is left out, with the
`pip install` that brings it in.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from segmenter_cases import HARD_CASES  # beside this script
from timing import best_of_rounds, load_warning, machine

from transformer_mt.documents.sentences import SentenceSplitter, locate
from transformer_mt.tables import markdown_table

Segment = Callable[[str], list[str]]
KS = (2, 3, 5)
LANGUAGES = {"fra.txt": "fr", "deu.txt": "de"}  # Tatoeba's file inside each zip: its other language


def _sentencex(lang: str) -> Segment:
    return partial(importlib.import_module("sentencex").segment, lang)


def _pysbd(lang: str) -> Segment:
    return importlib.import_module("pysbd").Segmenter(language=lang, clean=False).segment


def _moses(lang: str) -> Segment:
    return importlib.import_module("sentence_splitter").SentenceSplitter(language=lang).split


def _syntok(lang: str) -> Segment:
    segmenter = importlib.import_module("syntok.segmenter")  # its rules are the same for every language

    def segment(text: str) -> list[str]:
        return ["".join(t.spacing + t.value for t in s) for p in segmenter.analyze(text) for s in p]
    return segment


def _blingfire(lang: str) -> Segment:
    to_sentences = importlib.import_module("blingfire").text_to_sentences  # one model for every language
    return lambda text: to_sentences(text).split("\n")


def _ours(lang: str) -> Segment:
    splitter = SentenceSplitter(lang)
    return lambda text: [text[a:b] for a, b in splitter.split(text)]


# Each candidate: (the module to import, what `pip install` names, a segmenter per language).
CANDIDATES: dict[str, tuple[str, str, Callable[[str], Segment]]] = {
    "sentencex": ("sentencex", "sentencex", _sentencex),
    "pysbd": ("pysbd", "pysbd", _pysbd),
    "sentence-splitter (Moses)": ("sentence_splitter", "sentence-splitter", _moses),
    "syntok": ("syntok", "syntok", _syntok),
    "blingfire": ("blingfire", "blingfire", _blingfire),
    "SentenceSplitter (ours, on sentencex)": ("sentencex", "sentencex", _ours),
}


@dataclass
class Joined:
    """Tatoeba entries of one language joined k at a time: the lines and where each join is."""

    lines: list[str] = field(default_factory=list)
    ks: list[int] = field(default_factory=list)
    joins: list[set[int]] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return sum(self.ks)


def read_sides(corpora: list[Path]) -> dict[str, list[str]]:
    """Each language's distinct Tatoeba sentences, in corpus order: English from the first zip."""
    sides: dict[str, list[str]] = {}
    for corpus in corpora:
        with zipfile.ZipFile(corpus) as archive:
            name = next(n for n in archive.namelist() if n in LANGUAGES)
            rows = [line.split("\t") for line in archive.read(name).decode("utf-8").splitlines()]
        sides.setdefault("en", list(dict.fromkeys(r[0].strip() for r in rows if len(r) > 1)))
        sides[LANGUAGES[name]] = list(dict.fromkeys(r[1].strip() for r in rows if len(r) > 1))
    return sides


def join_entries(sentences: list[str], lines: int, seed: int = 0) -> Joined:
    """`lines` lines (a third each of k = 2, 3, 5) of shuffled distinct sentences joined with one space."""
    pool = [s for s in sentences if s]
    random.Random(seed).shuffle(pool)
    joined, at = Joined(), 0
    for i in range(lines):
        k = KS[i % len(KS)]
        group, at = pool[at:at + k], at + k
        starts = [sum(len(s) + 1 for s in group[:j]) for j in range(1, k)]
        joined.lines.append(" ".join(group))
        joined.ks.append(k)
        joined.joins.append(set(starts))
    return joined


def _context(line: str, cut: int) -> str:
    return f"{line[max(0, cut - 30):cut]}⟂{line[cut:cut + 30]}"


def recovery(segment: Segment, data: Joined) -> dict:
    """Recall of the joins (per k and in all), lines split exactly, splits inside an entry (and a few)."""
    found = {k: 0 for k in KS}
    exact, inside, examples = 0, 0, []
    for line, k, joins in zip(data.lines, data.ks, data.joins):
        cuts = set(locate(line, segment(line)))
        found[k] += len(cuts & joins)
        exact += cuts == joins
        inside += len(cuts - joins)
        examples += [_context(line, c) for c in sorted(cuts - joins)][:3 - len(examples)]
    total = {k: sum(k - 1 for kk in data.ks if kk == k) for k in KS}
    recall = {str(k): found[k] / max(1, total[k]) for k in KS}
    recall["all"] = sum(found.values()) / max(1, sum(total.values()))
    return {"recall": recall, "exact_lines": exact / max(1, len(data.lines)),
            "inside_per_1000_entries": 1000 * inside / max(1, data.entries), "inside_examples": examples}


def hard_cases(segment: Segment, lang: str) -> dict:
    """How many of the language's hard cases come out as exactly their sentences, and which do not."""
    wrong = []
    for name, text, expected in HARD_CASES[lang]:
        bounds = [0, *locate(text, segment(text)), len(text)]
        got = [text[a:b].strip() for a, b in zip(bounds, bounds[1:])]
        if [g for g in got if g] != expected:
            wrong.append(name)
    return {"right": len(HARD_CASES[lang]) - len(wrong), "of": len(HARD_CASES[lang]), "wrong": wrong}


def speeds(segmenters: dict[str, Segment], data: Joined, rounds: int) -> dict[str, float]:
    """Sentences (Tatoeba entries) per second of each segmenter over all the joined lines."""
    runs = {name: (lambda s=segment: [s(line) for line in data.lines])
            for name, segment in segmenters.items()}
    best = best_of_rounds(runs, rounds)
    return {name: data.entries / seconds for name, (seconds, _) in best.items()}


def installed() -> tuple[list[str], list[str]]:
    """The candidates whose module imports, and the `pip install` names of the others."""
    found, missing = [], []
    for name, (module, package, _) in CANDIDATES.items():
        try:
            importlib.import_module(module)
            found.append(name)
        except ImportError:
            missing.append(package)
    return found, missing


def measure(sides: dict[str, list[str]], names: list[str], lines: int, rounds: int) -> dict:
    """Every figure for every candidate and language: {lang: {candidate: {...}}}."""
    results: dict[str, dict] = {}
    for lang, sentences in sides.items():
        data = join_entries(sentences, lines)
        segmenters = {name: CANDIDATES[name][2](lang) for name in names}
        rate = speeds(segmenters, data, rounds)
        results[lang] = {name: {**recovery(segment, data), "hard_cases": hard_cases(segment, lang),
                                "sentences_per_s": rate[name], "lines": len(data.lines),
                                "entries": data.entries} for name, segment in segmenters.items()}
    return results


def tables(results: dict) -> str:
    """The figures as two Markdown tables: per candidate and language, and per candidate overall."""
    header = ["segmenter", "language", *(f"recall k={k}" for k in KS), "lines exact", "inside / 1,000",
              "hard cases", "sentences/s"]
    rows = [[name, lang, *(f"{r['recall'][str(k)]:.1%}" for k in KS), f"{r['exact_lines']:.1%}",
             f"{r['inside_per_1000_entries']:.1f}", f"{r['hard_cases']['right']}/{r['hard_cases']['of']}",
             f"{r['sentences_per_s']:,.0f}"]
            for lang, by_name in results.items() for name, r in by_name.items()]
    names = list(next(iter(results.values())))
    overall = []
    for name in names:
        rs = [by_name[name] for by_name in results.values()]
        right, of = (sum(r["hard_cases"][key] for r in rs) for key in ("right", "of"))
        overall.append([name, f"{sum(r['recall']['all'] for r in rs) / len(rs):.1%}",
                        f"{sum(r['exact_lines'] for r in rs) / len(rs):.1%}", f"{right}/{of}",
                        f"{min(r['sentences_per_s'] for r in rs):,.0f}"])
    summary = markdown_table(["segmenter", "recall (mean)", "lines exact (mean)", "hard cases",
                              "sentences/s (slowest language)"], overall)
    return markdown_table(header, rows) + "\n\n" + summary


def details(results: dict) -> str:
    """The hard cases each candidate misses and a few of its splits inside one Tatoeba entry."""
    out = []
    for lang, by_name in results.items():
        for name, r in by_name.items():
            out.append(f"{lang} {name}: misses {', '.join(r['hard_cases']['wrong']) or 'none'}")
            out += [f"    inside: {example}" for example in r["inside_examples"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--corpora", type=Path, nargs="+", required=True,
                        help="Tatoeba zips (fra-eng, deu-eng)")
    parser.add_argument("--lines", type=int, default=2000, help="joined lines per language")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds for the speed")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names, missing = installed()
    if missing:
        print(f"left out (not installed): pip install {' '.join(sorted(set(missing)))}")
    warning = load_warning()
    results = measure(read_sides(args.corpora), names, args.lines, args.rounds)
    print(f"machine: {machine()}" + (f"; warning: {warning}" if warning else ""))
    print(tables(results))
    print(details(results))
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "warning": warning, "lines": args.lines,
                                        "rounds": args.rounds, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
