"""Every script in scripts/ runs on tiny inputs and writes what it promises, so that a change of the
package's interfaces cannot break one silently; and the test commands install nothing system-wide."""

from __future__ import annotations

import functools
import gzip
import importlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import ROOT, as_teacher, multi30k, require, runs_corpus, tiny_overrides
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.data import load_split_tsv, read_lines
from transformer_mt.tables import markdown_table

SCRIPTS = ROOT / "scripts"
# Every script (a file with a __main__ block) and the test below that runs it.
TESTED = {"adaptation_study.py", "average_checkpoints.py", "back_translation.py", "benchmark.py",
          "benchmark_data.py", "benchmark_decoding.py", "benchmark_documents.py", "benchmark_export.py",
          "benchmark_segmenters.py", "benchmark_serve.py", "benchmark_shapes.py", "benchmark_students.py",
          "build_shortlist.py", "decoding_profile.py", "measure_glossary.py", "measure_stand_ins.py",
          "plot_learning_curve.py", "results_table.py", "stress_serve.py"}
# The scripts whose run here takes seconds (benchmarks timing child processes, studies training several
# runs) are tested under the `slow` mark: outside the quick suite (scripts/test.sh), run by CI (.ci/run).


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Import a script by name, as `python scripts/<name>.py` finds its siblings (scripts/ on sys.path).
    A benchmark's look at the machine's load watches it for 0.1 s instead of 2: only its warning, which
    these tests do not read, depends on it."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    timing = importlib.import_module("timing")

    def load(name: str) -> ModuleType:
        module = importlib.import_module(name)
        if hasattr(module, "load_warning"):
            monkeypatch.setattr(module, "load_warning", functools.partial(timing.load_warning, 0.1))
        return module
    return load


def test_every_script_has_a_test_here() -> None:
    found = {p.name for p in SCRIPTS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}
    assert found == TESTED


def test_glossary_terms_come_from_consistent_phrase_pairs(script) -> None:
    """measure_glossary's terms (its aligner, eflomal, is the script's own tool and not installed here):
    tight phrase pairs consistent with the links, whole words found once, common words left out."""
    measure = script("measure_glossary")
    src, tgt = ["the", "red", "car", "is", "here"], ["la", "voiture", "rouge", "est", "là"]
    links = {(0, 0), (1, 2), (2, 1), (3, 3), (4, 4)}
    pairs = measure.phrase_pairs(src, tgt, links)
    assert (1, 3, 1, 3) in pairs and (1, 2, 2, 3) in pairs  # "red car" ~ "voiture rouge", "red" ~ "rouge"
    assert (0, 2, 0, 3) not in pairs and all(j - i <= 3 and m - k <= 3 for i, j, k, m in pairs)
    assert all(not ({(s, t) for s, t in links if i <= s < j} ^ {(s, t) for s, t in links if k <= t < m})
               for i, j, k, m in pairs)  # consistent: no link leaves the pair on either side
    terms = measure.candidate_terms(["The red car is here."], ["La voiture rouge est là."], [links],
                                    {"the", "is", "here"}, {"la", "est", "là"})
    got = {(e.source, e.target) for e in terms[0]}
    assert ("red", "rouge") in got and ("red car", "voiture rouge") in got and ("car", "voiture") in got
    assert all(e.source != "the" and e.target != "est" for e in terms[0])
    entry = measure.Entry
    candidates = [[entry("red", "rouge"), entry("car", "voiture")], [entry("dog", "chien")],
                  [entry("cat", "chat")], []]
    chosen = measure.choose(candidates, ["red car", "dog", "cat", "x"], one=2, two=1, seed=1)
    assert sorted(len(t) for t in chosen.values()) == [1, 1, 2] and 3 not in chosen


def test_the_markdown_table_writer() -> None:
    table = markdown_table(["run", "BLEU"], [["a|b", 1.5], ["c", 20]])
    assert table.splitlines() == ["| run | BLEU |", "| --- | ---: |", "| a\\|b | 1.5 |", "| c | 20 |"]
    assert markdown_table(["x", "y"], [], align="rl").splitlines()[1] == "| ---: | --- |"
    with pytest.raises(ValueError, match="2 columns"):
        markdown_table(["x", "y"], [["only one"]])
    with pytest.raises(ValueError, match="align"):
        markdown_table(["x", "y"], [], align="lc")


# -- benchmarks ------------------------------------------------------------------------------------
GPU_KEYS = ("train_loop_tgt_tok_s", "train_first_epoch_tgt_tok_s", "bare_step_tgt_tok_s", "greedy_sent_s",
            "beam5_sent_s", "peak_mem_gib", "padding_frac", "host_syncs_per_step")


def _benchmark_quick(benchmark: ModuleType, capsys: pytest.CaptureFixture, device: str, run: Path,
                     corpus: Path, tmp_path: Path) -> dict:
    """`benchmark.py --quick` on the tiny model and data of `run`, checked; its JSON. In this process (the
    script is not started as a command: its memory figures still come from children of their own)."""
    out = tmp_path / "bench.json"
    overrides = tiny_overrides(corpus, run, **{"device.num_threads": 1})  # one thread: robust on a busy CPU
    capsys.readouterr()
    assert benchmark.main(["--quick", "--device", device, "--threads", "1", "--checkpoint", str(run),
                           "--out", str(out), "--", *overrides]) == 0
    r = json.loads(out.read_text())
    assert r["device"] == device and r["device_name"]
    for key in (*GPU_KEYS, "train_tgt_tok_s", "train_tgt_tok_s_nn_transformer", "matmul_peak_gflops",
                "train_utilisation", "greedy_nocache_sent_s"):
        assert isinstance(r[key], float) and r[key] > 0, key
    assert r["loop_epochs"] == 2 and r["loop_batches_per_epoch"] == 3  # the short epochs of --quick
    assert 0 <= r["loop_overhead_frac"] <= 1 and 0 <= r["padding_frac"] < 1
    assert r["pad_to_multiple"] == 1 and 1 <= r["distinct_shapes_per_epoch"]
    assert r["padding_frac_pad8"] > r["padding_frac"]  # short sentences rounded up to 8
    assert 0 < r["host_syncs_per_step"] <= 1 and all("tally.py" in s for s in r["host_sync_sites"])
    assert r["decode_checkpoint"] == str(run)
    assert r["decode_sentences"] == len(load_split_tsv(run / "split" / "test.tsv")[0])  # all (< 200)
    assert "| train loop, first epoch (target tokens/s) |" in capsys.readouterr().out
    return r


@pytest.mark.slow
def test_benchmark_quick_writes_every_figure(script, capsys: pytest.CaptureFixture, tiny_run: Path,
                                             corpus: Path, tmp_path: Path) -> None:
    r = _benchmark_quick(script("benchmark"), capsys, "cpu", tiny_run, corpus, tmp_path)
    assert r["peak_rss_train_mib"] > 0 and r["peak_rss_translate_mib"] > 0  # child processes, CPU only


@pytest.mark.gpu
def test_benchmark_quick_on_cuda(script, capsys: pytest.CaptureFixture, tiny_run: Path, corpus: Path,
                                 tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    r = _benchmark_quick(script("benchmark"), capsys, "cuda", tiny_run, corpus, tmp_path)
    assert r["precision"] in ("bfloat16", "float16") and r["peak_rss_train_mib"] is None


def test_benchmark_refuses_cuda_without_it_in_one_line(script, capsys: pytest.CaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert script("benchmark").main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--device cuda" in err


def test_decoding_profile_splits_the_time_into_its_parts(script, tiny_run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The encoder's and the output projection's seconds are timed where the search calls them (both
    called, so both above 0), the rest is what is left of the total; int8 too."""
    out = tmp_path / "profile.json"
    main = script("decoding_profile").main
    assert main([str(tiny_run), "--sentences", "6", "--rounds", "1", "--precision", "int8",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    row = r["runs"][str(tiny_run)]
    assert (r["sentences"], r["beam"], r["precision"]) == (6, 5, "int8")
    assert row["encoder"] > 0 and row["output projection"] > 0 and row["decoder and search"] > 0
    parts = row["encoder"] + row["output projection"] + row["decoder and search"]
    assert parts == pytest.approx(row["total"])
    c = load_checkpoint(tiny_run / "best.pt")["model_config"]
    assert row["shape"].startswith(f"{c['encoder_layers']}+{c['decoder_layers']}, d {c['d_model']}")
    assert f"| {tiny_run} | {row['shape']} |" in capsys.readouterr().out
    assert main([str(tmp_path), "--sentences", "2"]) == 2  # no test split: one line
    assert "transformer-mt train" in capsys.readouterr().err


def test_benchmark_decoding(script, tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "decoding.json"
    main = script("benchmark_decoding").main
    assert main([str(tiny_run), "--sentences", "8", "--rounds", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sentences"] == 8 and r["rounds"] == 1
    for key in ("greedy_nocache_sent_s", "greedy_cache_sent_s", "beam5_sent_s", "cache_speedup",
                "beam5_cost_vs_greedy", "greedy_cache_int8_sent_s", "beam5_int8_sent_s"):
        assert r[key] > 0, key
    if importlib.util.find_spec("ctranslate2"):  # the ct2 extra: CTranslate2 int8 in the same rounds
        assert r["ct2_int8_beam5_sent_s"] > 0 and r["int8_beam5_vs_ct2_int8"] > 0


@pytest.mark.slow
def test_benchmark_shapes(script, tiny_run: Path, corpus: Path, tmp_path: Path) -> None:
    """The tiny run's shape against a deeper encoder and one decoder layer, and one with a tokenizer of
    its own (trained on the corpus); the CPU clock, one round."""
    out = tmp_path / "shapes.json"
    main = script("benchmark_shapes").main
    assert main([str(tiny_run), "--sentences", "12", "--rounds", "1", "--beam", "2",
                 "--shapes", "64/4/128/3+1", "32/4/64/3+1@300", "--corpus", str(corpus),
                 "--tokenizer-sentences", "2000", "--train-seconds", "0.05", "--clock", "cpu",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sentences"] == 12 and r["teacher_real_sent_s"] > 0 and r["teacher_forced_sent_s"] > 0
    assert [s["shape"] for s in r["shapes"].values()] == ["64/4/128/2+2@400", "64/4/128/3+1@400",
                                                          "32/4/64/3+1@300"]
    assert r["shapes"]["teacher"]["beam_speedup"] == 1 and r["shapes"]["teacher"]["train_speed"] == 1
    assert all(s["beam_sent_s"] > 0 and s["train_tok_s"] > 0 for s in r["shapes"].values())
    lengths = [s["reference_tokens"] for s in r["shapes"].values()]  # the same references, re-encoded
    assert lengths[0] == lengths[1] != lengths[2]


@pytest.mark.slow
def test_benchmark_students(script, fitted_model, fit_pairs, tiny_run: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture) -> None:
    """A teacher (post-norm 3+3) and a student (pre-norm 3+1) on the tiny run's test split: each run's
    shape, sizes and BLEU, the BLEU being beam 5 over the whole split (checked against our engine's own
    translations scored by sacrebleu), every engine's speed, and the ratios to the teacher's."""
    require("optimum.exporters.onnx")
    require("ctranslate2")
    import sacrebleu

    from transformer_mt.config import DecodingConfig
    from transformer_mt.data.ragged import Ragged
    from transformer_mt.decoding.shortlist import write_shortlist
    from transformer_mt.decoding.translator import Translator

    teacher = as_teacher(fitted_model("marian", tmp_path / "teacher"), tiny_run)
    student = as_teacher(fitted_model("pegasus", tmp_path / "student"), tiny_run)
    vocab = Translator.from_checkpoint(student, device="cpu").vocab
    en, fr = fit_pairs  # the student's shortlist: each engine timed with it too
    write_shortlist(student, Ragged.from_lists(vocab.encode_src(en)), Ragged.from_lists(vocab.encode_tgt(fr)),
                    vocab)
    out = tmp_path / "students.json"
    assert script("benchmark_students").main([str(teacher), str(student), "--sentences", "6", "--rounds", "1",
                                              "--onnx-sentences", "3", "--no-page", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["teacher", "student"]
    precisions = ("float32", "int8", *(["bf16"] if script("timing").native_bf16() else []))
    sources, refs = load_split_tsv(tiny_run / "split" / "test.tsv")
    for name, run in (("teacher", teacher), ("student", student)):
        row, spec = runs[name], load_checkpoint(run / "best.pt")["model_config"]
        assert row["shape"].endswith(f"{spec['encoder_layers']}+{spec['decoder_layers']}")
        assert row["float32 MB"] == round(row["parameters"] * 4 / 1e6, 1)
        assert 0 < row["CTranslate2 int8 MB"] < row["float32 MB"] and row["ONNX int8 MB"] > 0
        engine = Translator.from_checkpoint(run, device="cpu", amp="off",
                                            decoding=DecodingConfig(beam_size=5, confidence=False))
        expected = sacrebleu.corpus_bleu(engine.translate(sources, input_case="model"), [refs]).score
        assert row["BLEU ours float32"] == round(expected, 2)
        speeds = [f"{engine} {search}" for engine in ("CTranslate2 int8", *(f"ours {p}" for p in precisions))
                  for search in ("greedy", "beam 5")] + ["ONNX Runtime int8 greedy (one at a time)"]
        assert all(row[k] > 0 for k in speeds)
    listed = [f"{engine} shortlist {search}" for search in ("greedy", "beam 5")
              for engine in ("CTranslate2 int8", *(f"ours {p}" for p in precisions))]
    assert all(runs["student"][k] > 0 for k in listed) and not any(k in runs["teacher"] for k in listed)
    assert runs["student"]["BLEU ours float32 shortlist"] >= 0
    assert runs["student"]["shape"].endswith("3+1")
    printed = capsys.readouterr().out
    teacher_row = next(line for line in printed.splitlines() if line.startswith("| teacher | 1.00×"))
    assert set(teacher_row.strip("| ").split(" | ")[1:]) == {"1.00×"}


def test_benchmark_documents(script, tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "documents.json"
    assert script("benchmark_documents").main([str(tiny_run), "--sentences", "12", "--rounds", "1",
                                               "--beam", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sentences"] == 12 and 3 <= r["paragraphs"] <= 6 and r["ratio"] > 0
    assert set(r["sentences_per_s"]) == {"engine, one a line", "documents layer, one a line",
                                         "documents layer, paragraphs"}


def test_measure_stand_ins(script, tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "stand_ins.json"
    module = script("measure_stand_ins")
    assert module.main([str(tiny_run), "--cases", "2", "--beam", "1", "--out", str(out)]) == 0
    rates = json.loads(out.read_text())["rates"]
    assert set(rates) == set(module.CANDIDATES)
    assert all(0 <= rate <= 1 for kinds in rates.values() for rate in kinds.values())


@pytest.mark.slow
def test_benchmark_export(script, tiny_run: Path, tmp_path: Path) -> None:
    """Every engine's speed, parity and BLEU, and each format's size, from one call (needs the extras)."""
    require("optimum.exporters.onnx")
    require("ctranslate2")
    out = tmp_path / "export.json"
    main = script("benchmark_export").main
    assert main([str(tiny_run), "--sentences", "6", "--bleu-sentences", "6", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["sentences"] == 6 and len(r["speeds"]) == 8 and all(v > 0 for v in r["speeds"].values())
    parity = r["identical_to_ours"]
    assert set(parity) == {*script("benchmark_export").PARITY, "HF generate beam 5 (of the BLEU sentences)"}
    assert all(0 <= v <= 6 for v in parity.values())
    assert len(r["bleu"]) == 5 and all(v > 0 for v in r["size_mb"].values())


@pytest.mark.slow
def test_benchmark_data(script, tmp_path: Path) -> None:
    """Two sizes: one row each, and the memory ratios of the larger against the smaller."""
    out = tmp_path / "data.json"
    assert script("benchmark_data").main(["--sizes", "300", "1200", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    small, large = r["rows"]
    assert (small["pairs"], large["pairs"]) == (300, 1200) and large["corpus_mib"] > 3 * small["corpus_mib"]
    for row in (small, large):
        assert row["pairs_per_s"] == pytest.approx(row["pairs"] / row["prepare_seconds"])
        assert row["start_peak_rss_mib"] > 0
        assert 0 < row["prepare_peak_anon_mib"] <= row["prepare_peak_rss_mib"]  # RSS counts the anonymous
    for ratio, key in (("rss", "prepare_peak_rss_mib"), ("anon", "prepare_peak_anon_mib")):
        assert r[f"{ratio}_ratio_largest_vs_smallest"] == pytest.approx(large[key] / small[key])


def test_benchmark_segmenters(script, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture) -> None:
    """Two segmenters whose figures are known without running them: one that never splits (no join
    found, nothing split inside an entry, right on the hard cases of one sentence only) and one that
    splits at every space (every join found, and each three-word entry split twice inside)."""
    bench = script("benchmark_segmenters")
    monkeypatch.setattr(bench, "CANDIDATES", {"never": ("json", "json", lambda lang: lambda text: [text]),
                                              "every space": ("json", "json", lambda lang: str.split),
                                              "absent": ("no_such_module", "no-such-package", None)})
    corpora = []
    for name, other in (("fra", "Phrase"), ("deu", "Satz")):
        corpora.append(tmp_path / f"{name}-eng.zip")
        with zipfile.ZipFile(corpora[-1], "w") as archive:
            archive.writestr(f"{name}.txt", "".join(f"Sentence number {i}.\t{other} Nummer {i}.\tCC-BY 2.0\n"
                                                    for i in range(40)))
    out = tmp_path / "segmenters.json"
    args = ["--corpora", *map(str, corpora), "--lines", "9", "--rounds", "1", "--out", str(out)]
    assert bench.main(args) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"en", "fr", "de"}
    for lang, found in results.items():
        never, spaces = found["never"], found["every space"]
        assert (never["recall"]["all"], never["exact_lines"], never["inside_per_1000_entries"]) == (0, 0, 0)
        one = sum(len(sentences) == 1 for _, _, sentences in bench.HARD_CASES[lang])
        hard = never["hard_cases"]
        assert hard["right"] == one == hard["of"] - len(hard["wrong"])
        assert spaces["recall"] == {"2": 1.0, "3": 1.0, "5": 1.0, "all": 1.0}
        assert spaces["entries"] == 3 * (2 + 3 + 5) and spaces["inside_per_1000_entries"] == 2000
        assert never["sentences_per_s"] > 0 and spaces["sentences_per_s"] > 0
    assert "pip install no-such-package" in capsys.readouterr().out


@pytest.mark.slow
def test_benchmark_serve(script, tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    main = script("benchmark_serve").main
    assert main([str(tiny_run), "--clients", "2", "--requests", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    for mode in ("batching on", "batching off"):
        assert r["results"][mode]["sentences"] == 4 and r["results"][mode]["sent_s"] > 0
    assert r["speedup"] > 0


@pytest.mark.slow
def test_stress_serve_holds_its_criteria(script, tiny_run: Path, tmp_path: Path) -> None:
    """32 clients, eight of them hostile (each starting on another kind of abuse), for two seconds: every
    kind is sent, every well-formed request is served or refused with Retry-After, no 5xx but 503,
    /health stays fast, and the server serves after."""
    out = tmp_path / "stress.json"
    stress = script("stress_serve")
    assert len(stress.HOSTILE) <= 8
    code = stress.main([str(tiny_run), "--clients", "32", "--seconds", "2", "--sentences", "20",
                        "--health-limit", "2", "--out", str(out)])
    r = json.loads(out.read_text())
    assert code == 0, {name: check["value"] for name, check in r["checks"].items() if not check["ok"]}
    assert r["served"] > 0 and r["rss_max_mib"] > 0
    assert set(r["statuses"]) == {"well-formed", *stress.HOSTILE}  # every kind of abuse was sent


# -- tools for runs ----------------------------------------------------------------------------------
def test_results_table(script, tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("tensorboard"))
    tmt.evaluate([f"checkpoint={run}", "decoding.beam_size=1"])
    [report] = [json.loads(p.read_text()) for p in (run / "eval").glob("test.*.json")]
    minutes = json.loads((run / "result.json").read_text())["train_seconds"] / 60
    capsys.readouterr()
    assert script("results_table").main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == (f"| en→fr | best.pt | greedy | {report['bleu']:.2f} | {report['chrf']:.2f} | "
                        f"{report['cer']:.3f} | {report['wer']:.3f} | {report['n']} | "
                        f"{report['sentences_per_s']:.0f} | {minutes:.1f} |")
    assert lines[-1].startswith("Signatures: BLEU nrefs:1")



def test_results_table_compares_groups_of_runs(script, tiny_run: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    """Each group's mean and spread are those of its runs' reports (one run with two searches needs
    --search). The tiny run scores 0 BLEU: a2's report is a1's with other scores, as a real run has."""
    skip = shutil.ignore_patterns("tensorboard")
    a1, a2, b1 = (Path(shutil.copytree(tiny_run, tmp_path / n, ignore=skip)) for n in ("a1", "a2", "b1"))
    evaluations = ((a1, "decoding.beam_size=1"), (a2, "decoding.beam_size=1"),
                   (b1, "decoding.beam_size=1"), (b1, "decoding.beam_size=2"))
    for run, *overrides in evaluations:
        tmt.evaluate([f"checkpoint={run}", *overrides])
    report = a2 / "eval" / "test.best.greedy.json"
    report.write_text(json.dumps({**json.loads(report.read_text()), "bleu": 31.25, "chrf": 52.5}))
    greedy = {run.name: json.loads((run / "eval" / "test.best.greedy.json").read_text())
              for run in (a1, a2, b1)}
    assert greedy["a1"]["bleu"] != greedy["a2"]["bleu"]  # two different figures to average
    groups = ["--group", "a", str(a1), str(a2), "--group", "b", str(b1)]
    table = script("results_table")
    capsys.readouterr()
    assert table.main(groups) == 2
    assert "choose one with --search" in capsys.readouterr().err
    assert table.main([*groups, "--search", "greedy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = json.loads((tiny_run / "result.json").read_text())["steps"]
    bleus, chrfs = [greedy[n]["bleu"] for n in ("a1", "a2")], [greedy[n]["chrf"] for n in ("a1", "a2")]
    assert (f"| a | 2 | {steps:,} | {statistics.mean(bleus):.2f} | {statistics.stdev(bleus):.2f} | "
            f"{min(bleus):.2f}–{max(bleus):.2f} | {statistics.mean(chrfs):.2f} | "
            f"{statistics.stdev(chrfs):.2f} |" in lines)
    b = greedy["b1"]
    assert (f"| b | 1 | {steps:,} | {b['bleu']:.2f} | — | {b['bleu']:.2f}–{b['bleu']:.2f} | "
            f"{b['chrf']:.2f} | — |") in lines
    assert sum(line.startswith(("| a | a", "| b | b")) for line in lines) == 3  # a row per run
    assert lines[-1].startswith("Signatures: BLEU nrefs:1")

@pytest.mark.slow
def test_back_translation(script, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The whole recipe on 400 pairs: the halves are disjoint, the synthetic sources are the reverse model's
    translations of the monolingual half, the second run trains on them tagged; one table at the end."""
    out = tmp_path / "bt"
    # Plumbing, not learning: one smoke epoch a run, and --sampling, since a barely trained reverse model's
    # beam search either ends every translation at once (all empty, which the script refuses: the tiny
    # model's after two epochs) or runs each to its length limit (this one's, at several times the cost).
    # float32: bf16 autocast (chosen on a CPU with native bf16) only slows a model this small.
    smoke = ["--", "debug=smoke", "dataset.max_pairs=null", "device.num_threads=1", "device.amp=off",
             f"dataset.cache_dir={tmp_path / 'cache'}"]
    assert script("back_translation").main(["--corpus", str(runs_corpus(corpus)), "--max-pairs", "400",
                                            "--sampling", "--out", str(out), *smoke]) == 0
    parallel, test = (load_split_tsv(out / f"{name}.tsv") for name in ("parallel", "test"))
    mono = read_lines(out / "mono.txt")
    assert not set(mono) & set(parallel[1]) and not set(test[1]) & (set(mono) | set(parallel[1]))
    synthetic = load_split_tsv(out / "synthetic.tsv")
    back = read_lines(out / "synthetic.txt")
    assert synthetic[1] == [t for s, t in zip(back, mono) if s.strip()]
    summary = json.loads((out / "parallel+bt" / "split" / "train_summary.json").read_text())
    assert summary["mixture"][1]["tag"] == "<bt>" and summary["mixture"][1]["train"] > 0
    table = capsys.readouterr().out
    assert "| parallel only |" in table and "| parallel + tagged back-translation |" in table
    assert "BLEU signature: nrefs:1" in table


def test_back_translation_pairs_each_line_with_its_own(script, tmp_path: Path) -> None:
    """A barely trained model's byte-level pieces can spell a form feed or another control character
    that str.splitlines() would end a line at: each back-translation still meets its own target line."""
    mono = tmp_path / "mono.txt"
    mono.write_text("un\ndeux\ntrois\n", encoding="utf-8")
    (tmp_path / "synthetic.txt").write_text("one\x0c1\n\n\x1cthree\n", encoding="utf-8")  # exists: not run
    back_translate = script("back_translation").back_translate
    synthetic = back_translate(tmp_path / "reverse", {"mono": mono}, False, tmp_path)
    assert load_split_tsv(synthetic) == (["one\x0c1", "\x1cthree"], ["un", "trois"])


def _first_pairs(corpus: Path, path: Path, n: int) -> Path:
    """A Tatoeba zip of the corpus's first n pairs: (d) mixes in all of its Tatoeba, which the smoke runs'
    plumbing does not need."""
    with zipfile.ZipFile(corpus) as source, zipfile.ZipFile(path, "w") as target:
        for name in source.namelist():
            text = source.read(name).decode("utf-8")
            target.writestr(name, text if name.startswith("_") else "".join(text.splitlines(True)[:n]))
    return path


def _first_captions(folder: Path, path: Path, n: int) -> Path:
    """A Multi30k folder (English and French) of the first n lines of each file: each Multi30k run reads
    its whole training set (to draw the test split leak-free), 29,000 lines the smoke runs do not need."""
    path.mkdir()
    for split, lang in itertools.product(("train", "val"), ("en", "fr")):
        with gzip.open(folder / f"{split}.{lang}.gz", "rt", encoding="utf-8") as source:
            lines = list(itertools.islice(source, n))
        with gzip.open(path / f"{split}.{lang}.gz", "wt", encoding="utf-8") as target:
            target.writelines(lines)
    return path


@pytest.mark.slow
def test_adaptation_study(script, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The four runs on a few hundred pairs (en->fr): (c) starts from (b), (d) mixes Tatoeba in; one
    table of all four on Multi30k's validation set and test split."""
    captions = _first_captions(multi30k(), tmp_path / "multi30k", 1000)
    out, tatoeba = tmp_path / "study", _first_pairs(corpus, tmp_path / "fra-eng.zip", 500)
    # float32: bf16 autocast (chosen on a CPU with native bf16) only slows a model this small
    smoke = ["--", "debug=smoke", "training.epochs=1", "device.num_threads=1", "device.amp=off",
             "training.valid_max_sentences=8"]
    assert script("adaptation_study").main(["--multi30k", str(captions), "--tatoeba", str(tatoeba), "--tgt",
                                            "fr", "--max-sentences", "10", "--out", str(out), *smoke]) == 0
    assert load_checkpoint(out / "c" / "best.pt")["parent"] == str((out / "b" / "best.pt").resolve())
    assert json.loads((out / "d" / "split" / "train_summary.json").read_text())["mixture"][1]["weight"] == 0.2
    table = capsys.readouterr().out
    assert table.count("\n| (") == 4 and "nrefs:1" in table and "nc:6" in table


def test_plot_learning_curve(script, tiny_run: Path, tmp_path: Path) -> None:
    require("matplotlib")
    out = tmp_path / "curve.png"
    assert script("plot_learning_curve").main([str(tiny_run), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_build_shortlist_counts_what_train_wrote(script, tiny_run_copy: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """A run's shortlist counted again from its recorded dataset and tokenizer is the one `train` wrote."""
    written = (tiny_run_copy / "shortlist.json").read_text()
    (tiny_run_copy / "shortlist.json").unlink()
    script("build_shortlist").main([str(tiny_run_copy)])
    assert capsys.readouterr().out.strip() == str(tiny_run_copy / "shortlist.json")
    assert (tiny_run_copy / "shortlist.json").read_text() == written
    with pytest.raises(SystemExit, match="^error: checkpoint path .* does not exist"):
        script("build_shortlist").main([str(tiny_run_copy / "missing")])


def test_average_checkpoints(script, tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "avg.pt"
    assert script("average_checkpoints").main([str(tiny_run), "--out", str(out)]) == 0
    first, second = (load_checkpoint(tiny_run / f"epoch_00{i}.pt")["model"] for i in (1, 2))
    averaged = load_checkpoint(out)["model"]
    for name, value in averaged.items():
        torch.testing.assert_close(value, (first[name] + second[name]) / 2, msg=name)


# -- the test commands ------------------------------------------------------------------------------
# scripts/test.sh's pytest command line, before the arguments it is given.
PYTEST_COMMAND = ("python -m pytest -q --disable-plugin-autoload -p xdist.plugin -p _hypothesis_pytestplugin "
                  "-n auto --dist loadfile --no-loadscope-reorder")
def _sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A checkout holding only scripts/test.sh and .ci/run, with setup.sh, .venv, apt-get, ruff and
    python replaced by stubs that write their command line (and CI) to a log."""
    checkout, stubs = tmp_path / "checkout", tmp_path / "bin"
    for path in ("scripts/test.sh", ".ci/run"):
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, checkout / path)
    (checkout / "scripts" / "setup.sh").write_text('echo "setup.sh" >> "$LOG"\n')
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "activate").write_text("")
    stubs.mkdir()
    for name in ("apt-get", "ruff", "python"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $* CI=${{CI:-}}" >> "$LOG"\n')
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "LOG": str(tmp_path / "log"),
           "TMT_CHROMIUM": str(tmp_path / "no-chromium")}
    env.pop("CI", None)
    return checkout, env


def test_the_test_command_installs_nothing(tmp_path: Path) -> None:
    checkout, env = _sandbox(tmp_path)
    result = subprocess.run(["bash", "scripts/test.sh", "-k", "x"], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert log == ["setup.sh", "ruff check transformer_mt tests scripts CI=",
                   f"{PYTEST_COMMAND} -k x CI="]
    note = result.stdout.splitlines()[0]  # then one for npm, where it lacks
    assert "browser tests are skipped" in note and "apt-get install chromium" in note


def test_ci_prepares_the_browser_then_runs_the_test_command_on_every_test(tmp_path: Path) -> None:
    """CI runs the README's test command with the `slow` tests too, which the command leaves out."""
    checkout, env = _sandbox(tmp_path)
    result = subprocess.run(["bash", ".ci/run"], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "log").read_text().splitlines()
    installs = ["apt-get install -y -q chromium CI="] if os.getuid() == 0 else []  # only root installs
    assert log == [*installs, "setup.sh", "ruff check transformer_mt tests scripts CI=1",
                   f"{PYTEST_COMMAND} -m slow or not slow CI=1"]


@pytest.mark.parametrize(("ci", "outcome"), [(None, pytest.skip.Exception), ("", pytest.skip.Exception),
                                             ("0", pytest.skip.Exception), ("false", pytest.skip.Exception),
                                             ("1", pytest.fail.Exception), ("true", pytest.fail.Exception)])
def test_under_ci_a_missing_corpus_fails_instead_of_skipping(ci: str | None, outcome: type[BaseException],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Without ../shared a test that needs a corpus is skipped on a laptop; CI must run it, so it fails."""
    from tests import conftest

    monkeypatch.setattr(conftest, "CORPORA", (tmp_path / "shared" / "fra-eng.zip",))
    monkeypatch.setattr(conftest, "MULTI30K", tmp_path / "shared" / "multi30k")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    for needs in (conftest.tatoeba_corpus, conftest.multi30k):
        with pytest.raises((pytest.skip.Exception, pytest.fail.Exception), match="not found at ../shared/data"
                           ) as raised:  # both, so that a skip where a failure is due fails this test
            needs()
        assert raised.type is outcome
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "fra-eng.zip").write_bytes(b"")
    assert conftest.tatoeba_corpus() == tmp_path / "shared" / "fra-eng.zip"  # found: no skip, no failure
