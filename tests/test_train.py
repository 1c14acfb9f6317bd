"""End to end on real Tatoeba pairs: the tiny model trained as a user would (`tiny_run`, conftest.py),
resumed, evaluated and translated with (in this process, through the same jobs)."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import pytest

import transformer_mt as tmt
from tests.conftest import require, run_cli, tiny_overrides
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import CheckpointError, DataError
from transformer_mt.decoding.translator import Translator


def _scalars(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_training_writes_a_complete_run(tiny_run: Path) -> None:
    for name in ("epoch_001.pt", "epoch_002.pt", "best.pt", "latest.pt", "tokenizer.json",
                 "split/valid.tsv", "split/test.tsv", ".hydra/config.yaml", "metrics.jsonl"):
        assert (tiny_run / name).exists(), name
    scalars = _scalars(tiny_run)
    for tag in ("valid/bleu", "valid/chrf", "valid/cer", "valid/wer", "valid/loss", "train/loss",
                "train/lr", "train/grad_norm", "train/tgt_tokens_per_s"):
        assert tag in scalars, tag
    assert len(scalars["valid/bleu"]) == 2
    losses = scalars["train/loss"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, "training loss did not fall"
    epochs = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2]


def test_checkpoint_describes_itself(tiny_run: Path) -> None:
    state = load_checkpoint(tiny_run / "latest.pt")
    assert state["epoch"] == 2 and state["batch_in_epoch"] == 0 and state["step"] > 0
    assert state["model_config"]["d_model"] == 64
    assert state["config"]["training"]["epochs"] == 2
    for key in ("optimizer", "scheduler", "scaler", "rng", "tokenizer", "best"):
        assert key in state


def test_a_checkpoint_lists_the_words_of_its_training_pairs_and_not_those_held_out(tiny_run: Path) -> None:
    from transformer_mt.checkpoints.store import word_list
    from transformer_mt.data import load_split_tsv
    from transformer_mt.data.words import words_of

    known = word_list(load_checkpoint(tiny_run / "latest.pt"))
    assert known is not None and {"tom", "the"} <= known
    sources, targets = load_split_tsv(tiny_run / "split" / "valid.tsv")
    held_out = set().union(*(words_of(t) for t in sources + targets))
    assert held_out - known, "every held-out word is also a training word: nothing tells them apart"
    assert Translator.from_checkpoint(tiny_run, device="cpu").known_words == known


def test_resume_continues_with_the_same_schedule(tiny_run_copy: Path, corpus: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    before = load_checkpoint(tiny_run_copy / "latest.pt")
    with caplog.at_level("INFO"):
        tmt.train([f"resume={tiny_run_copy}", "training.epochs=3"])
    assert "resumed at epoch 3" in caplog.text
    assert "resumed at epoch 3" in (tiny_run_copy / "train.log").read_text()  # the API logs as the CLI does
    after = load_checkpoint(tiny_run_copy / "latest.pt")
    assert after["epoch"] == 3
    assert after["step"] > before["step"]
    assert after["scheduler"]["last_epoch"] == after["step"]  # the schedule went on, not restarted
    assert after["words"] == before["words"]  # carried, not read from the corpora again
    assert (tiny_run_copy / "epoch_003.pt").exists()


def test_evaluate_reports_all_metrics(tiny_run_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmt.evaluate([f"checkpoint={tiny_run_copy}", "decoding.beam_size=2", "max_sentences=20", "device=cpu"])
    out = capsys.readouterr().out
    assert "BLEU" in out and "nrefs:1|case:mixed" in out
    reports = list((tiny_run_copy / "eval").glob("test.*.beam2.json"))
    report = json.loads(reports[0].read_text())
    for key in ("bleu", "chrf", "cer", "wer", "sentences_per_s", "tokens_per_s"):
        assert key in report


def test_a_translation_holding_a_line_break_stays_on_its_line(tiny_run_copy: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The hypothesis file has one line per test sentence, whatever the model writes (a byte-level model can
    write a line break): scores and files read back line by line stay aligned."""
    from transformer_mt.decoding.text_translator import Translation
    from transformer_mt.jobs import evaluate as job

    broken = [Translation(f"a\nb\rc{i}", 0.0) for i in range(5)]
    monkeypatch.setattr(job, "_translated", lambda engine, sources: (broken[:len(sources)], 1.0, 0.0))
    tmt.evaluate([f"checkpoint={tiny_run_copy}", "max_sentences=5", "device=cpu"])
    written = next((tiny_run_copy / "eval").glob("test.*.hyp.txt")).read_text(encoding="utf-8")
    assert written.split("\n") == [f"a b c{i}" for i in range(5)] + [""]


@pytest.mark.parametrize("given", ["split", "files", "tsv"])
def test_evaluate_prints_and_records_sacrebleus_scores(given: str, tiny_run_copy: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """BLEU and chrF, as evaluate prints and records them, are sacrebleu's on the hypotheses it wrote and
    the references given: a split of the run (split=), two files (src_file=, ref_file=), one TSV."""
    import sacrebleu

    rows = (tiny_run_copy / "split" / "valid.tsv").read_text(encoding="utf-8").splitlines()[:20]
    sources, references = zip(*(row.split("\t") for row in rows))
    given_as = {"split": ["split=valid", "max_sentences=20"],
                "files": [f"src_file={tmp_path / 'held.en'}", f"ref_file={tmp_path / 'held.fr'}"],
                "tsv": [f"tsv_file={tmp_path / 'held.tsv'}"]}
    (tmp_path / "held.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "held.fr").write_text("\n".join(references) + "\n", encoding="utf-8")
    (tmp_path / "held.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    # Sampled: this barely trained model's search ends at once, and empty translations score 0 whatever
    # the references are.
    tmt.evaluate([f"checkpoint={tiny_run_copy}", *given_as[given], "decoding.sampling=true",
                  "decoding.top_k=10", "device=cpu", f"output_dir={tmp_path / 'eval'}"])
    [written] = (tmp_path / "eval").glob(f"{'valid' if given == 'split' else 'held'}.*.sampling.hyp.txt")
    hypotheses = written.read_text(encoding="utf-8").split("\n")[:-1]  # one a line
    assert len(hypotheses) == 20
    bleu = sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
    chrf = sacrebleu.corpus_chrf(hypotheses, [list(references)]).score
    report = json.loads(written.with_name(written.name.replace(".hyp.txt", ".json")).read_text())
    assert (report["bleu"], report["chrf"]) == (pytest.approx(bleu), pytest.approx(chrf)) and chrf > 0
    assert f"(20 sentences, sampling): BLEU {bleu:.2f}  chrF {chrf:.2f}" in capsys.readouterr().out


def _stdin(monkeypatch: pytest.MonkeyPatch, text: bytes) -> None:
    """A pipe on stdin (not a terminal), as in `echo ... | transformer-mt translate`."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text), encoding="utf-8"))


def test_translate_keeps_lines_aligned(tiny_run: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _stdin(monkeypatch, b"He is sleeping.\n\nI am cold, \"really\" = yes.\n")
    tmt.translate([f"checkpoint={tiny_run}", "device=cpu"])
    out = capsys.readouterr().out.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""


def test_translate_text_argument_is_verbatim(tiny_run: Path, run_cli_here) -> None:
    result = run_cli_here("translate", f"checkpoint={tiny_run}", "text=Hi, it's me = \"Tom\"!",
                          "decoding.n_best=2", "decoding.beam_size=2", "scores=true")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = result.stdout.strip("\n").split("\n")
    assert len(rows) == 2 and rows[0].startswith("1\t") and rows[1].startswith("2\t")


def test_translate_rejects_non_utf8(tiny_run: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Ça va?\n".encode("latin-1"))
    for source in ([f"input={bad}"], []):  # a file, then stdin
        _stdin(monkeypatch, "Ça va?\n".encode("latin-1"))
        with pytest.raises(DataError, match="line 1 is not valid UTF-8") as info:
            tmt.translate([f"checkpoint={tiny_run}", *source])
        assert "\n" not in str(info.value)


def test_translate_closes_its_input_file(tiny_run: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "in.txt"
    src.write_text("Hello.\nGoodbye.\n", encoding="utf-8")
    opened = []
    real_open = Path.open

    def spy(self: Path, *args: object, **kwargs: object):  # noqa: ANN202 - a file object
        handle = real_open(self, *args, **kwargs)
        if self == src:
            opened.append(handle)
        return handle

    monkeypatch.setattr(Path, "open", spy)
    tmt.translate([f"checkpoint={tiny_run}", f"input={src}", f"output={tmp_path / 'out.txt'}"])
    assert len(opened) == 1 and opened[0].closed


def test_translate_file_to_file_and_long_input(tiny_run: Path, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "in.txt"
    src.write_text("Hello.\n" + "very " * 400 + "long\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    caplog.set_level(logging.INFO)
    tmt.translate([f"checkpoint={tiny_run}", f"input={src}", f"output={out}", "decoding.beam_size=1"])
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert "1 cut into parts" in caplog.text  # too long for the model: translated in parts, none cut off
    assert "were cut" not in caplog.text


def test_attention_heatmap_png(tiny_run: Path, tmp_path: Path) -> None:
    require("matplotlib")
    png = tmp_path / "attention.png"
    cfg = tmt.compose("translate", [f"checkpoint={tiny_run}", f"attention_png={png}"])
    cfg.text = "I am cold."
    tmt.translate(cfg)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validation_logs_an_attention_image(tiny_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tiny_run / "tensorboard"))
    acc.Reload()
    assert "valid/cross_attention" in acc.Tags()["images"]


def test_python_api(tiny_run: Path) -> None:
    from transformer_mt import Translator  # the documented import

    engine = Translator.from_checkpoint(tiny_run, device="cpu")
    single = engine.predict("He is sleeping.")
    assert isinstance(single, str)
    batch = engine.translate(["He is sleeping.", "", "I am cold."], beam_size=3)
    assert len(batch) == 3 and batch[1] == ""
    assert engine.translate(["He is sleeping.", "I am cold."])[0] == single  # batching changes nothing
    nbest = engine.translate_nbest(["I am cold."], beam_size=4, n_best=3)[0]
    assert len(nbest) == 3
    assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)


def test_corrupt_and_mismatched_checkpoints(tiny_run: Path, tmp_path: Path, run_cli_here) -> None:
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((tiny_run / "best.pt").read_bytes()[:5000])
    result = run_cli_here("translate", f"checkpoint={truncated}", "text=Hello")
    assert result.returncode == 2 and "corrupt or truncated" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        tmt.evaluate([f"checkpoint={truncated}"])


def test_opus_books_trains_offline_from_a_fixture(tmp_path: Path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "opus_books_en_fr.jsonl"
    run_dir = tmp_path / "opus"
    tmt.train(["dataset=opus_books", "dataset.hf_path=json", f"dataset.hf_data_files={fixture}",
               f"dataset.cache_dir={tmp_path / 'cache'}", "model=tiny", "device=cpu", "tokenizer=char",
               "training.epochs=1", "training.progress=false", f"checkpoint.dir={run_dir}"])
    assert (run_dir / "epoch_001.pt").exists() and (run_dir / "split" / "test.tsv").exists()


@pytest.mark.slow
def test_compiled_training_writes_plain_checkpoints(tmp_path: Path, corpus: Path) -> None:
    """device.compile=true trains through torch.compile; checkpoints hold the plain model's keys."""
    run_dir = tmp_path / "compiled"
    result = run_cli("train", *tiny_overrides(corpus, run_dir, **{"device.compile": "true",
                                                                   "training.epochs": 1}),
                     timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir / "epoch_001.pt")
    assert not any(key.startswith("_orig_mod.") for key in state["model"])
    translated = run_cli("translate", f"checkpoint={run_dir}", "text=Hello.")
    assert translated.returncode == 0, translated.stderr[-3000:]
