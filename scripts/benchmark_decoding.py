"""Decoding speed on one checkpoint and one set of test sentences, measured in one run.

    python scripts/benchmark_decoding.py saved_weights/<run> [--sentences 1000] [--rounds 3] [--out f.json]

Compares uncached greedy (the whole prefix recomputed every step, as the classic tutorials do),
cached greedy and cached beam 5 on the run's own test split, in float32, under bf16 autocast where the
CPU computes in bf16, and with int8 linear layers (decoding.quantize=int8); and CTranslate2 int8 greedy
and beam 5 on an export of the same checkpoint (its fast search, ct2_exact=false; with the `ct2` extra).
Reports sentences/s, tokens/s, BLEU and the ratios the project targets (cached >= 3x uncached; beam 5
<= 3x the cost of greedy; int8 against CTranslate2 int8). Each figure is the best of a few interleaved
rounds, so that a busy neighbour on a shared machine does not decide a ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from timing import best_of_rounds, load_warning, machine, native_bf16  # beside this script

from transformer_mt.config import DecodingConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.metrics import score
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ConfigError
from transformer_mt.tables import markdown_table


def run_test_pairs(engine: Translator, n: int) -> tuple[list[str], list[str]]:
    """The first n (source, reference) pairs of the test split saved with the engine's run."""
    sources, refs = load_split_tsv(Path(engine.info["checkpoint"]).parent / SPLIT_DIR / "test.tsv")
    return sources[:n], refs[:n]


Run = Callable[[list[str]], list[str]]  # sources in, their translations out


def our_run(engine: Translator, decoding: DecodingConfig, dtype: torch.dtype | None) -> Run:
    """A Translator's search (under autocast to `dtype`); the engine keeps its own model and quantization."""
    def run(sources: list[str]) -> list[str]:
        engine.decoding = dataclasses.replace(decoding, quantize=engine.decoding.quantize)
        engine.precision = dataclasses.replace(engine.precision, dtype=dtype)
        return engine.translate(sources)  # type: ignore[return-value]
    return run


def time_decoding(engine: Translator, sources: list[str],
                  settings: dict[str, tuple[DecodingConfig, torch.dtype | None]],
                  rounds: int) -> dict[str, tuple[float, list[str]]]:
    """Best seconds and the translations of `sources` with each (decoding, autocast dtype) setting of a
    Translator."""
    for _, dtype in settings.values():  # warm-up of each precision: allocator, thread pool, weight casts
        our_run(engine, DecodingConfig(beam_size=1), dtype)(sources[:8])
    runs = {name: functools.partial(our_run(engine, *setting), sources) for name, setting in settings.items()}
    return best_of_rounds(runs, rounds)  # type: ignore[return-value]


def searches(bf16: bool) -> dict[str, tuple[DecodingConfig, torch.dtype | None]]:
    """The searches compared, each with its autocast dtype: uncached greedy (the whole prefix recomputed
    every step), cached greedy and beam 5 in float32, and with bf16 both cached ones under bf16 too."""
    greedy, beam5 = DecodingConfig(beam_size=1), DecodingConfig(beam_size=5)
    settings = {"greedy_nocache": (dataclasses.replace(greedy, use_cache=False), None),
                "greedy_cache": (greedy, None), "beam5": (beam5, None)}
    if bf16:
        settings |= {"greedy_cache_bf16": (greedy, torch.bfloat16), "beam5_bf16": (beam5, torch.bfloat16)}
    return settings


def int8_runs(checkpoint: str) -> dict[str, Run]:
    """Cached greedy and beam 5 with decoding.quantize=int8, or none (and why) where this torch cannot."""
    try:
        engine = Translator.from_checkpoint(checkpoint, device="cpu",
                                            decoding=DecodingConfig(quantize="int8"))
    except ConfigError as ex:
        print(f"int8 skipped: {ex}")
        return {}
    return {"greedy_cache_int8": our_run(engine, DecodingConfig(beam_size=1), None),
            "beam5_int8": our_run(engine, DecodingConfig(beam_size=5), None)}


def ct2_runs(checkpoint: str, where: Path) -> dict[str, Run]:
    """CTranslate2 int8 greedy and beam 5 on an export of the checkpoint written into `where`, with its
    fast search (ct2_exact=false) and torch's thread count; none without the `ct2` extra."""
    try:
        from transformer_mt.decoding.ct2 import CT2Translator, ctranslate2_module
        from transformer_mt.interop.ct2_export import export_ctranslate2

        ctranslate2_module()
    except (ImportError, ConfigError):
        print("CTranslate2 skipped: pip install 'transformer-mt[ct2]'")
        return {}
    model_dir = export_ctranslate2(checkpoint, where / "ct2-int8", quantization="int8")
    engine = CT2Translator.from_dir(model_dir, exact=False, intra_threads=torch.get_num_threads())
    return {f"ct2_int8_{name}": functools.partial(engine.translate, beam_size=beam)  # type: ignore[misc]
            for name, beam in (("greedy", 1), ("beam5", 5))}


def decoding_speeds(checkpoint: Path, n: int, device: torch.device, rounds: int = 1,
                    bf16: bool = False) -> dict[str, float]:
    """Sentences/s of uncached greedy, cached greedy and beam 5 on the run's own test sentences, in
    float32; with bf16, cached greedy and beam 5 under bf16 autocast too (BLEU against float32)."""
    engine = Translator.from_checkpoint(checkpoint, device=device, amp="off")
    sources, refs = run_test_pairs(engine, n)
    results: dict[str, float] = {"decode_sentences": len(sources), "decode_rounds": rounds}
    for name, (seconds, hyps) in time_decoding(engine, sources, searches(bf16), rounds).items():
        results[f"{name}_sent_s"] = len(sources) / seconds
        results[f"{name}_bleu"] = score(hyps, refs).bleu
    results["greedy_sent_s"] = results["greedy_cache_sent_s"]  # what a user gets: the cached search
    if device.type == "cpu":
        results.update(ct2_speeds(checkpoint, sources, refs, results["beam5_bleu"]))
    return results


def ct2_speeds(checkpoint: Path, sources: list[str], refs: list[str], beam5_bleu: float) -> dict:
    """CTranslate2 beam 5 in int8 and float32, exact (PyTorch-identical search) and fast, when the
    `ct2` extra is installed. The contract's `ct2_int8_beam5_sent_s` is int8 with `ct2_exact=false`."""
    try:
        import ctranslate2  # noqa: F401

        from transformer_mt.decoding.ct2 import CT2Translator
        from transformer_mt.interop.ct2_export import export_ctranslate2
    except ImportError:
        return {"ct2_int8_beam5_sent_s": None, "ct2_bleu_delta": None}
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("int8", "float32"):
            model_dir = export_ctranslate2(checkpoint, Path(tmp) / quantization, quantization=quantization)
            for exact in (False, True):
                engine = CT2Translator.from_dir(model_dir, exact=exact)
                engine.translate(sources[:8], beam_size=5)
                start = time.perf_counter()
                hyps = engine.translate(sources, beam_size=5)
                name = f"ct2_{quantization}_beam5{'_exact' if exact else ''}"
                results[f"{name}_sent_s"] = len(sources) / (time.perf_counter() - start)
                results[f"{name}_bleu_delta"] = score(hyps, refs).bleu - beam5_bleu
    results["ct2_bleu_delta"] = results["ct2_int8_beam5_bleu_delta"]
    return results


def measure(runs: dict[str, Run], sources: list[str], refs: list[str], vocab: Vocabulary,
            rounds: int) -> dict[str, dict]:
    """Each run's best time on `sources` of `rounds` interleaved rounds (after a short warm-up each:
    allocator, thread pools, weight casts), its speed and scores."""
    for run in runs.values():
        run(sources[:8])
    results = {}
    timed = {name: functools.partial(run, sources) for name, run in runs.items()}
    for name, (seconds, hyps) in best_of_rounds(timed, rounds).items():
        tokens = sum(len(t) for t in vocab.encode_tgt(hyps))
        scores = score(hyps, refs)
        results[name] = {"seconds": seconds, "sent_s": len(refs) / seconds,
                         "tok_s": tokens / seconds, "bleu": scores.bleu, "chrf": scores.chrf}
    return results


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """The ratios the project targets: the cache's speed-up, beam 5's cost, int8 against CTranslate2 int8
    (speed) and against float32 (BLEU), where both were measured."""
    found = {"cache_speedup": results["greedy_cache"]["sent_s"] / results["greedy_nocache"]["sent_s"],
             "beam5_cost_vs_greedy": results["greedy_cache"]["sent_s"] / results["beam5"]["sent_s"]}
    for search, ours in (("greedy", "greedy_cache"), ("beam5", "beam5")):
        if f"{ours}_int8" in results:
            found[f"int8_{search}_bleu_delta"] = results[f"{ours}_int8"]["bleu"] - results[ours]["bleu"]
        if f"{ours}_int8" in results and f"ct2_int8_{search}" in results:
            found[f"int8_{search}_vs_ct2_int8"] = (results[f"{ours}_int8"]["sent_s"]
                                                   / results[f"ct2_int8_{search}"]["sent_s"])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="checkpoint file or run directory")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many interleaved rounds")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Translator.from_checkpoint(args.checkpoint, device="cpu", amp="off")
    sources, refs = run_test_pairs(engine, args.sentences)
    warning = load_warning()
    if warning:
        print(f"warning: {warning}")
    runs = {name: our_run(engine, *setting) for name, setting in searches(native_bf16()).items()}  # as auto
    with tempfile.TemporaryDirectory() as tmp:
        runs |= int8_runs(args.checkpoint) | ct2_runs(args.checkpoint, Path(tmp))
        results = measure(runs, sources, refs, engine.vocab, args.rounds)
    summary = {"machine": machine(), "checkpoint": engine.info["checkpoint"], "sentences": len(sources),
               "rounds": args.rounds,
               **{f"{name}_{k}": v for name, r in results.items() for k, v in r.items()},
               **ratios(results), "warning": warning}
    print(f"machine: {summary['machine']}; {len(sources)} test sentences of {summary['checkpoint']}'s "
          f"run; best of {args.rounds} interleaved rounds")
    rows = [[name, f"{r['sent_s']:.1f}", f"{r['tok_s']:.0f}", f"{r['bleu']:.2f}", f"{r['chrf']:.2f}"]
            for name, r in results.items()]
    print(markdown_table(["decoding", "sentences/s", "tokens/s", "BLEU", "chrF"], rows))
    print(f"cached greedy is {summary['cache_speedup']:.2f}x uncached greedy; "
          f"beam 5 costs {summary['beam5_cost_vs_greedy']:.2f}x cached greedy")
    for search in ("greedy", "beam5"):
        if f"int8_{search}_vs_ct2_int8" in summary:
            print(f"int8 {search}: {summary[f'int8_{search}_vs_ct2_int8']:.2f}x CTranslate2 int8's speed, "
                  f"BLEU {summary[f'int8_{search}_bleu_delta']:+.2f} against float32")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
