"""Validation BLEU against training minutes, from runs' metrics.jsonl, as one small PNG.

    python scripts/plot_learning_curve.py saved_weights/RUN_A saved_weights/RUN_B \
        --labels "en→fr" "fr→en" --out docs/learning_curve.png

Needs matplotlib (`pip install -e .[plot]`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_curve(run_dir: Path) -> tuple[list[float], list[float]]:
    """(minutes, BLEU) of the run's single-checkpoint validations, in order."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found; give run directories written by transformer-mt train")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [r for r in records if "model" not in r]  # averaged checkpoints are not on the curve
    return [r["train_minutes"] for r in records], [r["bleu"] for r in records]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--labels", nargs="*", default=None, help="one legend label per run")
    parser.add_argument("--title", default="Validation BLEU (greedy) during training, 2-core CPU")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    labels = args.labels or [p.name for p in args.runs]
    if len(labels) != len(args.runs):
        print("error: give one --labels entry per run", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
    for run, label in zip(args.runs, labels):
        minutes, bleu = read_curve(run)
        ax.plot(minutes, bleu, marker="o", markersize=3, label=label)
    ax.set_xlabel("training minutes (validation and checkpoints included)")
    ax.set_ylabel("valid BLEU")
    ax.set_title(args.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
