"""Comparing the runs of a sweep: the summary of their `result.json` files, as a table.

Every training run writes `result.json` into its directory when it ends (`records.py`). At the end of a
multirun, the `SweepSummary` callback (registered in configs/train.yaml) gathers them into `summary.csv`
and `summary.md` at the sweep root and prints the table; `python -m transformer_mt.jobs.sweep <sweep dir>`
rebuilds it by hand, e.g. for a sweep that stopped early. Jobs given their own `checkpoint.dir` outside
the sweep directory are found through the pointer each leaves in `<sweep dir>/.runs/`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from transformer_mt.tables import markdown_table
from transformer_mt.training.records import RESULT

log = logging.getLogger(__name__)
POINTERS = ".runs"  # <sweep dir>/.runs/<job number>: the directory of a job that lies elsewhere
COLUMNS = ("job", "overrides", "best_bleu", "best_chrf", "epochs", "wall_seconds", "tgt_tokens_per_s",
           "checkpoint")
HEADERS = ("job", "overrides", "best BLEU", "best chrF", "epochs", "wall time (s)", "tgt tokens/s",
           "checkpoint")


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """The results of the sweep's runs, by job number: inside the sweep directory, and elsewhere."""
    found = {p.resolve() for p in sweep_dir.rglob(RESULT)}
    pointers = sweep_dir / POINTERS
    for pointer in sorted(pointers.iterdir()) if pointers.is_dir() else []:
        path = Path(pointer.read_text(encoding="utf-8").strip()) / RESULT
        if path.is_file():
            found.add(path.resolve())
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(found)]
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
    lines = [markdown_table(HEADERS, rows, align="".join("l" if h in ("overrides", "checkpoint") else "r"
                                                         for h in HEADERS))]
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

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """A job whose directory lies outside the sweep's (its own checkpoint.dir) leaves a pointer.
        This runs in the job's own process, whichever launcher started it."""
        hydra = config.hydra
        if hydra.mode != RunMode.MULTIRUN:
            return
        sweep_dir, run_dir = Path(hydra.sweep.dir).resolve(), Path(hydra.runtime.output_dir).resolve()
        if not run_dir.is_relative_to(sweep_dir):
            (sweep_dir / POINTERS).mkdir(parents=True, exist_ok=True)
            (sweep_dir / POINTERS / str(hydra.job.num)).write_text(str(run_dir) + "\n", encoding="utf-8")

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
        sys.exit("usage: python -m transformer_mt.jobs.sweep <sweep dir>")
    print(write_summary(Path(sys.argv[1])), end="")
