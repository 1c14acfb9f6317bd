"""Student shapes (a deep encoder, a shallow decoder): the `model=student` preset, and
`training.decode_speedup`, which has the plan choose the decoder depth from beam-search speeds it measures
(training/decoding_speed.py; rules.decoder_depth). Checked against brute force (every encoder depth's
FLOPs), the references themselves (forced outputs) and a planned run's own checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import transformer_mt as tmt
from tests.conftest import tiny_overrides
from transformer_mt import plan as planning
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import ConfigError, DecodingConfig, ModelConfig, TrainConfig
from transformer_mt.data import EncodedSplit, Ragged
from transformer_mt.jobs.composition import compose
from transformer_mt.model import Transformer
from transformer_mt.plan import decide, rules
from transformer_mt.runtime.rng import rng_state
from transformer_mt.training import decoding_speed
from transformer_mt.training.throughput import forward_flops

PAD, V = 0, 40


def test_the_deepest_decoder_at_the_speedup_else_the_shallowest() -> None:
    speeds = {"3+3": 100.0, "4+2": 130.0, "6+1": 160.0}
    assert rules.decoder_depth(speeds, 1.25) == "4+2"  # 6+1 reaches it too: the deeper decoder is kept
    assert rules.decoder_depth(speeds, 1.5) == "6+1"
    assert rules.decoder_depth(speeds, 3.0) == "6+1"  # none reaches it: the shallowest
    assert rules.decoder_depth({"3+3": 100.0, "4+2": 170.0, "6+1": 160.0}, 1.6) == "4+2"  # as measured
    # none reaches it, and a busy machine measured the one-layer decoder slower: still the shallowest
    assert rules.decoder_depth({"3+3": 100.0, "4+2": 140.0, "6+1": 120.0}, 2.0) == "6+1"


def _data(src_len: int, tgt_len: int, vocab: int = 8000) -> SimpleNamespace:
    """What relative_flops reads of prepared data: the training pairs' lengths, the target vocabulary."""
    lengths = np.array([[src_len - 1, tgt_len - 1], [src_len + 1, tgt_len + 1]])
    return SimpleNamespace(train=SimpleNamespace(lengths=lambda: lengths),
                           vocab=SimpleNamespace(tgt_vocab_size=vocab))


@pytest.mark.parametrize("size", ["small", "base"])
def test_layers_move_to_the_encoder_at_about_the_balanced_shapes_training_flops(size: str) -> None:
    balanced = decide.shape(size, ModelConfig())
    data = _data(12, 14)
    shapes = decoding_speed.shallow_decoders(balanced, data, 4096)  # type: ignore[arg-type]
    decoders = list(range(balanced.decoder_layers, 0, -1))
    assert [c.decoder_layers for c in shapes.values()] == decoders  # the balanced shape first

    def flops(encoder: int, decoder: int) -> float:  # per batch of the mean lengths (13 and 15, eos included)
        c = dataclasses.replace(balanced, encoder_layers=encoder, decoder_layers=decoder)
        return forward_flops(c, 8000, 4096 // 15, 13, 15)

    target = flops(balanced.encoder_layers, balanced.decoder_layers)
    for name, c in shapes.items():  # brute force over every encoder depth
        assert name == f"{c.encoder_layers}+{c.decoder_layers}"
        nearest = min(range(1, 40), key=lambda e: abs(flops(e, c.decoder_layers) - target))
        assert c.encoder_layers == nearest and (c.d_model, c.d_ff) == (balanced.d_model, balanced.d_ff)
    if size == "small":  # the preset is the rule's one-layer decoder at Tatoeba's lengths
        student = tmt.compose("train", ["model=student"]).model
        assert shapes["6+1"] == dataclasses.replace(balanced, encoder_layers=6, decoder_layers=1)
        assert dataclasses.replace(student, max_positions=balanced.max_positions) == shapes["6+1"]


def _pairs(n: int, seed: int = 0) -> EncodedSplit:
    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(3, V, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    tgt = [torch.randint(3, V, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    return EncodedSplit(Ragged.from_lists(src), Ragged.from_lists(tgt))


@pytest.mark.parametrize("beam", [1, 4])
def test_forced_outputs_are_the_references(beam: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """An untrained model decodes each source to its reference's length (an empty one: one token), through
    the search as it is: what forced_seconds times."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=1,
                                    max_positions=64), V, V, PAD).eval()
    outputs: list = []
    decode = decoding_speed.decode_ids
    monkeypatch.setattr(decoding_speed, "decode_ids", lambda *a, **k: outputs.extend(decode(*a, **k)))
    pairs = _pairs(30)
    assert decoding_speed.forced_seconds(model, pairs, DecodingConfig(beam_size=beam, batch_tokens=40),
                                         torch.device("cpu"), None) > 0
    for hyps, reference in zip(outputs, pairs.tgt_ids, strict=True):
        assert hyps[0].tokens[:len(reference)] == reference.tolist()
        assert len(hyps[0].tokens) == max(len(reference), 1)


def test_each_shape_is_timed_in_alternating_rounds_with_the_generators_left_as_they_were(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    seconds = {"3+3": [9.0, 2.0, 3.0], "6+1": [9.0, 1.5, 1.0]}  # the warm-up, then two rounds each

    def timed(model: str, pairs: EncodedSplit, *args: object) -> float:
        calls.append((model, len(pairs)))
        return seconds[model].pop(0)

    monkeypatch.setattr(decoding_speed, "forced_seconds", timed)
    speeds = decoding_speed.forced_speeds({"3+3": "3+3", "6+1": "6+1"}, _pairs(10), DecodingConfig(),  # type: ignore[dict-item]
                                          torch.device("cpu"), None)
    assert calls == [("3+3", 2), ("6+1", 2), ("3+3", 10), ("6+1", 10), ("3+3", 10), ("6+1", 10)]
    assert speeds == {"3+3": 10 / 2.0, "6+1": 10 / 1.0}  # each its best round
    before = rng_state()["torch"]
    vocab = SimpleNamespace(src_vocab_size=V, tgt_vocab_size=V, pad_id=PAD)
    models = decoding_speed.untrained({"a": ModelConfig(d_model=32, d_ff=64)}, vocab,  # type: ignore[arg-type]
                                      torch.device("cpu"))
    assert torch.equal(rng_state()["torch"], before) and not models["a"].training


def test_the_plan_takes_the_deepest_decoder_at_the_speedup(monkeypatch: pytest.MonkeyPatch) -> None:
    small = decide.shape("small", ModelConfig())
    shapes = {"3+3": small, "4+2": dataclasses.replace(small, encoder_layers=4, decoder_layers=2),
              "6+1": dataclasses.replace(small, encoder_layers=6, decoder_layers=1)}
    speeds = {"3+3": 60.0, "4+2": 75.0, "6+1": 91.0}
    monkeypatch.setattr(decide, "decoder_speeds", lambda *a: (shapes, speeds))
    cfg = compose("train", ["training.plan=auto", "training.max_minutes=5", "training.decode_speedup=1.5"])
    planner = decide._Planner(cfg, set(), world_size=1)
    start = SimpleNamespace(data=None, device=torch.device("cpu"))
    assert planner.decoder(small, start, None, 2048) == shapes["6+1"]  # type: ignore[arg-type]
    chosen = planner.choices["model.decoder_layers"]
    assert (chosen.value, planner.choices["model.encoder_layers"].value, chosen.source) == (1, 6, "plan")
    assert "1.5× the beam search of 3+3" in chosen.why and "{'3+3': 60, '4+2': 75, '6+1': 91}" in chosen.why


def test_the_key_asks_for_a_plan_and_a_shape_of_yours_is_kept() -> None:
    with pytest.raises(ConfigError, match=r"training.decode_speedup=2.0 is out of range; it must be 1 "
                                          r"without training.plan=auto.*model=student"):
        compose("train", ["training.decode_speedup=2"])
    with pytest.raises(ConfigError, match=r"training.decode_speedup=0.5 is out of range; it must be >= 1"):
        compose("train", ["training.plan=auto", "training.max_minutes=5", "training.decode_speedup=0.5"])
    overrides = ["model=student", "training.plan=auto", "training.max_minutes=5", "training.decode_speedup=2"]
    cfg = compose("train", overrides)
    assert (cfg.model.encoder_layers, cfg.model.decoder_layers, cfg.model.d_model) == (6, 1, 256)
    assert set(decide.SHAPE) <= decide.chosen_by_you(cfg, overrides)  # make() leaves it as it is
    assert TrainConfig().training.decode_speedup == 1  # the balanced shape unless asked


def test_a_run_asking_for_faster_decoding_is_planned_measured_and_trained(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unmocked: the plan (its shapes `tiny` and `small` here, for the test's time) measures each decoder
    depth of the shape it chose, trains the one rules.decoder_depth picks, and says why."""
    measured: list[tuple[dict[str, ModelConfig], dict[str, float]]] = []
    real = decide.decoder_speeds
    monkeypatch.setattr(decide, "decoder_speeds", lambda *a: measured.append(real(*a)) or measured[-1])
    monkeypatch.setattr(rules, "SIZES", ("tiny", "small"))
    overrides = tiny_overrides(corpus, tmp_path / "run", **{  # a budget a busy machine validates within,
        "training.plan": "auto", "training.max_minutes": 0.5, "training.epochs": 1,  # one epoch ends it
        "training.decode_speedup": 1.2, "dataset.max_pairs": 600, "dataset.valid_size": 60,
        "dataset.test_size": 60, "tokenizer.vocab_size": 400, "training.progress": "false", "device": "cpu"})
    tmt.train([o for o in overrides if not o.startswith("debug=")])  # the shape left open
    plan = planning.Plan.from_record(json.loads((tmp_path / "run" / "result.json").read_text())["plan"])
    (shapes, speeds), = measured
    balanced = next(iter(shapes.values()))
    assert balanced == decide.shape("tiny" if balanced.d_model == 64 else "small", balanced)
    assert [c.decoder_layers for c in shapes.values()] == list(range(balanced.decoder_layers, 0, -1))
    chosen = shapes[rules.decoder_depth(speeds, 1.2)]
    v = plan.values
    assert (v["model.encoder_layers"], v["model.decoder_layers"]) == (chosen.encoder_layers,
                                                                       chosen.decoder_layers)
    assert plan.sources["model.decoder_layers"] == "plan" and "sentences/s {" in plan.table()
    saved = load_checkpoint(tmp_path / "run" / "latest.pt")["model_config"]
    assert (saved["encoder_layers"], saved["decoder_layers"], saved["d_model"]) == (
        chosen.encoder_layers, chosen.decoder_layers, chosen.d_model)
