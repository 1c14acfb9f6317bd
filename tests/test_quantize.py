"""int8 decoding (decoding.quantize=int8, runtime/quantize.py): every linear layer of a copy of the model in
int8, its logits close to float32's, the search's own rules kept, the float model untouched, and each thing
it cannot run with refused in one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import transformer_mt as tmt
from tests.conftest import require
from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import DecodingConfig
from transformer_mt.data import collate, pad_sources
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.search import greedy_search
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ConfigError
from transformer_mt.runtime import quantize

CPU = torch.device("cpu")
INT8 = DecodingConfig(quantize="int8")
Pairs = tuple[list[str], list[str]]  # sources, their targets


@pytest.fixture(scope="module")
def fitted_run(fitted_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model fitted for a few seconds (conftest.fitted_checkpoint): real words, of varied lengths."""
    return fitted_model("marian", tmp_path_factory.mktemp("int8"))


@pytest.fixture(scope="module")
def float_engine(fitted_run: Path) -> Translator:
    return Translator.from_checkpoint(fitted_run, device="cpu", amp="off")


@pytest.fixture(scope="module")
def int8_engine(fitted_run: Path) -> Translator:
    return Translator.from_checkpoint(fitted_run, device="cpu", decoding=INT8)


@pytest.fixture(scope="module")
def pairs(fit_pairs: Pairs) -> Pairs:
    return fit_pairs[0][:40], fit_pairs[1][:40]


def relative_error(found: torch.Tensor, exact: torch.Tensor) -> float:
    return ((found - exact).norm() / exact.norm()).item()


def teacher_forced(model: nn.Module, engine: Translator, pairs: Pairs) -> torch.Tensor:
    """Each target token's logits (tokens, V), the pairs in one batch."""
    batch = collate(engine.encode(pairs[0]), engine.vocab.encode_tgt(pairs[1]), PAD_ID)
    with torch.inference_mode():
        return model(batch.src, batch.tgt_in)[batch.tgt_out != PAD_ID]


def test_every_linear_layer_is_int8_and_the_logits_stay_close(float_engine: Translator,
                                                              int8_engine: Translator, pairs: Pairs) -> None:
    """Each nn.Linear of the float model has an int8 counterpart; teacher-forced logits differ from
    float32's by the rounding of 8 bits (about 2%), far less than a wrong scale makes them, and not at all
    where nothing was quantized."""
    linears = sum(isinstance(m, nn.Linear) for m in float_engine.model.modules())
    assert linears > 0 and not any(isinstance(m, nn.Linear) for m in int8_engine.model.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear)
               for m in int8_engine.model.modules()) == linears
    exact = teacher_forced(float_engine.model, float_engine, pairs)
    rounded = teacher_forced(int8_engine.model, int8_engine, pairs)
    assert 1e-3 < relative_error(rounded, exact) < 0.04
    assert (rounded.argmax(-1) == exact.argmax(-1)).float().mean() > 0.9
    assert str(int8_engine.precision).startswith("int8 linear layers, float32 elsewhere")
    assert int8_engine.precision.dtype is None  # no autocast around the int8 kernels


def test_the_float_model_is_left_as_it_was(fitted_run: Path) -> None:
    _, _, model, _ = model_from_checkpoint(fitted_run)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = [type(m) for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.ao's deprecation warnings are silenced where it is called
        copy = quantize.quantized(model)
    assert copy is not model and [type(m) for m in model.modules()] == kinds
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)


# -- the search under int8 ---------------------------------------------------------------------------------
def test_beam_one_is_greedy_under_int8(int8_engine: Translator, pairs: Pairs) -> None:
    src = pad_sources(int8_engine.encode(pairs[0]), PAD_ID)
    with torch.inference_mode():
        greedy = greedy_search(int8_engine.model, src, bos_id=BOS_ID, eos_id=EOS_ID)
        beam = beam_search(int8_engine.model, src, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=1)
    assert [h[0].tokens for h in beam] == [h[0].tokens for h in greedy]
    assert len({len(h[0].tokens) for h in greedy}) > 3  # real, varied outputs


def incremental(model: nn.Module, engine: Translator, pairs: Pairs) -> torch.Tensor:
    """teacher_forced's logits, one target position a step through the decoder's key/value cache (the
    search's way, the output projection included)."""
    batch = collate(engine.encode(pairs[0]), engine.vocab.encode_tgt(pairs[1]), PAD_ID)
    with torch.inference_mode():
        memory, src_pad = model.encode(batch.src)
        cache = model.new_cache()
        steps = [model.decode(batch.tgt_in[:, t:t + 1], memory, src_pad, cache)
                 for t in range(batch.tgt_in.size(1))]
    return torch.cat(steps, dim=1)[batch.tgt_out != PAD_ID]


@pytest.mark.parametrize(("quantize", "bound"), [("none", 1e-5), ("int8", 0.04)])
def test_cached_steps_and_one_by_one_equal_the_batched_pass(quantize: str, bound: float,
                                                            float_engine: Translator, int8_engine: Translator,
                                                            pairs: Pairs) -> None:
    """The search's cache and its batches give the model's own logits: to float32's rounding; under int8
    within the rounding of 8 bits, since each call quantizes its input with one scale taken from all of it
    (a sentence's rows in a batch of others, a step's rows against the whole prefix's)."""
    engine = int8_engine if quantize == "int8" else float_engine
    whole = teacher_forced(engine.model, engine, pairs)
    assert relative_error(incremental(engine.model, engine, pairs), whole) < bound
    alone = torch.cat([teacher_forced(engine.model, engine, ([s], [t])) for s, t in zip(*pairs)])
    assert relative_error(alone, whole) < bound


def test_int8_translations_are_deterministic(int8_engine: Translator, pairs: Pairs) -> None:
    assert int8_engine.translate(pairs[0], beam_size=3) == int8_engine.translate(pairs[0], beam_size=3)


# -- what int8 cannot run with: one line each -------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "expected"), [
    (["device.amp=bf16"], "decoding.quantize=int8 runs the layers around its int8 kernels in float32, not "
                          "device.amp=bf16"),
    (["device.amp=fp16"], "not device.amp=fp16"),
    (["device=cuda"], "decoding.quantize=int8 runs on the CPU (PyTorch's int8 kernels are CPU kernels), "
                      "not on cuda"),
    (["engine=ctranslate2", "model_dir=/nonexistent"], "decoding.quantize=int8 runs on engine=pytorch; "
                                                        "CTranslate2 computes in the type its export chose"),
])
def test_what_int8_cannot_run_with_is_one_line(run_cli_here, fitted_run: Path, overrides: list[str],
                                               expected: str) -> None:
    result = run_cli_here("translate", f"checkpoint={fitted_run}", "decoding.quantize=int8", *overrides,
                          "text=Hello.")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and expected in result.stderr


def test_evaluate_and_serve_refuse_the_same(run_cli_here, fitted_run: Path) -> None:
    for command in ("evaluate", "serve"):
        result = run_cli_here(command, f"checkpoint={fitted_run}", "decoding.quantize=int8",
                              "device.amp=bf16")
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "not device.amp=bf16" in result.stderr
    result = run_cli_here("evaluate", f"checkpoint={fitted_run}", "decoding.quantize=int4")
    assert result.returncode == 2 and "decoding.quantize='int4' is not allowed; choose one of: none, int8" \
        in result.stderr


def test_a_torch_without_an_x86_int8_engine_is_one_line(run_cli_here, fitted_run: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "_supported_engines", lambda: ["qnnpack", "none"])
    result = run_cli_here("translate", f"checkpoint={fitted_run}", "device=cpu", "decoding.quantize=int8",
                          "text=Hello.")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert ("decoding.quantize=int8 needs a torch build with an x86 int8 engine (x86 or fbgemm or onednn); "
            "this one has qnnpack, none") in result.stderr


def test_a_device_resolved_to_a_gpu_and_a_call_asking_for_int8_are_refused(float_engine: Translator) -> None:
    with pytest.raises(ConfigError, match="runs on the CPU .* not on cuda"):
        quantize.decoding_precision("int8", "auto", torch.device("cuda"))  # device=auto on a GPU machine
    assert quantize.decoding_precision("int8", "off", CPU).int8
    with pytest.raises(ConfigError, match="chosen when it loads"):
        float_engine.translate("Hello.", quantize="int8")


# -- the commands take it ----------------------------------------------------------------------------------
def test_translate_takes_it(run_cli_here, fitted_run: Path, int8_engine: Translator,
                            pairs: Pairs) -> None:
    lines = pairs[0][:6]
    result = run_cli_here("translate", f"checkpoint={fitted_run}", "device=cpu", "decoding.quantize=int8",
                          input="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == int8_engine.translate(lines)  # the same batch: the same rounding


def test_evaluate_takes_it_and_says_so(fitted_run: Path, pairs: Pairs,
                                       tmp_path: Path) -> None:
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(*pairs)), encoding="utf-8")
    bleu = tmt.evaluate([f"checkpoint={fitted_run}", "device=cpu", "decoding.quantize=int8",
                         f"tsv_file={tsv}", "decoding.beam_size=2", f"output_dir={tmp_path / 'eval'}"])
    report = json.loads(next((tmp_path / "eval").glob("*.beam2.json")).read_text())
    assert report["bleu"] == bleu > 0 and report["decoding"]["quantize"] == "int8"
    assert report["amp"].startswith("int8 linear layers")


def test_serve_takes_it_and_says_so(fitted_run: Path, int8_engine: Translator,
                                    pairs: Pairs) -> None:
    require("fastapi")
    from fastapi.testclient import TestClient

    from transformer_mt.decoding.engine import load_engine
    from transformer_mt.serve.app import create_app

    cfg = tmt.compose("serve", [f"checkpoint={fitted_run}", "device=cpu", "decoding.quantize=int8",
                                "allowed_hosts=[testserver]"])
    with TestClient(create_app(load_engine(cfg), cfg)) as client:
        body = client.post("/translate", json={"text": pairs[0][:3]}).json()
        assert body["translations"] == int8_engine.translate(pairs[0][:3], beam_size=cfg.decoding.beam_size)
        assert client.get("/health").json()["precision"].startswith("int8 linear layers")
