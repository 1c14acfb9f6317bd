"""Markdown tables of `transformer-mt evaluate` reports, for the README's results section.

    python scripts/results_table.py saved_weights/RUN_A saved_weights/RUN_B
    python scripts/results_table.py --group planned runs/p1 runs/p2 runs/p3 \
        --group tuned runs/t1 runs/t2 runs/t3 --search beam5

The first reads each run's result.json (written when training ends: its direction and training time)
and its eval/*.json (written by `transformer-mt evaluate`), and prints one row per report, with the
sacrebleu signatures underneath. The second compares groups of runs of one setting each (repeated runs
differ by their seeds and by what the machine managed in the time): a row per run, then each group's
mean and spread (sample standard deviation, and the lowest and highest run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from transformer_mt.tables import markdown_table
from transformer_mt.training.records import RESULT

HEADER = ["direction", "checkpoint", "search", "BLEU", "chrF", "CER", "WER", "sentences", "sent/s",
          "train min"]
RUN_HEADER = ["group", "run", "updates", "target tokens/s", "validation BLEU", "BLEU", "chrF"]
GROUP_HEADER = ["group", "runs", "updates (mean)", "BLEU mean", "BLEU sd", "BLEU lowest–highest",
                "chrF mean", "chrF sd"]


class TableError(Exception):
    """A run that cannot be tabled: its message says what to do."""


def run_result(run_dir: Path) -> dict:
    """The run's result.json."""
    path = run_dir / RESULT
    if not path.is_file():
        raise TableError(f"no {RESULT} in {run_dir}: give run directories whose training has ended")
    return json.loads(path.read_text(encoding="utf-8"))


def run_facts(run_dir: Path) -> tuple[str, float]:
    """('en→fr', training minutes) from the run's result.json."""
    result = run_result(run_dir)
    return f"{result['src_lang']}→{result['tgt_lang']}", result["train_seconds"] / 60


def reports(run_dir: Path, split: str, search: str | None = None) -> list[dict]:
    """The run's evaluation reports of `split` (and of `search`, e.g. beam5, if given), by file name."""
    found = [json.loads(path.read_text(encoding="utf-8"))
             for path in sorted((run_dir / "eval").glob(f"{split}.*.json"))]
    found = [r for r in found if search is None or r["search"] == search]
    if not found:
        which = f"{split} reports" + (f" with search {search}" if search else "")
        raise TableError(f"no {which} in {run_dir / 'eval'}; run transformer-mt evaluate first")
    return found


def signature(report: dict) -> str:
    """The report's sacrebleu signatures, as the tables' last lines show them."""
    return f"BLEU {report['bleu_signature']}; chrF {report['chrf_signature']}"


def report_row(direction: str, minutes: float, r: dict) -> list[str]:
    """One evaluation report as a row of the table."""
    return [direction, Path(r["checkpoint"]).name, r["search"], f"{r['bleu']:.2f}", f"{r['chrf']:.2f}",
            f"{r['cer']:.3f}", f"{r['wer']:.3f}", str(r["n"]), f"{r['sentences_per_s']:.0f}",
            f"{minutes:.1f}"]


def the_report(run_dir: Path, split: str, search: str | None) -> dict:
    """The one report a comparison reads from a run: several of them need `--search` to choose."""
    found = reports(run_dir, split, search)
    if len(found) > 1:
        choices = ", ".join(sorted({r["search"] for r in found}))
        raise TableError(f"{run_dir} has {len(found)} {split} reports ({choices}): choose one with --search")
    return found[0]


def spread(values: list[float]) -> str:
    """The sample standard deviation, or a dash for a single value."""
    return f"{statistics.stdev(values):.2f}" if len(values) > 1 else "—"


def comparison(groups: list[list[str]], split: str, search: str | None) -> tuple[str, str, set[str]]:
    """Two Markdown tables, one row per run, then one per group (mean and spread); and the signatures."""
    run_rows, group_rows, signatures = [], [], set()
    for name, *runs in groups:
        if not runs:
            raise TableError(f"--group {name} names no runs: give --group NAME RUN [RUN ...]")
        bleus, chrfs, updates = [], [], []
        for run in map(Path, runs):
            result, report = run_result(run), the_report(run, split, search)
            signatures.add(signature(report))
            bleus.append(report["bleu"])
            chrfs.append(report["chrf"])
            updates.append(result["steps"])
            run_rows.append([name, run.name, f"{result['steps']:,}", f"{result['tgt_tokens_per_s']:,.0f}",
                             f"{result['best_bleu']:.2f}", f"{report['bleu']:.2f}", f"{report['chrf']:.2f}"])
        group_rows.append([name, str(len(runs)), f"{statistics.mean(updates):,.0f}",
                           f"{statistics.mean(bleus):.2f}", spread(bleus),
                           f"{min(bleus):.2f}–{max(bleus):.2f}",
                           f"{statistics.mean(chrfs):.2f}", spread(chrfs)])
    return (markdown_table(RUN_HEADER, run_rows, align="ll" + "r" * (len(RUN_HEADER) - 2)),
            markdown_table(GROUP_HEADER, group_rows), signatures)


def run_table(runs: list[Path], split: str) -> tuple[str, set[str]]:
    """A row per evaluation report of each run, and the reports' signatures."""
    rows, signatures = [], set()
    for run in runs:
        direction, minutes = run_facts(run)
        for r in reports(run, split):
            signatures.add(signature(r))
            rows.append(report_row(direction, minutes, r))
    return markdown_table(HEADER, rows, align="lll" + "r" * (len(HEADER) - 3)), signatures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--group", nargs="+", action="append", metavar=("NAME", "RUN"),
                        help="a name and its runs, to compare with the other groups (repeat the flag)")
    parser.add_argument("--set", default="test", help="which evaluated set (default: test)")
    parser.add_argument("--search", help="which search's reports, e.g. beam5 or greedy "
                                         "(default: the only one)")
    args = parser.parse_args(argv)
    if bool(args.runs) == bool(args.group):
        parser.error("give run directories, or --group NAME RUN [RUN ...] at least once, not both")
    try:
        if args.group:
            runs, groups, signatures = comparison(args.group, args.set, args.search)
            tables = [runs, groups]
        else:
            table, signatures = run_table(args.runs, args.set)
            tables = [table]
    except TableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for table in tables:
        print(table)
        print()
    for line in sorted(signatures):
        print(f"Signatures: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
