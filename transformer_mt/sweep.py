"""Comparing runs: each run's `result.json` and HParams entry, and the summary of a Hydra sweep.

Every training run writes `result.json` into its directory when it ends. At the end of a multirun,
the `SweepSummary` callback (registered in configs/train.yaml) gathers them into `summary.csv` and
`summary.md` at the sweep root and prints the table; `python -m transformer_mt.sweep <sweep dir>`
rebuilds it by hand, e.g. for a sweep that stopped early. The HParams entry puts the same runs side by
side in TensorBoard (`tensorboard --logdir <sweep dir>`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)
RESULT = "result.json"
# The settings that usually explain a difference between runs; swept keys are added to them.
HPARAMS = ("model.d_model", "model.n_heads", "model.d_ff", "model.encoder_layers", "model.decoder_layers",
           "model.dropout", "tokenizer.kind", "tokenizer.vocab_size", "training.lr", "training.scheduler",
           "training.warmup_steps", "training.batch_tokens", "training.accumulate",
           "training.label_smoothing", "training.epochs", "dataset.max_pairs", "seed")
COLUMNS = ("job", "overrides", "best_bleu", "best_chrf", "epochs", "wall_seconds", "tgt_tokens_per_s",
           "checkpoint")
HEADERS = ("job", "overrides", "best BLEU", "best chrF", "epochs", "wall time (s)", "tgt tokens/s",
           "checkpoint")


def best_scores(run_dir: Path) -> dict[str, float]:
    """The best BLEU and chrF, and the lowest validation loss, over the run's validations so far."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()] if path.is_file() else []
    if not records:
        return {"bleu": math.nan, "chrf": math.nan, "valid_loss": math.nan}
    return {"bleu": max(r["bleu"] for r in records), "chrf": max(r["chrf"] for r in records),
            "valid_loss": min(r["valid_loss"] for r in records)}


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _lookup(cfg: Any, key: str) -> Any:
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def hparams(cfg: Any, overrides: list[str], world_size: int) -> dict[str, bool | int | float | str]:
    """Hyperparameters to show in TensorBoard: the usual suspects plus every overridden key.

    A group choice such as `model=tiny` is shown by its name; TensorBoard takes only numbers,
    strings and booleans, so anything else (None, lists) is shown as text.
    """
    values: dict[str, Any] = {key: _lookup(cfg, key) for key in HPARAMS}
    for override in overrides:
        key = _override_key(override)
        if key.startswith("hydra.") or key in ("resume", "debug") or key.startswith("checkpoint."):
            continue
        try:
            value = _lookup(cfg, key)
        except AttributeError:
            value = override.split("=", 1)[1]
        values[key] = override.split("=", 1)[1] if dataclasses.is_dataclass(value) else value
    values["world_size"] = world_size
    return {k: v if isinstance(v, (bool, int, float, str)) else "null" if v is None else str(v)
            for k, v in values.items()}


def log_hparams(writer: Any, params: dict[str, Any], scores: dict[str, float], step: int) -> None:
    """Add the run to TensorBoard's HParams tab, with its best scores as the metrics.

    `run_name="."` keeps the entry in the run's own directory, so that every run of a sweep is one row.
    """
    metrics = {f"best/{name}": value for name, value in scores.items() if math.isfinite(value)}
    writer.add_hparams(params, metrics, run_name=".", global_step=step)


def write_result(run_dir: Path, result: dict[str, Any]) -> Path:
    """Write the run's result.json (what the sweep summary reads)."""
    path = run_dir / RESULT
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return path


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """The results of the sweep's runs, by job number."""
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(sweep_dir.rglob(RESULT))]
    return sorted(results, key=lambda r: (r["job"] is None, r["job"] or 0))


def _varying(results: list[dict[str, Any]]) -> set[str]:
    """Overrides that are not the same in every job: what the sweep compared."""
    counts: dict[str, int] = {}
    for r in results:
        for o in set(r["overrides"]):
            counts[o] = counts.get(o, 0) + 1
    return {o for o, n in counts.items() if n < len(results)}


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def _rows(results: list[dict[str, Any]], sweep_dir: Path, short: bool) -> list[list[str]]:
    varying = _varying(results) if short and len(results) > 1 else None
    rows = []
    for r in results:
        overrides = [o for o in r["overrides"] if varying is None or o in varying]
        checkpoint = Path(r["checkpoint"])
        if short and checkpoint.is_relative_to(sweep_dir.resolve()):
            checkpoint = checkpoint.relative_to(sweep_dir.resolve())
        rows.append([_cell(r["job"], 0), " ".join(overrides), _cell(r["best_bleu"], 2),
                     _cell(r["best_chrf"], 2), _cell(r["epochs"], 0), _cell(r["wall_seconds"], 1),
                     _cell(r["tgt_tokens_per_s"], 0), str(checkpoint)])
    return rows


def markdown(results: list[dict[str, Any]], sweep_dir: Path) -> str:
    """A Markdown table, one row per job; overrides shown are those that differ between jobs."""
    rows = _rows(results, sweep_dir, short=True)
    varying = _varying(results)
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---:" if h not in ("overrides", "checkpoint")
                                                              else "---" for h in HEADERS) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    scored = [r for r in results if math.isfinite(r["best_value"])]
    if scored:
        higher = scored[0]["higher_is_better"]
        best = (max if higher else min)(scored, key=lambda r: r["best_value"])
        swept = [o for o in best["overrides"] if o in varying]
        lines.append(f"\nbest {best['best_metric']}: job {best['job']} ({best['best_value']:.2f})"
                     + (f": {' '.join(swept)}" if swept else ""))
    return "\n".join(lines) + "\n"


def write_summary(sweep_dir: Path) -> str:
    """Write summary.csv (full overrides, absolute paths) and summary.md at the sweep root."""
    results = collect(sweep_dir)
    if not results:
        raise FileNotFoundError(f"no {RESULT} under {sweep_dir}: no run of this sweep has finished")
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    writer.writerows(_rows(results, sweep_dir, short=False))
    (sweep_dir / "summary.csv").write_text(buffer.getvalue(), encoding="utf-8")
    table = markdown(results, sweep_dir)
    (sweep_dir / "summary.md").write_text(table, encoding="utf-8")
    return table


class SweepSummary(Callback):
    """Hydra callback: when a multirun ends, write and print the summary of its runs."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            table = write_summary(sweep_dir)
        except FileNotFoundError as ex:
            log.warning("%s", ex)
            return
        print(f"\nsweep summary ({sweep_dir}/summary.md, summary.csv):\n\n{table}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m transformer_mt.sweep <sweep dir>")
    print(write_summary(Path(sys.argv[1])), end="")
