"""The rules a plan follows, each setting a small pure function of what the probe measured and what the
budget holds: a test states what each does, docs/planning.md which measurement it rests on."""

from __future__ import annotations

import math

BATCH_CANDIDATES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SIZES = ("small", "base")  # the planned model shapes, smallest first (`tiny` is for tests)
VALIDATION_SHARE = 0.05  # of the budget, at most
MOST_VALIDATIONS = 20
VALID_SENTENCES = 1000  # validated pairs where the split has them: enough to rank checkpoints
FEWEST_VALID_SENTENCES = 100
UPDATES_PER_TOKEN = 1.0  # the batch rule's line: updates per token of a batch, where the larger batch pays
EMA_UPDATES = 2000  # an EMA of decay 0.999 averages ~1,000 updates: with fewer it holds early weights
# data/variants.py. No capitals: translation folds ALL CAPS to sentence case (decoding.input_case), and
# training on them costs text as written more than the runs' spread (docs/input-variants.md). No names
# and numbers substituted, no pairs joined: through the documents layer, which splits sentences and
# keeps spans, they gain nothing and cost text as written (docs/documents.md)
VARIANTS = {"caps": 0.0, "title": 0.0, "lower": 0.1, "no_punct": 0.1, "typos": 0.5, "substitute": 0.0,
            "join": 0.0}
VARIANTS_WHY = "input as people type and write it: docs/input-variants.md, docs/documents.md"


def batch_tokens(updates: dict[int, float], batches_per_update: int = 1) -> int:
    """The largest batch that the budget still trains for at least as many updates as an update holds
    tokens, i.e. about the square root of the tokens the budget trains: a longer budget or a faster
    device earns larger batches, a short one keeps the updates it needs (the smallest size when none
    qualifies). `updates`: the expected updates at each batch size; an update holds
    `batches_per_update` batches (processes × accumulation)."""
    return max((b for b, n in updates.items() if n >= UPDATES_PER_TOKEN * b * batches_per_update),
               default=min(updates))


def batch_why(updates: float) -> str:
    """The plan table's reason for a batch the rule chose with `updates` expected updates."""
    return f"the largest whose {updates:.0f} updates are at least {UPDATES_PER_TOKEN:g} × its tokens each"


def model_size(tokens: dict[str, float], params: dict[str, int]) -> str:
    """The largest shape that the budget shows at least one target token per parameter (`tokens`: what
    the budget trains of each shape at its measured speed); `small` when none does."""
    fitting = [size for size in SIZES if tokens[size] >= params[size]]
    return fitting[-1] if fitting else SIZES[0]


def decoder_depth(speeds: dict[str, float], speedup: float) -> str:
    """The deepest decoder whose beam search is `speedup` times the balanced shape's, else the shallowest
    (`speeds`: sentences/s of each shape, the balanced one first, then shallower decoders, deepest first)."""
    balanced = next(iter(speeds.values()))
    return next((s for s, v in speeds.items() if v >= speedup * balanced), list(speeds)[-1])


def peak_lr(d_model: int) -> float:
    """2e-3 for d_model 256 with pre-norm, scaled by d_model^-0.5 as in the paper's schedule."""
    return round(2e-3 * math.sqrt(256 / d_model), 5)


def warmup_steps(updates: float) -> int:
    """A tenth of the expected updates, at least 300 and at most 4,000, never more than half the run
    (rounded to 100 steps, so that the plan does not move with the probe's noise)."""
    steps = min(max(0.1 * updates, 300), 4000, 0.5 * updates)
    return max(int(round(steps, -2)), 100 if updates >= 200 else int(updates // 2))


def dropout(epochs: float) -> float:
    """None for one or two passes over the data, then 0.1 more at each doubling of the passes, at most 0.3:
    0.1 from 4 epochs, 0.2 from 8, 0.3 from 16."""
    if epochs < 4:
        return 0.0
    return min(0.3, round(0.1 * math.floor(math.log2(epochs / 2)), 1))


def ema_decay(updates: float) -> float:
    """An EMA of the weights (0.999) when the run makes enough updates for it to average late weights."""
    return 0.999 if updates >= EMA_UPDATES else 0.0


def average_last(ema_decay: float, keep_last: int) -> int:
    """Average the last 3 checkpoints at the end only when they are EMA weights: without EMA, the
    checkpoints a short run keeps are far apart in quality and their average loses to the last."""
    return min(3, keep_last) if ema_decay > 0 and keep_last >= 2 else 0


def average_why(ema_decay: float) -> str:
    """The plan table's reason for average_last."""
    return "with EMA: kept only if validation does not drop" if ema_decay else "without EMA the average loses"


def valid_sentences(valid_pairs: int, epochs: float, budget_s: float, per_pair_s: float) -> int:
    """Validate on VALID_SENTENCES pairs (or the whole split, if smaller), fewer only when the epochs' own
    validations would pass VALIDATION_SHARE of the budget, never below FEWEST_VALID_SENTENCES."""
    n = min(valid_pairs, VALID_SENTENCES)
    affordable = VALIDATION_SHARE * budget_s / max(math.ceil(epochs), 1) / per_pair_s
    return max(min(n, int(affordable)), min(valid_pairs, FEWEST_VALID_SENTENCES))


def validations(budget_s: float, validation_s: float) -> int:
    """How many validations fit in VALIDATION_SHARE of the budget (1 to MOST_VALIDATIONS)."""
    return max(1, min(MOST_VALIDATIONS, int(VALIDATION_SHARE * budget_s / validation_s)))


def valid_every_steps(updates: float, count: int, steps_per_epoch: int, at_end: int = 1) -> int:
    """The interval (rounded up to 100 steps) of the validations that make `count` over the run together
    with the one at each epoch's end and the `at_end` that the run's end makes (its last checkpoint's,
    and the average's); 0 (the epochs' ends only) when those leave none, or an epoch is shorter."""
    between = count - math.floor(updates / steps_per_epoch) - at_end
    if between < 1:
        return 0
    every = math.ceil(updates / (between + 1) / 100) * 100
    return 0 if every >= steps_per_epoch else every


def validations_at_end(average_last: int) -> int:
    """The validations a run makes when it ends: its last checkpoint's, and the average's if it keeps one."""
    return 1 + (average_last >= 2)
