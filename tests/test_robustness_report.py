"""The robustness report (`evaluate robustness=true`): the input of each variant, and its scores against
sacrebleu run here on the same text, through the command's own JSON and through a Translator."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import sacrebleu

import transformer_mt as tmt
from transformer_mt.data import load_split_tsv
from transformer_mt.data.text_variants import add_typos, drop_final_punct, one_case, sentence_case
from transformer_mt.decoding.robustness import AS_WRITTEN, robustness, table, varied_sources
from transformer_mt.decoding.translator import Translator

SOURCES = ["Where is the station?", "He is sleeping.", "I don't know what to do.",
           "The meeting has been postponed until tomorrow."]


def _lowercased(hypotheses: list[str], references: list[str]) -> tuple[float, float]:
    """BLEU and chrF of the lowercased text, by sacrebleu's own functions."""
    return (sacrebleu.corpus_bleu([h.lower() for h in hypotheses], [[r.lower() for r in references]]).score,
            sacrebleu.corpus_chrf([h.lower() for h in hypotheses], [[r.lower() for r in references]]).score)


def test_each_variant_of_the_input() -> None:
    varied = varied_sources(SOURCES, seed=3)
    assert list(varied) == [AS_WRITTEN, "caps", "lower", "no_punct", "typos"]
    assert varied[AS_WRITTEN] is SOURCES
    assert varied["caps"] == [s.upper() for s in SOURCES] and varied["lower"] == [s.lower() for s in SOURCES]
    assert varied["no_punct"] == [drop_final_punct(s) for s in SOURCES]
    assert varied["typos"] == varied_sources(SOURCES, seed=3)["typos"]  # seeded: one input per seed
    assert any(varied_sources(SOURCES * 20, seed=s)["typos"] != varied_sources(SOURCES * 20, seed=3)["typos"]
               for s in (4, 5))
    assert all(len(t) in (len(s) - 1, len(s), len(s) + 1) for t, s in
               zip(" ".join(varied["typos"]).split(), " ".join(SOURCES).split(), strict=True))
    assert add_typos("a an the", random.Random(0), rate=1.0) == "a an the"  # no word of 4 letters


def test_scores_ignore_case_and_are_sacrebleus() -> None:
    """A 'model' that copies its input, against the input as references: ALL CAPS and lowercase cost
    nothing once case is ignored, the punctuation and the typos cost what sacrebleu says."""
    rows = {r.variant: r for r in robustness(lambda s: list(s), SOURCES, SOURCES, seed=1)[0]}
    varied = varied_sources(SOURCES, seed=1)
    for name, row in rows.items():
        assert (row.bleu, row.chrf) == pytest.approx(_lowercased(varied[name], SOURCES))
        assert row.share == pytest.approx(row.bleu / rows[AS_WRITTEN].bleu)
    assert rows["caps"].bleu == pytest.approx(100.0) and rows["lower"].share == pytest.approx(1.0)
    assert rows["no_punct"].bleu < 100 and rows["no_punct"].changed == len(SOURCES)
    assert "| ALL CAPS | 100.00 | 100% |" in table(list(rows.values()))


def test_evaluate_reports_each_variant(tiny_run_copy: Path, tiny_engine: Translator,
                                       capsys: pytest.CaptureFixture) -> None:
    tmt.evaluate([f"checkpoint={tiny_run_copy}", "decoding.beam_size=1", "robustness=true", "seed=2",
                  "device.amp=off"])
    [path] = (tiny_run_copy / "eval").glob("test.*.json")
    report = json.loads(path.read_text())["robustness"]
    assert report["seed"] == 2 and "case:lc" in report["bleu_signature"]
    sources, references = load_split_tsv(tiny_run_copy / "split" / "test.tsv")
    varied = varied_sources(sources, seed=2)
    assert [row["variant"] for row in report["variants"]][-2:] == ["caps_as_typed", "lower_as_typed"]
    for row in report["variants"]:  # decoding.input_case=fold, then =model for the last two rows
        name, typed = row["variant"].removesuffix("_as_typed"), row["variant"].endswith("_as_typed")
        options = {"input_case": "model"} if typed else {}
        hypotheses = tiny_engine.translate(varied[name], beam_size=1, **options)
        assert (row["bleu"], row["chrf"]) == pytest.approx(_lowercased(hypotheses, references), abs=1e-9)
    assert "typos (15% of longer words)" in capsys.readouterr().out


def test_one_case_input_is_translated_in_sentence_case_and_its_translation_written_in_that_case(
        tiny_engine: Translator) -> None:
    """decoding.input_case=fold against the same engine given the sentence-cased text by hand; `model`
    against its own search of the text as typed; a sentence in mixed case, or a prefix, is left as is."""
    assert [one_case(t) for t in ("HE IS SLEEPING.", "I.", "NASA is big", "OK!", "42", "ok", "i", "Ok")] == [
        "caps", None, None, "caps", None, "lower", None, None]
    assert sentence_case("WHERE IS THE STATION?") == "Where is the station?"
    assert sentence_case("« ÇA VA ? »") == "« Ça va ? »" and sentence_case("...") == "..."
    for case, write in (("caps", str.upper), ("lower", str.lower)):
        typed = [write(s) for s in SOURCES]
        by_hand = tiny_engine.translate([sentence_case(s) for s in typed], beam_size=1)
        assert tiny_engine.translate(typed, beam_size=1) == [write(t) for t in by_hand], case
        searched = [n[0].text for n in tiny_engine.search_nbest(typed, beam_size=1)]
        assert tiny_engine.translate(typed, beam_size=1, input_case="model") == searched
    mixed = ["HE is sleeping.", SOURCES[0].upper()]
    assert tiny_engine.translate(mixed, beam_size=1, prefixes=["", "La"]) == [
        n[0].text for n in tiny_engine.search_nbest(mixed, beam_size=1, prefixes=["", "La"])]


def test_a_deterministic_search_searches_each_distinct_text_once(tiny_engine: Translator,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated line, and the ALL CAPS and lowercase forms that fold to it, are searched once and
    translated as each alone; sampling draws each line anew."""
    searched: list[list[str]] = []
    search = tiny_engine.search_nbest

    def recorded(texts: list[str], *args: object, **options: object) -> list:
        searched.append(list(texts))
        return search(texts, *args, **options)

    typed = [SOURCES[0], SOURCES[0].upper(), SOURCES[0].lower(), SOURCES[1], SOURCES[0]]
    monkeypatch.setattr(tiny_engine, "search_nbest", recorded)
    together = tiny_engine.translate(typed, beam_size=2)
    assert searched == [[SOURCES[0], SOURCES[1]]]
    assert together == [tiny_engine.translate([text], beam_size=2)[0] for text in typed]
    searched.clear()
    tiny_engine.translate(typed, sampling=True, top_k=5)
    assert searched == [[SOURCES[0], SOURCES[0], SOURCES[0], SOURCES[1], SOURCES[0]]]


def test_the_report_asks_for_every_variant_in_one_call() -> None:
    calls: list[tuple[int, dict]] = []

    def copy(texts: list[str], **options: str) -> list[str]:
        calls.append((len(texts), options))
        return list(texts)

    rows, _ = robustness(copy, SOURCES, SOURCES, seed=1, folded=True, written=list(SOURCES))
    assert calls == [(4 * len(SOURCES), {}), (2 * len(SOURCES), {"input_case": "model"})]
    assert [r.variant for r in rows] == [AS_WRITTEN, "caps", "lower", "no_punct", "typos", "caps_as_typed",
                                         "lower_as_typed"]
    assert rows[-2].changed == len(SOURCES) and rows[-2].share == pytest.approx(1.0)
