"""Mixed precision: device.amp=auto picks bf16 where the processor has it, and bf16 runs on any CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import tiny_overrides
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import DeviceConfig
from transformer_mt.decoding.translator import Translator
from transformer_mt.runtime import device as runtime

CPU = torch.device("cpu")


@pytest.mark.parametrize(("flags", "torch_agrees", "expected"), [
    ({"avx2", "avx512f", "avx512_bf16"}, True, "avx512_bf16"),
    ({"avx512_bf16", "amx_bf16", "amx_tile"}, True, "amx_bf16"),  # AMX first: the faster of the two
    ({"avx2", "fma"}, True, None),  # Zen 1 and most pre-2022 CPUs
    ({"avx512f", "avx512_bf16"}, False, None),  # the flag without kernels that use it
    (set(), True, None),  # not Linux: no flags, no bf16
])
def test_native_bf16_comes_from_the_cpu_flags(flags: set[str], torch_agrees: bool,
                                              expected: str | None) -> None:
    assert runtime.cpu_bf16(flags, torch_agrees) == expected


def test_auto_is_bf16_on_a_bf16_cpu_and_float32_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_torch_has_cpu_bf16", lambda: True)
    monkeypatch.setattr(runtime, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    chosen = runtime.precision(DeviceConfig(), CPU)
    assert chosen.dtype == torch.bfloat16 and str(chosen) == "amp bf16 (cpu has avx512_bf16)"
    monkeypatch.setattr(runtime, "cpu_flags", lambda: {"avx2"})
    chosen = runtime.precision(DeviceConfig(), CPU)
    assert chosen.dtype is None and str(chosen) == "amp off (cpu has no native bf16)"
    assert runtime.precision(DeviceConfig(amp="bf16"), CPU).dtype == torch.bfloat16  # forced
    monkeypatch.setattr(runtime, "cpu_flags", lambda: {"avx512_bf16"})
    assert str(runtime.precision(DeviceConfig(amp="off"), CPU)) == "amp off (device.amp=off)"
    cuda = torch.device("cuda")
    assert runtime.precision(DeviceConfig(), cuda, training=False).dtype is None  # GPU decoding: float32


def test_bf16_training_and_decoding_run_on_any_cpu(tmp_path: Path, corpus: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Slow where the CPU has no bf16 arithmetic, so tiny: a few steps, a few sentences."""
    run_dir = tmp_path / "bf16"
    with caplog.at_level("INFO"):
        best = tmt.train(tiny_overrides(corpus, run_dir, **{
            "device.amp": "bf16", "training.epochs": 1, "dataset.max_pairs": 200, "dataset.valid_size": 20,
            "dataset.test_size": 20, "training.valid_max_sentences": 8}))
    assert math.isfinite(best)
    assert "amp bf16 (device.amp=bf16)" in caplog.text  # the device line names the precision
    assert json.loads((run_dir / "result.json").read_text())["amp"] == "amp bf16 (device.amp=bf16)"
    state = load_checkpoint(run_dir / "latest.pt")
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    engine = Translator.from_checkpoint(run_dir, device="cpu", amp="bf16")
    nbest = engine.translate_nbest(["He is sleeping.", "I am cold."], beam_size=3)
    assert all(math.isfinite(h[0].score) for h in nbest)
    assert engine.precision.dtype == torch.bfloat16
