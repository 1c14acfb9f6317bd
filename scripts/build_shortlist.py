"""Count the shortlist of a run trained before `train` wrote one (`decoding.shortlist=true` reads it).

    python scripts/build_shortlist.py <run directory> [...]

The run's training pairs are prepared again from its recorded dataset and tokenizer settings (the encoded
cache makes that seconds when it is still there); the shortlist is counted from them as `train` does at its
end and written to <run>/shortlist.json. A distilled run is counted on its corpus's own targets here, where
`train` counts the teacher's translations it trained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import DatasetConfig, TokenizerConfig
from transformer_mt.config.typed import to_dataclass
from transformer_mt.data import prepare_data
from transformer_mt.decoding.shortlist import write_shortlist
from transformer_mt.errors import UserError


def build(run: Path) -> Path:
    """Write <run>/shortlist.json from the run's training pairs; its path."""
    file, state, _, vocab = model_from_checkpoint(run)
    config = state.get("config", {})
    dataset = to_dataclass(OmegaConf.create(config["dataset"]), DatasetConfig)
    tokenizer = to_dataclass(OmegaConf.create(config["tokenizer"]), TokenizerConfig)
    data = prepare_data(dataset, tokenizer, None, vocab)
    return write_shortlist(file.parent, data.train.src_ids, data.train.tgt_ids, vocab)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (or checkpoints)")
    args = parser.parse_args(argv)
    for run in args.runs:
        try:
            print(build(run))
        except UserError as e:
            sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
