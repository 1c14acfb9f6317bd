"""How a plan is made: probe this machine (training/probe.py), then fill each key the user left open by its
rule (rules.py), for the run's budget and corpus and the length of run they hold."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.config import ModelConfig, TrainConfig, VariantsConfig
from transformer_mt.config.overrides import named_keys
from transformer_mt.config.typed import preset
from transformer_mt.data import PreparedData
from transformer_mt.errors import TrainingError
from transformer_mt.plan import rules
from transformer_mt.plan.record import Choice, Measured, Plan
from transformer_mt.runtime.device import pad_to_multiple, precision
from transformer_mt.training import finetune
from transformer_mt.training.decoding_speed import decoder_speeds
from transformer_mt.training.probe import Probe, interpolated
from transformer_mt.training.run_length import RunLength
from transformer_mt.training.start import RunStart
from transformer_mt.training.throughput import relative_flops
from transformer_mt.training.validation_cost import validation_seconds

SHAPE = ("model.d_model", "model.n_heads", "model.d_ff", "model.encoder_layers", "model.decoder_layers")
PLANNED = (*SHAPE, "training.batch_tokens", "training.epochs", "training.lr", "training.scheduler",
           "training.decay_by_time", "training.warmup_steps", "model.norm_first", "model.dropout",
           "training.valid_max_sentences", "training.valid_every_steps", "training.ema_decay",
           "training.average_last")
PROBE_SHARE = 0.02  # of the budget: what the probe may take
BATCH_SWEEP_SHARE = 0.6  # of the probe's time: no new batch size is measured after it
SHAPE_SHARE = 0.2  # of the probe's time after the sweep: the larger shape is measured if it ends in it
TIMED_SIZES = 5  # the sweep's time is divided among this many sizes' timed steps (and their warm-up)
UNTIL_THE_BUDGET = 1000  # training.epochs when the budget ends the run
log = logging.getLogger(__name__)


class PlannedBatch(NamedTuple):
    """A planned batch size, its tokens/s, and the probe's tokens/s at each size it measured."""

    tokens: int
    tokens_per_s: float
    measured: dict[int, float]


def chosen_by_you(cfg: TrainConfig, overrides: Sequence[str]) -> set[str]:
    """The planned keys the user chose: named in an override, or different from the schema's default
    (an experiment or `model=...` file set them); a model group or `init=` chooses the whole shape."""
    named, default = named_keys(overrides), TrainConfig()
    yours = {key for key in PLANNED if key in named or _get(cfg, key) != _get(default, key)}
    if "model" in named or cfg.init or yours & set(SHAPE):
        yours |= set(SHAPE)
    return yours | {key for key in named if key.startswith("dataset.variants.")}


def inputs(cfg: TrainConfig, overrides: Sequence[str]) -> TrainConfig:
    """A planned run's input variants (rules.VARIANTS), before its data (the tokenizer's sample shows them),
    unless you chose any: a dataset.variants key, or a config's or a mixed corpus's variants."""
    named = any(key.startswith("dataset.variants") for key in named_keys(overrides))
    if (cfg.training.plan != "auto" or named or cfg.dataset.variants != VariantsConfig()
            or any(m.variants for m in cfg.dataset.mix)):
        return cfg
    chosen = {name: p for name, p in rules.VARIANTS.items() if p}
    log.info("plan: dataset.variants %s (as people type and write; dataset.variants.caps=0: none)", chosen)
    variants = VariantsConfig(**rules.VARIANTS)
    return dataclasses.replace(cfg, dataset=dataclasses.replace(cfg.dataset, variants=variants))


def _get(cfg: Any, key: str) -> Any:
    """A dotted key's value: `section.name` of a TrainConfig, or `name` of a ModelConfig."""
    section, name = key.split(".")
    return getattr(getattr(cfg, section) if isinstance(cfg, TrainConfig) else cfg, name)


def shape(size: str, base: ModelConfig) -> ModelConfig:
    """`base` with the d_model, heads, FFN and layers of configs/model/<size>.yaml."""
    sized = preset("model", size, ModelConfig)
    return dataclasses.replace(base, **{k.split(".")[1]: _get(sized, k) for k in SHAPE})


class _Planner:
    """Fills a plan key by key: the user's value where they chose one, else the rule's."""

    def __init__(self, cfg: TrainConfig, yours: set[str], world_size: int) -> None:
        self.cfg, self.yours, self.world_size = cfg, yours, world_size
        self.choices: dict[str, Choice] = {}

    def pick(self, key: str, value: Any, why: str) -> Any:
        """The key's value in the plan: yours (or, for a fine-tuning run's model, its parent's), or
        `value`, the plan's for the reason `why`."""
        if key in self.yours:
            section, name = key.split(".")  # a fine-tuning run's model is its parent's:
            parents = self.cfg.init and name not in finetune.OWN_KEYS.get(section, (name,))
            self.choices[key] = Choice(key, _get(self.cfg, key), "parent" if parents else "you")
        else:
            self.choices[key] = Choice(key, value, "plan", why)
        return self.choices[key].value

    def batch(self, probe: Probe, model: ModelConfig, length: RunLength, deadline: float | None = None
              ) -> PlannedBatch:
        """The batch size, its tokens/s and what the probe measured (by `deadline`, else the sweep's)."""
        if "training.batch_tokens" in self.yours:
            b = self.cfg.training.batch_tokens
            speed = probe.batch_speeds(model, (b,))[b]
            return PlannedBatch(self.pick("training.batch_tokens", b, ""), speed, {b: speed})

        def least(speed: float) -> int:  # the rule's choice were every size this slow
            updates = _updates(length, dict.fromkeys(rules.BATCH_CANDIDATES, speed), after=0)
            return rules.batch_tokens(updates, length.batches_per_update)

        measured = probe.batch_speeds(model, rules.BATCH_CANDIDATES, least=least, deadline=deadline)
        return self.weigh(measured, probe.too_large, length)

    def weigh(self, measured: dict[int, float], too_large: int | None, length: RunLength) -> PlannedBatch:
        """The batch rule on the sizes from the smallest measured to the one that ran out of memory, each
        size the probe skipped at the speed `interpolated` between its neighbours (probe.py)."""
        sizes = [b for b in rules.BATCH_CANDIDATES if min(measured) <= b < (too_large or math.inf)]
        speeds = {b: interpolated(measured, b) for b in sizes}
        updates = _updates(length, speeds, after=max(measured))
        b = rules.batch_tokens(updates, length.batches_per_update)
        return PlannedBatch(self.pick("training.batch_tokens", b, rules.batch_why(updates[b])), speeds[b],
                            measured)

    def shape(self, probe: Probe, data: PreparedData, length: RunLength
              ) -> tuple[ModelConfig, PlannedBatch, dict[str, float] | None]:
        """The model's shape (unless chosen), its batch and each shape's tokens/s: the largest shape the
        budget trains on a target token per parameter, its speed the small one's scaled by FLOPs (a lower
        bound), or measured at the small one's batch where the probe has time (a GPU that a small model
        leaves idle trains a larger one nearly as fast; docs/planning.md)."""
        if SHAPE[0] in self.yours:
            for key in SHAPE:
                self.pick(key, None, "")
            return self.cfg.model, self.batch(probe, self.cfg.model, length), None
        shapes = {s: shape(s, self.cfg.model) for s in rules.SIZES}
        small, larger = rules.SIZES
        batch = self.batch(probe, shapes[small], length)
        compute = relative_flops(data, shapes, batch.tokens)
        speeds = {s: batch.tokens_per_s / compute[s] for s in rules.SIZES}
        size, why = self.size(speeds, data, shapes, length), f"{larger}'s speed from FLOPs"
        measured = (probe.tokens_per_s_within(shapes[larger], batch.tokens, compute[larger])
                    if size == small else None)
        if measured:
            speeds[larger], why = measured, f"{larger} measured at {batch.tokens}"
            size = self.size(speeds, data, shapes, length)
            if size == larger:  # (what the probe measured of it: one size)
                level = measured / batch.tokens_per_s
                batch = self.weigh({b: v * level for b, v in batch.measured.items()}, probe.too_large,
                                   length)._replace(measured={batch.tokens: measured})
        elif size != small:  # its sweep has the time the larger shape's measurement would have had
            batch = self.batch(probe, shapes[size], length, probe.shape_deadline)
        for key in SHAPE:
            self.pick(key, _get(shapes[size], key), f"{size}: the largest shape the budget trains on one "
                                                    f"target token per parameter or more ({why})")
        return shapes[size], batch, {s: round(v) for s, v in speeds.items()}

    def size(self, speeds: dict[str, float], data: PreparedData, shapes: dict[str, ModelConfig],
             length: RunLength) -> str:
        """rules.model_size on the target tokens each shape trains in the budget at one process's `speeds`."""
        train_s = length.budget_s * (1 - rules.VALIDATION_SHARE) * self.world_size
        params = {s: parameter_count(m, data.vocab.src_vocab_size, data.vocab.tgt_vocab_size)
                  for s, m in shapes.items()}
        return rules.model_size({s: v * train_s for s, v in speeds.items()}, params)

    def decoder(self, model: ModelConfig, start: RunStart, amp: Any, batch_tokens: int) -> ModelConfig:
        """The shape with the decoder training.decode_speedup asks for (rules.decoder_depth)."""
        speedup = self.cfg.training.decode_speedup
        shapes, speeds = decoder_speeds(model, start.data, self.cfg.decoding, start.device, amp, batch_tokens)
        chosen, measured = rules.decoder_depth(speeds, speedup), {k: round(v) for k, v in speeds.items()}
        for key in SHAPE[3:]:
            self.pick(key, _get(shapes[chosen], key), f"the deepest decoder at {speedup:g}× the beam search "
                      f"of {next(iter(speeds))}, else the shallowest; sentences/s {measured}")
        return shapes[chosen]

    def follow(self, model: ModelConfig, updates: float, epochs: float, ends_by: str, steps_per_epoch: int,
               valid_pairs: int, budget_s: float, per_pair_s: float) -> float:
        """The keys that follow from the model, the updates and epochs expected: the schedule, dropout,
        EMA and the average, validation's sample and interval; the seconds one validation takes."""
        pick = self.pick
        pick("training.epochs", UNTIL_THE_BUDGET, "the budget ends the run")
        pick("training.lr", rules.peak_lr(model.d_model), "2e-3 at d_model 256, × (256 / d_model)^0.5")
        pick("training.scheduler", "linear", "decays to 0 as the run ends")
        pick("training.decay_by_time", ends_by == "budget",
             "the budget ends the run" if ends_by == "budget" else "training.epochs end the run first")
        pick("training.warmup_steps", rules.warmup_steps(updates),
             f"a tenth of {updates:.0f} updates, 300-4,000")
        pick("model.norm_first", True, "pre-norm: stable at a high learning rate")
        pick("model.dropout", rules.dropout(epochs), f"{epochs:.1f} epochs")
        ema = pick("training.ema_decay", rules.ema_decay(updates), f"{updates:.0f} updates")
        average = pick("training.average_last", rules.average_last(ema, self.cfg.training.keep_last),
                       rules.average_why(ema))
        n = pick("training.valid_max_sentences",
                 rules.valid_sentences(valid_pairs, epochs, budget_s, per_pair_s),
                 f"up to {rules.VALID_SENTENCES} of the {valid_pairs} validation pairs")
        count = rules.validations(budget_s, n * per_pair_s)
        every = rules.valid_every_steps(updates, count, steps_per_epoch, rules.validations_at_end(average))
        pick("training.valid_every_steps", every, f"{count} validations of {n * per_pair_s:.1f}s, each "
             f"epoch's end and the run's among them: at most {rules.VALIDATION_SHARE:.0%} of the budget")
        return n * per_pair_s


def make(cfg: TrainConfig, start: RunStart, overrides: Sequence[str]) -> Plan:
    """Probe, then plan every key of PLANNED the user left open (see rules.py for each rule)."""
    started = time.perf_counter()
    t, data, device = cfg.training, start.data, start.device
    budget_s = t.max_minutes * 60
    amp, decode_amp = start.precision.dtype, precision(cfg.device, device, training=False).dtype
    planner = _Planner(cfg, chosen_by_you(cfg, overrides), start.world.size)
    pad = pad_to_multiple(t.pad_to_multiple, device, cfg.device.compile)  # as the run will pad
    sweep_s = BATCH_SWEEP_SHARE * PROBE_SHARE * budget_s  # the rest: the larger shape, then a validation
    probe = Probe(data, device, amp, cfg.seed, started + sweep_s, pad, sweep_s / TIMED_SIZES,
                  started + (BATCH_SWEEP_SHARE + SHAPE_SHARE) * PROBE_SHARE * budget_s)
    length = RunLength(data, budget_s, started, t.accumulate, start.world.size, pad,
                       t.epochs if "training.epochs" in planner.yours else None, rules.VALIDATION_SHARE)
    model, batch, shape_speeds = planner.shape(probe, data, length)
    if t.decode_speedup > 1 and SHAPE[0] not in planner.yours:  # (a shape of yours is kept as it is)
        model = planner.decoder(model, start, decode_amp, batch.tokens)
    per_pair = validation_seconds(model, data, cfg.decoding, batch.tokens, device, amp, decode_amp,
                                  started + PROBE_SHARE * budget_s, rules.VALID_SENTENCES)
    smallest = min(len(data.valid), rules.FEWEST_VALID_SENTENCES) * per_pair
    if smallest > 0.25 * budget_s:
        least = math.ceil(4 * smallest / 60)
        raise TrainingError(f"training.max_minutes={t.max_minutes} is too short: one validation takes "
                            f"{smallest:.1f}s here; set at least training.max_minutes={least}")
    updates, epochs, ends_by = length.expect(batch.tokens, batch.tokens_per_s)
    steps_per_epoch = length.epoch(batch.tokens)[0]
    validation_s = planner.follow(model, updates, epochs, ends_by, steps_per_epoch, len(data.valid),
                                  budget_s, per_pair)
    measured = Measured(time.perf_counter() - started, batch.tokens_per_s, batch.measured, shape_speeds,
                        updates, epochs, steps_per_epoch, ends_by, validation_s)
    return Plan((*(planner.choices[key] for key in PLANNED), *variant_choices(cfg, overrides)), measured)


def variant_choices(cfg: TrainConfig, overrides: Sequence[str]) -> tuple[Choice, ...]:
    """The input variants the run trains with (`inputs` chose them before the data), each as the plan's
    choice when they are its rules.VARIANTS and no dataset.variants key was named, else yours."""
    named = any(key.startswith("dataset.variants") for key in named_keys(overrides))
    planned = not named and cfg.dataset.variants == VariantsConfig(**rules.VARIANTS)
    return tuple(Choice(f"dataset.variants.{name}", p, "plan" if planned else "you",
                        rules.VARIANTS_WHY if planned else "")
                 for name, p in dataclasses.asdict(cfg.dataset.variants).items())


def _updates(length: RunLength, speeds: dict[int, float], after: int) -> dict[int, float]:
    """The updates the budget holds at each size of `speeds` (smallest first), until a size past `after`
    that the batch rule does not take: no larger one would be (its updates halve as its line doubles)."""
    updates: dict[int, float] = {}
    for size, speed in speeds.items():
        updates[size] = length.expect(size, speed)[0]
        if size > after and rules.batch_tokens(updates, length.batches_per_update) < size:
            break
    return updates

