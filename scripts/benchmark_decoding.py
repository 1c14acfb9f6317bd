"""Decoding speed on one checkpoint and one set of test sentences, measured in one run.

    python scripts/benchmark_decoding.py saved_weights/<run> [--sentences 1000] [--rounds 3] [--out f.json]

Compares uncached greedy (the whole prefix recomputed every step, as the classic tutorials do),
cached greedy and cached beam 5 on the run's own test split (and both cached searches under bf16
autocast where the CPU computes in bf16), and reports sentences/s, tokens/s,
BLEU and the ratios the project targets (cached ≥ 3× uncached; beam 5 ≤ 3× the cost of greedy).
Each figure is the best of a few interleaved rounds, so that a busy neighbour on a shared machine
does not decide a ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.metrics import score
from transformer_mt.translator import Translator

from benchmark import (  # scripts/ is on sys.path when run as a script
    load_warning,
    machine,
    native_bf16,
    time_decoding,
)


def measure(engine: Translator, sources: list[str], refs: list[str],
            settings: dict[str, tuple[DecodingConfig, torch.dtype | None]], rounds: int) -> dict[str, dict]:
    """Translate all sources with each decoding setting; best time of `rounds` interleaved rounds."""
    results = {}
    for name, (seconds, hyps) in time_decoding(engine, sources, settings, rounds).items():
        tokens = sum(len(t) for t in engine.vocab.encode_tgt(hyps))
        scores = score(hyps, refs)
        results[name] = {"seconds": seconds, "sent_s": len(sources) / seconds,
                         "tok_s": tokens / seconds, "bleu": scores.bleu, "chrf": scores.chrf}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint file or run directory")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many interleaved rounds")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Translator.from_checkpoint(args.checkpoint, device="cpu", amp="off")
    split = Path(engine.info["checkpoint"]).parent / "split" / "test.tsv"
    sources, refs = load_split_tsv(split)
    sources, refs = sources[: args.sentences], refs[: args.sentences]
    warning = load_warning()
    if warning:
        print(f"warning: {warning}")
    base = DecodingConfig(beam_size=1, n_best=1)
    beam5 = dataclasses.replace(base, beam_size=5)
    settings = {"greedy_nocache": (dataclasses.replace(base, use_cache=False), None),
                "greedy_cache": (base, None), "beam5": (beam5, None)}
    if native_bf16():  # what device.amp=auto decodes with on this CPU
        settings |= {"greedy_cache_bf16": (base, torch.bfloat16), "beam5_bf16": (beam5, torch.bfloat16)}
    results = measure(engine, sources, refs, settings, args.rounds)
    summary = {
        "machine": machine(),
        "checkpoint": engine.info["checkpoint"],
        "sentences": len(sources),
        "rounds": args.rounds,
        **{f"{name}_{k}": v for name, r in results.items() for k, v in r.items()},
        "cache_speedup": results["greedy_cache"]["sent_s"] / results["greedy_nocache"]["sent_s"],
        "beam5_cost_vs_greedy": results["greedy_cache"]["sent_s"] / results["beam5"]["sent_s"],
        "warning": warning,
    }
    print(f"machine: {summary['machine']}; {len(sources)} test sentences from {split}; "
          f"best of {args.rounds} interleaved rounds")
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
