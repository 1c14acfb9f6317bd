"""Distillation (`distill.teacher=`): the teacher's translations, chunked and resumable, as a student's
targets; the student keeps the teacher's tokenizer and held-out pairs; bad settings refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_mt as tmt
from tests.conftest import as_teacher, run_cli, start_cli, tiny_overrides, wait_for_log
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import DecodingConfig
from transformer_mt.data import EncodedSplit, PreparedData, Ragged, load_split_tsv
from transformer_mt.decoding.translator import Translator
from transformer_mt.training import distill
from transformer_mt.training.distill import Teacher, translate_sources

BEAM = DecodingConfig(beam_size=5, confidence=False, batch_tokens=300)


@pytest.fixture(scope="module")
def teacher(fitted_model, tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model that writes real words, as a run with tiny_run's split (the students read the real corpus)."""
    return as_teacher(fitted_model("marian", tmp_path_factory.mktemp("distill") / "teacher"), tiny_run)


@pytest.fixture(scope="module")
def engine(teacher: Path) -> Translator:
    return Translator.from_checkpoint(teacher, device="cpu", amp="off")


@pytest.fixture(scope="module")
def student(teacher: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A student of another shape (one decoder layer) distilled from the teacher, one epoch."""
    run_dir = tmp_path_factory.mktemp("distill") / "student"
    tmt.train(tiny_overrides(corpus, run_dir, **{"dataset.path": corpus, "training.epochs": 1,
                                                 "distill.teacher": teacher, "distill.chunk_pairs": 64,
                                                 "device.amp": "off", "model.decoder_layers": 1}))
    return run_dir


def _sources(engine: Translator, tiny_run: Path, n: int) -> tuple[list[str], Ragged]:
    texts = load_split_tsv(tiny_run / "split" / "valid.tsv")[0][:n]
    return texts, Ragged.from_lists(engine.encode(texts))


def test_chunked_translations_are_the_teachers_one_by_one(engine: Translator, teacher: Path, tiny_run: Path,
                                                          tmp_path: Path) -> None:
    """What the chunks hold is, sentence by sentence, what the teacher's translator writes for the text
    alone (another path: text in, one sentence a call) with the same beam."""
    texts, sources = _sources(engine, tiny_run, 40)
    outputs, report = translate_sources(Teacher([teacher / "best.pt"], engine), sources, BEAM, tmp_path, 16,
                                        progress=False)
    assert report["chunks"] == 3 and report["translated"] == 40 and report["chunks_cached"] == 0
    written = engine.vocab.decode_tgt(outputs.tolist())
    assert sum(bool(w) for w in written) >= 30  # real translations, not empty ones
    assert written == [engine.translate(text, beam_size=5) for text in texts]


def test_a_killed_translation_resumes_without_translating_a_chunk_twice(
        engine: Translator, teacher: Path, tiny_run: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped in its third chunk (as by kill -9: the chunk being translated is lost, the finished ones are
    on disk), the translation goes on from there: every source is translated once, and the result is the
    uninterrupted one's."""
    _, sources = _sources(engine, tiny_run, 50)
    whole, _ = translate_sources(Teacher([teacher], engine), sources, BEAM, tmp_path / "whole", 16, False)
    real, decoded = distill.decode_ids, []

    def dies_in_third_chunk(model, ids, *args, **kwargs):
        decoded.append(len(ids))
        if len(decoded) == 3:
            raise KeyboardInterrupt
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(distill, "decode_ids", dies_in_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        translate_sources(Teacher([teacher], engine), sources, BEAM, tmp_path / "killed", 16, False)
    saved = sorted(p.name for p in (tmp_path / "killed").glob("chunk_*"))
    assert saved == ["chunk_000000.npz", "chunk_000001.npz"]
    decoded.clear()
    monkeypatch.setattr(distill, "decode_ids", lambda model, ids, *a, **k: decoded.append(len(ids)) or real(
        model, ids, *a, **k))
    again, report = translate_sources(Teacher([teacher], engine), sources, BEAM, tmp_path / "killed", 16,
                                      False)
    assert decoded == [16, 2] and report["chunks_cached"] == 2  # chunks 2 and 3 only
    assert again.tolist() == whole.tolist()


def _prepared(src: list[list[int]], tgt: list[list[int]]) -> PreparedData:
    empty = EncodedSplit(Ragged.from_lists([]), Ragged.from_lists([]))
    train = EncodedSplit(Ragged.from_lists(src), Ragged.from_lists(tgt))
    return PreparedData(None, train, empty, empty, {}, {})  # type: ignore[arg-type]


def test_targets_are_the_teachers_within_the_length_limits() -> None:
    """A pair takes the teacher's target unless it has none within min_len..max_len (an empty one, a
    long one, a source too long for the teacher); with original_weight, the originals are a corpus more."""
    data = _prepared([[5], [6], [7], [8]], [[10], [11], [12], [13]])
    outputs = Ragged.from_lists([[20, 21], [], [22, 23, 24, 25], [26]])
    out, kept = distill._with_targets(data, outputs, min_len=1, max_len=3, original_weight=0.0, seed=1)
    assert kept == 2 and out.mixture is None
    assert out.train.tgt_ids.tolist() == [[20, 21], [11], [12], [26]]
    assert out.train.src_ids.tolist() == [[5], [6], [7], [8]]
    both, _ = distill._with_targets(data, outputs, 1, 3, original_weight=0.5, seed=1)
    assert both.train.tgt_ids.tolist() == [[20, 21], [11], [12], [26], [10], [11], [12], [13]]
    assert [(p.start, p.stop, p.weight) for p in both.mixture.parts] == [(0, 4, 1.0), (4, 8, 0.5)]
    rows = both.mixture.rows(epoch=1)
    assert sorted(rows[:4]) == [0, 1, 2, 3] and len(rows) == 6 and all(r >= 4 for r in rows[4:])


def test_original_targets_take_their_corpus_variants_tag_and_weight() -> None:
    """With original_weight, each corpus's original pairs are a part of that corpus: the dataset's input
    variants, a mixed corpus's own tag and variants, its weight times original_weight."""
    from transformer_mt.config import DatasetConfig, MixedCorpus, VariantsConfig
    from transformer_mt.data.mixture import Mixture, Part
    from transformer_mt.data.variants import corpus_variants

    data = _prepared([[5], [6], [7], [8]], [[10], [11], [12], [13]])
    data = dataclasses.replace(data, mixture=Mixture((Part("a", 0, 3, 1.0), Part("b", 3, 4, 2.0)), seed=1))
    outputs = Ragged.from_lists([[20], [21], [22], [23]])
    both, _ = distill._with_targets(data, outputs, 1, 3, original_weight=0.5, seed=1)
    parts = [(p.start, p.stop, p.weight) for p in both.mixture.parts]
    assert parts == [(0, 3, 1.0), (3, 4, 2.0), (4, 7, 0.5), (7, 8, 1.0)]
    assert both.mixture.corpora() == [0, 1, 0, 1]
    own, mixed = VariantsConfig(typos=0.5), VariantsConfig(caps=0.2)
    cfg = DatasetConfig(variants=own, mix=[MixedCorpus(path="b.tsv", tag="<b>", variants=mixed)])
    got = [(c.start, c.stop, c.variants, c.tag) for c in corpus_variants(cfg, both.mixture, 8)]
    assert got == [(0, 3, own, None), (3, 4, mixed, "<b>"), (4, 7, own, None), (7, 8, mixed, "<b>")]


def test_the_student_trains_on_its_teachers_tokenizer_and_targets(student: Path, teacher: Path,
                                                                   engine: Translator) -> None:
    """The student's tokenizer is the teacher's (not trained on its corpus); its summary says what the
    teacher did; the translations in the cache decode to the teacher's for the student's sources."""
    state, teacher_state = load_checkpoint(student / "best.pt"), load_checkpoint(teacher / "best.pt")
    assert state["tokenizer"] == teacher_state["tokenizer"]
    assert state["model_config"]["decoder_layers"] == 1
    summary = json.loads((student / "split" / "train_summary.json").read_text())
    report = summary["distillation"]
    assert report["translated"] == summary["counts"]["train"] > 64 and report["chunks_cached"] == 0
    assert report["chunks"] == math.ceil(report["translated"] / 64)
    assert report["teacher"] == [str(teacher / "best.pt")]
    chunks = sorted(Path(report["cache"]).glob("chunk_*.npz"))
    assert len(chunks) == report["chunks"]
    assert [len(np.load(c)["offsets"]) - 1 for c in chunks] == [64] * (len(chunks) - 1) + [
        report["translated"] - 64 * (len(chunks) - 1)]


def test_a_second_student_reads_the_cache(student: Path, teacher: Path, corpus: Path, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """Another student of the same teacher and corpus (another seed) translates nothing."""
    with caplog.at_level("INFO"):
        tmt.train(tiny_overrides(corpus, tmp_path / "again", **{
            "dataset.path": corpus, "training.epochs": 1, "distill.teacher": teacher,
            "distill.chunk_pairs": 64, "device.amp": "off", "seed": 2, "training.calibration_sentences": 0}))
    report = json.loads((tmp_path / "again" / "split" / "train_summary.json").read_text())["distillation"]
    assert report["translated"] == 0 and report["chunks_cached"] == report["chunks"]
    assert "the teacher translated" not in caplog.text


@pytest.mark.parametrize(("extra", "message"), [
    ({"dataset.split_seed": 2}, "differs from the teacher's"),
    ({"dataset.src_lang": "fr", "dataset.tgt_lang": "en"}, "this run is fr->en"),
    ({"tokenizer.vocab_size": 600}, "tokenizer.vocab_size=600 contradicts the teacher's 500"),
    ({"tokenizer": "char"}, "a student keeps its teacher's tokenizer"),
    ({"distill.original_weight": -1}, "distill.original_weight"),
])
def test_bad_distillation_settings_are_one_line(teacher: Path, corpus: Path, tmp_path: Path, run_cli_here,
                                                extra: dict, message: str) -> None:
    result = run_cli_here("train", *tiny_overrides(corpus, tmp_path / "run", **{
        "dataset.path": corpus, "training.epochs": 1, "distill.teacher": teacher, **extra}))
    assert result.returncode != 0 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_teacher_weights_decide_the_cache(engine: Translator, teacher: Path, tiny_run: Path,
                                         tmp_path: Path) -> None:
    """Another teacher (one weight changed, or its linear layers in int8), another search or other sources
    give another cache directory; the float teacher's key holds the search's fields of when the key was
    defined alone (no `quantize`: precision says int8; a later field only where it is not at its default),
    so the translations made before those options existed are still found."""
    from transformer_mt.config import DatasetConfig, TrainConfig

    cfg = TrainConfig(dataset=DatasetConfig(cache_dir=str(tmp_path)))
    _, sources = _sources(engine, tiny_run, 8)
    first = distill.chunk_directory(cfg, Teacher([teacher], engine), sources, BEAM)
    assert distill.chunk_directory(cfg, Teacher([teacher], engine), sources, BEAM) == first
    assert distill.chunk_directory(cfg, Teacher([teacher], engine), sources[:7], BEAM) != first
    assert distill.chunk_directory(cfg, Teacher([teacher], engine), sources,
                                   dataclasses.replace(BEAM, beam_size=4)) != first
    int8 = Translator.from_checkpoint(teacher, device="cpu", decoding=DecodingConfig(quantize="int8"))
    assert distill.chunk_directory(cfg, Teacher([teacher], int8), sources, BEAM) != first
    keyed = json.loads((first / "key.json").read_text())["search"]
    assert "quantize" not in keyed and set(keyed) == set(distill.KEYED_SEARCH)  # no field added since
    assert distill.chunk_directory(cfg, Teacher([teacher], engine), sources,
                                   dataclasses.replace(BEAM, shortlist=True)) != first
    with torch.no_grad():
        bias = next(p for n, p in engine.model.named_parameters() if n.endswith("bias"))
        bias += 1.0
        try:
            assert distill.chunk_directory(cfg, Teacher([teacher], engine), sources, BEAM) != first
        finally:
            bias -= 1.0


# Two processes and a whole chunked translation: under `slow` (CI runs it); the chunks' resumption runs in
# the quick suite in this process (test_a_killed_translation_resumes_without_translating_a_chunk_twice).
@pytest.mark.slow
def test_kill_9_while_the_teacher_translates_then_again(teacher: Path, student: Path, corpus: Path,
                                                         tmp_path: Path) -> None:
    """As a user would: a run killed (SIGKILL) while its teacher translates, started again with the same
    command, translates only the chunks the killed one had not saved, and its training targets are the
    uninterrupted student's."""
    cache = tmp_path / "cache"
    overrides = tiny_overrides(corpus, tmp_path / "run", **{
        "dataset.path": corpus, "dataset.cache_dir": cache, "training.epochs": 1, "distill.teacher": teacher,
        "distill.chunk_pairs": 8, "device.amp": "off", "training.calibration_sentences": 0})
    log_file = tmp_path / "first.log"
    proc = start_cli(["train", *overrides], log_file)
    wait_for_log(log_file, "chunk 3 of", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    [folder] = (cache / "distilled").iterdir()
    saved = len(list(folder.glob("chunk_*.npz")))
    assert 3 <= saved < 60, "the teacher finished before it was killed"
    assert not list(folder.glob(".*")), "a chunk half written was left behind"
    result = run_cli("train", *overrides, "checkpoint.overwrite=true")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "split" / "train_summary.json").read_text())["distillation"]
    uninterrupted = json.loads((student / "split" / "train_summary.json").read_text())["distillation"]
    pairs = uninterrupted["translated"]  # the training sources
    assert report["chunks"] == math.ceil(pairs / 8) and report["chunks_cached"] == saved
    assert report["translated"] == pairs - 8 * saved  # none twice (the last chunk, unsaved, may be short)
    again = [distill._load_chunk(p) for p in sorted(folder.glob("chunk_*.npz"))]
    whole = [distill._load_chunk(p) for p in sorted(Path(uninterrupted["cache"]).glob("chunk_*.npz"))]
    assert Ragged.concat(again).tolist() == Ragged.concat(whole).tolist()


def test_an_ensemble_of_teachers_is_one_value_on_the_command_line(teacher: Path, corpus: Path, tmp_path: Path,
                                                                   run_cli_here) -> None:
    """`distill.teacher=a,b` is an ensemble of two teachers, as `checkpoint=a,b` is for translate, not a
    sweep of two runs (which Hydra would make of the commas)."""
    overrides = tiny_overrides(corpus, tmp_path / "run", **{"distill.teacher": f"{teacher},{teacher}"})
    result = run_cli_here("train", *overrides, "--cfg", "job")
    assert result.returncode == 0, result.stderr
    assert f"teacher: {teacher},{teacher}\n" in result.stdout
