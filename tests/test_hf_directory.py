"""`export format=hf` and `init=<a Hugging Face directory>` (interop/hf.py, hf_import.py), end to end: a
fitted model of each architecture, exported, loads with AutoModelForSeq2SeqLM and AutoTokenizer and
translates greedily token for token as our search does; the directory comes back as the same weights and
tokenizer; what cannot go there or come back is refused in one line, nothing half-written."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import ARCHITECTURES, fitted_checkpoint, require, tiny_overrides
from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import ConfigError, DecodingConfig
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import CheckpointError, ExportError

require("transformers")

from transformer_mt.decoding.search import gnmt_slope as length_exponent  # noqa: E402
from transformer_mt.interop import hf_import  # noqa: E402
from transformer_mt.interop.generate import ExportedModel  # noqa: E402
from transformer_mt.interop.hf import export_hf  # noqa: E402


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def fitted(request: pytest.FixtureRequest, fitted_model,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """(model_type, our run, its format=hf export) of a post-norm (Marian) and a pre-norm (Pegasus) model."""
    run = fitted_model(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, run, export_hf(run, run / "hf")


def test_generate_greedy_is_our_search_token_for_token(fitted: tuple[str, Path, Path],
                                                       fit_pairs: tuple[list[str], list[str]]) -> None:
    model_type, run, exported = fitted
    assert json.loads((exported / "config.json").read_text())["model_type"] == model_type
    sources = fit_pairs[0][-40:]
    ours = Translator.from_checkpoint(run, device="cpu", amp="off", decoding=DecodingConfig(beam_size=1))
    expected = ours.translate(sources, input_case="model")
    assert sum(bool(t) for t in expected) >= 30  # real outputs, not empty ones that agree trivially
    assert ExportedModel.load(exported).translate(sources) == expected


def test_init_takes_the_directory_back_as_the_same_model(fitted: tuple[str, Path, Path],
                                                         fit_pairs: tuple[list[str], list[str]]) -> None:
    _, run, exported = fitted
    _, _, model, vocab = model_from_checkpoint(run)
    state = hf_import.parent_state(exported, {"src_lang": "en", "tgt_lang": "fr"})
    for key, tensor in model.state_dict().items():
        assert torch.equal(state["model"][key], tensor), key
    back = Vocabulary.from_json(state["tokenizer"])
    assert back.encode_src(fit_pairs[0][:50]) == vocab.encode_src(fit_pairs[0][:50])


def test_a_fine_tuning_run_starts_from_the_exported_run(tiny_run: Path, corpus: Path, tmp_path: Path) -> None:
    """`train init=<hf dir>` through the command line's composition: the run's first weights are the
    exported run's."""
    from transformer_mt.jobs.train import build_trainer

    exported = export_hf(tiny_run, tmp_path / "hf")
    _, _, parent, _ = model_from_checkpoint(tiny_run)
    overrides = tiny_overrides(corpus, tmp_path / "run", init=exported)
    trainer = build_trainer(tmt.compose("train", overrides), tmp_path / "run", overrides)
    for key, tensor in parent.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[key], tensor), key


def test_train_init_an_exported_directory_through_the_command_line(tiny_run: Path, corpus: Path,
                                                                  tmp_path: Path, run_cli_here) -> None:
    """The documented round trip: `export format=hf`, then `train init=<that directory>`; the command line
    checks the directory before torch is imported as it checks a checkpoint's header."""
    exported = export_hf(tiny_run, tmp_path / "hf")
    overrides = tiny_overrides(corpus, tmp_path / "run", init=exported, **{"training.epochs": 1})
    done = run_cli_here("train", *overrides)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "latest.pt").is_file()
    (exported / "config.json").write_text(json.dumps({**json.loads((exported / "config.json").read_text()),
                                                       "model_type": "bert"}))
    refused = run_cli_here("train", *tiny_overrides(corpus, tmp_path / "again", init=exported))
    assert refused.returncode != 0 and "model_type 'bert'" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "again" / "latest.pt").exists()


def test_what_the_classes_cannot_hold_is_refused_in_one_line(fit_pairs: tuple[list[str], list[str]],
                                                             tmp_path: Path) -> None:
    run, _ = fitted_checkpoint(fit_pairs, tmp_path / "learned", steps=1, positional="learned")
    with pytest.raises(ExportError, match="model.positional=learned") as info:
        export_hf(run, tmp_path / "out")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def test_an_existing_output_dir_is_refused_unless_overwrite(fitted: tuple[str, Path, Path]) -> None:
    _, run, exported = fitted
    before = sorted((p.name, p.stat().st_mtime_ns) for p in exported.iterdir())
    with pytest.raises(ExportError, match="overwrite=true") as info:
        export_hf(run, exported)
    assert "\n" not in str(info.value)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in exported.iterdir()) == before


def test_a_missing_extra_names_how_to_install_it(fitted: tuple[str, Path, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'transformer-mt\[hf\]'") as info:
        export_hf(fitted[1], tmp_path / "out")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()


def _foreign(exported: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(exported, target)
    return target


@pytest.mark.parametrize("damage, message", [
    ("bert", "model_type 'bert' is not one of marian, pegasus"),
    ("not json", "config.json is not valid JSON"),
    ("no d_model", "config.json lacks d_model"),
    ("opus-mt", "SentencePiece models source.spm, target.spm, as OPUS-MT ships: not supported"),
    ("truncated weights", "model.safetensors is damaged"),
    ("output bias", "final_logits_bias"),
    ("huge config", "its model_config breaks|d_model=.* is out of range|out of range"),
    ("fewer weights", r"describe a model of [\d,]+ parameters .* its model.safetensors holds"),
    ("a pickle", r"no model.safetensors \(pytorch_model.bin is not loaded"),
    ("crafted splitter", "tokenizer.json.pre_tokenizer is .*, expected the pre_tokenizer transformer-mt"),
])
def test_a_foreign_or_corrupt_directory_is_refused_in_one_line(fitted: tuple[str, Path, Path], tmp_path: Path,
                                                                damage: str, message: str) -> None:
    directory = _foreign(fitted[2], tmp_path, "hf")
    config = json.loads((directory / "config.json").read_text())
    if damage == "bert":
        (directory / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    elif damage == "not json":
        (directory / "config.json").write_text("{\"model_type\": ")
    elif damage == "no d_model":
        del config["d_model"]
        (directory / "config.json").write_text(json.dumps(config))
    elif damage == "opus-mt":
        (directory / "tokenizer.json").unlink()
        for name in ("source.spm", "target.spm"):
            (directory / name).write_bytes(b"\x00")
    elif damage == "truncated weights":
        weights = directory / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "huge config":
        (directory / "config.json").write_text(json.dumps({**config, "d_model": 10**6}))
    elif damage == "fewer weights":
        (directory / "config.json").write_text(json.dumps({**config, "encoder_layers": 60}))
    elif damage == "a pickle":
        (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    elif damage == "crafted splitter":
        tokenizer = json.loads((directory / "tokenizer.json").read_text())
        tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
                                      "invert": False}
        (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    else:
        from safetensors.torch import load_file, save_file

        weights = load_file(str(directory / "model.safetensors"))
        weights["final_logits_bias"] = torch.ones_like(weights["final_logits_bias"])
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"^init={directory}: .*{message}") as info:
        hf_import.parent_state(directory, {"src_lang": "en", "tgt_lang": "fr"})
    assert "\n" not in str(info.value)


def test_generate_beam_search_mostly_ranks_as_ours(fitted: tuple[str, Path, Path],
                                                   fit_pairs: tuple[list[str], list[str]]) -> None:
    """Beam 5 under generate's length penalty with the exponent nearest GNMT's: the same 1-best on nearly
    every sentence (a hypothesis finishing between the two penalties' rankings may differ)."""
    _, run, exported = fitted
    sources = fit_pairs[0][-40:]
    ours = Translator.from_checkpoint(run, device="cpu", amp="off", decoding=DecodingConfig(beam_size=5))
    expected = ours.translate(sources, input_case="model")
    theirs = ExportedModel.load(exported).translate(sources, num_beams=5)
    assert sum(a == b for a, b in zip(theirs, expected)) >= 36


def test_the_length_exponent_has_gnmts_slope_at_the_source_length() -> None:
    alpha, n, h = 0.6, 12, 1e-6
    gnmt_slope = (alpha * math.log(5 + n * math.exp(h)) - alpha * math.log(5 + n)) / h  # d/d(log length)
    assert length_exponent(n, alpha) == pytest.approx(gnmt_slope, rel=1e-4)


def test_the_command_line_exports_and_refuses_in_one_line(fitted: tuple[str, Path, Path], tmp_path: Path,
                                                          run_cli_here) -> None:
    """`transformer-mt export format=hf`: the directory's path on stdout; then the same output_dir again,
    refused in one line (no traceback), the export untouched."""
    _, run, _ = fitted
    result = run_cli_here("export", f"checkpoint={run}", "format=hf", f"output_dir={tmp_path / 'hf'}")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).resolve() == (tmp_path / "hf").resolve()
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    again = run_cli_here("export", f"checkpoint={run}", "format=hf", f"output_dir={tmp_path / 'hf'}")
    assert again.returncode != 0 and "overwrite=true" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr


def test_format_onnx_without_its_extra_names_how_to_install_it(fitted: tuple[str, Path, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_mt.interop.onnx import export_onnx

    monkeypatch.setitem(sys.modules, "optimum.exporters.onnx", None)
    with pytest.raises(ConfigError, match=r"pip install 'transformer-mt\[onnx\]'") as info:
        export_onnx(fitted[1], tmp_path / "out")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists()
