"""The model card of an export: the Hub's metadata holds what the run recorded, and nothing it did not."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from transformer_mt.interop.card import card_text, corpus_of

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"


def _state(**dataset: object) -> dict:
    return {"step": 1234, "overrides": ["experiment=tatoeba_cpu", "seed=2"],
            "config": {"dataset": {"name": "tatoeba", "src_lang": "en", "tgt_lang": "fr", **dataset},
                       "model": {"d_model": 256, "encoder_layers": 3, "decoder_layers": 3,
                                 "max_positions": 128}}}


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_the_card_carries_the_runs_evaluations_with_their_signatures(tmp_path: Path) -> None:
    (tmp_path / "eval").mkdir()
    record = {"set": "test", "search": "beam5", "bleu": 41.9612, "chrf": 60.93, "n": 2000,
              "bleu_signature": SIGNATURE, "chrf_signature": "nrefs:1|nc:6"}
    (tmp_path / "eval" / "test.best.beam5.json").write_text(json.dumps(record))
    (tmp_path / "eval" / "broken.json").write_text("{not json")
    text = card_text(_state(), tmp_path, "pegasus", 7_600_000)
    meta = _front_matter(text)
    assert meta["language"] == ["en", "fr"] and meta["license"] == "cc-by-2.0"
    (result,) = meta["model-index"][0]["results"]
    bleu, chrf = result["metrics"]
    assert (bleu["type"], bleu["value"], bleu["args"]["signature"]) == ("bleu", 41.96, SIGNATURE)
    assert (chrf["type"], chrf["value"]) == ("chrf", 60.93)
    assert result["dataset"]["split"] == "test"
    assert "transformer-mt train experiment=tatoeba_cpu seed=2" in text
    assert "| test | beam5 | 2000 | 41.96 | 60.93 |" in text and "7,600,000 parameters" in text


def test_a_run_never_evaluated_has_no_model_index(tmp_path: Path) -> None:
    meta = _front_matter(card_text(_state(), tmp_path, "marian", 10))
    assert "model-index" not in meta and "## Evaluation" not in card_text(_state(), tmp_path, "marian", 10)


def test_the_users_own_files_claim_no_licence() -> None:
    corpus = corpus_of({"name": "parallel", "src_path": "/data/x.en.gz", "tgt_path": "/data/x.de.gz"})
    assert corpus.licence == "other" and corpus.hub_id is None and "x.en.gz" in corpus.source
    assert corpus_of({"name": "hf", "hf_path": "wmt14"}).hub_id == "wmt14"
