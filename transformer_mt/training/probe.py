"""How fast the Trainer's own step (step.py) trains on this machine, in this precision, on the run's own
data, at each batch size a plan (plan/) weighs, within the time the plan gives it. A probe trains a
throw-away copy of the model for a few seconds; it leaves every random generator as it found it. (What
one validation costs is validation_cost.py's.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch._dynamo  # noqa: F401  (a process's first optimizer imports it, for seconds: not in the probe)

from transformer_mt.checkpoints.store import build_model
from transformer_mt.config import ModelConfig
from transformer_mt.data import PreparedData
from transformer_mt.errors import TrainingError
from transformer_mt.runtime.rng import rng_state, set_rng_state
from transformer_mt.training.throughput import real_batches, time_training

STEPS = 4  # timed optimizer steps per batch size at least, after two untimed ones
ALWAYS_TIMED = 2  # batch sizes measured whatever the deadline: the larger ones' speed is not a guess
POOL = 64  # batches of the run's first epoch that the timed steps go round
AS_FAST = 0.9  # a doubling that gains less than 10% tokens/s: the device is busy already, stop measuring


class Timing(NamedTuple):
    """One batch size's measurement: its training speed, and what the next size's cost is predicted from."""

    tokens_per_s: float  # target tokens
    timed_s: float  # the timed steps' seconds (seconds_per_size at least)
    step_s: float  # one step of an average batch


@dataclass
class Probe:
    """Where a probe runs and how long it may take."""

    data: PreparedData
    device: torch.device
    amp: torch.dtype | None  # training's autocast dtype
    seed: int
    deadline: float  # time.perf_counter() value: no batch size whose measurement would end later starts
    pad_to_multiple: int = 1  # the run's batch padding (runtime.pad_to_multiple), so that shapes match
    seconds_per_size: float = 0.0  # timed steps at one batch size go on this long (at least STEPS)
    shape_deadline: float = math.inf  # the same, for the larger model shape's measurements
    too_large: int | None = None  # the batch size that ran out of memory, if one did
    # the last sweep's measurements: (seconds each took, of them its timed steps, seconds per step)
    timings: dict[int, tuple[float, float, float]] = field(default_factory=dict, init=False, repr=False)

    def batch_speeds(self, model_cfg: ModelConfig, batches: tuple[int, ...],
                     least: Callable[[float], int] | None = None, deadline: float | None = None
                     ) -> dict[int, float]:
        """Training target tokens/s at each batch size, smallest first, until a doubling no longer gains
        10%, the device runs out of memory, or the next size would end past the deadline (the first
        ALWAYS_TIMED sizes are measured whatever the deadline: a short budget's deadline would otherwise
        allow one size, and the batch rule nothing to compare). After the first size, the sizes below
        `least(its tokens/s)` are skipped: `least` is the size the plan would choose were every size as
        slow as the first, and a larger batch never trains slower, so the plan chooses no smaller one
        (on a GPU, whose speed grows with the batch far beyond a CPU's, the sweep's time goes to the
        sizes in question). `deadline`: another than the sweep's (the larger shape's sweep has its own)."""
        deadline = self.deadline if deadline is None else deadline
        speeds: dict[int, float] = {}
        self.timings, skip_below = {}, 0
        for size in batches:
            if size < skip_below:
                continue
            started = time.perf_counter()
            if len(speeds) >= ALWAYS_TIMED and started + self.cost(size) > deadline:
                break
            try:
                timing = self.measure(model_cfg, size)
            except torch.OutOfMemoryError as ex:
                if not speeds:
                    raise TrainingError(f"training.plan=auto: a {size}-token batch of this model does not "
                                        f"fit on {self.device} ({str(ex).splitlines()[0]}); choose a "
                                        "smaller model (model=small) or another device") from None
                self.too_large = size
                break
            finally:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            speeds[size] = timing.tokens_per_s
            self.timings[size] = (time.perf_counter() - started, timing.timed_s, timing.step_s)
            if len(speeds) == 1 and least is not None:
                skip_below = least(speeds[size])
            if len(speeds) > 1 and speeds[size] < list(speeds.values())[-2] / AS_FAST:
                break
        return speeds

    def cost(self, size: int, compute: float = 1.0) -> float:
        """What measuring `size` would take, from the largest size this sweep measured at or below it: its
        untimed part (model, batches, warm-up steps) and its steps grow with the tokens a step holds,
        and by `compute`, another model's compute per token over the measured one's; its timed steps
        go on for seconds_per_size at least."""
        measured = max(b for b in self.timings if b <= size)
        took, timed, step = self.timings[measured]
        scale = size / measured * compute
        return (took - timed) * scale + max(self.seconds_per_size, STEPS * step * scale) + step * scale

    def tokens_per_s_within(self, model_cfg: ModelConfig, batch_tokens: int, compute: float) -> float | None:
        """Another model's training tokens/s at a batch size, if its cost (`compute`: its compute per
        token over the swept model's) ends its measurement by shape_deadline and the model fits; else None."""
        if time.perf_counter() + self.cost(batch_tokens, compute) > self.shape_deadline:
            return None
        try:
            return self.measure(model_cfg, batch_tokens).tokens_per_s
        except torch.OutOfMemoryError:
            return None
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def measure(self, model_cfg: ModelConfig, batch_tokens: int) -> Timing:
        """Target tokens/s of real optimizer steps on the first batches of the run's first epoch (a random
        sample of its lengths), timed for seconds_per_size: a few steps on a CPU are too noisy."""
        state = rng_state()
        try:
            model = build_model(model_cfg, self.data.vocab).to(self.device)
            batches = real_batches(self.data, batch_tokens, self.seed, POOL, self.pad_to_multiple)
            seconds, tokens = time_training(model, batches, self.device, self.amp,
                                            seconds=self.seconds_per_size, min_steps=STEPS)
        finally:
            set_rng_state(state)
        step_s = seconds * sum(b.n_tgt_tokens for b in batches) / len(batches) / tokens
        return Timing(tokens / seconds, seconds, step_s)


def interpolated(measured: dict[int, float], size: int) -> float:
    """The speed at `size` on the log-log line through the measured sizes around it; past them, the last's
    (a larger batch never trains slower)."""
    below = max(b for b in measured if b <= size)
    above = min((b for b in measured if b > size), default=None)
    if above is None or below == size:
        return measured[below]
    return measured[below] * (measured[above] / measured[below]) ** (math.log(size / below) /
                                                                     math.log(above / below))
