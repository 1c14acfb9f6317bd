"""Side-by-side speed and memory of transformer-mt on this machine, in one process, on real batches.

    python scripts/benchmark.py [--quick] [--checkpoint saved_weights/<run>] --out results.json

Measures, on the same real Tatoeba token batches and the same dimensions (the `small` model):
- training throughput (forward + backward + AdamW step) of our model and of `torch.nn.Transformer`,
  with default dropout and with none, and our utilisation of a matmul peak measured here;
- padding of our length-bucketed token batches against fixed-size random sentence batches;
- the whole `train` loop (data, logging, validation, checkpointing) against pure compute;
- decoding speed of uncached greedy, cached greedy and beam 5 (and CTranslate2 when installed);
- peak resident memory of training and of translation (each in a child process);
- with --cheap-wins, bf16 autocast and torch.compile against eager fp32 (both off by default on CPU).
Figures are only meaningful on an idle machine: the script warns when the load says otherwise,
and takes the best of a few interleaved rounds (--rounds) against short disturbances.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.reference, the nn.Transformer the tests compare us with

from transformer_mt.model.reference import TorchReference  # noqa: E402
from transformer_mt.checkpoint import build_model  # noqa: E402
from transformer_mt.config import DecodingConfig, ModelConfig, TrainConfig  # noqa: E402
from transformer_mt.data import PreparedData, TokenBatchSampler, load_split_tsv, prepare_data  # noqa: E402
from transformer_mt.loss import summed_nll  # noqa: E402
from transformer_mt.metrics import score  # noqa: E402
from transformer_mt.runtime import cpu_flags, cpu_native_bf16  # noqa: E402
from transformer_mt.tokenizer import PAD_ID  # noqa: E402

# The CPU features that decide our speed: vector width, bf16 and int8 arithmetic.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


# -- the machine -----------------------------------------------------------------------------------
def relevant_flags() -> list[str]:
    """Which of FLAGS this CPU has."""
    have = cpu_flags()
    return [flag for flag in FLAGS if flag in have]


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (device.amp=auto picks bf16 there)."""
    return cpu_native_bf16() is not None


def machine() -> str:
    """CPU model and flags, threads and torch version."""
    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    threads = torch.get_num_threads()
    return (f"{cpu} ({' '.join(relevant_flags()) or 'flags unknown'}); {os.cpu_count()} cores, "
            f"torch threads {threads}; torch {torch.__version__}")


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def load_warning(seconds: float = 2.0) -> str | None:
    """Other work on the CPU distorts every figure: measure how busy it is right now.

    /proc/stat over a short window, not the load average, which still counts work that ended a
    minute ago.
    """
    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    busy = (busy1 - busy0) / max(1, total1 - total0)
    return f"the CPU is {busy:.0%} busy with other processes" if busy > 0.1 else None


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GEMM rate of a large square product: the ceiling for matmul-bound training."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


# -- training throughput ---------------------------------------------------------------------------
def forward_flops(c: ModelConfig, vocab_size: int, batch_size: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one forward pass at padded shapes (training ≈ 3× this)."""
    d, f, B, S, T = c.d_model, c.d_ff, batch_size, src_len, tgt_len
    enc = B * S * (2 * d * 3 * d + 2 * d * d + 4 * d * f) + 4 * B * S * S * d
    dec = (B * T * (2 * d * 3 * d + 2 * d * d + 2 * d * d + 2 * d * d + 4 * d * f)
           + B * S * 2 * d * 2 * d + 4 * B * T * T * d + 4 * B * T * S * d)
    return c.encoder_layers * enc + c.decoder_layers * dec + 2 * B * T * d * vocab_size


def time_training(model: nn.Module, batches: list, label_smoothing: float = 0.1,
                  autocast_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """Seconds for forward + backward + AdamW step over `batches` (after two warm-up steps)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(batch) -> None:
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            logits = model(batch.src, batch.tgt_in)
        loss = summed_nll(logits, batch.tgt_out, label_smoothing) / batch.n_tgt_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for batch in batches[:2]:
        step(batch)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    return time.perf_counter() - start, float(sum(b.n_tgt_tokens for b in batches))


def padding_fractions(data, batch_tokens: int, seed: int = 0) -> tuple[float, float]:
    """Padded share of target positions: our token batches vs random 128-sentence batches."""
    lengths = data.train.lengths()
    tgt = lengths[:, 1] + 1  # + eos
    ours = TokenBatchSampler(lengths, batch_tokens, shuffle=True, seed=seed).batches(0)
    ours_real = sum(int(tgt[b].sum()) for b in ours)
    ours_padded = sum(len(b) * int(tgt[b].max()) for b in ours)
    order = np.random.default_rng(seed).permutation(len(tgt))
    fixed = [order[i:i + 128] for i in range(0, len(order), 128)]
    fixed_real = sum(int(tgt[b].sum()) for b in fixed)
    fixed_padded = sum(len(b) * int(tgt[b].max()) for b in fixed)
    return 1 - ours_real / ours_padded, 1 - fixed_real / fixed_padded


# -- options that are off by default on a CPU ------------------------------------------------------
def cheap_wins(model_cfg: ModelConfig, data: PreparedData, batches: list) -> dict[str, float]:
    """Training speed with torch.compile (dynamic shapes) against eager fp32 on the same batches;
    compile time is reported apart (the warm-up steps pay it)."""
    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return build_model(model_cfg, data.vocab)

    eager_s, tokens = time_training(fresh(), batches)
    compiled = torch.compile(fresh(), dynamic=True)
    start = time.perf_counter()
    time_training(compiled, batches[:1])  # two warm-up steps of two shapes: static, then dynamic
    compile_s = time.perf_counter() - start
    compiled_s, _ = time_training(compiled, batches)
    return {"train_tgt_tok_s_eager": tokens / eager_s,
            "torch_compile_speedup": eager_s / compiled_s,
            "torch_compile_seconds": compile_s}


# -- the whole loop --------------------------------------------------------------------------------
def loop_overhead(cfg: TrainConfig, data, compute_tok_s: float, n_batches: int) -> dict[str, float]:
    """Time one real training epoch of `n_batches` batches (validation and checkpoint included),
    and extrapolate the fixed costs to a full-corpus epoch at the measured compute rate."""
    from transformer_mt.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        sub = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, dir=tmp),
                                  device=dataclasses.replace(cfg.device, amp="off"))  # as the compute
        sub.dataset.max_pairs = None
        sub.training = dataclasses.replace(cfg.training, epochs=1)
        trainer = Trainer(sub, Path(tmp))
        batches = trainer.sampler.batches(0)
        trainer.sampler.batches = lambda epoch, *a, **k: batches[:n_batches]  # a short epoch
        tokens = sum(trainer.data.train.batch(b).n_tgt_tokens for b in batches[:n_batches])
        start = time.perf_counter()
        trainer.fit()
        wall = time.perf_counter() - start
    compute = tokens / compute_tok_s
    fixed = max(0.0, wall - compute)  # validation, checkpoint, logging, data
    full_tokens = float(data.train.tgt_lens.sum() + len(data.train))
    full_compute = full_tokens / compute_tok_s
    return {"loop_short_epoch_s": wall, "loop_short_compute_s": compute,
            "loop_overhead_frac_short_epoch": fixed / wall,
            "loop_overhead_frac": fixed / (full_compute + fixed)}


# -- decoding --------------------------------------------------------------------------------------
def best_of_rounds(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, object]]:
    """Fastest wall time (and output) of each run over `rounds` interleaved rounds.

    Each round runs every setting once, so a slow drift of a shared machine hits all of them
    alike; the minimum is the least disturbed measurement (the `timeit` convention).
    """
    best: dict[str, tuple[float, object]] = {}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            out = run()
            seconds = time.perf_counter() - start
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, out)
    return best


def time_decoding(engine, sources: list[str], settings: dict[str, tuple[DecodingConfig, torch.dtype | None]],
                  rounds: int) -> dict[str, tuple[float, list[str]]]:
    """Best seconds and the translations of `sources` with each (decoding, autocast dtype) setting of a
    Translator."""
    from transformer_mt.runtime import Precision

    def runner(decoding: DecodingConfig, dtype: torch.dtype | None) -> Callable[[], list[str]]:
        def run() -> list[str]:
            engine.decoding, engine.precision = decoding, Precision(dtype, "benchmark")
            return engine.translate(sources)
        return run

    for _, dtype in settings.values():  # warm-up of each precision: allocator, thread pool, weight casts
        runner(DecodingConfig(beam_size=1), dtype)()
    return best_of_rounds({name: runner(*setting) for name, setting in settings.items()}, rounds)


def decoding_speeds(checkpoint: Path, n: int, rounds: int = 1, bf16: bool = False) -> dict[str, float]:
    """Sentences/s of uncached greedy, cached greedy and beam 5 on the run's own test sentences, in
    float32; with bf16, cached greedy and beam 5 under bf16 autocast too (BLEU against float32)."""
    from transformer_mt.translator import Translator

    engine = Translator.from_checkpoint(checkpoint, device="cpu", amp="off")
    sources, refs = load_split_tsv(Path(engine.info["checkpoint"]).parent / "split" / "test.tsv")
    sources, refs = sources[:n], refs[:n]
    results: dict[str, float] = {"decode_sentences": len(sources), "decode_rounds": rounds}
    greedy, beam5 = DecodingConfig(beam_size=1), DecodingConfig(beam_size=5)
    settings = {"greedy_nocache": (DecodingConfig(beam_size=1, use_cache=False), None),
                "greedy_cache": (greedy, None), "beam5": (beam5, None)}
    if bf16:
        settings |= {"greedy_cache_bf16": (greedy, torch.bfloat16), "beam5_bf16": (beam5, torch.bfloat16)}
    for name, (seconds, hyps) in time_decoding(engine, sources, settings, rounds).items():
        results[f"{name}_sent_s"] = len(sources) / seconds
        results[f"{name}_bleu"] = score(hyps, refs).bleu
    results.update(ct2_speeds(checkpoint, sources, refs, results["beam5_bleu"]))
    return results


def ct2_speeds(checkpoint: Path, sources: list[str], refs: list[str], beam5_bleu: float) -> dict:
    """CTranslate2 beam 5 in int8 and float32, exact (PyTorch-identical search) and fast, when the
    `ct2` extra is installed. The contract's `ct2_int8_beam5_sent_s` is int8 with `ct2_exact=false`."""
    try:
        import ctranslate2  # noqa: F401

        from transformer_mt.ct2 import CT2Translator, export_ctranslate2
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


# -- memory (child processes, so each peak is its own) ----------------------------------------------
def child_peak_rss_mib(mode: str, checkpoint: Path | None) -> float | None:
    """Run this script in `--child MODE` and read back its peak RSS."""
    if mode == "translate" and checkpoint is None:
        return None
    args = [sys.executable, __file__, "--child", mode]
    if checkpoint is not None:
        args += ["--checkpoint", str(checkpoint)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return float(out.strip().splitlines()[-1])


def run_child(mode: str, checkpoint: Path | None) -> None:
    if mode == "train":
        cfg = TrainConfig()
        data = prepare_data(cfg.dataset, cfg.tokenizer)
        batches = _real_batches(data, cfg, 6)
        time_training(build_model(cfg.model, data.vocab), batches)
    else:
        from transformer_mt.translator import Translator

        engine = Translator.from_checkpoint(checkpoint, device="cpu")
        sources, _ = load_split_tsv(Path(engine.info["checkpoint"]).parent / "split" / "test.tsv")
        engine.translate(sources[:300])
    print(peak_rss_mib())


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM starts afresh at exec; ru_maxrss does not (on
    Linux it keeps the parent's peak across fork + exec), so prefer it where /proc exists."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _real_batches(data, cfg: TrainConfig, n: int) -> list:
    batches = TokenBatchSampler(data.train.lengths(), cfg.training.batch_tokens, shuffle=True,
                                seed=cfg.seed).batches(0)
    return [data.train.batch(b) for b in batches[:n]]


def _newest_checkpoint() -> Path | None:
    found = sorted((ROOT / "saved_weights").glob("*/best.pt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer batches and sentences (< 2 min)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="for decoding (default: newest)")
    parser.add_argument("--out", type=Path, default=Path("benchmark.json"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2,
                        help="training and decoding: best of this many interleaved rounds "
                             "(1 with --quick)")
    parser.add_argument("--cheap-wins", action="store_true",
                        help="also time bf16 autocast and torch.compile against eager fp32 (slow)")
    parser.add_argument("--child", choices=["train", "translate"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint = args.checkpoint or _newest_checkpoint()
    if args.child:
        run_child(args.child, checkpoint)
        return

    warning = load_warning()
    if warning:
        print(f"warning: {warning}; figures will be low", file=sys.stderr)
    torch.manual_seed(0)
    cfg = TrainConfig()
    cfg.training.progress = False
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    n_batches = 4 if args.quick else 12
    batches = _real_batches(data, cfg, n_batches)
    model_cfg, vocab_size = cfg.model, data.vocab.tgt_vocab_size
    peak = matmul_peak_gflops()

    # Our defaults (dropout on sub-layer outputs and embeddings only) against nn.Transformer with
    # the one dropout it has (which it also applies to attention and the FFN inner layer), and
    # both with dropout off: pure compute. Best of interleaved rounds, as for decoding.
    no_dropout = dataclasses.replace(model_cfg, dropout=0.0, attention_dropout=0.0,
                                     activation_dropout=0.0)

    def ours(c: ModelConfig) -> nn.Module:
        return build_model(c, data.vocab)

    def reference(c: ModelConfig) -> nn.Module:
        return TorchReference(c, vocab_size, PAD_ID)

    # bf16 autocast where the CPU computes in bf16 (device.amp=auto picks it there), or on request.
    bf16 = native_bf16() or args.cheap_wins
    settings = [("ours", ours, model_cfg, None), ("ref", reference, model_cfg, None)]
    if bf16:
        settings += [("ours_bf16", ours, model_cfg, torch.bfloat16)]
    if not args.quick:
        settings += [("ours_nodrop", ours, no_dropout, None), ("ref_nodrop", reference, no_dropout, None)]
        settings += [("ref_bf16", reference, model_cfg, torch.bfloat16)] if bf16 else []
    models = {}
    for name, build, c, dtype in settings:
        torch.manual_seed(0)
        models[name] = (build(c), dtype)
    train_rounds = 1 if args.quick else args.rounds
    seconds = {name: math.inf for name in models}
    for _ in range(train_rounds):
        for name, (model, dtype) in models.items():
            elapsed, tokens = time_training(model, batches, autocast_dtype=dtype)
            seconds[name] = min(seconds[name], elapsed)
    ours_s, ref_s = seconds["ours"], seconds["ref"]
    flops = 3 * sum(forward_flops(model_cfg, vocab_size, *b.src.shape[:1], b.src.size(1), b.tgt_in.size(1))
                    for b in batches)
    src_tokens = float(sum(b.n_src_tokens for b in batches))
    ours_pad, fixed_pad = padding_fractions(data, cfg.training.batch_tokens)
    results: dict = {
        "machine": machine(),
        "load_warning": warning,
        "quick": args.quick,
        "train_batches": n_batches,
        "train_tgt_tok_s": tokens / ours_s,
        "train_src_tgt_tok_s": (tokens + src_tokens) / ours_s,
        "train_tgt_tok_s_nn_transformer": tokens / ref_s,
        "train_ratio_vs_nn_transformer": ref_s / ours_s,
        "train_rounds": train_rounds,
        "train_tgt_tok_s_no_dropout": tokens / seconds["ours_nodrop"] if not args.quick else None,
        "train_tgt_tok_s_nn_transformer_no_dropout":
            tokens / seconds["ref_nodrop"] if not args.quick else None,
        "train_ratio_vs_nn_transformer_no_dropout":
            seconds["ref_nodrop"] / seconds["ours_nodrop"] if not args.quick else None,
        "matmul_peak_gflops": peak,
        "train_gflops": flops / ours_s / 1e9,
        "train_utilisation": flops / ours_s / 1e9 / peak,
        "padding_frac": ours_pad,
        "padding_frac_fixed_random_batches": fixed_pad,
        "cpu_flags": relevant_flags(),
        "cpu_native_bf16": native_bf16(),
        "train_tgt_tok_s_bf16": tokens / seconds["ours_bf16"] if bf16 else None,
        "cpu_bf16_train_speedup": ours_s / seconds["ours_bf16"] if bf16 else None,
        "train_ratio_vs_nn_transformer_bf16":
            seconds["ref_bf16"] / seconds["ours_bf16"] if "ref_bf16" in seconds else None,
    }
    results.update(loop_overhead(cfg, data, results["train_tgt_tok_s"], 3 if args.quick else 10))
    if args.cheap_wins:
        results.update(cheap_wins(model_cfg, data, batches))
    if checkpoint is not None:
        results["decode_checkpoint"] = str(checkpoint)
        results.update(decoding_speeds(checkpoint, 200 if args.quick else 1000,
                                       rounds=1 if args.quick else args.rounds, bf16=bf16))
    else:
        print("no checkpoint found: decoding figures skipped (train one or pass --checkpoint)",
              file=sys.stderr)
    results["peak_rss_train_mib"] = child_peak_rss_mib("train", checkpoint)
    results["peak_rss_translate_mib"] = child_peak_rss_mib("translate", checkpoint)
    args.out.write_text(json.dumps(results, indent=2))
    print(markdown(results))


def markdown(r: dict) -> str:
    """The results as the README's table."""
    def fmt(value: object, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    rows = [
        ("training, ours (target tokens/s)", fmt(r["train_tgt_tok_s"], ".0f")),
        ("training, torch.nn.Transformer (target tokens/s)", fmt(r["train_tgt_tok_s_nn_transformer"], ".0f")),
        ("ratio ours / nn.Transformer", fmt(r["train_ratio_vs_nn_transformer"], ".2f")),
        ("the same with all dropout off: ours / nn.Transformer (target tokens/s), ratio",
         f"{fmt(r['train_tgt_tok_s_no_dropout'], '.0f')} / "
         f"{fmt(r['train_tgt_tok_s_nn_transformer_no_dropout'], '.0f')}, "
         f"{fmt(r['train_ratio_vs_nn_transformer_no_dropout'], '.2f')}"),
        ("matmul peak (GFLOP/s) / utilisation", f"{r['matmul_peak_gflops']:.0f} / "
                                                 f"{r['train_utilisation']:.0%}"),
        ("padding: token buckets / random 128-sentence batches",
         f"{r['padding_frac']:.1%} / {r['padding_frac_fixed_random_batches']:.1%}"),
        ("train loop overhead (full epoch, extrapolated)", fmt(r["loop_overhead_frac"], ".1%")),
        ("bf16 autocast training, ours (target tokens/s) / speed-up over float32",
         f"{fmt(r['train_tgt_tok_s_bf16'], '.0f')} / {fmt(r['cpu_bf16_train_speedup'], '.2f')}x"),
        ("bf16: ratio ours / nn.Transformer", fmt(r["train_ratio_vs_nn_transformer_bf16"], ".2f")),
        ("greedy without cache (sentences/s)", fmt(r.get("greedy_nocache_sent_s"), ".1f")),
        ("greedy with cache (sentences/s)", fmt(r.get("greedy_cache_sent_s"), ".1f")),
        ("beam 5 (sentences/s)", fmt(r.get("beam5_sent_s"), ".1f")),
        *[(f"bf16 {label} (sentences/s) / BLEU difference to float32",
           f"{fmt(r.get(f'{name}_bf16_sent_s'), '.1f')} / "
           f"{fmt(r.get(f'{name}_bf16_bleu', math.nan) - r.get(f'{name}_bleu', math.nan), '+.2f')}")
          for name, label in (("greedy_cache", "greedy with cache"), ("beam5", "beam 5"))],
        *[(f"CTranslate2 {q} beam 5{', exact' if exact else ''} (sentences/s) / BLEU delta to ours",
           f"{fmt(r.get(f'ct2_{q}_beam5{x}_sent_s'), '.1f')} / "
           f"{fmt(r.get(f'ct2_{q}_beam5{x}_bleu_delta'), '+.2f')}")
          for q in ("int8", "float32") for exact, x in ((False, ""), (True, "_exact"))],
        *([("torch.compile training speed vs eager fp32 (compile seconds)",
            f"{r['torch_compile_speedup']:.2f}x ({r['torch_compile_seconds']:.0f} s)")]
          if "torch_compile_speedup" in r else []),
        ("peak RSS train / translate (MiB)",
         f"{fmt(r['peak_rss_train_mib'], '.0f')} / {fmt(r['peak_rss_translate_mib'], '.0f')}"),
    ]
    lines = [f"Machine: {r['machine']}", "", "| measure | value |", "|---|---:|"]
    return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows])


if __name__ == "__main__":
    main()
