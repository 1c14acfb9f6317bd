"""The plan's measurements on this machine, in this precision, on the run's own data: training tokens/s
of a model at several batch sizes, and what one validation costs. A probe trains a throw-away copy of
the model for a few steps; it leaves every random generator as it found it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch._dynamo  # noqa: F401  (a process's first optimizer imports it, for seconds: not in the probe)

from transformer_mt.checkpoint import build_model
from transformer_mt.config import DecodingConfig, ModelConfig, SearchConfig
from transformer_mt.data import EncodedSplit, PreparedData
from transformer_mt.errors import TrainingError
from transformer_mt.metrics import score
from transformer_mt.model import Transformer
from transformer_mt.plan.rules import BATCH_CANDIDATES, VALID_SENTENCES
from transformer_mt.runtime import rng_state, set_rng_state
from transformer_mt.throughput import real_batches, synchronize, time_training
from transformer_mt.translator import decode_ids, decoding_batches
from transformer_mt.validation import validation_loss

STEPS = 4  # timed optimizer steps per batch size at least, after two untimed ones
ALWAYS_TIMED = 2  # batch sizes measured whatever the deadline: the larger ones' speed is not a guess
POOL = 64  # batches of the run's first epoch that the timed steps go round
DECODED = 32  # validation sentences decoded first to time one (more, where the probe has time)
UNTIMED = 2  # sentences (and pairs of the loss) run once before timing: a GPU's first calls set up kernels
AS_FAST = 0.9  # a doubling that gains less than 10% tokens/s: the device is busy already, stop measuring
LOSS_PAIRS = 200  # validation pairs whose loss is timed


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
    decode_amp: torch.dtype | None  # validation decoding's
    seed: int
    deadline: float  # time.perf_counter() value: no batch size whose measurement would end later starts
    pad_to_multiple: int = 1  # the run's batch padding (runtime.pad_to_multiple), so that shapes match
    seconds_per_size: float = 0.0  # timed steps at one batch size go on this long (at least STEPS)
    shape_deadline: float = math.inf  # the same, for the larger model shape's measurements
    too_large: int | None = None  # the batch size that ran out of memory, if one did
    # the last sweep's measurements: (seconds each took, of them its timed steps, seconds per step)
    timings: dict[int, tuple[float, float, float]] = field(default_factory=dict, init=False, repr=False)

    def batch_speeds(self, model_cfg: ModelConfig, batches: tuple[int, ...] = BATCH_CANDIDATES,
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

    def validation_seconds(self, model_cfg: ModelConfig, decoding: SearchConfig, batch_tokens: int,
                           deadline: float) -> float:
        """Seconds per pair of validation's sample: its loss and its scores, timed on up to LOSS_PAIRS
        pairs, and its decoding (sentence_seconds)."""
        valid = self.data.valid
        timed = valid.subset(range(min(LOSS_PAIRS, len(valid))))
        state = rng_state()
        try:
            model = build_model(model_cfg, self.data.vocab).to(self.device).eval()
            validation_loss(model, valid.subset(range(min(UNTIMED, len(valid)))), batch_tokens, self.device,
                            self.amp)
            synchronize(self.device)
            start = time.perf_counter()
            validation_loss(model, timed, batch_tokens, self.device, self.amp)
            synchronize(self.device)
            loss_each = (time.perf_counter() - start) / max(len(timed), 1)
            return loss_each + scoring_seconds(timed) + self.sentence_seconds(model, decoding, deadline)
        finally:
            set_rng_state(state)

    def sentence_seconds(self, model: Transformer, decoding: SearchConfig, deadline: float) -> float:
        """Seconds per sentence of validation's decoding: the padded tokens of its batches (a batch decodes
        each row for its longest source) at what one costs in the batch of validation's median sentence,
        whose rows share each step as validation's do (fewer rows cost more per token). UNTIMED of its
        rows are decoded first, then DECODED timed, then as many more as `deadline` leaves time for. An
        untrained model never ends a sentence, so each is decoded to its source's length, about what a
        trained one writes."""
        src = self.data.valid.src_ids[:VALID_SENTENCES]
        as_long = DecodingConfig(**{**dataclasses.asdict(decoding), "max_len_a": 1.0, "max_len_b": 1})
        batches = decoding_batches([len(s) for s in src], as_long, self.device)
        order = [i for batch in batches for i in batch]
        batch = next(b for b in batches if order[len(order) // 2] in b)

        def padded(rows: list[int]) -> int:
            return len(rows) * (max(len(src[i]) for i in rows) + 1)

        def seconds_per_token(rows: int) -> float:
            middle = batch[(len(batch) - rows) // 2:][:rows]
            start = time.perf_counter()
            decode_ids(model, [src[i] for i in middle], as_long, self.device, amp=self.decode_amp)
            synchronize(self.device)
            return (time.perf_counter() - start) / padded(middle)

        seconds_per_token(min(UNTIMED, len(batch)))  # (untimed)
        per_token = seconds_per_token(min(DECODED, len(batch)))
        row_s = per_token * padded(batch) / len(batch)
        more = min(len(batch), int((deadline - time.perf_counter()) / row_s))
        if more > DECODED:
            per_token = seconds_per_token(more)
        return per_token * sum(padded(b) for b in batches) / len(src)


def scoring_seconds(pairs: EncodedSplit) -> float:
    """Seconds per pair of validation's scores (BLEU, chrF, CER, WER), timed with each pair's source as its
    translation: a text about as long as a translation, unlike its reference as an untrained model's
    output is (scoring identical texts would take edit distances' shortcuts)."""
    if not len(pairs) or pairs.src_text is None or pairs.tgt_text is None:
        return 0.0
    start = time.perf_counter()
    score(pairs.src_text, pairs.tgt_text)
    return (time.perf_counter() - start) / len(pairs)
