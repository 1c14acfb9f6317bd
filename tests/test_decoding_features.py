"""Prefix decoding, ensembles and the unigram tokenizer from the command line and the Python API."""

from __future__ import annotations

from pathlib import Path

import pytest

import transformer_mt as tmt
from tests.conftest import smoke_overrides
from transformer_mt.data import load_split_tsv
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ConfigError

SENTENCES = ["He is sleeping.", "I am cold.", "Where is the station?"]


@pytest.fixture(scope="module")
def unigram_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """A smoke run with the unigram tokenizer: another vocabulary than tiny_run's BPE."""
    run_dir = tmp_path_factory.mktemp("unigram") / "run"
    tmt.train(smoke_overrides(corpus, run_dir, tokenizer="unigram"))
    return run_dir


def test_prefix_from_the_command_line_and_a_tsv(tiny_run: Path, tmp_path: Path, run_cli_here) -> None:
    one = run_cli_here("translate", f"checkpoint={tiny_run}", "decoding.prefix=Il", "text=He is sleeping.")
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("Il")
    tsv = tmp_path / "in.tsv"
    tsv.write_text("He is sleeping.\tIl dort\nI am cold.\tJ'\nWhere is the station?\n", encoding="utf-8")
    many = run_cli_here("translate", f"checkpoint={tiny_run}", f"input={tsv}", "input_format=tsv",
                        "decoding.beam_size=3")
    assert many.returncode == 0, many.stderr
    lines = many.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("Il dort") and lines[1].startswith("J'")


def test_prefix_in_the_python_api(tiny_run: Path) -> None:
    engine = Translator.from_checkpoint(tiny_run, device="cpu")
    out = engine.translate(SENTENCES, beam_size=4, prefixes=["Il", "", "Où"])
    assert out[0].startswith("Il") and out[2].startswith("Où")
    assert out[1] == engine.translate(SENTENCES[1], beam_size=4)  # an empty prefix is no prefix
    assert engine.translate(SENTENCES[0], beam_size=1, prefixes="Il") == \
        engine.translate(SENTENCES[0], beam_size=1, prefixes="Il", use_cache=False)
    assert engine.translate(["", " ", "I am cold."], prefixes=["Il dort", "", ""])[:2] == ["Il dort", ""]
    with pytest.raises(ConfigError, match="2 prefixes for 3 sentences"):
        engine.translate(SENTENCES, prefixes=["a", "b"])


def test_an_ensemble_of_checkpoints(tiny_run: Path, tmp_path: Path, run_cli_here) -> None:
    # The tiny models mostly stop at once; a prefix gives the comparisons words to continue.
    first, second = tiny_run / "epoch_001.pt", tiny_run / "epoch_002.pt"
    single = Translator.from_checkpoint(second, device="cpu")
    twice = Translator.from_checkpoint(f"{second},{second}", device="cpu")
    assert len(twice.info["ensemble"]) == 2
    for prefixes in (None, ["Il", "Je", "Où"]):  # two identical models are the model alone
        alone = single.translate_nbest(SENTENCES, beam_size=4, prefixes=prefixes)
        together = twice.translate_nbest(SENTENCES, beam_size=4, prefixes=prefixes)
        assert [n[0].text for n in together] == [n[0].text for n in alone]
        assert [n[0].score for n in together] == pytest.approx([n[0].score for n in alone], abs=1e-4)
    pair = Translator.from_checkpoint(f"{first},{second}", device="cpu")
    bleu = tmt.evaluate([f"checkpoint={first},{second}", "device=cpu", "decoding.beam_size=2",
                         f"output_dir={tmp_path}"])
    sources, _ = load_split_tsv(tiny_run / "split" / "test.tsv")
    hyps = (tmp_path / "test.ensemble2.beam2.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert bleu >= 0 and hyps == pair.translate(sources, beam_size=2)
    out = run_cli_here("translate", f"checkpoint={first},{second}", "decoding.prefix=Je", "scores=true",
                       "text=I am cold.")
    assert out.returncode == 0, out.stderr
    best = pair.translate_nbest(["I am cold."], prefixes=["Je"])[0][0]
    assert out.stdout == f"{best.score:.4f}\t{best.text}\n" and best.text.startswith("Je")


def test_an_ensemble_needs_one_vocabulary(tiny_run: Path, unigram_run: Path, run_cli_here) -> None:
    result = run_cli_here("translate", f"checkpoint={tiny_run},{unigram_run}", "text=I am cold.")
    assert result.returncode == 2
    assert "different vocabularies" in result.stderr and "Traceback" not in result.stderr


def test_a_unigram_run_translates(unigram_run: Path) -> None:
    engine = Translator.from_checkpoint(unigram_run, device="cpu")
    assert engine.vocab.kind == "unigram"
    assert isinstance(engine.translate("He is sleeping."), str)
