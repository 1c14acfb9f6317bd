"""A small in-domain corpus, four ways: Multi30k (image captions) with and without a Tatoeba model.

    python scripts/adaptation_study.py --multi30k ../shared/data/multi30k \
        --tatoeba ../shared/data/deu-eng.zip --tgt de --out runs/m30k-de

(b) a Tatoeba model of the pair (`experiment=tatoeba_cpu_tuned`, --minutes), used as it is;
(c) that model fine-tuned on Multi30k (`init=`, --finetune-minutes);
(a) a model trained on Multi30k alone from scratch (--minutes);
(d) a model trained from scratch on Multi30k mixed with Tatoeba (`dataset.mix`, --minutes).

The Multi30k runs validate on Multi30k's validation set and draw a 1,000-pair test split from its
training pairs (leak-free). Every model is evaluated on both with beam 5, and one Markdown table with
the sacreBLEU signatures is printed. Each run lives in --out under its letter; a run that has ended
(its result.json exists) is not trained again, so a cut study continues where it stopped. Everything
after `--` goes to every training run.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import transformer_mt as tmt
from transformer_mt.tables import markdown_table

# What each Multi30k run changes in experiment=tatoeba_cpu_tuned (docs/results.md says how they were chosen).
FINETUNE = ["training.lr=1e-3", "training.warmup_steps=200", "training.valid_every_steps=800",
            "model.dropout=0.1"]
SCRATCH = ["model.dropout=0.3", "training.valid_every_steps=1500"]
MIXTURE = ["model.dropout=0.2", "training.valid_every_steps=1500"]
TATOEBA_WEIGHT = 0.2  # Tatoeba's pairs per epoch, as a share of its own (Multi30k's weight is 1)
RUNS = {"b": "Tatoeba model as it is", "c": "Tatoeba model fine-tuned on Multi30k",
        "a": "Multi30k alone, from scratch", "d": "Multi30k + Tatoeba mixed, from scratch"}


def multi30k(folder: Path, tgt: str, cache: Path) -> list[str]:
    """The Multi30k dataset of a run: its training pairs, its validation set, a test split of 1,000."""
    return ["dataset=parallel", f"dataset.src_path={folder / 'train.en.gz'}",
            f"dataset.tgt_path={folder / f'train.{tgt}.gz'}",
            f"dataset.valid_src_path={folder / 'val.en.gz'}",
            f"dataset.valid_tgt_path={folder / f'val.{tgt}.gz'}", f"dataset.tgt_lang={tgt}",
            "dataset.test_size=1000", "training.valid_max_sentences=1014", f"dataset.cache_dir={cache}"]


def plans(args: argparse.Namespace) -> dict[str, list[str]]:
    """The overrides of each run."""
    cache = args.out / "cache"
    m30k = ["experiment=tatoeba_cpu_tuned", *multi30k(args.multi30k.resolve(), args.tgt, cache)]
    mix = f"dataset.mix=[{{name:tatoeba,path:'{args.tatoeba.resolve()}',weight:{TATOEBA_WEIGHT}}}]"
    return {
        "b": ["experiment=tatoeba_cpu_tuned", f"dataset.path={args.tatoeba.resolve()}", "dataset.url=null",
              f"dataset.tgt_lang={args.tgt}", f"dataset.cache_dir={cache}",
              f"training.max_minutes={args.minutes}"],
        "c": [*m30k, f"init={args.out / 'b'}", f"training.max_minutes={args.finetune_minutes}", *FINETUNE],
        "a": [*m30k, f"training.max_minutes={args.minutes}", *SCRATCH],
        "d": [*m30k, f"training.max_minutes={args.minutes}", *MIXTURE, mix],
    }


def evaluate(run: Path, sets: dict[str, list[str]], limit: int | None) -> dict[str, dict]:
    """The run's reports on each set (beam 5), as `transformer-mt evaluate` writes them."""
    reports = {}
    for name, given in sets.items():
        out = run / f"eval-{name}"
        if not list(out.glob("*.json")):
            tmt.evaluate([f"checkpoint={run}", *given, "decoding.beam_size=5", f"output_dir={out}",
                          f"max_sentences={'null' if limit is None else limit}"])
        reports[name] = json.loads(next(out.glob("*.json")).read_text(encoding="utf-8"))
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", type=Path, required=True, help="the folder of {train,val}.<lang>.gz")
    parser.add_argument("--tatoeba", type=Path, required=True, help="the pair's <lang>-eng.zip")
    parser.add_argument("--tgt", default="de", help="the target language (from English)")
    parser.add_argument("--minutes", type=float, default=40.0, help="budget of runs b, a and d")
    parser.add_argument("--finetune-minutes", type=float, default=10.0, help="budget of run c")
    parser.add_argument("--max-sentences", type=int, default=None, help="evaluate on the first N only")
    parser.add_argument("--out", type=Path, required=True)
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")  # the runs' logs
    extra = [a for a in extra if a != "--"]
    args.out = args.out.resolve()
    for letter, overrides in plans(args).items():
        run = args.out / letter
        if not (run / "result.json").is_file():
            tmt.train([*overrides, *extra, f"checkpoint.dir={run}"])
    val = args.multi30k.resolve()
    sets = {"val": [f"src_file={val / 'val.en.gz'}", f"ref_file={val / f'val.{args.tgt}.gz'}"],
            "test-split": [f"tsv_file={args.out / 'a' / 'split' / 'test.tsv'}"]}
    rows, signatures = [], set()
    for letter, what in RUNS.items():
        reports = evaluate(args.out / letter, sets, args.max_sentences)
        result = json.loads((args.out / letter / "result.json").read_text(encoding="utf-8"))
        rows.append([f"({letter}) {what}", str(result["steps"]), f"{result['train_seconds'] / 60:.1f}",
                     *(f"{reports[s][m]:.2f}" for s in sets for m in ("bleu", "chrf"))])
        signatures |= {reports[s][f"{m}_signature"] for s in sets for m in ("bleu", "chrf")}
    print(markdown_table(["run", "updates", "minutes", "val BLEU", "val chrF", "test-split BLEU",
                          "test-split chrF"], rows))
    print("\n" + "\n".join(sorted(signatures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
