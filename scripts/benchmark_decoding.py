"""Decoding speed on one checkpoint and one set of test sentences, measured in one run.

    python scripts/benchmark_decoding.py saved_weights/<run> [--sentences 1000] [--out decoding.json]

Compares uncached greedy (the whole prefix recomputed every step, as the classic tutorials do),
cached greedy and cached beam 5 on the run's own test split, and reports sentences/s, tokens/s,
BLEU and the ratios the project targets (cached ≥ 3× uncached; beam 5 ≤ 3× the cost of greedy).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.metrics import score
from transformer_mt.translator import Translator

from benchmark import load_warning, machine  # scripts/ is on sys.path when run as a script


def run(engine: Translator, sources: list[str], refs: list[str], decoding: DecodingConfig) -> dict:
    """Translate all sources with one decoding setting and time it."""
    engine.decoding = decoding
    engine.translate(sources[:8])  # warm-up: allocator, thread pool
    started = time.perf_counter()
    hyps = engine.translate(sources)
    seconds = time.perf_counter() - started
    tokens = sum(len(t) for t in engine.vocab.encode_tgt(hyps))
    scores = score(hyps, refs)
    return {"seconds": seconds, "sent_s": len(sources) / seconds, "tok_s": tokens / seconds,
            "bleu": scores.bleu, "chrf": scores.chrf}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint file or run directory")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Translator.from_checkpoint(args.checkpoint, device="cpu")
    split = Path(engine.info["checkpoint"]).parent / "split" / "test.tsv"
    sources, refs = load_split_tsv(split)
    sources, refs = sources[: args.sentences], refs[: args.sentences]
    warning = load_warning()
    if warning:
        print(f"warning: {warning}")
    base = DecodingConfig(beam_size=1, n_best=1)
    results = {
        "greedy_nocache": run(engine, sources, refs, dataclasses.replace(base, use_cache=False)),
        "greedy_cache": run(engine, sources, refs, base),
        "beam5": run(engine, sources, refs, dataclasses.replace(base, beam_size=5)),
    }
    summary = {
        "machine": machine(),
        "checkpoint": engine.info["checkpoint"],
        "sentences": len(sources),
        **{f"{name}_{k}": v for name, r in results.items() for k, v in r.items()},
        "cache_speedup": results["greedy_cache"]["sent_s"] / results["greedy_nocache"]["sent_s"],
        "beam5_cost_vs_greedy": results["greedy_cache"]["sent_s"] / results["beam5"]["sent_s"],
        "warning": warning,
    }
    print(f"machine: {summary['machine']}; {len(sources)} test sentences from {split}")
    print("| decoding | sentences/s | tokens/s | BLEU | chrF |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['sent_s']:.1f} | {r['tok_s']:.0f} | {r['bleu']:.2f} | {r['chrf']:.2f} |")
    print(f"cached greedy is {summary['cache_speedup']:.2f}x uncached greedy; "
          f"beam 5 costs {summary['beam5_cost_vs_greedy']:.2f}x cached greedy")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
