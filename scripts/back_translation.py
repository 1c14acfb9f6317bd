"""Back-translation measured as the literature measures it: half a corpus as parallel data, the target
side of the other half as monolingual text.

    python scripts/back_translation.py --corpus ../shared/data/fra-eng.zip --minutes 20 --out runs/bt

1. Split the corpus, leak-free (whole sentence groups): a parallel half, a monolingual half (only its
   target side is used) and 4,000 held-out pairs (valid and test of every run).
2. Train a reverse model (target -> source) on the parallel half.
3. Translate the monolingual half back with it (beam search, or `--sampling`).
4. Train source -> target twice, the same minutes each: on the parallel half alone, and on the parallel
   half plus the synthetic pairs, their sources tagged `<bt>` (Caswell et al., 2019).
5. Evaluate both on the test pairs (beam 5) and print a Markdown table with the sacreBLEU signatures.

Everything after `--` goes to every training run (e.g. `-- experiment=tatoeba_cpu`). Each step's output
is kept under --out, and a step whose output exists is not run again.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

import transformer_mt as tmt
from transformer_mt.config import DatasetConfig
from transformer_mt.data import load_pairs, read_lines, sentence_key
from transformer_mt.data.cache import sample_indices
from transformer_mt.data.split import group_roots
from transformer_mt.tables import markdown_table

TAG = "<bt>"
HELD_OUT = 4000  # pairs: half valid, half test


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def split_corpus(corpus: Path, src: str, tgt: str, max_pairs: int | None, out: Path, seed: int) -> dict:
    """The parallel half, the monolingual half's targets and the held-out pairs, as files under out; pairs
    that share a sentence (a group) stay on one side."""
    sources, targets = load_pairs(DatasetConfig(path=str(corpus), url=None, src_lang=src, tgt_lang=tgt))
    if max_pairs is not None:
        keep = sample_indices(len(sources), max_pairs, seed).tolist()
        sources, targets = [sources[i] for i in keep], [targets[i] for i in keep]
    keys = [np.array([sentence_key(s) for s in side], dtype=np.int64) for side in (sources, targets)]
    _, group, sizes = np.unique(group_roots(*keys), return_inverse=True, return_counts=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(sizes))  # the groups in a random order: the first ones are held out
    held = np.zeros(len(sizes), dtype=bool)
    held[order[np.cumsum(sizes[order]) - sizes[order] < min(HELD_OUT, len(sources) // 10)]] = True
    mono = rng.random(len(sizes)) < 0.5
    part = np.where(held[group], 2, np.where(mono[group], 1, 0))  # 0: parallel, 1: monolingual, 2: held out
    parallel, monolingual, test = ([(sources[i], targets[i]) for i in np.flatnonzero(part == p)]
                                   for p in range(3))
    files = {"parallel": write_tsv(out / "parallel.tsv", parallel),
             "valid": write_tsv(out / "valid.tsv", test[: len(test) // 2]),
             "test": write_tsv(out / "test.tsv", test[len(test) // 2:]),
             "mono": out / "mono.txt"}
    files["mono"].write_text("".join(f"{t}\n" for _, t in monolingual), encoding="utf-8")
    for name in ("parallel", "valid", "test"):  # the reverse direction's files
        rows = [line.split("\t") for line in read_lines(files[name])]
        files[f"{name}_reverse"] = write_tsv(out / f"{name}.reverse.tsv", [(t, s) for s, t in rows])
    counts = {"parallel": len(parallel), "monolingual": len(monolingual), "valid": len(test) // 2,
              "test": len(test) - len(test) // 2}
    (out / "split.json").write_text(json.dumps(counts, indent=2), encoding="utf-8")
    return files


def train(run: Path, src: str, tgt: str, files: dict, reverse: bool, minutes: float, extra: list[str],
          mix: str | None = None) -> Path:
    """One training run on the split's files (reverse: target -> source); skipped when it has ended."""
    if (run / "result.json").is_file():
        return run
    suffix = "_reverse" if reverse else ""
    overrides = ["dataset=parallel", f"dataset.path={files['parallel' + suffix]}",
                 f"dataset.valid_path={files['valid' + suffix]}",
                 f"dataset.test_path={files['test' + suffix]}",
                 f"dataset.src_lang={tgt if reverse else src}", f"dataset.tgt_lang={src if reverse else tgt}",
                 f"training.max_minutes={minutes}", f"checkpoint.dir={run}", *extra]
    tmt.train([*overrides, *([f"dataset.mix=[{{name:parallel,path:'{mix}',tag:'{TAG}'}}]"] if mix else [])])
    return run


def back_translate(reverse_run: Path, files: dict, sampling: bool, out: Path) -> Path:
    """The synthetic pairs: each monolingual target sentence after its back-translation."""
    synthetic = out / "synthetic.txt"
    if not synthetic.is_file():
        search = ["decoding.sampling=true", "decoding.top_k=10"] if sampling else ["decoding.beam_size=5"]
        tmt.translate([f"checkpoint={reverse_run}", f"input={files['mono']}", f"output={synthetic}", *search])
    # lines as translate reads them: str.splitlines() would also split at the form feeds and other
    # control characters that a barely trained model's byte-level pieces can spell
    mono = read_lines(files["mono"])
    back = read_lines(synthetic)
    pairs = [(s, t) for s, t in zip(back, mono, strict=True) if s.strip()]
    if not pairs:
        raise SystemExit(f"error: the reverse model in {reverse_run} translated none of the {len(mono)} "
                         "monolingual sentences (all empty); train it longer (--minutes)")
    return write_tsv(out / "synthetic.tsv", pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="a Tatoeba <lang>-eng.zip")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="fr")
    parser.add_argument("--minutes", type=float, default=20.0, help="training budget of each run")
    parser.add_argument("--max-pairs", type=int, default=None, help="use this many pairs of the corpus")
    parser.add_argument("--sampling", action="store_true", help="back-translate by sampling (top-k 10)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, required=True)
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")  # the runs' logs
    extra = [a for a in extra if a != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    files = split_corpus(args.corpus, args.src, args.tgt, args.max_pairs, args.out, args.seed)
    reverse = train(args.out / "reverse", args.src, args.tgt, files, True, args.minutes, extra)
    synthetic = back_translate(reverse, files, args.sampling, args.out)
    pair = (args.src, args.tgt, files, False, args.minutes, extra)
    runs = {"parallel only": train(args.out / "parallel", *pair),
            "parallel + tagged back-translation": train(args.out / "parallel+bt", *pair, mix=str(synthetic))}
    rows, signature = [], ""
    for name, run in runs.items():
        eval_dir = run / "eval-bt"
        tmt.evaluate([f"checkpoint={run}", f"tsv_file={files['test']}", "decoding.beam_size=5",
                      f"output_dir={eval_dir}"])
        report = json.loads(next(eval_dir.glob("test.*.json")).read_text(encoding="utf-8"))
        result = json.loads((run / "result.json").read_text(encoding="utf-8"))
        rows.append([name, str(result.get("steps", "")), f"{report['bleu']:.2f}", f"{report['chrf']:.2f}"])
        signature = report["bleu_signature"]
    print(markdown_table(["training data", "updates", "test BLEU (beam 5)", "chrF"], rows))
    print(f"\nBLEU signature: {signature}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
