"""training.plan=auto: the rules, what counts as the user's choice, the probe's limits, and a planned run
(its table, result.json, checkpoints, a resume that reuses the plan, the errors)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import DATA_CACHE, runs_corpus, tiny_overrides
from transformer_mt import plan as planning
from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import ConfigError, ModelConfig, TrainConfig, VariantsConfig
from transformer_mt.errors import TrainingError
from transformer_mt.jobs.composition import compose
from transformer_mt.plan import decide, rules
from transformer_mt.training import probe as probe_module
from transformer_mt.training import validation_cost
from transformer_mt.training.probe import Probe, Timing
from transformer_mt.training.throughput import relative_flops

SIZES = rules.BATCH_CANDIDATES
# A short budget keeps the probe (a share of it) short; the tiny run's epochs still end it first.
PLANNED = {"training.plan": "auto", "training.max_minutes": 1}


# -- the rules ---------------------------------------------------------------------------------------
def test_the_batch_is_the_largest_with_as_many_updates_as_tokens() -> None:
    assert rules.batch_tokens({512: 2866.0, 1024: 1539.0, 2048: 772.0}) == 1024  # 10 minutes
    assert rules.batch_tokens({512: 7200.0, 1024: 4343.0, 2048: 1989.0}) == 1024  # 40 minutes
    assert rules.batch_tokens({512: 2046.0, 1024: 1087.0}) == 1024  # on the line
    assert rules.batch_tokens({512: 800.0, 1024: 450.0}) == 512  # a shorter budget
    assert rules.batch_tokens({512: 9000.0, 1024: 5000.0, 2048: 2800.0, 4096: 1400.0}) == 2048  # longer
    assert rules.batch_tokens({512: 100.0, 1024: 50.0}) == 512  # none qualifies: the smallest
    assert rules.batch_tokens({512: 2866.0, 1024: 1539.0}, batches_per_update=2) == 512  # 2 processes


def test_dropout_grows_with_the_passes_over_the_data() -> None:
    assert [rules.dropout(e) for e in (0.5, 1.5, 3.9, 4, 7.9, 8, 16, 100)] == [0, 0, 0, .1, .1, .2, .3, .3]


def test_warm_up_is_a_tenth_of_the_run_within_bounds() -> None:
    assert rules.warmup_steps(5500) == 600 and rules.warmup_steps(27000) == 2700
    assert rules.warmup_steps(1000) == 300 and rules.warmup_steps(10**6) == 4000
    assert rules.warmup_steps(400) == 200 and rules.warmup_steps(40) == 20  # never above half the run


def test_validation_fits_its_share_of_the_budget() -> None:
    assert rules.validations(2400, 2.0) == rules.MOST_VALIDATIONS
    assert rules.validations(600, 6.0) == 5 and rules.validations(60, 100.0) == 1
    assert rules.valid_every_steps(27000, 20, 3500) == 2100  # 12 of them, 7 epochs' ends and the run's
    assert rules.valid_every_steps(1640, 3, 3494) == 600  # within one epoch: 600, 1,200 and the run's end
    assert rules.valid_every_steps(5000, 20, 10000) == 300
    assert rules.valid_every_steps(2000, 4, 400) == 0  # an epoch is shorter: its end validates
    assert rules.valid_every_steps(1749, 7, 341) == 0  # 5 epochs' ends and the run's: no room for more
    assert rules.valid_every_steps(1640, 3, 3494, at_end=2) == 900  # the average is validated too
    assert rules.validations_at_end(3) == 2 and rules.validations_at_end(0) == 1


def validations_made(updates: int, every: int, steps_per_epoch: int, at_end: int) -> int:
    """The validations of a run, as the trainer makes them: each epoch's end, every `every` steps, and
    `at_end` when it ends."""
    ends = set(range(steps_per_epoch, updates + 1, steps_per_epoch))
    intervals = set(range(every, updates + 1, every)) if every else set()
    return len((ends | intervals) - {updates}) + at_end


def test_the_interval_counts_the_validations_at_each_epochs_end_and_the_runs() -> None:
    for updates in (300, 1749, 5000, 27000):
        for steps_per_epoch in (341, 1000, 3500, 10000):
            for count in (1, 3, 7, 20):
                for at_end in (1, 2):
                    every = rules.valid_every_steps(updates, count, steps_per_epoch, at_end)
                    made = validations_made(updates, every, steps_per_epoch, at_end)
                    assert made <= max(count, updates // steps_per_epoch + at_end), (updates, steps_per_epoch,
                                                                                      count, at_end)


def test_validation_samples_fit_their_share_of_the_budget() -> None:
    assert rules.valid_sentences(2000, 2, 2400, 0.01) == 1000
    assert rules.valid_sentences(500, 2, 2400, 0.01) == 500
    assert rules.valid_sentences(2000, 6, 600, 0.006) == 833  # 6 epochs' validations of 5 s
    assert rules.valid_sentences(2000, 500, 600, 0.01) == 100  # hundreds of epochs: the fewest


def test_the_model_grows_when_the_budget_trains_it_on_enough_tokens() -> None:
    params = {"small": 7_600_000, "base": 60_000_000}
    assert rules.model_size({"small": 10e6, "base": 2e6}, params) == "small"
    assert rules.model_size({"small": 900e6, "base": 100e6}, params) == "base"
    assert rules.model_size({"small": 1e6, "base": 1e5}, params) == "small"  # never below small


def test_lr_ema_and_averaging() -> None:
    assert rules.peak_lr(256) == 2e-3 and rules.peak_lr(512) == pytest.approx(1.41e-3, abs=1e-6)
    assert rules.ema_decay(1999) == 0 and rules.ema_decay(2000) == 0.999
    assert rules.average_last(0.999, keep_last=5) == 3 and rules.average_last(0.999, keep_last=2) == 2
    assert rules.average_last(0.0, keep_last=5) == 0 and rules.average_last(0.999, keep_last=1) == 0


# -- whose choice ----------------------------------------------------------------------------------
def test_keys_set_in_an_experiment_or_on_the_command_line_are_yours() -> None:
    overrides = ["experiment=tatoeba_cpu_tuned", "training.plan=auto", "training.ema_decay=0"]
    yours = decide.chosen_by_you(compose("train", overrides), overrides)
    assert {"training.batch_tokens", "training.lr", "training.warmup_steps", "model.dropout",
            "training.ema_decay", "model.norm_first"} <= yours
    assert not set(decide.SHAPE) & yours  # the recipe leaves the model's size open
    bare = decide.chosen_by_you(compose("train", ["training.plan=auto", "training.max_minutes=5"]), [])
    assert bare == set()
    group = ["model=small", "training.max_minutes=5"]
    assert set(decide.SHAPE) <= decide.chosen_by_you(compose("train", group), group)


def test_a_planned_run_takes_the_input_variants_unless_you_chose_any() -> None:
    """Chosen before the data are prepared (the tokenizer's sample shows them): a dataset.variants key,
    or a config's variants, are yours, and then the plan sets none."""
    auto = ["training.plan=auto", "training.max_minutes=5"]
    planned = planning.inputs(compose("train", auto), auto)
    assert planned.dataset.variants == VariantsConfig(**rules.VARIANTS)
    for overrides in ([*auto, "dataset.variants.caps=0"], [*auto, "dataset.variants.typos=0.3"], []):
        cfg = compose("train", overrides)
        assert planning.inputs(cfg, overrides).dataset.variants == cfg.dataset.variants, overrides
    mixed = [*auto, "dataset.mix=[{name:parallel,path:x.tsv,variants:{caps:0.5}}]"]
    assert planning.inputs(compose("train", mixed), mixed).dataset.variants == VariantsConfig()


def test_model_presets_are_read_from_their_files() -> None:
    base = decide.shape("base", ModelConfig(dropout=0.3))
    assert (base.d_model, base.n_heads, base.d_ff, base.encoder_layers) == (512, 8, 2048, 6)
    assert base.dropout == 0.3  # the rest stays


# -- the probe -------------------------------------------------------------------------------------
class _Speeds(Probe):
    """A probe whose speeds are given (tokens/s per batch size), counting what it measures."""

    def __init__(self, speeds: dict[int, float], deadline: float = float("inf"),
                 shape_deadline: float = float("inf"), larger: float = 0.0) -> None:
        super().__init__(data=None, device=torch.device("cpu"), amp=None, seed=1,  # type: ignore[arg-type]
                         deadline=deadline, shape_deadline=shape_deadline)
        self.speeds, self.measured, self.larger = speeds, [], larger  # a larger shape's share of the speed

    def measure(self, model_cfg: ModelConfig, batch_tokens: int) -> Timing:
        larger = model_cfg.d_model > ModelConfig().d_model
        self.measured.append(("larger", batch_tokens) if larger else batch_tokens)
        if self.speeds[batch_tokens] < 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Timing(self.speeds[batch_tokens] * (self.larger if larger else 1.0), 0.0, 0.0)


def test_the_probe_doubles_the_batch_while_it_gains_and_stops_at_its_deadline() -> None:
    cpu = _Speeds({512: 1000, 1024: 1040, 2048: 1050})
    assert cpu.batch_speeds(ModelConfig(), SIZES) == {512: 1000, 1024: 1040} and cpu.measured == [512, 1024]
    gpu = _Speeds({512: 1e4, 1024: 2e4, 2048: 4e4, 4096: -1})  # the fourth does not fit
    assert gpu.batch_speeds(ModelConfig(), SIZES) == {512: 1e4, 1024: 2e4, 2048: 4e4}
    late = _Speeds({512: 1e4, 1024: 2e4, 2048: 4e4}, deadline=0.0)  # past: the two sizes a rule needs
    assert late.batch_speeds(ModelConfig(), SIZES) == {512: 1e4, 1024: 2e4}
    with pytest.raises(TrainingError, match="does not fit on cpu .*choose a smaller model"):
        _Speeds({512: -1}).batch_speeds(ModelConfig(), SIZES)


class _Length:
    """A run length whose updates are `seconds` of training at the given tokens/s, one batch each."""

    batches_per_update = 1

    def __init__(self, seconds: float) -> None:
        self.seconds = self.budget_s = seconds

    def expect(self, batch_tokens: int, tokens_per_s: float) -> tuple[float, float, str]:
        return self.seconds * tokens_per_s / batch_tokens, 1.0, "budget"


def test_the_plan_skips_batches_it_would_pass_over_and_weighs_those_it_did_not_measure() -> None:
    planner = decide._Planner(TrainConfig(), set(), world_size=1)
    speeds = {512: 1000, 1024: 1020, 2048: 1040, 4096: 1050}
    cpu = _Speeds(speeds)  # at 512's speed the rule takes 2048: 1024 is skipped; 2048 gains too little
    planned = planner.batch(cpu, ModelConfig(), _Length(5000))  # type: ignore[arg-type]
    assert cpu.measured == [512, 2048] and planned == (2048, 1040, {512: 1000, 2048: 1040})
    short = _Speeds(speeds)  # at 512's speed the rule takes 512: nothing to skip
    assert planner.batch(short, ModelConfig(), _Length(1000))[0] == 512 and short.measured == [512, 1024]  # type: ignore[arg-type]
    full = _Speeds({512: 1000, 1024: 2000, 2048: -1})  # 2048 runs out of memory: 1024 at most
    assert planner.batch(full, ModelConfig(), _Length(5000))[0] == 1024  # type: ignore[arg-type]
    assert full.too_large == 2048
    yours = decide._Planner(TrainConfig(), {"training.batch_tokens"}, world_size=1)  # 4096 by default
    assert yours.batch(cpu, ModelConfig(), _Length(5000)) == (4096, 1050, {4096: 1050})  # type: ignore[arg-type]


def test_the_probe_starts_no_batch_size_that_would_end_past_its_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(probe_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Timed(_Speeds):
        def measure(self, model_cfg: ModelConfig, batch_tokens: int) -> Timing:
            clock[0] += batch_tokens / 512  # each doubling takes twice as long
            return super().measure(model_cfg, batch_tokens)

    gpu = Timed({512: 1e4, 1024: 2e4, 2048: 4e4, 4096: 8e4}, deadline=10.0)
    # 512 ends at 1 s, 1024 at 3, 2048 (expected to end at 7) at 7; 4096 would end at 15: not started
    assert gpu.batch_speeds(ModelConfig(), SIZES) == {512: 1e4, 1024: 2e4, 2048: 4e4} and clock == [7.0]
    clock[0] = 0.0
    short = Timed({512: 1e4, 1024: 2e4, 2048: 4e4}, deadline=2.0)  # 1024 ends past it, but is measured
    assert short.batch_speeds(ModelConfig(), SIZES) == {512: 1e4, 1024: 2e4} and clock == [3.0]


def test_the_next_size_is_expected_to_take_its_timed_seconds_and_twice_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's steps take milliseconds, so each size's measurement is its seconds_per_size of timed steps
    and an untimed rest: a doubling doubles the rest, not the timed seconds (which a CPU's slow steps
    can pass)."""
    clock = [0.0]
    monkeypatch.setattr(probe_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    class Timed(_Speeds):
        def measure(self, model_cfg: ModelConfig, batch_tokens: int) -> Timing:
            step = 0.01 * batch_tokens / 512 if self.slow else 0.01  # a CPU's steps grow with the batch
            timed = max(self.seconds_per_size, probe_module.STEPS * step)
            clock[0] += 0.2 * batch_tokens / 512 + timed  # the untimed rest grows with the batch
            return super().measure(model_cfg, batch_tokens)._replace(timed_s=timed, step_s=step)

    gpu = Timed({512: 1e4, 1024: 2e4, 2048: 4e4, 4096: 8e4}, deadline=5.0)
    gpu.seconds_per_size, gpu.slow = 1.0, False
    # 512 ends at 1.2 s, 1024 at 2.6; 2048 is expected to take 0.8 + 1.0 + 0.02 s: it ends at 4.4;
    # 4096 (1.6 + 1.0 + 0.02) would end at 7.0: not started
    assert gpu.batch_speeds(ModelConfig(), SIZES) == {512: 1e4, 1024: 2e4, 2048: 4e4}
    assert clock[0] == pytest.approx(4.4)
    assert gpu.cost(4096) == pytest.approx(2.62) and gpu.cost(4096, compute=3.0) == pytest.approx(5.86)
    clock[0] = 0.0
    cpu = Timed({512: 1e4, 1024: 1.2e4, 2048: 1.4e4}, deadline=3.0)
    cpu.seconds_per_size, cpu.slow = 0.05, True  # steps of 0.01 s a 512-token batch, 4 of them timed
    # ends at 0.25, 0.73 and 1.69 s; 4096, whose 4 steps pass seconds_per_size, doubles it all: 3.69
    assert cpu.batch_speeds(ModelConfig(), SIZES) == {512: 1e4, 1024: 1.2e4, 2048: 1.4e4}
    assert clock[0] == pytest.approx(1.69) and cpu.cost(4096) == pytest.approx(2 * 0.8 + 2 * 0.16 + 0.08)


def test_the_probe_times_decoding_in_a_batch_like_validations(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_mt.config import DecodingConfig
    from transformer_mt.decoding import decode

    clock, rows, first = [0.0], [], [False]

    def search(model: object, src: torch.Tensor, *args: object) -> list[list[None]]:
        rows.append(len(src))  # each step of the batch costs 1 per row, and 20 shared by its rows
        clock[0] += src.shape[1] * (20 + len(src)) + 1e6 * first[0]  # (a GPU's first call: set-up)
        first[0] = False
        return [[None] for _ in src]

    monkeypatch.setattr(validation_cost, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(decode, "_search", search)
    src = [[5] * (1 + i % 9) for i in range(700)]
    data = SimpleNamespace(valid=SimpleNamespace(src_ids=src))
    greedy, model = DecodingConfig(beam_size=1, batch_tokens=400), torch.nn.Linear(1, 1)
    decode.decode_ids(model, src[:600], greedy, torch.device("cpu"))  # what validation decodes
    validation_s = clock[0]
    # 10 batches from 133 rows of 2 tokens (eos included) to 29 of 10; the median sentence (5 tokens and
    # eos) is in the fourth: 57 rows of up to 7 tokens
    assert rows == [133, 80, 66, 57, 57, 50, 44, 44, 40, 29]

    rows.clear()
    first[0] = True  # the first decoding is not timed
    def sentence_seconds(deadline: float) -> float:  # the first 600 pairs are validated
        return validation_cost.sentence_seconds(model, data, greedy, torch.device("cpu"), None,  # type: ignore[arg-type]
                                                deadline, sentences=600)

    with_time = sentence_seconds(deadline=clock[0] + 1e6 + 1e4)
    untimed, timed = validation_cost.UNTIMED, validation_cost.DECODED
    assert rows == [untimed, timed, 57]  # then the whole batch: its padded tokens' cost, scaled
    assert with_time * 600 == pytest.approx(validation_s, rel=0.15)
    rows.clear()
    without = sentence_seconds(deadline=clock[0])
    assert rows == [untimed, timed] and without > with_time  # fewer rows: more per token
    rows.clear()
    some = sentence_seconds(deadline=clock[0] + 900.0)  # 312 for the first 32 rows
    assert timed < rows[2] < 57 and with_time < some < without


def test_the_probe_times_validations_scores_with_the_sources_as_translations(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A validation's cost per pair: its loss, its decoding and its scores, the last timed on the loss's
    pairs with each source standing for its translation."""
    from transformer_mt.data import prepare_data

    cfg = compose("train", tiny_overrides(corpus, tmp_path / "run"))
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    clock, scored = [0.0], []

    def score(hypotheses: list[str], references: list[str]) -> None:
        scored.append((hypotheses, references))
        clock[0] += 0.002 * len(hypotheses)  # the only timed call that moves the clock

    monkeypatch.setattr(validation_cost, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(validation_cost, "score", score)
    monkeypatch.setattr(validation_cost, "sentence_seconds", lambda *args: 0.5)
    cpu = torch.device("cpu")
    per_pair = validation_cost.validation_seconds(cfg.model, data, cfg.decoding, 256, cpu, None, None,
                                                  deadline=0.0, sentences=1000)
    n = min(validation_cost.LOSS_PAIRS, len(data.valid))
    assert scored == [(data.valid.src_text[:n], data.valid.tgt_text[:n])]
    assert per_pair == pytest.approx(0.5 + 0.002)


def test_timed_steps_go_round_the_batches_until_their_time_is_up(corpus: Path, tmp_path: Path) -> None:
    from transformer_mt.checkpoints.store import build_model
    from transformer_mt.data import prepare_data
    from transformer_mt.training.throughput import real_batches, time_training

    cfg = compose("train", tiny_overrides(corpus, tmp_path / "run"))
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    batches = real_batches(data, 256, seed=1, n=2)
    model = build_model(cfg.model, data.vocab)
    _, every = time_training(model, batches, torch.device("cpu"))  # each batch once
    _, five = time_training(model, batches, torch.device("cpu"), seconds=0.0, min_steps=5)
    one, two = (b.n_tgt_tokens for b in batches)
    assert every == one + two and five == 3 * one + 2 * two


def test_the_model_size_counts_the_tokens_of_every_process(corpus: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from transformer_mt.data import prepare_data

    cfg = compose("train", tiny_overrides(corpus, tmp_path / "run"))
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    budgets: list[dict[str, float]] = []
    monkeypatch.setattr(rules, "model_size", lambda tokens, params: budgets.append(tokens) or "small")
    for world_size in (1, 2):
        planner = decide._Planner(cfg, set(), world_size)
        planner.shape(_Speeds({512: 1000.0, 1024: 1000.0}, shape_deadline=0.0), data, _Length(600))  # type: ignore[arg-type]
    one, two = budgets  # the larger shape not measured: its speed scaled by FLOPs
    assert one["small"] > one["base"] > 0 and two == pytest.approx({k: 2 * v for k, v in one.items()})


def test_a_larger_shape_is_measured_where_its_flops_would_keep_the_small_one(corpus: Path,
                                                                            tmp_path: Path) -> None:
    """On a GPU a small model leaves mostly idle, a larger one trains nearly as fast: where the probe has
    time, the larger shape is measured at the small one's batch, and chosen when the budget trains it on
    a token per parameter; its batch sizes are the small one's, at its own speed."""
    from transformer_mt.data import prepare_data

    cfg = compose("train", tiny_overrides(corpus, tmp_path / "run"))
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    shapes = {s: decide.shape(s, cfg.model) for s in rules.SIZES}
    base_params = parameter_count(shapes["base"], data.vocab.src_vocab_size, data.vocab.tgt_vocab_size)
    seconds = 100.0
    speed = 3 * base_params / (seconds * (1 - rules.VALIDATION_SHARE))  # 3 tokens per base parameter
    assert relative_flops(data, shapes, 4096)["base"] > 3  # so FLOPs alone keep the small shape
    every = {b: speed for b in rules.BATCH_CANDIDATES}
    for deadline, share, chosen in ((float("inf"), 0.5, "base"), (float("inf"), 0.2, "small"),
                                    (0.0, 0.5, "small")):
        probe = _Speeds(every, shape_deadline=deadline, larger=share)
        planner = decide._Planner(cfg, set(), world_size=1)
        model, batch, shape_speeds = planner.shape(probe, data, _Length(seconds))  # type: ignore[arg-type]
        small_batch = probe.measured[1]
        assert model == shapes[chosen] and (deadline == 0.0) != (("larger", small_batch) in probe.measured)
        if chosen == "base":
            assert batch.tokens <= small_batch and batch.tokens_per_s == pytest.approx(share * speed)
            assert batch.measured == {small_batch: share * speed}
            assert planner.choices["model.d_model"].why.endswith(f"(base measured at {small_batch})")
            assert shape_speeds == {"small": round(speed),
                                                             "base": round(share * speed)}
    # Where FLOPs alone choose the larger shape, its own sweep goes on to the shape's deadline, not the
    # small one's (past here: it measured two sizes)
    growing = {b: 4 * speed * b / 512 for b in rules.BATCH_CANDIDATES}  # a GPU far from saturated
    probe = _Speeds(growing, deadline=0.0, shape_deadline=float("inf"))
    model, _, _ = decide._Planner(cfg, set(), world_size=1).shape(probe, data, _Length(seconds))  # type: ignore[arg-type]
    swept = [m for m in probe.measured if isinstance(m, tuple)]
    assert model == shapes["base"] and len(probe.measured) - len(swept) == 2 and len(swept) > 2


def test_a_real_probe_times_the_larger_shape_from_its_own_sweep(corpus: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's bookkeeping on real steps: each size's measurement split into timed steps and the rest,
    and the larger shape measured at the small one's batch when its predicted cost fits (the shapes
    planned here are `tiny` and `small`, for the test's time)."""
    import time

    from transformer_mt.data import prepare_data
    from transformer_mt.training.run_length import RunLength

    monkeypatch.setattr(rules, "SIZES", ("tiny", "small"))
    cfg = compose("train", tiny_overrides(corpus, tmp_path / "run"))
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    now = time.perf_counter()
    probe = Probe(data, torch.device("cpu"), None, seed=1, deadline=now, seconds_per_size=0.05,
                  shape_deadline=now + 600)
    length = RunLength(data, 60.0, now, 1, 1, 1, None, rules.VALIDATION_SHARE)
    planner = decide._Planner(cfg, set(), world_size=1)
    model, batch, speeds = planner.shape(probe, data, length)  # type: ignore[arg-type]
    assert len(batch.measured) == 2
    assert all(took > timed > step > 0 for took, timed, step in probe.timings.values())
    assert probe.cost(4 * max(batch.measured)) > probe.cost(max(batch.measured))
    assert speeds["tiny"] > speeds["small"] > 0 and model == decide.shape("tiny", cfg.model)
    assert planner.choices["model.d_model"].why.endswith(f"(small measured at {batch.tokens})")


@pytest.fixture(scope="module")
def planned_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """The tiny run, planned: its model and batch are chosen (debug=tiny), the rest is the plan's."""
    run_dir = tmp_path_factory.mktemp("plan") / "run"
    tmt.train(tiny_overrides(corpus, run_dir, **PLANNED))
    return run_dir


def test_a_planned_run_records_its_plan(planned_run: Path) -> None:
    result = json.loads((planned_run / "result.json").read_text())
    plan = planning.Plan.from_record(result["plan"])
    assert plan.sources["training.batch_tokens"] == plan.sources["model.d_model"] == "you"
    assert plan.sources["training.lr"] == plan.sources["model.dropout"] == "plan"
    assert plan.sources["training.warmup_steps"] == "you"  # debug=tiny sets it: a config file wins too
    assert plan.values["training.epochs"] == 2  # yours: the run's length
    assert plan.values["training.lr"] == rules.peak_lr(64) and plan.values["training.scheduler"] == "linear"
    steps_per_epoch = plan.measured.steps_per_epoch
    assert plan.measured.updates == 2 * steps_per_epoch and result["epochs"] == 2
    # each epoch draws its input variants anew: its varied pairs, and pairs joined into longer examples,
    # may batch into a few batches more or fewer
    assert abs(result["steps"] - 2 * steps_per_epoch) <= max(1, 0.1 * 2 * steps_per_epoch)
    saved = load_checkpoint(planned_run / "latest.pt")
    assert saved["plan"] == result["plan"]
    assert saved["config"]["training"]["lr"] == plan.values["training.lr"]  # the run trained with it
    # chosen before the data (plan.inputs)
    assert saved["config"]["dataset"]["variants"] == dataclasses.asdict(VariantsConfig(**rules.VARIANTS))
    assert "| training.lr |" in plan.table() and "target tokens/s" in plan.table()


def test_the_decay_follows_the_clock_unless_the_epochs_end_the_run_first(planned_run: Path) -> None:
    """A run that training.epochs end before the budget decays by its steps alone, so that its learning
    rates (and a resume) do not depend on its speed."""
    from transformer_mt.training.optim import lr_lambda

    plan = planning.Plan.from_record(json.loads((planned_run / "result.json").read_text())["plan"])
    assert plan.measured.ends_by == "epochs" and plan.values["training.decay_by_time"] is False
    assert plan.sources["training.decay_by_time"] == "plan"
    cfg = load_checkpoint(planned_run / "latest.pt")["config"]["training"]
    assert cfg["decay_by_time"] is False  # the config the Trainer received
    t = TrainConfig().training
    t.scheduler, t.warmup_steps = "linear", 0
    halfway = lr_lambda(t, 100, lambda: 0.9)(49)
    assert halfway == pytest.approx(0.1)  # the clock's 0.9 of the budget, past the steps' half
    t.decay_by_time = False  # (what the Trainer passes then: no clock)
    assert lr_lambda(t, 100)(49) == pytest.approx(0.5)


def test_a_resumed_run_reuses_its_plan(planned_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    run_dir = Path(shutil.copytree(planned_run, tmp_path / "run"))
    monkeypatch.setattr(planning, "make", lambda *a, **k: pytest.fail("a resumed run planned again"))
    with caplog.at_level(logging.INFO):
        tmt.train([f"resume={run_dir}", "training.epochs=3"])
    assert "the run's plan, as it was made" in caplog.text
    saved = load_checkpoint(planned_run / "latest.pt")["plan"]
    assert load_checkpoint(run_dir / "latest.pt")["plan"] == saved


def test_a_run_with_nothing_set_by_hand_is_planned_trained_and_recorded(corpus: Path, tmp_path: Path) -> None:
    """The automatic path, unmocked: the real probe on 600 pairs picks the model, the batch and the rest
    for a budget of 12 seconds; the run trains until the budget ends it and keeps the plan it trained
    with, every planned key the plan's and within its rule. (Its data are the tiny runs' 600 pairs,
    from the session's data cache: no setting of the plan's. Its validation split is small, 30 pairs, so
    that one validation stays well under the quarter of the budget the plan allows it when the machine
    is busy with the other worker's tests.)"""
    run_dir = tmp_path / "run"
    tmt.train([f"dataset.path={runs_corpus(corpus)}", "dataset.url=null",
               f"dataset.cache_dir={os.environ[DATA_CACHE]}",
               "dataset.max_pairs=600", "dataset.valid_size=30", "dataset.test_size=60",
               "tokenizer.vocab_size=400", "device=cpu", "device.num_threads=1", "training.progress=false",
               "training.plan=auto", "training.max_minutes=0.2", f"checkpoint.dir={run_dir}"])
    result = json.loads((run_dir / "result.json").read_text())
    saved = load_checkpoint(run_dir / "latest.pt")
    plan = planning.Plan.from_record(result["plan"])
    assert saved["plan"] == result["plan"] and result["steps"] == saved["step"] > 0
    variants = {f"dataset.variants.{name}" for name in rules.VARIANTS}
    assert set(plan.values) == set(decide.PLANNED) | variants and set(plan.sources.values()) == {"plan"}
    assert {key: plan.values[key] for key in variants} == {f"dataset.variants.{k}": p
                                                           for k, p in rules.VARIANTS.items()}
    assert saved["config"]["dataset"]["variants"] == rules.VARIANTS  # the run trained with them
    v = plan.values
    assert plan.measured.probe_seconds > 0 and plan.measured.ends_by == "budget"
    assert v["training.decay_by_time"] is True
    sizes = {size: decide.shape(size, ModelConfig()) for size in rules.SIZES}
    assert any(all(v[key] == getattr(m, key.split(".")[1]) for key in decide.SHAPE) for m in sizes.values())
    assert v["training.batch_tokens"] in rules.BATCH_CANDIDATES
    assert v["training.lr"] == rules.peak_lr(v["model.d_model"]) and v["training.scheduler"] == "linear"
    assert v["training.warmup_steps"] == rules.warmup_steps(plan.measured.updates)
    assert v["training.epochs"] == decide.UNTIL_THE_BUDGET and v["model.norm_first"] is True
    assert v["model.dropout"] in (0.0, 0.1, 0.2, 0.3) and v["training.ema_decay"] in (0.0, 0.999)
    assert v["training.average_last"] == rules.average_last(v["training.ema_decay"], 3)
    assert v["training.valid_max_sentences"] == 30  # the whole split: fewer than FEWEST_VALID_SENTENCES
    assert v["training.valid_every_steps"] % 100 == 0
    trained = {key: saved["config"][key.split(".")[0]][key.split(".")[1]] for key in decide.PLANNED}
    assert trained == {key: v[key] for key in decide.PLANNED}  # trained with them
    assert saved["model_config"]["d_model"] == v["model.d_model"]


def test_a_plan_needs_a_budget(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="training.max_minutes=None .* with training.plan=auto"):
        compose("train", tiny_overrides(corpus, tmp_path / "run", **{"training.plan": "auto"}))


def test_a_budget_too_short_for_one_validation_is_refused(corpus: Path, tmp_path: Path) -> None:
    overrides = tiny_overrides(corpus, tmp_path / "run", **{**PLANNED, "training.max_minutes": 0.0005})
    with pytest.raises(TrainingError, match=r"=0.0005 is too short: .* set at least training.max_minutes=1$"):
        tmt.train(overrides)
