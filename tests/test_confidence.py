"""Confidence (decoding/confidence.py, calibration.py, confidence_report.py): the scores against the model's
own log-probabilities read otherwise (the training objective, greedy search's score, a plain forward pass),
words against `target_words`, batched against one by one; the calibration's fit against a known curve; the
rank statistics against a direct computation; and what the commands make of it (translate's JSON lines and
thresholds, evaluate's report and calibration, the server's answer)."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path

import pytest
import torch

from tests.conftest import require, tatoeba_sample
from transformer_mt.config import DecodingConfig
from transformer_mt.data import collate
from transformer_mt.decoding import confidence_report
from transformer_mt.decoding.alignment import target_words
from transformer_mt.decoding.calibration import fit_calibration, fit_logistic, words_in_reference
from transformer_mt.decoding.confidence import (
    CALIBRATION_FILE,
    Calibration,
    Logistic,
    Rater,
    read_calibration,
    verdict,
    weights_fingerprint,
)
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.scoring import score_pairs, token_log_probs
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import DataError


@pytest.fixture(scope="module")
def fitted(fitted_model, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model fitted for seconds (conftest.fitted_model, post-norm), which writes words where the
    tiny run still writes nothing, in a directory of its own with 80 other Tatoeba pairs as its held-out
    split."""
    run = fitted_model("marian", tmp_path_factory.mktemp("confidence"))
    (run / "split").mkdir()
    valid = tatoeba_sample(corpus, 997, 79)
    valid.append((valid[0][0], "Une autre traduction."))  # a source twice, as Tatoeba's splits have them
    held_out = {"valid": valid, "test": tatoeba_sample(corpus, 991, 20)}
    for name, pairs in held_out.items():
        (run / "split" / f"{name}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return run


def held_out(run: Path, n: int) -> tuple[list[str], list[str]]:
    from transformer_mt.data import load_split_tsv

    sources, references = load_split_tsv(run / "split" / "valid.tsv")
    return sources[:n], references[:n]


@pytest.fixture(scope="module")
def sources(fitted: Path) -> list[str]:
    return held_out(fitted, 24)[0]


@pytest.fixture(scope="module")
def raw_engine(fitted: Path) -> Translator:
    """The fitted model's Translator, uncalibrated: its confidences are the model's own probabilities."""
    engine = Translator.from_checkpoint(fitted, device="cpu", amp="off")
    assert engine.rater.calibration is None
    return engine


# -- the scores ------------------------------------------------------------------------------------------
def test_the_forced_pass_reads_the_training_objective_and_greedys_own_scores(raw_engine: Translator,
                                                                            sources: list[str]) -> None:
    src = raw_engine.vocab.encode_src(sources)
    greedy = [n[0] for n in decode_ids(raw_engine.model, src, DecodingConfig(beam_size=1), raw_engine.device)]
    gained = token_log_probs(raw_engine.model, src, [h.tokens for h in greedy], raw_engine.device, 6000)
    for h, g in zip(greedy, gained, strict=True):
        assert len(g) == len(h.tokens) + 1  # pieces and <eos>
        assert abs(float(g.double().sum()) - h.score) < 1e-4 * len(g)  # the search summed the same
    pairs = score_pairs(raw_engine.model, src, [h.tokens for h in greedy], raw_engine.device, 6000)
    assert all(abs(p.log_prob - float(g.double().sum())) < 1e-6 for p, g in zip(pairs, gained))
    # one pair, by a plain forward pass of the model: each token's log-softmax entry
    batch = collate([src[0]], [greedy[0].tokens])
    with torch.no_grad():
        logp = torch.log_softmax(raw_engine.model.eval()(batch.src, batch.tgt_in).float(), -1)[0]
    direct = logp.gather(1, batch.tgt_out[0][:, None])[:, 0]
    assert torch.allclose(direct, gained[0], atol=1e-5)


def test_confidences_are_the_pieces_probabilities_grouped_by_target_words(raw_engine: Translator,
                                                                         sources: list[str]) -> None:
    found = [n[0] for n in raw_engine.translate_nbest(sources, beam_size=1, input_case="model")]
    src = raw_engine.vocab.encode_src(sources)
    greedy = decode_ids(raw_engine.model, src, DecodingConfig(beam_size=1), raw_engine.device)
    ids = [n[0].tokens for n in greedy]
    gained = token_log_probs(raw_engine.model, src, ids, raw_engine.device, 6000)
    assert any(len(t.text.split()) > 2 for t in found)
    for t, tokens, g in zip(found, ids, gained, strict=True):
        assert t.confidence == pytest.approx(math.exp(float(g.double().mean())), rel=1e-5)
        words = t.text.split()
        assert [w for w, _ in t.word_confidences] == words
        owners = target_words(raw_engine.vocab.tgt, tokens)
        for k, (_, value) in enumerate(t.word_confidences):
            pieces = [float(g[p]) for p, w in enumerate(owners) if w == k]
            assert pieces, "every word has a piece of its own here"
            assert value == pytest.approx(math.exp(sum(pieces)), rel=1e-5)


def test_batched_confidences_equal_one_by_one_and_only_the_best_is_rated(raw_engine: Translator,
                                                                         sources: list[str]) -> None:
    together = raw_engine.translate_nbest(sources[:10], beam_size=3, n_best=2)
    for sentence, nbest in zip(sources[:10], together):
        alone = raw_engine.translate_nbest([sentence], beam_size=3, n_best=2)[0]
        assert nbest[0].text == alone[0].text
        assert nbest[0].confidence == pytest.approx(alone[0].confidence, abs=1e-5)
        assert [c for _, c in nbest[0].word_confidences] == pytest.approx(
            [c for _, c in alone[0].word_confidences], abs=1e-5)
        assert nbest[1].confidence is None and nbest[1].word_confidences is None
    off = raw_engine.translate_nbest(sources[:3], confidence=False)
    assert all(n[0].confidence is None and n[0].word_confidences is None for n in off)
    empty = raw_engine.translate_nbest(["", "   "])
    assert all(n[0].text == "" and n[0].confidence is None for n in empty)


def test_a_folded_input_gets_its_words_in_its_case(raw_engine: Translator) -> None:
    plain = raw_engine.translate_nbest(["Tom is reading a book."])[0][0]
    caps = raw_engine.translate_nbest(["TOM IS READING A BOOK."])[0][0]
    assert caps.text == plain.text.upper()
    assert caps.word_confidences == [(w.upper(), c) for w, c in plain.word_confidences]


def test_a_text_of_sentences_gets_its_parts_confidences(raw_engine: Translator) -> None:
    from transformer_mt.config import DocumentConfig
    from transformer_mt.documents.pipeline import DocumentTranslator

    docs = DocumentTranslator.for_engine(raw_engine, DocumentConfig())
    first, second = "I am cold.", "Tom is reading a book at 10:30."
    parts = [n[0] for n in docs.translate_nbest([first, second])]
    whole = docs.translate_nbest([f"{first} {second}"])[0][0]
    assert whole.text == f"{parts[0].text} {parts[1].text}"
    assert whole.word_confidences == parts[0].word_confidences + parts[1].word_confidences
    weights = [len(p.text) for p in parts]
    expected = sum(w * p.confidence for w, p in zip(weights, parts)) / sum(weights)
    assert whole.confidence == pytest.approx(expected, rel=1e-6)
    assert any("10:30" in w for w, _ in whole.word_confidences)  # a span, restored, has a confidence


# -- calibration -----------------------------------------------------------------------------------------
def test_the_fit_recovers_a_known_curve() -> None:
    rng = random.Random(0)
    scores = [rng.uniform(-4.0, 0.5) for _ in range(20_000)]
    truth = Logistic(2.0, 1.0)
    exact = fit_logistic(scores, [truth(s) for s in scores])  # the curve's own values as targets
    assert exact.slope == pytest.approx(2.0, abs=1e-4) and exact.bias == pytest.approx(1.0, abs=1e-4)
    drawn = fit_logistic(scores, [float(rng.random() < truth(s)) for s in scores])  # outcomes drawn from it
    assert drawn.slope == pytest.approx(2.0, abs=0.15) and drawn.bias == pytest.approx(1.0, abs=0.15)
    falling = fit_logistic(scores, [truth(-s) for s in scores])  # a decreasing relation: kept increasing
    assert 0.0 <= falling.slope < 1e-3


def test_words_are_in_the_reference_once_each_case_and_punctuation_aside() -> None:
    found = words_in_reference(["Il", "dort,", "il", "dort", "?", "vite"], "il DORT ? Il")
    assert found == [True, True, True, False, True, False]


def test_a_calibration_is_fitted_kept_and_read_back_for_its_weights_only(
        raw_engine: Translator, fitted: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sources, references = held_out(fitted, 40)
    translations = [n[0] for n in raw_engine.translate_nbest(sources)]
    fitted = {"fingerprint": weights_fingerprint(raw_engine.model), "checkpoint": "best.pt"}
    calibration = fit_calibration(translations, references, fitted)
    assert calibration.fitted["sentences"] == 40
    assert calibration.fitted["words"] == sum(len(t.text.split()) for t in translations)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps(calibration.to_json()), encoding="utf-8")
    assert read_calibration(tmp_path, fitted["fingerprint"]) == calibration
    with caplog.at_level(logging.WARNING):
        assert read_calibration(tmp_path, "other weights") is None
    assert "not for these weights" in caplog.text
    (tmp_path / CALIBRATION_FILE).write_text('{"sentence": 1}', encoding="utf-8")
    with pytest.raises(DataError, match="is not a calibration"):
        read_calibration(tmp_path)
    with pytest.raises(DataError, match="at least"):
        fit_calibration(translations[:3], references[:3], fitted)
    engine = Translator(raw_engine.model, raw_engine.vocab, raw_engine.device)
    engine.rater = Rater(calibration)
    rated = engine.translate_nbest(sources[:5])
    for t, raw in zip(rated, translations[:5]):
        confidence, words = calibration.applied(raw.confidence, raw.word_confidences)
        assert t[0].confidence == pytest.approx(confidence, abs=1e-6)
        assert [w for w, _ in t[0].word_confidences] == [w for w, _ in words]
        assert [c for _, c in t[0].word_confidences] == pytest.approx([c for _, c in words], abs=1e-6)


def test_a_run_is_calibrated_on_the_end_of_its_validation_split(fitted: Path, raw_engine: Translator,
                                                                tmp_path: Path) -> None:
    import shutil

    from transformer_mt.config import DeviceConfig, SearchConfig
    from transformer_mt.decoding.calibration import calibrate_run

    run = Path(shutil.copytree(fitted, tmp_path / "run"))
    written = calibrate_run(run, 50, SearchConfig(beam_size=1), DeviceConfig("cpu", amp="off"))
    assert written == run / CALIBRATION_FILE
    data = json.loads((run / CALIBRATION_FILE).read_text(encoding="utf-8"))
    assert data["fingerprint"] == weights_fingerprint(raw_engine.model) and data["search"] == "greedy"
    assert data["sentences"] == 50 and data["held_out"] == "split/valid.tsv, pairs 31-80"
    sources, references = held_out(fitted, 80)
    again = fit_calibration([n[0] for n in raw_engine.translate_nbest(sources[30:], beam_size=1)],
                            references[30:], {})
    assert (again.sentence, again.word) == (Calibration.from_json(data, "").sentence,
                                            Calibration.from_json(data, "").word)
    engine = Translator.from_checkpoint(run, device="cpu", amp="off")
    assert engine.rater.calibration == Calibration.from_json(data, "")


def test_training_ends_by_calibrating_or_saying_why_not(tiny_run: Path) -> None:
    """The tiny run writes nothing yet (every validation translation empty): no words to fit, which the
    log says, and the run ends well all the same."""
    log = (tiny_run / "train.log").read_text(encoding="utf-8")
    assert "confidence not calibrated: the held-out translations have no words" in log
    assert not (tiny_run / CALIBRATION_FILE).exists() and (tiny_run / "result.json").is_file()


# -- thresholds ------------------------------------------------------------------------------------------
def test_the_threshold_marks_or_withholds_below_it_only() -> None:
    assert verdict(0.4, 0.5, "mark") == "mark" and verdict(0.4, 0.5, "withhold") == "withhold"
    assert verdict(0.5, 0.5, "withhold") is None and verdict(0.4, None, "mark") is None
    assert verdict(None, 0.5, "withhold") is None


# -- the report ------------------------------------------------------------------------------------------
def _ranks(values: list[float]) -> list[float]:
    """Average 1-based ranks, by counting: the values below, and half of the ties (itself included)."""
    return [sum(v < x for v in values) + (sum(v == x for v in values) + 1) / 2 for x in values]


def _pearson(a: list[float], b: list[float]) -> float:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


def _tensor(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_spearman_is_the_rank_correlation_computed_directly() -> None:
    x, y = [0.3, 0.9, 0.1, 0.5, 0.7], [20.0, 80.0, 35.0, 60.0, 50.0]  # no ties: the textbook formula
    d = [a - b for a, b in zip(_ranks(x), _ranks(y))]
    textbook = 1 - 6 * sum(v * v for v in d) / (len(x) * (len(x) ** 2 - 1))
    got = confidence_report.spearman(_tensor(x), _tensor(y))
    assert float(got) == pytest.approx(textbook, abs=1e-12)
    x, y = [0.3, 0.3, 0.1, 0.5, 0.5, 0.8], [100.0, 100.0, 35.0, 100.0, 50.0, 80.0]  # ties on both sides
    got = confidence_report.spearman(_tensor(x), _tensor(y))
    assert float(got) == pytest.approx(_pearson(_ranks(x), _ranks(y)), abs=1e-12)


def test_the_bootstrap_interval_is_the_quantiles_of_resampled_correlations() -> None:
    rng = random.Random(3)
    x = [rng.random() for _ in range(30)]
    y = [round(v * 50 + rng.random() * 40) for v in x]  # tied chrF values, as short sentences give
    tx, ty = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    low, high = confidence_report.bootstrap_interval(tx, ty, 200, seed=5)
    drawn = torch.randint(0, 30, (200, 30), generator=torch.Generator().manual_seed(5)).tolist()
    values = sorted(_pearson(_ranks([x[i] for i in row]), _ranks([y[i] for i in row])) for row in drawn)
    point = _pearson(_ranks(x), _ranks(y))
    direct = torch.quantile(torch.tensor(values, dtype=torch.float64), torch.tensor([0.025, 0.975],
                                                                                     dtype=torch.float64))
    assert (low, high) == pytest.approx(direct.tolist(), abs=1e-9)
    assert low < point < high
    assert confidence_report.bootstrap_interval(tx, ty, 200, seed=5) == (low, high)  # seeded


def test_the_most_confident_share_and_the_report() -> None:
    assert confidence_report.most_confident([0.2, 0.9, 0.5, 0.9, 0.1], 0.5) == [1, 2, 3]
    references = ["il dort .", "j'ai froid .", "où est la gare ?", "tom lit un livre ."]
    texts = ["il dort .", "j'ai chaud .", "où est la gare ?", "un chat ."]
    found = [Translation(t, 0.0, confidence=c, word_confidences=[(w, c) for w in t.split()])
             for t, c in zip(texts, [0.9, 0.4, 0.8, 0.1])]
    section = confidence_report.report(found, references, seed=1, calibrated=True)
    import sacrebleu

    chrf = [sacrebleu.sentence_chrf(t, [r]).score for t, r in zip(texts, references)]
    assert chrf[0] == chrf[2] == 100.0 and chrf[3] < chrf[1] < 100.0
    assert section["spearman_chrf"] == pytest.approx(_pearson(_ranks([0.9, 0.4, 0.8, 0.1]), _ranks(chrf)))
    assert section["bleu_most_confident"]["50%"] == pytest.approx(100.0)  # the two exact ones
    assert section["words_in_reference"] == pytest.approx(12 / 14)  # chaud and chat are not
    assert "Spearman with sentence chrF 0.949" in "\n".join(confidence_report.lines(section))


# -- the commands ----------------------------------------------------------------------------------------
LINES = ["He is sleeping.", "", "I am cold.", "Where is the station?"]


def test_translate_writes_json_lines_with_the_tsv_score_beside(fitted: Path, raw_engine: Translator,
                                                               tmp_path: Path, run_cli_here) -> None:
    given = tmp_path / "in.txt"
    given.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    common = ["translate", f"checkpoint={fitted}", "device=cpu", "device.amp=off", f"input={given}"]
    plain = run_cli_here(*common, "scores=true")
    rows = run_cli_here(*common, "output_format=jsonl")
    assert plain.returncode == 0 and rows.returncode == 0, rows.stderr
    objects = [json.loads(line) for line in rows.stdout.splitlines()]
    expected = [n[0] for n in raw_engine.translate_nbest(LINES)]
    assert len(objects) == len(LINES) and sum(bool(t.text) for t in expected) == 3
    for obj, line, t in zip(objects, plain.stdout.splitlines(), expected, strict=True):
        score, text = line.split("\t")
        assert obj["text"] == text == t.text and obj["score"] == pytest.approx(float(score), abs=1e-4)
        assert set(obj) == {"text", "score", "confidence", "words"}
        if t.confidence is None:  # the empty line
            assert obj["confidence"] is None and obj["words"] is None
            continue
        assert obj["confidence"] == pytest.approx(t.confidence, abs=1e-4)
        assert [w for w, _ in obj["words"]] == text.split()
        assert [c for _, c in obj["words"]] == pytest.approx([c for _, c in t.word_confidences], abs=1e-4)
    # an uncalibrated model: said once in the log, with the command that calibrates it; text output shows
    # no confidence and computes none
    assert rows.stderr.count("confidences are uncalibrated") == 1 and "uncalibrated" not in plain.stderr
    how = f"transformer-mt evaluate checkpoint={fitted / 'best.pt'} split=valid calibrate=true"
    assert how in rows.stderr


def _threshold(found: list[Translation]) -> tuple[float, list[bool]]:
    """A threshold that only the least confident translation is below, and which ones are."""
    rated = sorted(t.confidence for t in found if t.confidence is not None)
    threshold = (rated[0] + rated[1]) / 2
    return threshold, [t.confidence is not None and t.confidence < threshold for t in found]


@pytest.mark.parametrize("output_format", ["text", "jsonl"])
def test_a_threshold_marks_or_withholds_what_is_below_it(output_format: str, fitted: Path,
                                                         raw_engine: Translator, tmp_path: Path,
                                                         run_cli_here) -> None:
    given = tmp_path / "in.txt"
    given.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    found = [n[0] for n in raw_engine.translate_nbest(LINES)]
    threshold, low = _threshold(found)
    common = ["translate", f"checkpoint={fitted}", "device=cpu", "device.amp=off", f"input={given}",
              f"output_format={output_format}", f"decoding.min_confidence={threshold}"]
    for action in ("mark", "withhold"):
        done = run_cli_here(*common, f"decoding.low_confidence={action}")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert f"1 of 4 translations below decoding.min_confidence={threshold:g}" in done.stderr
        for line, t, is_low in zip(lines, found, low, strict=True):
            if output_format == "text":
                assert line == ("" if is_low and action == "withhold" else t.text)
                continue
            obj = json.loads(line)
            assert obj["low_confidence"] == is_low
            assert obj.get("withheld", False) == (is_low and action == "withhold")
            assert obj["text"] == ("" if obj.get("withheld") else t.text)
            if obj.get("withheld"):
                assert obj["words"] == [] and obj["confidence"] == pytest.approx(t.confidence, abs=1e-4)


@pytest.mark.parametrize("override, says", [
    ("decoding.min_confidence=1.5",
     "decoding.min_confidence=1.5 is out of range; it must be in [0, 1] or null"),
    ("decoding.min_confidence=-0.1", "decoding.min_confidence=-0.1 is out of range"),
    ("decoding.low_confidence=hide",
     "decoding.low_confidence='hide' is not allowed; choose one of: mark, withhold"),
    ("output_format=json", "output_format='json' is not allowed; choose one of: text, jsonl"),
    ("decoding.confidence=false decoding.min_confidence=0.5",
     "decoding.min_confidence=0.5 needs decoding.confidence=true"),
])
def test_a_bad_threshold_is_one_line(override: str, says: str, fitted: Path, run_cli_here) -> None:
    done = run_cli_here("translate", f"checkpoint={fitted}", "device=cpu", *override.split(),
                        "text=I am cold.")
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_evaluate_reports_confidence_and_calibrates_on_the_validation_split(
        fitted: Path, raw_engine: Translator, tmp_path: Path, run_cli_here) -> None:
    import shutil

    run = Path(shutil.copytree(fitted, tmp_path / "run"))
    out = tmp_path / "eval"
    test_split = run_cli_here("evaluate", f"checkpoint={run}", "device=cpu", "calibrate=true")
    assert test_split.returncode == 2 and "use split=valid" in test_split.stderr
    pair = run_cli_here("evaluate", f"checkpoint={run},{run}", "split=valid", "calibrate=true")
    assert pair.returncode == 2 and "give one checkpoint, not an ensemble" in pair.stderr
    done = run_cli_here("evaluate", f"checkpoint={run}", "device=cpu", "device.amp=off", "split=valid",
                        "calibrate=true", f"output_dir={out}")
    assert done.returncode == 0, done.stderr
    assert "Spearman with sentence chrF" in done.stdout and "BLEU of the most confident 50%" in done.stdout
    report = json.loads(next(out.glob("valid.*.json")).read_text(encoding="utf-8"))
    section = report["confidence"]
    assert section["calibrated"] and section["sentences"] == 80
    assert set(section["bleu_most_confident"]) == {"50%", "80%", "90%"}
    low, high = section["spearman_interval"]
    assert low <= section["spearman_chrf"] <= high
    calibration = json.loads((run / CALIBRATION_FILE).read_text(encoding="utf-8"))
    assert calibration["held_out"] == "valid" and calibration["sentences"] == 80
    assert calibration["search"] == "beam5"
    # fitted on these very translations, each curve gets their mean right (the fit of a mean) ...
    assert section["mean_confidence"] == pytest.approx(section["mean_chrf"], abs=1e-3)
    # ... and each translation is rated once through it (a source given twice is one translation object)
    curves = Calibration.from_json(calibration, "")
    raw = [n[0].confidence for n in raw_engine.translate_nbest(held_out(fitted, 80)[0])]
    expected = sum(curves.sentence(math.log(c)) for c in raw) / len(raw)
    assert section["mean_confidence"] == pytest.approx(expected, abs=1e-6)
    assert section["mean_word_confidence"] == pytest.approx(section["words_in_reference"], abs=1e-3)
    # the test split, with the calibration now there: the same report, calibrated out of sample
    tested = run_cli_here("evaluate", f"checkpoint={run}", "device=cpu", f"output_dir={out}")
    assert tested.returncode == 0 and "confidence (calibrated)" in tested.stdout, tested.stderr


def test_the_server_answers_confidences_and_marks_or_withholds(fitted: Path, raw_engine: Translator) -> None:
    require("fastapi")
    from fastapi.testclient import TestClient

    import transformer_mt as tmt
    from transformer_mt.serve.app import create_app

    def config(*overrides: str):
        return tmt.compose("serve", [f"checkpoint={fitted}", "device=cpu", "allowed_hosts=[testserver]",
                                     *overrides])

    expected = [n[0] for n in raw_engine.translate_nbest(LINES)]
    with TestClient(create_app(raw_engine, config())) as c:
        body = c.post("/translate", json={"text": LINES}).json()
        health = c.get("/health").json()["confidence"]
    assert health == {"on": True, "calibrated": False, "min_confidence": None}
    assert "low_confidence" not in body and "withheld" not in body
    for value, words, t in zip(body["confidence"], body["words"], expected, strict=True):
        if t.confidence is None:  # the empty text
            assert value is None and words is None
            continue
        assert value == pytest.approx(t.confidence, abs=1e-4)
        assert [w for w, _ in words] == t.text.split()
        assert [c for _, c in words] == pytest.approx([c for _, c in t.word_confidences], abs=1e-4)
    threshold, low = _threshold(expected)
    for action in ("mark", "withhold"):
        cfg = config(f"decoding.min_confidence={threshold}", f"decoding.low_confidence={action}")
        strict = Translator.from_checkpoint(fitted, device="cpu", decoding=cfg.decoding, amp="off")
        with TestClient(create_app(strict, cfg)) as c:
            answer = c.post("/translate", json={"text": LINES, "scores": True}).json()
            assert c.get("/metrics").json()["low_confidence"] == 1
        assert answer["low_confidence"] == low
        kept = [not (is_low and action == "withhold") for is_low in low]
        assert answer["translations"] == [t.text if k else "" for t, k in zip(expected, kept)]
        if action == "mark":
            assert "withheld" not in answer
            continue
        assert answer["withheld"] == [not k for k in kept]
        gone = kept.index(False)
        assert answer["words"][gone] == [] and [h["text"] for h in answer["nbest"][gone]] == [""]
        assert answer["confidence"][gone] == pytest.approx(expected[gone].confidence, abs=1e-4)
