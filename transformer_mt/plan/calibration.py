"""The plan's batch, checked once against the run's own training.

The probe times each batch size for a few seconds, and a few seconds measure only themselves: a CPU's
speed wanders by a fifth over seconds to minutes, and the batch rule's line can fall inside that error.
So a planned run that its budget ends times its own first CHECKED_SHARE of training (validation and
checkpoints left out), takes that speed as the level of the probe's (whose ratios between batch sizes
stay), and applies the batch rule again to the whole budget: the updates made so far and those the
rest of it holds; the other planned keys that follow from the updates and epochs expected (validation
interval, dropout, EMA and the average) are planned again from the same numbers. At another size, the
epoch goes on with the pairs its batches have not held yet, cut into batches of the new size
(data/epochs.py). The plan records the check either way, and where it resized (a resumed run does not
check again, and cuts the same rest); a run whose length `training.epochs` fixes never checks, so that
it stays independent of its timing.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from transformer_mt.overrides import named_keys
from transformer_mt.plan import rules

if TYPE_CHECKING:
    from transformer_mt.plan import Plan
    from transformer_mt.plan.length import RunLength

CHECKED_SHARE = 0.1  # of the budget's training seconds, timed before the check
SKIPPED_STEPS = 5  # a process's first steps allocate what the later ones reuse: not timed
BATCH = "training.batch_tokens"
DROPOUT, EMA, AVERAGE = "model.dropout", "training.ema_decay", "training.average_last"  # planned anew too


class Calibration:
    """Times a planned run's training steps, then checks its batch against it (`decide`)."""

    def __init__(self, plan: Plan, length: RunLength, keep_last: int = 3) -> None:
        self.plan, self.length, self.keep_last = plan, length, keep_last  # (the checkpoints an average takes)
        self.seconds = self.tokens = 0.0  # of timed training
        self._last: tuple[float, int] | None = None
        self._skip = SKIPPED_STEPS

    def observe(self, seconds: float, tokens: int) -> None:
        """At each optimizer step: the run's clock and this process's target tokens so far."""
        if self._last is not None and self._skip <= 0:
            self.seconds += seconds - self._last[0]
            self.tokens += tokens - self._last[1]
        self._last, self._skip = (seconds, tokens), self._skip - 1

    def pause(self) -> None:
        """A validation or a checkpoint since the last step: the next step's time is not training's."""
        self._last = None

    @property
    def ready(self) -> bool:
        """Whether CHECKED_SHARE of the budget's training seconds have been timed."""
        timed = CHECKED_SHARE * self.length.budget_s * (1 - rules.VALIDATION_SHARE)
        return self.tokens > 0 and self.seconds >= timed

    def decide(self, used_s: float, steps: int) -> Plan:
        """The plan with its batch (and the validation interval, in steps of it) checked, after `steps`
        updates and `used_s` seconds of the budget."""
        plan, m = copy.deepcopy(self.plan), self.plan.measured
        was, speed = plan.values[BATCH], self.tokens / self.seconds
        level = speed / m["tokens_per_s"]
        left_s = (self.length.budget_s - used_s) * (1 - rules.VALIDATION_SHARE)
        done = steps * self.length.update_tokens(was)  # target tokens of one process so far
        updates = {b: (done + left_s * s * level) / self.length.update_tokens(b)
                   for b, s in ((int(b), s) for b, s in m["speeds"].items())}
        size = rules.batch_tokens(updates, self.length.batches_per_update)
        plan.values[BATCH] = size
        plan.reasons[BATCH] = rules.batch_why(updates[size]) + ", at the speed of training"
        steps_per_epoch, ours = self.length.epoch(size)[0], plan.sources.get
        epochs = updates[size] / steps_per_epoch
        ema = rules.ema_decay(updates[size]) if ours(EMA) == "plan" else plan.values[EMA]
        planned = {DROPOUT: (rules.dropout(epochs), f"{epochs:.1f} epochs"),
                   EMA: (ema, f"{updates[size]:.0f} updates"),
                   AVERAGE: (rules.average_last(ema, self.keep_last), rules.average_why(ema))}
        changed = {}
        for key, (value, why) in planned.items():
            if ours(key) == "plan" and value != plan.values[key]:
                changed[key] = [plan.values[key], value]
                plan.values[key], plan.reasons[key] = value, why + ", at the speed of training"
        if ours("training.valid_every_steps") == "plan":
            count = rules.validations(self.length.budget_s, m["validation_seconds"])
            plan.values["training.valid_every_steps"] = rules.valid_every_steps(
                updates[size], count, steps_per_epoch, rules.validations_at_end(plan.values[AVERAGE]))
        plan.measured["calibrated"] = {"tokens_per_s": speed, "seconds": self.seconds, "at_step": steps,
                                       "was": was, "updates": {str(b): round(n) for b, n in updates.items()},
                                       "changed": changed}
        return plan


def needed(plan: Plan | None, overrides: Sequence[str]) -> bool:
    """Whether a run checks its plan's batch: the plan chose it, the budget ends the run, no check yet
    (a plan saved before checks could be made lacks their speeds), no override names it."""
    named = named_keys(overrides)
    return (plan is not None and plan.sources.get(BATCH) == "plan" and BATCH not in named
            and plan.measured.get("ends_by") == "budget" and "speeds" in plan.measured
            and "calibrated" not in plan.measured)
