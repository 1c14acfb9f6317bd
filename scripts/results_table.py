"""A Markdown table of `transformer-mt evaluate` reports, for the README's results section.

    python scripts/results_table.py saved_weights/RUN_A saved_weights/RUN_B

Reads each run's eval/*.json (written by `transformer-mt evaluate`) and prints one row per report,
with the run's direction, training minutes and the sacrebleu signatures underneath.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run_facts(run_dir: Path) -> tuple[str, float]:
    """('en→fr', training minutes) from the run's metrics.jsonl and .hydra config."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    minutes = max(r["train_minutes"] for r in records)
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    langs = {k: v for k, v in (line.strip().split(": ", 1) for line in config.splitlines()
                               if line.strip().startswith(("src_lang:", "tgt_lang:")))}
    return f"{langs.get('src_lang', '?')}→{langs.get('tgt_lang', '?')}", minutes


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
            r = json.loads(path.read_text())
            signatures.add(f"BLEU {r['bleu_signature']}; chrF {r['chrf_signature']}")
            rows.append(f"| {direction} | {Path(r['checkpoint']).name} | {r['search']} | {r['bleu']:.2f} | "
                        f"{r['chrf']:.2f} | {r['cer']:.3f} | {r['wer']:.3f} | {r['n']} | "
                        f"{r['sentences_per_s']:.0f} | {minutes:.1f} |")
    print("| direction | checkpoint | search | BLEU | chrF | CER | WER | sentences | sent/s | train min |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    for signature in sorted(signatures):
        print(f"Signatures: {signature}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
