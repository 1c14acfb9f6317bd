"""Several target languages in one model (data/languages.py): the tokens the tokenizer reserves, the
sources each corpus and held-out part starts with, held-out parts no training pair leaks into, the
validation of each direction, and `tgt_lang=` where a model is used; checked against independent
references (the ids built by hand, sacrebleu on the written files, decoding with the token put in by
hand) and bad languages refused in one line."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sacrebleu
import torch

import transformer_mt as tmt
from tests.conftest import ROOT, missing, require, smoke_overrides
from transformer_mt.config import ConfigError, DatasetConfig, DecodingConfig, MixedCorpus, TokenizerConfig
from transformer_mt.data import Ragged, load_split_tsv, prepare_data
from transformer_mt.data.languages import prefixed, split_file
from transformer_mt.data.tokenizer import SPECIAL_TOKENS, train_tokenizers
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.translator import Translator

GERMAN = ROOT.parent / "shared" / "data" / "deu-eng.zip"


def _every_40th(zip_path: Path, member: str, out: Path) -> Path:
    with zipfile.ZipFile(zip_path) as z:
        out.write_text("\n".join(z.read(member).decode("utf-8").splitlines()[::40]) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def small(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Every 40th pair of Tatoeba en-fr and en-de, as fra.txt and deu.txt: the tests read each corpus
    whole, and all of it would take seconds a test."""
    if not GERMAN.is_file():
        missing("Tatoeba en-de not found at ../shared/data/deu-eng.zip")
    folder = tmp_path_factory.mktemp("tatoeba")
    french = _every_40th(corpus, "fra.txt", folder / "fra.txt")
    return french, _every_40th(GERMAN, "deu.txt", folder / "deu.txt")


def _two_targets(corpus: Path, german: Path, run_dir: Path, **extra: object) -> list[str]:
    """A smoke run of en→fr (the dataset) and en→de (a corpus of the mix with a target of its own)."""
    mix = f"dataset.mix=[{{name:tatoeba,path:'{german}',tgt_lang:de,max_pairs:300}}]"
    return [*smoke_overrides(corpus, run_dir, **{"dataset.max_pairs": 300, "dataset.valid_size": 30,
                                                 "dataset.test_size": 30, "training.epochs": 2,
                                                 "training.valid_max_sentences": 20, **extra}), mix]


@pytest.fixture(scope="module")
def two_targets(small: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("languages") / "run"
    tmt.train(_two_targets(*small, run_dir))
    return run_dir


def test_the_tokenizer_reserves_a_token_for_each_language_that_text_never_spells() -> None:
    cfg = TokenizerConfig(kind="bpe", vocab_size=400)
    vocab = train_tokenizers(cfg, ["Where is <2fr> the station?"] * 5, ["Où est la gare ?"] * 5, ["fr", "de"])
    assert vocab.target_languages == ("fr", "de")
    first = len(SPECIAL_TOKENS)  # the ids right after <pad>, <bos>, <eos>, <unk>
    assert [vocab.language_id(lang) for lang in ("fr", "de")] == [first, first + 1]
    assert vocab.language_id("fr") not in vocab.encode_src(["Where is <2fr> the station?"])[0]  # typed: text
    assert vocab.decode_src([[vocab.language_id("de"), *vocab.encode_src(["Where"])[0]]]) == ["Where"]
    with pytest.raises(ConfigError, match=r"tgt_lang='es': this model has no <2es> token \(its target "
                                          r"languages: fr, de\)") as info:
        vocab.language_id("es")
    assert "\n" not in str(info.value)
    assert train_tokenizers(cfg, ["a b"], ["c d"]).target_languages == ()


def test_prefixed_puts_the_token_before_each_sequence() -> None:
    seqs = [[5, 6], [], [7, 8, 9]]
    ids = Ragged.from_offsets(np.array([i for s in seqs for i in s], dtype=np.int32),
                              np.concatenate([[0], np.cumsum([len(s) for s in seqs])]))
    assert prefixed(ids[1:], 4).tolist() == [[4], [4, 7, 8, 9]]  # a slice: starts not at 0
    assert prefixed(ids, 4).tolist() == [[4, *s] for s in seqs]


def test_each_corpus_and_held_out_part_starts_with_its_language_and_nothing_leaks(
        small: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, german = small
    cfg = DatasetConfig(path=str(corpus), url=None, max_pairs=400, valid_size=40, test_size=40,
                        cache_dir=str(tmp_path / "cache"),
                        mix=[MixedCorpus(name="tatoeba", path=str(german), tgt_lang="de", max_pairs=400)])
    data = prepare_data(cfg, TokenizerConfig(vocab_size=500), tmp_path / "run")
    fr, de = (data.vocab.language_id(lang) for lang in ("fr", "de"))
    assert data.vocab.target_languages == ("fr", "de") and set(data.directions) == {"fr", "de"}
    first, second = data.mixture.parts
    firsts = [ids[0] for ids in data.train.src_ids]
    assert set(firsts[first.start:first.stop]) == {fr} and set(firsts[second.start:second.stop]) == {de}
    for lang, token in (("fr", fr), ("de", de)):
        for part, split in zip(("valid", "test"), data.directions[lang]):
            assert {ids[0] for ids in split.src_ids} == {token}
            written = load_split_tsv(split_file(tmp_path / "run", part, lang))
            assert written == (split.src_text, split.tgt_text)
    english = set(data.vocab.decode_src([ids[1:] for ids in data.train.src_ids.tolist()]))
    held_out = {s for valid, test in data.directions.values() for s in valid.src_text + test.src_text}
    assert english and not english & held_out  # no English sentence of any held-out part is trained on


def test_one_target_needs_no_token_and_several_sources_share_it(small: tuple[Path, Path],
                                                                tmp_path: Path) -> None:
    """fr→en and de→en into one model: one target language, no token."""
    corpus, german = small
    cfg = DatasetConfig(path=str(corpus), url=None, src_lang="fr", tgt_lang="en", max_pairs=300,
                        valid_size=30, test_size=30, cache_dir=str(tmp_path / "cache"),
                        mix=[MixedCorpus(name="tatoeba", path=str(german), src_lang="de", max_pairs=300)])
    data = prepare_data(cfg, TokenizerConfig(vocab_size=500))
    assert data.vocab.target_languages == () and not data.directions
    assert "ß" in "".join(data.vocab.decode_src(data.train.src_ids.tolist()))  # German sources are in


def test_training_validates_each_direction_and_keeps_the_best_mean(two_targets: Path) -> None:
    records = [json.loads(line) for line in (two_targets / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in records if "bleu_fr" in r]
    assert validations
    for r in validations:
        assert r["bleu"] == pytest.approx((r["bleu_fr"] + r["bleu_de"]) / 2)
    log = (two_targets / "train.log").read_text()
    assert re.search(r"valid: loss [\d.]+, BLEU [\d.]+, .*; fr: BLEU [\d.]+, chrF [\d.]+; de: BLEU", log)
    best = json.loads((two_targets / "result.json").read_text())["best_bleu"]
    assert best == pytest.approx(max(r["bleu"] for r in validations))  # the mean of the directions


def test_translate_into_each_language_as_the_token_put_in_by_hand(two_targets: Path) -> None:
    engine = Translator.from_checkpoint(two_targets, device="cpu", amp="off",
                                        decoding=DecodingConfig(beam_size=1))
    sources = load_split_tsv(split_file(two_targets, "valid", "de"))[0][:8]
    for lang in ("fr", "de"):
        token = engine.vocab.language_id(lang)
        ids = [[token, *seq] for seq in engine.vocab.encode_src(sources)]
        by_hand = decode_ids(engine.model, ids, DecodingConfig(beam_size=1), torch.device("cpu"))
        expected = engine.vocab.decode_tgt([h[0].tokens for h in by_hand])
        assert engine.translate(sources, beam_size=1, tgt_lang=lang) == expected
    assert engine.tgt_lang == "fr"  # the run's dataset.tgt_lang unless a call or the config names one
    with pytest.raises(ConfigError, match="tgt_lang='es': this model has no <2es> token"):
        engine.translate("Hello.", tgt_lang="es")


def test_evaluate_scores_the_language_asked_for_on_its_own_split(two_targets: Path, tmp_path: Path) -> None:
    tmt.evaluate([f"checkpoint={two_targets}", "tgt_lang=de", "decoding.beam_size=1",
                  f"output_dir={tmp_path}"])
    [report] = [json.loads(p.read_text()) for p in tmp_path.glob("test.de.*.json")]
    hypotheses = next(tmp_path.glob("test.de.*.hyp.txt")).read_text(encoding="utf-8").splitlines()
    _, references = load_split_tsv(split_file(two_targets, "test", "de"))
    assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)


def test_a_language_the_model_lacks_is_one_line_everywhere(two_targets: Path, tiny_run: Path,
                                                           run_cli_here: Callable[..., Any]) -> None:
    for args in (("translate", f"checkpoint={two_targets}", "tgt_lang=es", "text=Hello."),
                 ("evaluate", f"checkpoint={two_targets}", "tgt_lang=es"),
                 ("translate", f"checkpoint={tiny_run}", "tgt_lang=de", "text=Hello.")):
        result = run_cli_here(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr, args
        last = result.stderr.strip().splitlines()[-1]
        assert "tgt_lang=" in last and ("<2es>" in last or "into fr only" in last), last
    assert run_cli_here("translate", f"checkpoint={tiny_run}", "tgt_lang=fr", "text=Hello.").returncode == 0


def test_fine_tuning_a_model_of_one_target_on_two_is_refused_in_one_line(
        small: tuple[Path, Path], tiny_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no token for target language") as info:
        tmt.train([*_two_targets(*small, tmp_path / "run"), f"init={tiny_run}"])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("lang", "expected"), [("f r", "cannot name a language token"),
                                                 ("<de>", "cannot name a language token")])
def test_a_language_that_cannot_name_a_token_is_refused(lang: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        DatasetConfig(mix=[MixedCorpus(name="parallel", path="x.tsv", tgt_lang=lang)]).check()


def test_serve_takes_the_language_with_each_request(two_targets: Path) -> None:
    require("fastapi")
    from fastapi.testclient import TestClient

    from transformer_mt.serve.app import create_app

    cfg = tmt.compose("serve", [f"checkpoint={two_targets}", "device=cpu", "device.num_threads=1",
                                "allowed_hosts=[testserver]", "decoding.beam_size=1"])
    engine = Translator.from_checkpoint(two_targets, device="cpu", decoding=cfg.decoding, amp="off")
    sources = load_split_tsv(split_file(two_targets, "valid", "de"))[0][:4]
    with TestClient(create_app(engine, cfg)) as client:
        assert client.get("/health").json()["languages"] == {"source": "en", "target": "fr",
                                                             "targets": ["fr", "de"]}
        for lang in ("fr", "de"):
            answer = client.post("/translate", json={"text": sources, "tgt_lang": lang})
            assert answer.status_code == 200
            assert answer.json()["translations"] == engine.translate(sources, tgt_lang=lang)
        refused = client.post("/translate", json={"text": sources, "tgt_lang": "es"})
        assert refused.status_code == 422 and "<2es>" in refused.json()["error"]


def test_a_ctranslate2_export_keeps_the_languages(two_targets: Path, tmp_path: Path) -> None:
    """The export's vocabulary holds the language tokens and its metadata the default target: each
    language's greedy translations are PyTorch's (float32)."""
    require("ctranslate2")
    from transformer_mt.decoding.ct2 import CT2Translator
    from transformer_mt.interop.ct2_export import export_ctranslate2

    model_dir = export_ctranslate2(two_targets, tmp_path / "ct2", quantization="float32")
    greedy = DecodingConfig(beam_size=1)
    engine = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=greedy)
    reference = Translator.from_checkpoint(two_targets, device="cpu", amp="off", decoding=greedy)
    sources = load_split_tsv(split_file(two_targets, "valid", "de"))[0][:8]
    assert engine.tgt_lang == reference.tgt_lang == "fr"
    for lang in ("fr", "de"):
        assert engine.translate(sources, tgt_lang=lang) == reference.translate(sources, tgt_lang=lang)
    with pytest.raises(ConfigError, match="<2es>"):
        engine.translate("Hello.", tgt_lang="es")
