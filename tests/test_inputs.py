"""What the commands read and write, under abuse: mixture weights that make no epoch, outputs that are
directories, a large output streamed into place, files with old-Mac ("\\r") line ends, and command-line
text that is not UTF-8. Each is a one-line error naming the setting, or the input read as a person
would read it."""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
from pathlib import Path

import pytest

import transformer_mt as tmt
from tests.conftest import run_cli
from tests.test_mixture import CHARS, corpora, mixed_config  # noqa: F401 - corpora is a fixture
from transformer_mt.config import DatasetConfig, EvaluateConfig, ScoreConfig, TranslateConfig
from transformer_mt.data import load_pairs, load_split_tsv, prepare_data
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.jobs import translate as translate_job
from transformer_mt.jobs.evaluate import load_eval_set
from transformer_mt.jobs.score import read_pairs


# -- dataset.mix weights -----------------------------------------------------------------------------
@pytest.mark.parametrize("weight", ["inf", "nan"])
@pytest.mark.parametrize("key", ["dataset.mix[0].weight", "dataset.weight"])
def test_a_mix_weight_that_is_not_a_finite_number_is_one_line(weight: str, key: str, tmp_path: Path) -> None:
    corpus_weight, own_weight = (weight, 1) if key.startswith("dataset.mix") else (1, weight)
    overrides = ["dataset=parallel", "dataset.path=x.tsv", f"dataset.weight={own_weight}",
                 f"dataset.mix=[{{name:parallel,path:y.tsv,weight:{corpus_weight}}}]",
                 f"checkpoint.dir={tmp_path / 'run'}"]
    says = f"{re.escape(key)}={weight} is out of range; it must be a finite number > 0"
    with pytest.raises(ConfigError, match=says) as info:
        tmt.compose("train", overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("which", ["dataset.weight", "dataset.mix[0].weight"])
def test_a_weight_that_gives_an_epoch_no_pair_of_its_corpus_is_one_line(
        which: str, tmp_path: Path, corpora: dict[str, Path]) -> None:  # noqa: F811 - the fixture
    """0.001 x a few hundred pairs rounds to no pair at all: the corpus (or, with every weight so small,
    the whole epoch) would be empty."""
    cfg = mixed_config(tmp_path, corpora)
    if which == "dataset.weight":
        cfg.weight = 0.001
    else:
        cfg.mix[0] = dataclasses.replace(cfg.mix[0], weight=0.001)
    says = rf"{re.escape(which)}=0.001 gives an epoch none of the \d+ training pairs of .*raise it to"
    with pytest.raises(ConfigError, match=says) as info:
        prepare_data(cfg, CHARS)
    assert "\n" not in str(info.value)


# -- outputs -----------------------------------------------------------------------------------------
def test_an_output_that_is_a_directory_or_under_a_file_is_one_line_before_any_work(
        tiny_run: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x", encoding="utf-8")
    fifo = tmp_path / "a-pipe"
    os.mkfifo(fifo)  # written to, it would be replaced by a file, not written through
    common = [f"checkpoint={tiny_run}", "device=cpu"]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("I am cold.\tJ'ai froid.\n", encoding="utf-8")
    cases = [(tmt.translate, [*common, "text=Hello.", f"output={tmp_path}"], "output=.* is a directory"),
             (tmt.translate, [*common, "text=Hello.", f"output={a_file}/out.txt"], "a-file is a file"),
             (tmt.translate, [*common, "text=Hello.", f"output={fifo}"], "a-pipe is not a regular file"),
             (tmt.score, [*common, f"input={tsv}", f"output={tmp_path}"], "output=.* is a directory"),
             (tmt.evaluate, [*common, f"tsv_file={tsv}", f"output_dir={a_file}"], "output_dir=.* is a file")]
    for job, overrides, says in cases:
        with pytest.raises(ConfigError, match=says) as info:
            job(overrides)
        assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-pipe", "pairs.tsv"]
    nested = tmp_path / "new" / "dir" / "out.txt"  # directories that do not exist yet are made
    tmt.translate([*common, "text=Hello.", f"output={nested}"])
    assert len(nested.read_text(encoding="utf-8").splitlines()) == 1


def test_translate_output_is_written_chunk_by_chunk_then_renamed_into_place(
        tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.txt"
    src.write_text("".join(f"I am {n} years old.\n" for n in range(11)), encoding="utf-8")
    common = [f"checkpoint={tiny_run}", "device=cpu", f"input={src}"]
    tmt.translate(common)  # to stdout, in one chunk: the reference
    expected = capsys.readouterr().out

    out = tmp_path / "out" / "translations.txt"
    seen: list[tuple[bool, int]] = []  # before each chunk: (final file there?, lines already written)
    original = Translator.translate_nbest

    def spy(self: Translator, sentences: list[str], *args: object, **kwargs: object) -> object:
        partial = list(out.parent.glob(f".{out.name}.*.tmp")) if out.parent.exists() else []
        assert len(partial) <= 1
        written = len(partial[0].read_text(encoding="utf-8").splitlines()) if partial else -1
        seen.append((out.exists(), written))
        return original(self, sentences, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_nbest", spy)
    monkeypatch.setattr(translate_job, "CHUNK_LINES", 3)
    tmt.translate([*common, f"output={out}"])
    # each chunk on disk before the next (a chunk whose stand-ins the model dropped is asked twice)
    assert list(dict.fromkeys(seen)) == [(False, 0), (False, 3), (False, 6), (False, 9)]
    assert out.read_text(encoding="utf-8") == expected
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left

    seen.clear()

    def fail(self: Translator, sentences: list[str], *args: object, **kwargs: object) -> object:
        if len(seen) == 2:  # in the second chunk, or later: the first is written
            raise KeyboardInterrupt
        return spy(self, sentences, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_nbest", fail)
    failed = tmp_path / "failed.txt"
    with pytest.raises(KeyboardInterrupt):
        tmt.translate([*common, f"output={failed}"])
    assert not failed.exists() and not list(tmp_path.glob(".failed.txt.*"))  # nothing half-written


# -- line ends -------------------------------------------------------------------------------------
SOURCES, TARGETS = ["I am cold.", "", "Who are you?", "Go."], ["J'ai froid.", "", "Qui es-tu ?", "Va !"]


def _with_ends(lines: list[str], end: str) -> bytes:
    return "".join(line + end for line in lines).encode("utf-8")


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"])
def test_every_text_file_read_takes_cr_crlf_and_lf_as_line_ends(end: str, tmp_path: Path) -> None:
    src, ref, tsv = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "pairs.tsv"
    src.write_bytes(_with_ends(SOURCES, end))
    ref.write_bytes(_with_ends(TARGETS, "\n" if end == "\r" else "\r"))  # each file its own line ends
    tsv.write_bytes(_with_ends([f"{s}\t{t}" for s, t in zip(SOURCES, TARGETS) if s], end))
    kept = ([s for s in SOURCES if s], [t for t in TARGETS if t])
    no_run = (tmp_path, {})
    two_files = EvaluateConfig(src_file=str(src), ref_file=str(ref))
    assert load_eval_set(two_files, *no_run)[:2] == (SOURCES, TARGETS)
    assert load_eval_set(EvaluateConfig(tsv_file=str(tsv)), *no_run)[:2] == kept
    assert load_split_tsv(tsv) == kept
    assert read_pairs(ScoreConfig(src=str(src), tgt=str(ref)))[:2] == (SOURCES, TARGETS)
    assert read_pairs(ScoreConfig(input=str(tsv)))[:2] == kept
    corpus = DatasetConfig(name="parallel", path=None, url=None, src_lang="en", tgt_lang="fr")
    assert load_pairs(dataclasses.replace(corpus, src_path=str(src), tgt_path=str(ref))) == kept
    assert load_pairs(dataclasses.replace(corpus, path=str(tsv))) == kept


def test_a_byte_that_is_not_utf8_is_found_on_its_line_whatever_the_line_ends(tmp_path: Path) -> None:
    tsv = tmp_path / "pairs.tsv"
    for end in ("\r", "\r\n", "\n"):
        tsv.write_bytes(_with_ends(["a\tb", "c\td"], end) + "é\tf".encode("latin-1") + end.encode())
        for read in (lambda: load_split_tsv(tsv), lambda: read_pairs(ScoreConfig(input=str(tsv)))):
            with pytest.raises(DataError, match="line 3 is not valid UTF-8 \\(byte 0xe9\\)"):
                read()


def test_a_cr_inside_a_tsv_line_ends_it_in_every_reader(tmp_path: Path) -> None:
    """"\\r" is a line end everywhere, inside a TSV line too: the line before it has one column, which
    every TSV reader reports with its line number (never a sentence silently holding a line end)."""
    tsv = tmp_path / "pairs.tsv"
    tsv.write_bytes(b"I am cold.\tJ'ai froid.\nWho\rare you?\tQui es-tu ?\n")
    for read in (lambda: load_split_tsv(tsv), lambda: read_pairs(ScoreConfig(input=str(tsv))),
                 lambda: load_pairs(DatasetConfig(name="parallel", path=str(tsv), url=None))):
        with pytest.raises(DataError, match="line 2 has 1 tab-separated column"):
            read()


def test_a_lone_cr_in_one_of_two_aligned_files_is_a_line_count_error_that_says_why(tmp_path: Path) -> None:
    """Source and reference stay aligned: a "\\r" inside a line of one file makes one line more there,
    which every two-file reader refuses, naming the line ends."""
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_bytes(b"I am cold.\nWho\rare you?\n")
    ref.write_bytes(b"J'ai froid.\nQui es-tu ?\n")
    says = r"has \d lines but .* \(\\n, \\r\\n and a lone \\r each end a line\)"
    for read in (lambda: load_eval_set(EvaluateConfig(src_file=str(src), ref_file=str(ref)), tmp_path, {}),
                 lambda: read_pairs(ScoreConfig(src=str(ref), tgt=str(src))),
                 lambda: load_pairs(DatasetConfig(name="parallel", path=None, url=None, src_path=str(ref),
                                                  tgt_path=str(src)))):
        with pytest.raises(DataError, match=says):
            read()


def test_translate_reads_an_old_mac_file_line_by_line(tiny_run: Path, tmp_path: Path) -> None:
    lf, cr = tmp_path / "lf.txt", tmp_path / "cr.txt"
    lf.write_bytes(_with_ends(SOURCES, "\n"))
    cr.write_bytes(_with_ends(SOURCES, "\r"))
    for path in (lf, cr):
        tmt.translate([f"checkpoint={tiny_run}", "device=cpu", f"input={path}", f"output={path}.out"])
    text = Path(f"{cr}.out").read_text(encoding="utf-8")
    assert len(text.split("\n")) == len(SOURCES) + 1 and Path(f"{lf}.out").read_text(encoding="utf-8") == text


# -- text= -----------------------------------------------------------------------------------------
def test_text_that_is_not_utf8_is_one_line(tiny_run: Path) -> None:
    """A shell passes the byte 0xff as it is; Python holds it as the lone surrogate U+DCFF."""
    done = run_cli("translate", f"checkpoint={tiny_run}", "device=cpu", "text=Hello \udcff")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == ("error: text= is not valid UTF-8 (byte 0xff); give it as "
                                                    "UTF-8 text (a UTF-8 terminal or LANG=C.UTF-8)")
    with pytest.raises(ConfigError, match=r"text= is not valid UTF-8 \(lone surrogate U\+D800\)"):
        tmt.translate(TranslateConfig(checkpoint=str(tiny_run), text="Hello \ud800"))


def test_a_line_typed_at_the_prompt_that_is_not_utf8_is_one_line_and_the_prompt_goes_on(
        tiny_engine: Translator, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    typed = ["Hello \udcff", "Hello."]

    def prompt(_: str) -> str:
        if not typed:
            raise EOFError  # Ctrl-D
        return typed.pop(0)

    monkeypatch.setattr("builtins.input", prompt)
    translate_job.interactive(tiny_engine, TranslateConfig())
    captured = capsys.readouterr()
    assert "error: the line is not valid UTF-8 (byte 0xff)" in captured.err
    assert len(captured.out.splitlines()) == 1  # "Hello." is translated after it


# -- input files -----------------------------------------------------------------------------------
def test_an_input_that_is_a_directory_is_named_so(tmp_path: Path) -> None:
    for read in (lambda: read_pairs(ScoreConfig(src=str(tmp_path), tgt=str(tmp_path))),
                 lambda: load_split_tsv(tmp_path),
                 lambda: load_pairs(DatasetConfig(name="parallel", path=str(tmp_path), url=None))):
        with pytest.raises(DataError, match=f"^{re.escape(str(tmp_path))} is a directory, not a file"):
            read()


def test_translate_reads_a_gzip_input_as_every_other_command_does(tiny_run: Path, tmp_path: Path) -> None:
    plain, packed = tmp_path / "in.txt", tmp_path / "in.txt.gz"
    plain.write_bytes(_with_ends(SOURCES, "\n"))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        tmt.translate([f"checkpoint={tiny_run}", "device=cpu", f"input={path}", f"output={path}.out"])
    text = Path(f"{packed}.out").read_text(encoding="utf-8")
    assert len(text.split("\n")) == len(SOURCES) + 1
    assert text == Path(f"{plain}.out").read_text(encoding="utf-8")


def test_a_translation_holding_a_line_break_stays_on_its_line() -> None:
    """A byte-level model can write a newline or carriage return: the output keeps one line per input
    (n per input with n-best), and a tab inside a translation does not add a column."""
    from transformer_mt.decoding.text_translator import Translation

    broken = [Translation("Il dort.\nIl\r\nrêve\r.", -1.0), Translation("Il\tdort.", -2.0)]
    assert translate_job.format_nbest(broken, 1, with_scores=False) == ["Il dort. Il rêve ."]
    assert translate_job.format_nbest(broken, 2, with_scores=True) == ["1\t-1.0000\tIl dort. Il rêve .",
                                                                       "2\t-2.0000\tIl dort."]
    assert translate_job.format_nbest(broken[1:], 1, with_scores=False) == ["Il\tdort."]  # no columns: kept
