"""Average the weights of several checkpoints of one run into a new checkpoint (for inference).

    python scripts/average_checkpoints.py saved_weights/RUN/step_*.pt --out saved_weights/RUN/avg.pt
    python scripts/average_checkpoints.py saved_weights/RUN --last 5 --out saved_weights/RUN/avg.pt

Training does this itself at the end with `training.average_last=K`, keeping the result only when
validation agrees; this script is for any other list (e.g. from several runs of the same model).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformer_mt.checkpoints.store import (
    CheckpointError,
    average_checkpoints,
    numbered_checkpoints,
    save_checkpoint,
)


def checkpoint_paths(inputs: list[str], last: int | None) -> list[Path]:
    """Files as given; a run directory contributes its epoch/step checkpoints (the last N with --last)."""
    paths: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = numbered_checkpoints(path)
            paths += found[-last:] if last else found
        else:
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files or run directories")
    parser.add_argument("--last", type=int, default=None, help="from a run directory, only its last N")
    parser.add_argument("--out", required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    paths = checkpoint_paths(args.checkpoints, args.last)
    if len(paths) < 2:
        print(f"error: need at least two checkpoints to average, got {len(paths)}", file=sys.stderr)
        return 2
    try:
        state = average_checkpoints(paths)
    except CheckpointError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    save_checkpoint(state, Path(args.out))
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
