"""`training.plan=auto`: a run that plans itself from its budget, this machine and its corpus.

After the data are prepared, a probe (probe.py) measures what this machine trains per second, in this
precision, on the run's own batches, and what one validation costs. The rules (rules.py) turn that and
`training.max_minutes` into the settings the user left open: batch size, model size, learning rate and
warm-up, dropout, validation interval and sample, EMA, averaging. A key set on the command line or in
a config file (an experiment, `model=...`) keeps its value. The plan is logged as a table, saved in
every checkpoint and in result.json, and a resumed run reuses it instead of probing again.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import OmegaConf

from transformer_mt import distributed, finetune
from transformer_mt.config import CONFIG_DIR, ModelConfig, TrainConfig
from transformer_mt.data import PreparedData
from transformer_mt.data.epochs import TrainingEpochs
from transformer_mt.errors import TrainingError
from transformer_mt.overrides import named_keys
from transformer_mt.plan import rules
from transformer_mt.plan.calibration import Calibration, needed
from transformer_mt.plan.length import Batch, RunLength
from transformer_mt.plan.probe import Probe
from transformer_mt.runtime import TrainingClock, pad_to_multiple, precision
from transformer_mt.tables import markdown_table
from transformer_mt.throughput import forward_flops
from transformer_mt.typed import to_dataclass

log = logging.getLogger(__name__)
SHAPE = ("model.d_model", "model.n_heads", "model.d_ff", "model.encoder_layers", "model.decoder_layers")
PLANNED = (*SHAPE, "training.batch_tokens", "training.epochs", "training.lr", "training.scheduler",
           "training.warmup_steps", "model.norm_first", "model.dropout", "training.valid_max_sentences",
           "training.valid_every_steps", "training.ema_decay", "training.average_last")
PROBE_SHARE = 0.02  # of the budget: what the probe may take
BATCH_SWEEP_SHARE = 0.6  # of the probe's time: no new batch size is measured after it
SHAPE_SHARE = 0.2  # of the probe's time after the sweep: the larger shape is measured if it ends in it
TIMED_SIZES = 5  # the sweep's time is divided among this many sizes' timed steps (and their warm-up)
UNTIL_THE_BUDGET = 1000  # training.epochs when the budget ends the run


@dataclass
class Plan:
    """Every planned key's value, where it came from ("you", "plan", or "parent": a fine-tuning run's
    model is its parent's) and why; what was measured."""

    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """What planning took."""
        return float(self.measured.get("probe_seconds", 0.0))

    def apply(self, cfg: TrainConfig, yours: set[str]) -> TrainConfig:
        """A copy of cfg with the plan's values, except for the keys in `yours` (what the user chose, also
        on the command line of a resumed run)."""
        cfg = copy.deepcopy(cfg)
        for key, value in self.values.items():
            if self.sources[key] == "plan" and key not in yours:
                section, name = key.split(".")
                setattr(getattr(cfg, section), name, value)
        return cfg

    def table(self) -> str:
        """The log's table: each key, its value, from whom and why; then the measurements."""
        rows = [[key, _shown(self.values[key]), self.sources[key], self.reasons.get(key, "")]
                for key in self.values]
        m, checked = self.measured, calibrated(self)
        shapes = (f", {m['shape_speeds']} at the small shape's batch (shape: tokens/s)"
                  if "shape_speeds" in m else "")
        return (markdown_table(["key", "value", "from", "why"], rows, align="llll") +
                f"\nmeasured in {m['probe_seconds']:.1f}s: {m['tokens_per_s']:.0f} target tokens/s at "
                f"{m['batch_speeds']} (batch: tokens/s){shapes}; expected {m['updates']:.0f} updates, "
                f"{m['epochs']:.2f} epochs of {m['steps_per_epoch']} updates; one validation "
                f"{m['validation_seconds']:.1f}s" + (f"\n{checked}" if checked else ""))

    def to_dict(self) -> dict[str, Any]:
        """Plain types, for checkpoints and result.json."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(**d)


def calibrated(plan: Plan) -> str:
    """The batch's check against training (calibration.py) in a line; "" before it is made."""
    c = plan.measured.get("calibrated")
    if not c:
        return ""
    was, now = c["was"], plan.values["training.batch_tokens"]
    verdict = f"kept {was}" if was == now else f"{was} → {now}"
    near = {b: n for b, n in c["updates"].items() if int(b) <= 2 * max(was, now)}  # the sizes in question
    also = "".join(f", {key} {was:g} → {now:g}" for key, (was, now) in c.get("changed", {}).items())
    return (f"checked at step {c['at_step']} on {c['seconds']:.0f}s of training at {c['tokens_per_s']:.0f} "
            f"target tokens/s: expected updates {near} (batch: updates); batch {verdict}{also}")


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def chosen_by_you(cfg: TrainConfig, overrides: Sequence[str]) -> set[str]:
    """The planned keys the user chose: named in an override, or different from the schema's default
    (an experiment or `model=...` file set them); a model group or `init=` chooses the whole shape."""
    named = named_keys(overrides)
    default = TrainConfig()
    yours = {key for key in PLANNED if key in named or _get(cfg, key) != _get(default, key)}
    if "model" in named or cfg.init or yours & set(SHAPE):
        yours |= set(SHAPE)
    return yours


def _chooser(cfg: TrainConfig, key: str) -> str:
    """Who chose a key the plan keeps: a fine-tuning run's parent for what makes its model, else you."""
    section, name = key.split(".")
    parents = cfg.init and section in finetune.OWN_KEYS and name not in finetune.OWN_KEYS[section]
    return "parent" if parents else "you"


def _get(cfg: TrainConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def shape(size: str, base: ModelConfig) -> ModelConfig:
    """`base` with the d_model, heads, FFN and layers of configs/model/<size>.yaml."""
    preset = to_dataclass(OmegaConf.load(CONFIG_DIR / "model" / f"{size}.yaml"), ModelConfig)
    return dataclasses.replace(base, **{k.split(".")[1]: _get_model(preset, k) for k in SHAPE})


def _get_model(model: ModelConfig, key: str) -> Any:
    return getattr(model, key.split(".")[1])


def parameters(model: ModelConfig, data: PreparedData) -> int:
    """The model's parameter count (built on the meta device: no memory, no time)."""
    from transformer_mt.checkpoint import build_model

    with torch.device("meta"):
        return build_model(model, data.vocab).num_parameters()


def seconds(plan: Plan | None) -> float:
    """What planning took (0 without a plan): the training budget counts it."""
    return plan.seconds if plan else 0.0


def record(plan: Plan | None) -> dict[str, Any] | None:
    """The plan as checkpoints and result.json keep it (None without one)."""
    return plan.to_dict() if plan else None


def decay_clock(plan: Plan | None, clock: TrainingClock) -> Callable[[], float]:
    """What the learning-rate decay follows besides the step count: the budget's clock, unless
    the plan expects the user's training.epochs to end the run first; then the steps alone, so that the
    run does not depend on its timing (and a resumed run stays bit-exact)."""
    return (lambda: 0.0) if plan and plan.measured.get("ends_by") == "epochs" else clock.used


def settle(cfg: TrainConfig, state: dict[str, Any] | None, data: PreparedData, device: torch.device,
           overrides: Sequence[str], world: distributed.World) -> tuple[TrainConfig, Plan | None]:
    """The run's config with its plan applied, and the plan: the resumed run's own, else a new one (made
    on the first rank, the same on all), None without `training.plan=auto`."""
    saved = (state or {}).get("plan")
    if saved:
        plan = Plan.from_dict(saved)
        log.info("the run's plan, as it was made:\n%s", plan.table())
    elif cfg.training.plan == "auto":
        amp, decode_amp = (precision(cfg.device, device, training=t).dtype for t in (True, False))
        plan = make(cfg, data, device, amp, decode_amp, overrides, world.size) if world.is_main else None
        plan = distributed.from_main(plan, world)
        log.info("plan for %g minutes on this machine (training.plan=auto):\n%s", cfg.training.max_minutes,
                 plan.table())
    else:
        return cfg, None
    return plan.apply(cfg, chosen_by_you(cfg, overrides)), plan


def batch_check(plan: Plan | None, cfg: TrainConfig, data: PreparedData, pad: int, world_size: int,
                overrides: Sequence[str]) -> Calibration | None:
    """What times the run's first training and checks the plan's batch against it (calibration.py);
    None where the run makes no such check."""
    if not needed(plan, overrides):
        return None
    t = cfg.training
    return Calibration(plan, RunLength(data, t.max_minutes * 60, 0.0, t.accumulate, world_size, pad, None),
                       t.keep_last)


def resize(plan: Plan, epochs: TrainingEpochs, epoch: int, trained: int, world_size: int) -> TrainingEpochs:
    """The epochs at the checked batch size, `epoch` going on from its first `trained` batches (of each
    rank) with the pairs they did not hold; the plan records where, for a resumed run (epochs_of)."""
    plan.measured["calibrated"]["rest_of"] = [epoch, trained]
    return epochs.resized(plan.values["training.batch_tokens"], epoch, trained, world_size)


def epochs_of(plan: Plan | None, epochs: TrainingEpochs, world_size: int) -> TrainingEpochs:
    """A resumed run's epochs: where its check changed the batch within an epoch, that epoch's rest is cut
    from the same batches of the size before (resize)."""
    checked = plan.measured.get("calibrated", {}) if plan else {}
    if "rest_of" not in checked:
        return epochs
    return epochs.resized(checked["was"]).resized(epochs.batch_tokens, *checked["rest_of"], world_size)


class _Planner:
    """Fills a Plan key by key: the user's value where they chose one, else the rule's."""

    def __init__(self, cfg: TrainConfig, yours: set[str], world_size: int) -> None:
        self.cfg, self.yours, self.world_size, self.plan = cfg, yours, world_size, Plan({})

    def pick(self, key: str, value: Any, why: str) -> Any:
        """The key's value in the plan: yours, or `value` (the plan's, for the reason `why`)."""
        mine = key in self.yours
        self.plan.values[key] = _get(self.cfg, key) if mine else value
        self.plan.sources[key] = _chooser(self.cfg, key) if mine else "plan"
        self.plan.reasons[key] = "" if mine else why
        return self.plan.values[key]

    def batch(self, probe: Probe, model: ModelConfig, length: RunLength, deadline: float | None = None
              ) -> Batch:
        """The batch size, its tokens/s and what the probe measured (by `deadline`, else the sweep's)."""
        if "training.batch_tokens" in self.yours:
            b = self.cfg.training.batch_tokens
            speed = probe.batch_speeds(model, (b,))[b]
            return Batch(self.pick("training.batch_tokens", b, ""), speed, {b: speed}, {b: speed})

        def least(speed: float) -> int:  # the rule's choice were every size this slow
            updates = _updates(length, dict.fromkeys(rules.BATCH_CANDIDATES, speed), after=0)
            return rules.batch_tokens(updates, length.batches_per_update)

        return self.weigh(probe.batch_speeds(model, least=least, deadline=deadline), probe.too_large, length)

    def weigh(self, measured: dict[int, float], too_large: int | None, length: RunLength) -> Batch:
        """The batch rule on the sizes from the smallest measured to the one that ran out of memory. A size
        the probe skipped takes the speed between those of the measured sizes around it, as a power of
        the batch; one past the largest measured, that one's (a larger batch never trains slower: this
        underestimates it)."""
        sizes = [b for b in rules.BATCH_CANDIDATES if min(measured) <= b < (too_large or math.inf)]
        speeds = {b: _between(measured, b) for b in sizes}
        updates = _updates(length, speeds, after=max(measured))
        b = rules.batch_tokens(updates, length.batches_per_update)
        return Batch(self.pick("training.batch_tokens", b, rules.batch_why(updates[b])), speeds[b], measured,
                     {size: speeds[size] for size in updates})

    def shape(self, probe: Probe, data: PreparedData, length: RunLength) -> tuple[ModelConfig, Batch]:
        """The model's shape (unless chosen) and its batch: the largest shape that the budget trains on
        one target token per parameter. The small shape's batch sizes are measured; each larger shape's
        speed is the small one's scaled by its FLOPs per token, about a lower bound (a larger model
        uses a device about as well or better). When that keeps the small shape, the larger one is
        measured at the small one's batch where the probe has time: on a GPU that a small model leaves
        mostly idle, a larger one trains nearly as fast. A measured larger shape takes the small one's
        batch sizes, their speeds scaled by its own."""
        if SHAPE[0] in self.yours:
            model, size, why = self.cfg.model, "", ""
            batch = self.batch(probe, model, length)
        else:
            shapes = {s: shape(s, self.cfg.model) for s in rules.SIZES}
            small, larger = rules.SIZES
            batch = self.batch(probe, shapes[small], length)
            compute = _compute(data, shapes, batch.tokens)
            speeds = {s: batch.tokens_per_s / compute[s] for s in rules.SIZES}
            size, why = self.size(speeds, data, shapes, length), f"{larger}'s speed from FLOPs"
            measured = None if size != small else probe.tokens_per_s_within(shapes[larger], batch.tokens,
                                                                            compute[larger])
            if measured:
                speeds[larger], why = measured, f"{larger} measured at {batch.tokens}"
                size = self.size(speeds, data, shapes, length)
                if size == larger:  # (what the probe measured of it: one size)
                    level, at = measured / batch.tokens_per_s, batch.tokens
                    batch = self.weigh({b: v * level for b, v in batch.measured.items()}, probe.too_large,
                                       length)._replace(measured={at: measured})
            elif size != small:  # its sweep has the time the larger shape's measurement would have had
                batch = self.batch(probe, shapes[size], length, probe.shape_deadline)
            model = shapes[size]
            self.plan.measured["shape_speeds"] = {s: round(v) for s, v in speeds.items()}
        for key in SHAPE:
            self.pick(key, _get_model(model, key), f"{size}: the largest shape the budget trains on one "
                                                   f"target token per parameter or more ({why})")
        return model, batch

    def size(self, speeds: dict[str, float], data: PreparedData, shapes: dict[str, ModelConfig],
             length: RunLength) -> str:
        """rules.model_size on the target tokens each shape trains in the budget at `speeds` (of one
        process: every process trains as many)."""
        train_s = length.budget_s * (1 - rules.VALIDATION_SHARE) * self.world_size
        return rules.model_size({s: v * train_s for s, v in speeds.items()},
                                {s: parameters(m, data) for s, m in shapes.items()})


def make(cfg: TrainConfig, data: PreparedData, device: torch.device, amp: torch.dtype | None,
         decode_amp: torch.dtype | None, overrides: Sequence[str], world_size: int = 1) -> Plan:
    """Probe, then plan every key of PLANNED the user left open (see rules.py for each rule)."""
    started = time.perf_counter()
    t, budget_s = cfg.training, cfg.training.max_minutes * 60
    planner = _Planner(cfg, chosen_by_you(cfg, overrides), world_size)
    pick = planner.pick
    pad = pad_to_multiple(t.pad_to_multiple, device, cfg.device.compile)  # as the run will pad
    sweep_s = BATCH_SWEEP_SHARE * PROBE_SHARE * budget_s  # the rest: the larger shape, then a validation
    probe = Probe(data, device, amp, decode_amp, cfg.seed, started + sweep_s, pad, sweep_s / TIMED_SIZES,
                  started + (BATCH_SWEEP_SHARE + SHAPE_SHARE) * PROBE_SHARE * budget_s)
    length = RunLength(data, budget_s, started, t.accumulate, world_size, pad,
                       t.epochs if "training.epochs" in planner.yours else None)
    model, (batch, speed, speeds, weighed) = planner.shape(probe, data, length)
    probe_ends = started + PROBE_SHARE * budget_s
    per_pair = probe.validation_seconds(model, cfg.decoding, batch, probe_ends)
    smallest = min(len(data.valid), rules.FEWEST_VALID_SENTENCES) * per_pair
    if smallest > 0.25 * budget_s:
        least = math.ceil(4 * smallest / 60)
        raise TrainingError(f"training.max_minutes={t.max_minutes} is too short: one validation takes "
                            f"{smallest:.1f}s here; set at least training.max_minutes={least}")
    updates, epochs, ends_by = length.expect(batch, speed)
    steps_per_epoch = length.epoch(batch)[0]
    pick("training.epochs", UNTIL_THE_BUDGET, "the budget ends the run")
    pick("training.lr", rules.peak_lr(model.d_model), "2e-3 at d_model 256, × (256 / d_model)^0.5")
    pick("training.scheduler", "linear", "decays to 0 as the budget runs out")
    pick("training.warmup_steps", rules.warmup_steps(updates), f"a tenth of {updates:.0f} updates, 300-4,000")
    pick("model.norm_first", True, "pre-norm: stable at a high learning rate")
    pick("model.dropout", rules.dropout(epochs), f"{epochs:.1f} epochs")
    ema = pick("training.ema_decay", rules.ema_decay(updates), f"{updates:.0f} updates")
    average = pick("training.average_last", rules.average_last(ema, t.keep_last), rules.average_why(ema))
    n = pick("training.valid_max_sentences",
             rules.valid_sentences(len(data.valid), epochs, budget_s, per_pair),
             f"up to {rules.VALID_SENTENCES} of the {len(data.valid)} validation pairs")
    validation_s = n * per_pair
    count = rules.validations(budget_s, validation_s)
    every = rules.valid_every_steps(updates, count, steps_per_epoch, rules.validations_at_end(average))
    pick("training.valid_every_steps", every, f"{count} validations of {validation_s:.1f}s, each epoch's end "
         f"and the run's among them: at most {rules.VALIDATION_SHARE:.0%} of the budget")
    planner.plan.measured |= {
        "tokens_per_s": speed, "batch_speeds": {str(k): round(v) for k, v in speeds.items()},
        "speeds": {str(k): v for k, v in weighed.items()},
        "updates": updates, "epochs": epochs, "steps_per_epoch": steps_per_epoch, "ends_by": ends_by,
        "validation_seconds": validation_s, "probe_seconds": time.perf_counter() - started}
    return planner.plan


def _between(measured: dict[int, float], size: int) -> float:
    """The speed at `size` on the line through the measured sizes around it in log-log scale; past the
    largest, the largest's."""
    below = max(b for b in measured if b <= size)
    above = min((b for b in measured if b > size), default=None)
    if above is None or below == size:
        return measured[below]
    return measured[below] * (measured[above] / measured[below]) ** (math.log(size / below) /
                                                                     math.log(above / below))


def _updates(length: RunLength, speeds: dict[int, float], after: int) -> dict[int, float]:
    """The updates the budget holds at each size of `speeds` (smallest first), up to the first size past
    `after` that the batch rule does not take: at one speed, a doubling halves the updates while the
    rule's line doubles, so no larger size would be taken either."""
    updates: dict[int, float] = {}
    for size, speed in speeds.items():
        updates[size] = length.updates(size, speed)
        if size > after and rules.batch_tokens(updates, length.batches_per_update) < size:
            break
    return updates


def _compute(data: PreparedData, shapes: dict[str, ModelConfig], batch: int) -> dict[str, float]:
    """Each shape's training FLOPs per target token over the smallest's, at a batch of the run's mean
    lengths."""
    src, tgt = (int(x) + 1 for x in data.train.lengths().mean(axis=0).round())
    rows = max(batch // max(src, tgt), 1)
    flops = {s: forward_flops(m, data.vocab.tgt_vocab_size, rows, src, tgt) for s, m in shapes.items()}
    return {s: f / flops[rules.SIZES[0]] for s, f in flops.items()}
