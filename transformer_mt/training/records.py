"""What a training run records besides checkpoints: TensorBoard events, metrics.jsonl and result.json.

Only rank 0 records (the others get a disabled `RunRecords`). `result.json` and the TensorBoard
HParams entry are written when the run ends: they are what a sweep compares runs by (`sweep.py`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoints.store import BEST, LATEST, intact
from transformer_mt.decoding.metrics import HIGHER_IS_BETTER, Scores
from transformer_mt.errors import TrainingError
from transformer_mt.runtime.files import atomic_write

log = logging.getLogger(__name__)
RESULT = "result.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
# The settings that usually explain a difference between runs; overridden keys are added to them.
HPARAMS = ("model.d_model", "model.n_heads", "model.d_ff", "model.encoder_layers", "model.decoder_layers",
           "model.dropout", "tokenizer.kind", "tokenizer.vocab_size", "training.lr", "training.scheduler",
           "training.warmup_steps", "training.batch_tokens", "training.accumulate",
           "training.label_smoothing", "training.epochs", "dataset.max_pairs", "seed")


@dataclasses.dataclass
class Window:
    """Loss and target tokens since the last progress line."""

    loss: float = 0.0
    batches: int = 0
    tokens: int = 0
    start: float = dataclasses.field(default_factory=time.perf_counter)


class RunRecords:
    """The run's TensorBoard writer and files; every method is a no-op when not enabled (rank > 0)."""

    def __init__(self, run_dir: Path, enabled: bool, purge_step: int | None = None) -> None:
        self.run_dir = run_dir
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter  # slow import, only for training

            # purge_step: a resumed run redoes the steps after its checkpoint; drop their old events
            # and validation records (a kill between a record and its checkpoint would leave one twice).
            self.writer = SummaryWriter(str(run_dir / TENSORBOARD), purge_step=purge_step)
        # The records of the checkpoint's own step: a checkpoint written before its step's validation
        # (validated: false) is validated again when resumed, and that record replaces the old one.
        self.again: set[tuple[int, str | None]] = set()
        if enabled and purge_step is not None:
            kept = purge_records(run_dir, purge_step)
            self.again = {_key(r) for r in kept if r["step"] == purge_step - 1}

    def scalars(self, tag: str, values: dict[str, float], step: int) -> None:
        """Add `tag/name` scalars at step."""
        if self.writer is not None:
            for name, value in values.items():
                self.writer.add_scalar(f"{tag}/{name}", value, step)

    def validation(self, tag: str, step: int, loss: float, scores: Scores, samples: str,
                   record: dict[str, Any]) -> None:
        """A validation's scalars and sample translations, and its line in metrics.jsonl."""
        if self.writer is None:
            return
        self.scalars(tag, {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": scores.bleu,
                           "chrf": scores.chrf, "cer": scores.cer, "wer": scores.wer}, step)
        self.writer.add_text(f"{tag}/samples", samples, step)
        self.writer.flush()
        path = self.run_dir / METRICS
        try:
            if _key(record) in self.again:
                self.again.discard(_key(record))
                _write_records(path, [r for r in read_records(path) if _key(r) != _key(record)] + [record])
            else:
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
        except OSError as ex:
            raise TrainingError(f"could not record the validation of step {step} in {METRICS} "
                                f"({ex.strerror}); {intact(self.run_dir)}") from ex

    def attention(self, image: torch.Tensor, step: int) -> None:
        """A cross-attention matrix (output rows × source columns) as an image, each row scaled to [0, 1]."""
        if self.writer is None or image.numel() == 0:
            return
        image = image.float().cpu()
        image = image / image.amax(dim=1, keepdim=True).clamp_min(1e-9)
        scale = max(1, 256 // max(image.shape))
        image = image.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        self.writer.add_image("valid/cross_attention", image, step, dataformats="HW")

    def text(self, tag: str, text: str, step: int) -> None:
        """A text entry (e.g. the run's config)."""
        if self.writer is not None:
            self.writer.add_text(tag, text, step)

    def finish(self, result: dict[str, Any], params: dict[str, Any], step: int) -> None:
        """Complete the run's result with its best scores and checkpoint, write result.json, add the
        HParams entry (the best scores are its metrics), and close the writer.

        `run_name="."` keeps the HParams entry in the run's own directory: one row per run of a sweep.
        """
        if self.writer is None:
            return
        scores = best_scores(self.run_dir)
        best = self.run_dir / BEST
        checkpoint = best if best.exists() else self.run_dir / LATEST
        result = {**result, "higher_is_better": HIGHER_IS_BETTER[result["best_metric"]],
                  "best_bleu": scores["bleu"], "best_chrf": scores["chrf"],
                  "best_valid_loss": scores["valid_loss"], "checkpoint": str(checkpoint.resolve())}
        text = json.dumps(result, indent=2) + "\n"
        atomic_write(self.run_dir / RESULT, lambda f: f.write(text.encode("utf-8")))
        metrics = {f"best/{name}": value for name, value in scores.items() if math.isfinite(value)}
        self.writer.add_hparams(params, metrics, run_name=".", global_step=step)
        self.writer.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a line that is not a whole record (a write cut short by a kill
    or a full disk) is skipped with a warning."""
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            log.warning("%s: line %d is not a whole record (a write cut short?); skipped", path, number)
    return records


def _key(record: dict[str, Any]) -> tuple[int, str | None]:
    """What a validation record is of: its step, and the model (None: the trained one, or "averaged")."""
    return record["step"], record.get("model")


def _write_records(path: Path, records: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in records)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def purge_records(run_dir: Path, purge_step: int) -> list[dict[str, Any]]:
    """Keep the whole validation records of the steps before `purge_step` (the file rewritten, so that it
    ends with a whole line again); return them."""
    path = run_dir / METRICS
    if not path.is_file():
        return []
    kept = [r for r in read_records(path) if isinstance(r.get("step"), int) and r["step"] < purge_step]
    _write_records(path, kept)
    return kept


def best_scores(run_dir: Path) -> dict[str, float]:
    """The best BLEU and chrF, and the lowest validation loss, over the run's validations so far."""
    records = read_records(run_dir / METRICS)
    if not records:
        return {"bleu": math.nan, "chrf": math.nan, "valid_loss": math.nan}
    return {"bleu": max(r["bleu"] for r in records), "chrf": max(r["chrf"] for r in records),
            "valid_loss": min(r["valid_loss"] for r in records)}


def _lookup(cfg: Any, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def hparams(cfg: Any, overrides: list[str], world_size: int) -> dict[str, bool | int | float | str]:
    """Hyperparameters to show in TensorBoard: the usual suspects plus every overridden key.

    A group choice such as `model=tiny` is shown by its name; TensorBoard takes only numbers, strings
    and booleans, so anything else (None, lists) is shown as text.
    """
    values: dict[str, Any] = {key: _lookup(cfg, key) for key in HPARAMS}
    for override in overrides:
        key, _, given = override.lstrip("+~").partition("=")
        if key.startswith(("hydra.", "checkpoint.")) or key in ("resume", "traceback"):
            continue
        try:
            value = _lookup(cfg, key)
        except AttributeError:
            value = given
        values[key] = given if dataclasses.is_dataclass(value) else value
    values["world_size"] = world_size
    return {k: v if isinstance(v, (bool, int, float, str)) else "null" if v is None else str(v)
            for k, v in values.items()}
