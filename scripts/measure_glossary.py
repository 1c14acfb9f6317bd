"""What a glossary does to one run's translations: terms taken from its test split's own references by word
alignments, then the same sentences translated with and without them (issue 62's acceptance).

    pip install eflomal        # the statistical word aligner: a tool of this script, not of the package
    python scripts/measure_glossary.py saved_weights/<run> [--one 500] [--two 200] [--seed 1] [--rounds 3]
                                       [--out glossary.json] [--glossary-out terms.tsv]

1. Word alignments by eflomal (Östling & Tiedemann, 2016), a model independent of ours, over the run's
   training pairs and its test split, words as `\\w+|[^\\w\\s]`, both directions, intersected (precise links
   over many: a term taken from them should be a real translation).
2. Terms: for each test pair, the tight phrase pairs consistent with those links (1 to 3 words a side, the
   first and last word of each side linked), each side holding a word outside the 100 most frequent of its
   side of the training pairs, the source phrase once in its source and the target phrase once in its
   reference (as whole words). Seeded: `--one` sentences get one term, `--two` others two terms that do not
   overlap.
3. Those sentences at beam 5 and greedy, without terms and with their own (`translate_nbest(terms=)`):
   how many terms the output holds, BLEU and chrF, and sentences per second (median of interleaved rounds).
4. The whole test split with every term in one glossary: the sentences that no glossary term matches must
   come out exactly as without a glossary.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from timing import load_warning, machine, timed_rounds  # beside this script

from transformer_mt.config import DatasetConfig, DecodingConfig
from transformer_mt.data import load_pairs, load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.decoding.glossary import Entry, Glossary, holds_term
from transformer_mt.decoding.metrics import score
from transformer_mt.decoding.translator import Translator
from transformer_mt.tables import markdown_table

WORD = re.compile(r"\w+|[^\w\s]")
COMMON = 100  # a term holds a word outside its side's most frequent
MAX_WORDS = 3
APOSTROPHES = ("'", "’")
ALIGN_PAIRS = 100_000  # training pairs the aligner sees besides the test split


def words(text: str) -> list[str]:
    return WORD.findall(text)


def align(sources: Sequence[str], targets: Sequence[str]) -> list[set[tuple[int, int]]]:
    """Intersected eflomal links (source word, target word) of each pair."""
    try:
        from eflomal import Aligner
    except ImportError:
        sys.exit("this script needs eflomal: pip install eflomal")
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        Aligner().align([" ".join(words(s)).lower() for s in sources],
                        [" ".join(words(t)).lower() for t in targets],
                        links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)
        both = []
        for a, b in zip(fwd.read_text().splitlines(), rev.read_text().splitlines(), strict=True):
            links = [{tuple(map(int, link.split("-"))) for link in line.split()} for line in (a, b)]
            both.append(links[0] & links[1])
    return both


Phrase = tuple[int, int, int, int]  # src[i:j] and tgt[k:m]


def phrase_pairs(src: list[str], tgt: list[str], links: set[tuple[int, int]]) -> list[Phrase]:
    """Tight phrase pairs (i, j, k, m: src[i:j], tgt[k:m]) consistent with the links, 1..MAX_WORDS words."""
    out = []
    for i in range(len(src)):
        for j in range(i + 1, min(i + MAX_WORDS, len(src)) + 1):
            linked = [t for s, t in links if i <= s < j]
            if not linked:
                continue
            k, m = min(linked), max(linked) + 1
            if m - k > MAX_WORDS or any(i > s or s >= j for s, t in links if k <= t < m):
                continue
            if {i, j - 1} <= {s for s, _ in links} and {k, m - 1} <= {t for _, t in links}:
                out.append((i, j, k, m))
    return out


def word_edges(text: str, phrase: str) -> bool:
    """The phrase starts and ends with a word character and is no part of a contraction (`'ve`, `qu'`)."""
    at = text.find(phrase)
    before, after = text[at - 1:at] if at > 0 else "", text[at + len(phrase):at + len(phrase) + 1]
    return bool(re.match(r"\w", phrase) and re.search(r"\w$", phrase)) and before not in APOSTROPHES and \
        after not in APOSTROPHES


def once(text: str, phrase: str) -> bool:
    pattern = r"\s*".join(map(re.escape, phrase.split()))
    return len(re.findall(rf"(?<!\w){pattern}(?!\w)", text, re.IGNORECASE)) == 1


def source_phrase(text: str, tokens: list[str]) -> str | None:
    """The words as they stand in `text` (its own spacing, e.g. `don't` not `don ' t`), or None."""
    pattern = r"\s*".join(map(re.escape, tokens))
    m = re.search(rf"(?<!\w){pattern}(?!\w)", text, re.IGNORECASE)
    return text[m.start():m.end()] if m else None


def candidate_terms(sources: list[str], references: list[str], links: list[set[tuple[int, int]]],
                    common_src: set[str], common_tgt: set[str],
                    cased: collections.Counter[str] | None = None) -> list[list[Entry]]:
    """Each test pair's usable term pairs (step 2 of the module docstring). `cased`: how often each word
    is written in the training pairs, as written: a sentence's first word is lowercased where its
    lowercase form is the more common (`This`, not `Tom`)."""
    cased = cased if cased is not None else collections.Counter()

    def first(phrase: str) -> str:
        word = phrase.split()[0]
        lower = word[0].lower() + word[1:]
        return lower + phrase[len(word):] if cased[lower] > cased[word] else phrase

    out = []
    for source, reference, pair_links in zip(sources, references, links, strict=True):
        src, tgt = words(source), words(reference)
        terms = []
        for i, j, k, m in phrase_pairs([w.lower() for w in src], [w.lower() for w in tgt], pair_links):
            s_words, t_words = src[i:j], tgt[k:m]
            if not any(w.isalpha() for w in s_words + t_words):
                continue
            if all(w.lower() in common_src for w in s_words) or all(w.lower() in common_tgt for w in t_words):
                continue
            s_text, t_text = source_phrase(source, s_words), source_phrase(reference, t_words)
            if not (s_text and t_text and word_edges(source, s_text) and word_edges(reference, t_text)):
                continue
            if once(source, s_text) and once(reference, t_text):
                # A sentence's first word may be capitalised for being first: the term is the word itself.
                terms.append(Entry(first(s_text) if i == 0 else s_text, first(t_text) if k == 0 else t_text))
        out.append(terms)
    return out


def choose(candidates: list[list[Entry]], sources: list[str], one: int, two: int,
           seed: int) -> dict[int, list[Entry]]:
    """`one` sentences with one term and `two` others with two terms that do not overlap."""
    rng = random.Random(seed)
    order = list(range(len(candidates)))
    rng.shuffle(order)
    chosen: dict[int, list[Entry]] = {}
    for i in order:
        terms = candidates[i]
        if len(chosen) >= one + two or not terms:
            continue
        want_two = sum(len(t) == 2 for t in chosen.values()) < two
        if want_two:
            apart = [(a, b) for a in terms for b in terms if a.source.lower() < b.source.lower()
                     and not _overlap(sources[i], a.source, b.source) and a.target.lower() not in
                     b.target.lower() and b.target.lower() not in a.target.lower()]
            if apart:
                chosen[i] = list(rng.choice(apart))
                continue
        if sum(len(t) == 1 for t in chosen.values()) < one:
            chosen[i] = [rng.choice(terms)]
    return chosen


def _overlap(text: str, a: str, b: str) -> bool:
    low = text.lower()
    ia, ib = low.find(a.lower()), low.find(b.lower())
    return not (ia + len(a) <= ib or ib + len(b) <= ia)


def test_terms(engine: Translator, sources: list[str], references: list[str], one: int, two: int,
               seed: int) -> dict[int, list[Entry]]:
    """Steps 1 and 2 of the module docstring: the chosen test sentences' terms, by sentence index."""
    train_src, train_tgt = load_pairs(DatasetConfig(**engine.info["config"]["dataset"]), "train")
    sides = (train_src[:ALIGN_PAIRS], train_tgt[:ALIGN_PAIRS])
    links = align(list(sources) + sides[0], list(references) + sides[1])[:len(sources)]
    counts = [collections.Counter(w.lower() for t in side for w in words(t)) for side in sides]
    common = [{w for w, _ in c.most_common(COMMON)} for c in counts]
    cased = collections.Counter(w for side in sides for t in side for w in words(t))
    return choose(candidate_terms(sources, references, links, *common, cased), sources, one, two, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--one", type=int, default=500)
    parser.add_argument("--two", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--glossary-out", default=None, help="write the chosen terms (line, source, target)")
    args = parser.parse_args()

    engine = Translator.from_checkpoint(args.run, device="cpu")
    run_dir = Path(engine.info["checkpoint"]).parent
    sources, references = load_split_tsv(run_dir / SPLIT_DIR / "test.tsv")
    chosen = test_terms(engine, sources, references, args.one, args.two, args.seed)
    picked = sorted(chosen)
    texts, refs = [sources[i] for i in picked], [references[i] for i in picked]
    terms = [chosen[i] for i in picked]
    if args.glossary_out:
        Path(args.glossary_out).write_text("".join(f"{i + 1}\t{e.source}\t{e.target}\n" for i in picked
                                                   for e in chosen[i]), encoding="utf-8")

    rows, report = [], {"machine": machine(), "run": str(run_dir), "sentences": len(picked),
                        "terms": sum(map(len, terms)), "one_term": sum(len(t) == 1 for t in terms),
                        "two_terms": sum(len(t) == 2 for t in terms), "searches": {}}
    for name, beam in (("beam 5", 5), ("greedy", 1)):
        engine.decoding = DecodingConfig(beam_size=beam)
        outputs: dict[str, list[str]] = {}

        def run(with_terms: bool, outputs: dict[str, list[str]] = outputs) -> None:
            found = engine.translate_nbest(texts, terms=terms if with_terms else None)
            outputs[str(with_terms)] = [n[0].text for n in found]

        engine.translate_nbest(texts[:50], terms=terms[:50])  # warm-up
        seconds = timed_rounds({"without": lambda: run(False), "with": lambda: run(True)}, args.rounds)
        per = {}
        for key, label in (("False", "without"), ("True", "with")):
            out = outputs[key]
            held = sum(holds_term(text, e.target) for text, ts in zip(out, terms) for e in ts)
            s = score(out, refs)
            per[label] = {"terms_in_output": held / report["terms"], "bleu": s.bleu, "chrf": s.chrf,
                          "sentences_per_s": len(texts) / statistics.median(seconds[label])}
            speed = per[label]["sentences_per_s"]
            rate = f"{100 * held / report['terms']:.1f}%"
            rows.append([name, label, rate, f"{s.bleu:.2f}", f"{s.chrf:.2f}", f"{speed:.1f}"])
        report["searches"][name] = per

    engine.decoding = DecodingConfig(beam_size=5)
    pooled = {}  # one target per source term: the first chosen
    for e in (e for ts in terms for e in ts):
        pooled.setdefault(e.source, e.target)
    glossary = Glossary.of(sorted(pooled.items()), "test terms")
    matched = [bool(glossary.find(s)) for s in sources]
    with_glossary = [n[0].text for n in engine.translate_nbest(list(sources), glossary=glossary)]
    plain = [n[0].text for n in engine.translate_nbest(list(sources))]
    untouched = [i for i, m in enumerate(matched) if not m]
    same = sum(with_glossary[i] == plain[i] for i in untouched)
    report["identity"] = {"sentences_without_a_term": len(untouched), "identical": same}
    warning = load_warning()
    if warning:
        report["load_warning"] = warning
    print(f"{report['machine']}; {len(picked)} test sentences of {run_dir} ({report['one_term']} with one "
          f"term, {report['two_terms']} with two; {report['terms']} terms)")
    print(markdown_table(["search", "terms", "terms in output", "BLEU", "chrF", "sentences/s"], rows))
    print(f"whole test split with every term in one glossary: {same} of {len(untouched)} sentences without a "
          "term identical to decoding without a glossary (beam 5)")
    if warning:
        print(warning)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
