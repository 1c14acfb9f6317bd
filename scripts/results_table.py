"""A Markdown table of `transformer-mt evaluate` reports, for the README's results section.

    python scripts/results_table.py saved_weights/RUN_A saved_weights/RUN_B

Reads each run's result.json (written when training ends: its direction and training time) and its
eval/*.json (written by `transformer-mt evaluate`), and prints one row per report, with the sacrebleu
signatures underneath.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformer_mt.tables import markdown_table
from transformer_mt.training.records import RESULT

HEADER = ["direction", "checkpoint", "search", "BLEU", "chrF", "CER", "WER", "sentences", "sent/s",
          "train min"]


def run_facts(run_dir: Path) -> tuple[str, float]:
    """('en→fr', training minutes) from the run's result.json."""
    path = run_dir / RESULT
    if not path.is_file():
        raise SystemExit(f"error: no {RESULT} in {run_dir}: give run directories whose training has ended")
    result = json.loads(path.read_text(encoding="utf-8"))
    return f"{result['src_lang']}→{result['tgt_lang']}", result["train_seconds"] / 60


def report_row(direction: str, minutes: float, r: dict) -> list[str]:
    """One evaluation report as a row of the table."""
    return [direction, Path(r["checkpoint"]).name, r["search"], f"{r['bleu']:.2f}", f"{r['chrf']:.2f}",
            f"{r['cer']:.3f}", f"{r['wer']:.3f}", str(r["n"]), f"{r['sentences_per_s']:.0f}",
            f"{minutes:.1f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--set", default="test", help="which evaluated set (default: test)")
    args = parser.parse_args(argv)
    rows, signatures = [], set()
    for run in args.runs:
        direction, minutes = run_facts(run)
        reports = sorted((run / "eval").glob(f"{args.set}.*.json"))
        if not reports:
            print(f"error: no {args.set} reports in {run / 'eval'}; run transformer-mt evaluate first",
                  file=sys.stderr)
            return 2
        for path in reports:
            r = json.loads(path.read_text(encoding="utf-8"))
            signatures.add(f"BLEU {r['bleu_signature']}; chrF {r['chrf_signature']}")
            rows.append(report_row(direction, minutes, r))
    print(markdown_table(HEADER, rows, align="lll" + "r" * (len(HEADER) - 3)))
    print()
    for signature in sorted(signatures):
        print(f"Signatures: {signature}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
