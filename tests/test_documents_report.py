"""The documents report (documents/report.py, documents/span_cases.py) against translators whose effect is
known in advance, and the words of a run's training pairs (data/words.py) against its split read back."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from transformer_mt.config import DatasetConfig
from transformer_mt.config.schema import MixedCorpus
from transformer_mt.data import held_out_pairs
from transformer_mt.data.words import seen_words, training_words
from transformer_mt.documents.report import KS, LABELS, copied, documents_report, report_json, table
from transformer_mt.documents.span_cases import FORMS, KINDS, NAME_TEMPLATES, name_cases, span_cases

# Sentences of five 13a tokens each ("Tom", "has", "a", "cat", "."): a line's first sentence is exactly
# 1/k of k of them.
SOURCES = [f"{who} {verb} a {thing}." for who in ("Tom", "Mary", "Ann") for verb in ("has", "wants", "sees")
           for thing in ("cat", "car", "book")]
VALUE_SHAPES = {"time": r"\d{1,2}:\d\d", "year": r"\d{4}", "email": r"[\w.+-]+@[\w-]+(\.[\w-]+)+",
                "url": r"https?://\S+", "price": r"[$€£]\d{1,3}(,\d{3})*\.\d\d",
                "code": r"(?=.*[A-Z])(?=.*\d)[A-Z\d]+(-[A-Z\d]+)*", "path": r"(/|[A-Z]:\\)\S+"}


def _identity(texts: list[str]) -> list[str]:
    return list(texts)


def _no_digits(texts: list[str]) -> list[str]:
    return [re.sub(r"\d", "", t) for t in texts]


def _first_sentence(texts: list[str]) -> list[str]:
    return [re.split(r"(?<=[.!?]) ", t)[0] for t in texts]


def _report(translate=_identity, unsplit=_identity, unprotected=_identity, sources=SOURCES,
            seen=lambda _: False, cases=8):
    return documents_report(translate, unsplit, unprotected, sources, list(sources), list(sources), seed=5,
                            seen_words=seen, cases=cases)


def test_every_template_is_a_sentence_with_one_slot() -> None:
    templates = [t for forms in FORMS.values() for f in forms for t in f.templates] + list(NAME_TEMPLATES)
    for template in templates:
        assert template.count("{}") == 1, template
        text = template.format("X")
        assert text[0].isupper() and text[-1] in ".?" and "  " not in text, text


def test_span_lines_hold_their_value_alone_or_beside_a_test_sentence() -> None:
    cases = span_cases(seed=3, cases=12, paragraphs=SOURCES)
    assert [c.kind for c in cases] == [k for k in KINDS for _ in range(12)]
    templates = {k: {t for f in forms for t in f.templates} for k, forms in FORMS.items()}
    for i, case in enumerate(cases):
        assert case.line.count(case.value) == 1 and copied(case.value, case.line), case
        if case.kind in VALUE_SHAPES:
            assert re.fullmatch(VALUE_SHAPES[case.kind], case.value), case
        rest = case.line.replace(case.value, "{}")
        beside = {f"{s} {t}" for s in SOURCES for t in templates[case.kind]} | {
            f"{t} {s}" for s in SOURCES for t in templates[case.kind]}
        assert rest in (beside if i % 2 else templates[case.kind]), case  # every second: in a paragraph
    numbers = [c.value for c in cases if c.kind == "number"]
    assert any("," in n for n in numbers) and any(re.fullmatch(r"\d+\.\d\d", n) for n in numbers)
    assert any(" " in n or n.startswith("+") for n in numbers)  # a phone number
    paths = [c.value for c in cases if c.kind == "path"]
    assert any(p.startswith("/") for p in paths) and any(p[1:3] == ":\\" for p in paths)


def test_cases_depend_on_the_seed_alone() -> None:
    random.seed(1)
    first = span_cases(7, 10, SOURCES) + name_cases(7, 10, SOURCES, lambda _: False)
    random.seed(2)  # global random state is not theirs
    assert span_cases(7, 10, SOURCES) + name_cases(7, 10, SOURCES, lambda _: False) == first
    assert span_cases(8, 10, SOURCES) != span_cases(7, 10, SOURCES)


def test_names_are_distinct_and_unseen() -> None:
    unseen = name_cases(4, 30, SOURCES, lambda name: False)
    assert any(c.value[0] in "ABCDEFGHIJKLM" for c in unseen)
    names = name_cases(4, 30, SOURCES, lambda name: name[0] in "ABCDEFGHIJKLM")
    assert len(names) == 30 and len({c.value for c in names}) == 30
    assert all(c.value[0] not in "ABCDEFGHIJKLM" and copied(c.value, c.line) for c in names)
    report = _report(seen=lambda name: True)
    assert report.names.cases == 0 and report.names.pipeline is None
    assert f"| {LABELS['name']}: exact | 0 | n/a | n/a |" in table(report)


def test_copied_means_verbatim_and_whole() -> None:
    assert copied("42", "Il a 42 livres.") and copied("AB-1234", "Le code est «AB-1234».")
    assert not copied("42", "Il a 1942 livres.") and not copied("12.5", "Il fait 12.50 mètres.")
    assert not copied("$12.99", "Ça coûte 12,99 $.") and not copied("Anna", "Annabelle est là.")
    assert copied("https://a.com/", "Voir https://a.com/.") and copied("Zoé", "J'ai vu Zoé hier.")


def test_a_translator_that_copies_copies_every_span_and_keeps_every_sentence() -> None:
    report = _report()
    assert [s.k for s in report.lines] == list(KS)
    for s in report.lines:
        assert s.lines == len(SOURCES) // s.k
        assert s.split == s.unsplit == s.one_a_line == pytest.approx((100.0, 1.0))
    assert all(r.pipeline == r.unprotected == 1.0 and r.cases == 8 for r in [*report.spans, report.names])


def test_dropping_digits_loses_numbers_and_protection_shows_apart() -> None:
    rates = {r.kind: r for r in _report(translate=_no_digits).spans}
    for kind in ("number", "price", "time", "year", "code"):
        assert rates[kind].pipeline == 0.0 and rates[kind].unprotected == 1.0, kind
        assert len(rates[kind].misses) == 3 and rates[kind].misses[0]["translation"] == _no_digits(
            [rates[kind].misses[0]["line"]])[0]


def test_a_model_that_keeps_the_first_sentence_of_a_line() -> None:
    """Each k-a-line translation is one of k equally long sentences, all its n-grams right: the length
    ratio is 1/k and BLEU is 100 times the brevity penalty exp(1 - k)."""
    report = _report(unsplit=_first_sentence)
    for s in report.lines:
        assert s.unsplit[1] == pytest.approx(1 / s.k)
        assert s.unsplit[0] == pytest.approx(100 * math.exp(1 - s.k))
        assert s.share(s.unsplit[0]) == pytest.approx(math.exp(1 - s.k)) and s.split[0] == pytest.approx(100)


def test_each_translator_is_called_once_for_all_it_translates() -> None:
    calls: dict[str, list[int]] = {"translate": [], "unsplit": [], "unprotected": []}

    def recorded(name: str):
        def translate(texts: list[str]) -> list[str]:
            calls[name].append(len(texts))
            return list(texts)
        return translate

    _report(recorded("translate"), recorded("unsplit"), recorded("unprotected"), cases=6)
    groups = sum(len(SOURCES) // k for k in KS)
    spans = 6 * (len(KINDS) + 1)
    assert calls == {"translate": [groups, spans], "unsplit": [groups], "unprotected": [spans]}


def test_the_json_and_the_table_hold_every_row() -> None:
    report = _report(unsplit=_first_sentence, sources=SOURCES[:4])  # too few sentences for 5 a line
    data = json.loads(json.dumps(report_json(report)))
    assert [row["k"] for row in data["lines"]] == [2, 3]
    assert set(data["lines"][0]) == {"k", "lines", "one_a_line", "split", "unsplit"}
    assert data["lines"][1]["unsplit"]["length_ratio"] == pytest.approx(1 / 3)
    assert [row["kind"] for row in data["spans"]] == list(KINDS) and data["names"]["kind"] == "name"
    assert data["seed"] == 5 and data["cases"] == 8 and "nrefs:1" in data["bleu_signature"]
    assert data["faker"] and data["spans"][0]["exact"] == 1.0 and data["spans"][0]["misses"] == []
    lines = table(report).splitlines()
    assert len(lines) == 2 + 2 * 2 + len(KINDS) + 1
    assert all(line.count(" | ") == 4 for line in lines)
    assert "| 3 sentences a line: length ratio | 1 | 1.000 | 0.333 | 1.000 |" in lines


def test_a_report_refuses_translations_that_do_not_match_the_sources_and_takes_a_single_sentence() -> None:
    with pytest.raises(ValueError, match="4 sources, 4 references, 3 translations"):
        documents_report(_identity, _identity, _identity, SOURCES[:4], SOURCES[:4], SOURCES[:3], 1,
                         lambda _: False)
    alone = documents_report(_identity, _identity, _identity, SOURCES[:1], SOURCES[:1], SOURCES[:1], 1,
                             lambda _: False, cases=2)
    assert alone.lines == [] and alone.bleu_signature == "" and alone.spans[0].pipeline == 1.0


def _tsv(path: Path, pairs: list[tuple[str, str]]) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(path)


def test_seen_words_are_those_of_the_training_pairs(tmp_path: Path) -> None:
    """Each pair has words of its own: a word is seen exactly when its pair is in neither held-out
    part (as the split read back says), on either side, whatever its case; a mixed corpus's count."""
    pairs = [(f"Alpha{i} walks.", f"Gamma{i} marche.") for i in range(300)]
    cfg = DatasetConfig(name="parallel", path=_tsv(tmp_path / "pairs.tsv", pairs), url=None,
                        cache_dir=str(tmp_path / "cache"), valid_size=20, test_size=20)
    held_out = {p for part in ("valid", "test") for p in held_out_pairs(cfg, part)}
    seen = seen_words(training_words(cfg))
    assert len(held_out) >= 40 and seen("walks") and seen("MARCHE") and not seen("Zyxw")
    for i, pair in enumerate(pairs):
        assert seen(f"alpha{i}") == seen(f"GAMMA{i}") == (pair not in held_out), pair
    assert seen(f"Zyxw alpha{next(i for i, p in enumerate(pairs) if p not in held_out)}")  # any word counts

    drawn = DatasetConfig(**{**cfg.__dict__, "max_pairs": 200})
    held_out = {p for part in ("valid", "test") for p in held_out_pairs(drawn, part)}
    seen = seen_words(training_words(drawn))
    assert sum(seen(f"alpha{i}") for i in range(300)) == 200 - len(held_out)
    assert not any(seen(s.split()[0]) for s, _ in held_out)

    mixed = DatasetConfig(**{**cfg.__dict__, "mix": [MixedCorpus(path=_tsv(tmp_path / "more.tsv",
                                                                        [("Beta runs.", "Delta court.")]))]})
    assert seen_words(training_words(mixed))("delta") and not seen_words(training_words(cfg))("delta")


def test_training_words_are_read_from_the_cache_after_the_first_run(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The second run of a corpus reads its words from the data cache, the same words; a corpus changed
    since (its file) is streamed again."""
    from transformer_mt.data import words

    path = _tsv(tmp_path / "pairs.tsv", [(f"Alpha{i} walks.", f"Gamma{i} marche.") for i in range(100)])
    cfg = DatasetConfig(name="parallel", path=path, url=None, cache_dir=str(tmp_path / "cache"),
                        valid_size=10, test_size=10)
    streamed = training_words(cfg)
    monkeypatch.setattr(words, "training_pairs", lambda _: pytest.fail("streamed again"))
    assert training_words(cfg) == streamed and len(streamed) == 80 * 2 + 2
    _tsv(tmp_path / "pairs.tsv", [(f"Beta{i} runs.", f"Delta{i} court.") for i in range(101)])
    monkeypatch.undo()
    assert "beta7" in training_words(cfg) and "alpha7" not in training_words(cfg)


def test_evaluate_reports_text_as_people_have_it_with_unseen_names_copied(
        tiny_run_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`evaluate documents=true` on the tiny run: the table is printed and kept in the JSON; the names no
    training pair held come through the layer (which copies them) where the barely trained model alone
    garbles them; the typos line compares names copied with names translated."""
    import transformer_mt as tmt

    tmt.evaluate([f"checkpoint={tiny_run_copy}", "documents=true", "max_sentences=30", "device=cpu",
                  "decoding.beam_size=1"])
    out = capsys.readouterr().out
    assert "text as people have it" in out and "with document.names=model" in out
    report = json.loads(next((tiny_run_copy / "eval").glob("test.*.json")).read_text())["documents"]
    names = report["names"]
    assert names["cases"] >= 50 and names["exact"] >= 0.95 > names["exact_unprotected"], names
    assert report["typos_names"]["sentences_changed"] > 0
