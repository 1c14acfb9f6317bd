"""Several corpora in one run (`dataset.mix`): each epoch holds each corpus by its weight, one tokenizer
serves all, the held-out parts are the first corpus's and no training pair of another corpus shares a
sentence with them, tags mark a corpus's sources, and a resumed mixed run ends where an uninterrupted
one does. Checked against independent references: the first corpus prepared alone, decoded text, and
an uninterrupted run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_mt as tmt
from tests.conftest import run_cli
from tests.test_sources import pairs, tatoeba_zip, write_lines
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import DatasetConfig, MixedCorpus, TokenizerConfig
from transformer_mt.data import prepare_data
from transformer_mt.data.mixture import Mixture, Part
from transformer_mt.data.tokenizer import train_tokenizers
from transformer_mt.errors import ConfigError, DataError

CHARS = TokenizerConfig(kind="char", vocab_size=100)


def test_an_epoch_holds_each_corpus_by_its_weight() -> None:
    mixture = Mixture((Part("a", 0, 100, 1.0), Part("b", 100, 300, 0.5), Part("c", 300, 350, 2.0)), seed=3)
    first, second = mixture.rows(0), mixture.rows(1)
    for rows in (first, second):
        counts = np.bincount(np.searchsorted([100, 300], rows, side="right"), minlength=3)
        assert counts.tolist() == [100, 100, 100]  # all of a, half of b, c twice
        assert sorted(rows[rows < 100].tolist()) == list(range(100))
        assert np.bincount(rows[rows >= 300] - 300).tolist() == [2] * 50
        assert len(set(rows[(rows >= 100) & (rows < 300)].tolist())) == 100  # b's half: no pair twice
    assert not np.array_equal(first, second)  # b's half is drawn anew each epoch ...
    assert np.array_equal(first, mixture.rows(0))  # ... the same way for the same epoch (resume)
    assert "100 of b (weight 0.5)" in mixture.describe(first)
    assert not Mixture((Part("a", 0, 10, 1.0), Part("b", 10, 20, 3.0)), seed=0).varies


@pytest.fixture
def corpora(tmp_path: Path) -> dict[str, Path]:
    """The first corpus as two files, a Tatoeba zip and a TSV, sharing many sentences (few words)."""
    first = pairs(300, seed=1)
    return {"src": write_lines(tmp_path / "first.en", [e for e, _ in first]),
            "tgt": write_lines(tmp_path / "first.de", [d for _, d in first]),
            "zip": tatoeba_zip(tmp_path / "deu-eng.zip", pairs(200, seed=4)),
            "tsv": write_lines(tmp_path / "bt.tsv", [f"{e}\t{d}" for e, d in pairs(100, seed=5)])}


def mixed_config(tmp_path: Path, corpora: dict[str, Path], **first: object) -> DatasetConfig:
    mix = [MixedCorpus(name="tatoeba", path=str(corpora["zip"]), weight=0.5),
           MixedCorpus(name="parallel", path=str(corpora["tsv"]), weight=2.0, tag="<bt>")]
    return DatasetConfig(name="parallel", path=None, url=None, src_path=str(corpora["src"]),
                         tgt_path=str(corpora["tgt"]), src_lang="en", tgt_lang="de", valid_size=20,
                         test_size=20, cache_dir=str(tmp_path / "cache"), mix=mix, **first)


def test_the_held_out_parts_are_the_first_corpus_and_no_other_pair_leaks_into_them(
        tmp_path: Path, corpora: dict[str, Path]) -> None:
    cfg = mixed_config(tmp_path, corpora)
    data = prepare_data(cfg, CHARS, tmp_path / "run")
    alone = prepare_data(DatasetConfig(**{**cfg.__dict__, "mix": []}), CHARS)
    assert data.valid.src_text == alone.valid.src_text and data.test.tgt_text == alone.test.tgt_text
    assert (tmp_path / "run" / "split" / "valid.tsv").read_text().count("\n") == len(alone.valid)
    parts = data.mixture.parts
    assert [p.weight for p in parts] == [1.0, 0.5, 2.0] and parts[-1].stop == len(data.train)
    assert parts[0].stop == len(alone.train)  # the first corpus's training pairs, all of them
    held_out = set(data.valid.tgt_text) | set(data.test.tgt_text)
    targets = data.vocab.decode_tgt(data.train.tgt_ids.tolist())
    assert not held_out & set(targets)
    left_out = [c["left_out_as_held_out"] for c in data.stats["mixture"][1:]]
    assert left_out[0] > 0  # the zip shares sentences with the first corpus's held-out pairs
    assert len(data.train) == len(alone.train) + sum(c["train"] for c in data.stats["mixture"][1:])
    sources = data.vocab.decode_src(data.train.src_ids.tolist())
    tagged = sources[parts[2].start:parts[2].stop]
    assert all(s.startswith("<bt> ") for s in tagged) and not any(s.startswith("<bt>") for s in sources[:200])


def test_one_tokenizer_is_trained_for_all_corpora_and_kept(tmp_path: Path, corpora: dict[str, Path],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    cfg = mixed_config(tmp_path, corpora)
    first = prepare_data(cfg, CHARS)
    assert "ö" in first.vocab.src.get_vocab() and "<" in first.vocab.src.get_vocab()  # German; the tag
    with caplog.at_level("INFO"):
        again = prepare_data(cfg, CHARS)
    assert again.vocab.to_json() == first.vocab.to_json() and "cache miss" not in caplog.text
    assert len(list((tmp_path / "cache" / "mixtures").iterdir())) == 1


def test_a_given_tokenizer_is_used_as_it_is(tmp_path: Path, corpora: dict[str, Path]) -> None:
    """Fine-tuning on a mixture: the parent's tokenizer encodes every corpus; none is trained."""
    given = train_tokenizers(CHARS, ["abc defg"], ["hij klm"])
    data = prepare_data(mixed_config(tmp_path, corpora), CHARS, vocab=given)
    assert data.vocab.to_json() == given.to_json() and not (tmp_path / "cache" / "mixtures").exists()


def test_training_on_a_mixture_logs_its_corpora_and_resumes_exactly(
        tmp_path: Path, corpora: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    mix = (f"dataset.mix=[{{name:tatoeba,path:'{corpora['zip']}',weight:0.5}},"
           f"{{name:parallel,path:'{corpora['tsv']}',weight:2,tag:'<bt>'}}]")
    common = ["debug=smoke", "tokenizer=char", "dataset=parallel", f"dataset.src_path={corpora['src']}",
              f"dataset.tgt_path={corpora['tgt']}", "dataset.tgt_lang=de", "dataset.valid_size=20",
              "dataset.test_size=20", f"dataset.cache_dir={tmp_path / 'cache'}", mix, "training.epochs=2",
              "training.valid_max_sentences=4", "device.num_threads=1"]
    straight = tmp_path / "straight"
    with caplog.at_level("INFO"):
        tmt.train([*common, f"checkpoint.dir={straight}"])
    assert re.search(r"epoch 2: \d+ training pairs: \d+ of first.en, first.de \(weight 1\), \d+ of "
                     r"deu-eng.zip \(weight 0.5\), \d+ of bt.tsv \(weight 2\)", caplog.text)
    assert "mixed in deu-eng.zip" in caplog.text
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copyfile(straight / "epoch_001.pt", resumed / "latest.pt")
    tmt.train([f"resume={resumed}"])
    want, got = (load_checkpoint(run / "epoch_002.pt") for run in (straight, resumed))
    assert got["step"] == want["step"]
    for name, tensor in want["model"].items():
        assert torch.equal(got["model"][name], tensor), f"{name} differs after resume"


@pytest.mark.parametrize(("mix", "expected"), [
    ({"name": "parallel", "path": "x.tsv", "weight": 0.0}, r"dataset.mix\[0\].weight=0.0 is out of range"),
    ({"name": "tatoeba"}, r"dataset.mix\[0\]: dataset=tatoeba needs dataset.mix\[0\].path="),
    ({"name": "opus_books"}, r"dataset.mix\[0\].name='opus_books' is not allowed"),
    ({"name": "parallel", "path": "x.tsv", "tag": "a\tb"}, "give a tag of visible text on one line"),
])
def test_bad_corpora_are_refused_in_one_line(mix: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        DatasetConfig(mix=[MixedCorpus(**mix)]).check()  # type: ignore[arg-type]


def test_a_corpus_without_pairs_and_the_command_line_say_it_in_one_line(
        tmp_path: Path, corpora: dict[str, Path]) -> None:
    empty = write_lines(tmp_path / "empty.tsv", ["", ""])
    cfg = mixed_config(tmp_path, corpora)
    cfg.mix = [MixedCorpus(name="parallel", path=str(empty))]
    with pytest.raises(DataError, match="empty.tsv holds no pairs") as info:
        prepare_data(cfg, CHARS)
    assert "\n" not in str(info.value)
    result = run_cli("train", "dataset=parallel", f"dataset.path={corpora['tsv']}",
                     "dataset.mix=[{name:parallel,path:x.tsv,weight:-1}]")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "dataset.mix[0].weight=-1.0 is out of range" in result.stderr.strip().splitlines()[-1]
