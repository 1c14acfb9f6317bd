"""Side-by-side speed and memory of transformer-mt on this machine, in one process, on real batches.

    python scripts/benchmark.py [--quick] [--device cpu|cuda] [--checkpoint saved_weights/<run>]
        [--out benchmark.json] [-- train overrides, e.g. experiment=tatoeba_gpu]

Measures, on the same real token batches of the training config (by default the `small` model on
Tatoeba; train overrides after `--` pick another), with the same dimensions:
- training throughput (forward + backward + AdamW step) of our model and of `torch.nn.Transformer`,
  with default dropout and with none, and our utilisation of a matmul peak measured here (float32 on
  the CPU, the training precision on a GPU);
- a bare training step on one fixed shape, against the whole `train` loop (data, logging, validation,
  checkpointing) over short epochs: its first epoch and the epochs after;
- padding of our length-bucketed token batches against fixed-size random sentence batches;
- decoding speed of uncached greedy, cached greedy and beam 5 (and CTranslate2 when installed);
- peak memory: of this process on the device, and on the CPU of training and translating alone (each
  in a child process);
- with --cheap-wins, bf16 autocast and torch.compile against eager fp32 (both off by default on CPU).
Figures are only meaningful on an idle machine: the script warns when the load says otherwise,
and takes the best of a few interleaved rounds (--rounds) against short disturbances.

Each measurement is one function of `Bench` returning its keys; MEASUREMENTS lists them in order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from benchmark_decoding import decoding_speeds, run_test_pairs  # beside this script
from timing import (  # beside this script
    device_name,
    load_warning,
    machine,
    matmul_peak_gflops,
    native_bf16,
    peak_memory_gib,
    peak_rss_mib,
    relevant_flags,
)
from training_speed import (  # beside this script
    cheap_wins,
    epoch_shapes,
    fastest,
    host_reads,
    random_batch_padding,
    train_loop,
)

import transformer_mt as tmt
from transformer_mt.checkpoints.store import BEST, build_model
from transformer_mt.config import ModelConfig, TrainConfig, UserError
from transformer_mt.data import Batch, PreparedData, prepare_data
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.model.reference import TorchReference
from transformer_mt.runtime.device import pad_to_multiple, precision
from transformer_mt.tables import markdown_table
from transformer_mt.training.throughput import real_batches, time_training, training_flops


@dataclasses.dataclass
class Bench:
    """What every measurement may use: the options, the composed training config, the device, the real
    batches, and what the measurements before it found."""

    args: argparse.Namespace
    cfg: TrainConfig
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype of the comparisons: float32 (None) on the CPU
    data: PreparedData
    batches: list[Batch]  # real training batches, on the device
    results: dict[str, Any]

    def size(self, quick: int, full: int) -> int:
        """A size (batches, sentences, ...) for --quick or a full run."""
        return quick if self.args.quick else full


# -- the measurements, in order: each returns its keys ---------------------------------------------
def about_machine(b: Bench) -> dict[str, Any]:
    """Where and how the figures were taken."""
    return {"machine": machine(b.device), "device": b.device.type, "device_name": device_name(b.device),
            "precision": str(b.dtype or torch.float32).removeprefix("torch."), "quick": b.args.quick,
            "overrides": b.args.overrides, "cpu_flags": relevant_flags(), "cpu_native_bf16": native_bf16()}


def model_speeds(b: Bench) -> dict[str, Any]:
    """Our defaults (dropout on sub-layer outputs and embeddings only) against nn.Transformer with the
    one dropout it has (which it also applies to attention and the FFN inner layer), both with dropout
    off (pure compute), and on a CPU with native bf16 both under bf16 autocast; best of interleaved
    rounds. Our utilisation of the matmul peak (MFU) at the padded shapes."""
    c, vocab_size = b.cfg.model, b.data.vocab.tgt_vocab_size
    no_dropout = dataclasses.replace(c, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)

    def ours(m: ModelConfig) -> nn.Module:
        return build_model(m, b.data.vocab)

    def ref(m: ModelConfig) -> nn.Module:
        return TorchReference(m, vocab_size, PAD_ID)

    bf16 = b.device.type == "cpu" and (native_bf16() or b.args.cheap_wins)
    settings = [("ours", ours, c, b.dtype), ("ref", ref, c, b.dtype)]
    settings += [("ours_bf16", ours, c, torch.bfloat16)] if bf16 else []
    if not b.args.quick:
        settings += [("ours_nodrop", ours, no_dropout, b.dtype), ("ref_nodrop", ref, no_dropout, b.dtype)]
        settings += [("ref_bf16", ref, c, torch.bfloat16)] if bf16 else []
    models = {}
    for name, build, m, dtype in settings:
        torch.manual_seed(0)
        models[name] = (build(m).to(b.device), dtype)
    rounds = 1 if b.args.quick else b.args.rounds
    seconds, tokens = fastest(models, b.batches, b.device, rounds)
    rate = {name: tokens / s for name, s in seconds.items()}
    peak = matmul_peak_gflops(b.device, b.dtype or torch.float32, 8192 if b.device.type == "cuda" else 2048)
    gflops = training_flops(c, vocab_size, b.batches) / seconds["ours"] / 1e9
    src_tokens = float(sum(x.n_src_tokens for x in b.batches))
    return {
        "train_batches": len(b.batches), "train_rounds": rounds,
        "train_tgt_tok_s": rate["ours"], "train_src_tgt_tok_s": (tokens + src_tokens) / seconds["ours"],
        "train_tgt_tok_s_nn_transformer": rate["ref"],
        "train_ratio_vs_nn_transformer": rate["ours"] / rate["ref"],
        "train_tgt_tok_s_no_dropout": rate.get("ours_nodrop"),
        "train_tgt_tok_s_nn_transformer_no_dropout": rate.get("ref_nodrop"),
        "train_ratio_vs_nn_transformer_no_dropout":
            rate["ours_nodrop"] / rate["ref_nodrop"] if "ours_nodrop" in rate else None,
        "matmul_peak_gflops": peak, "train_gflops": gflops, "train_utilisation": gflops / peak,
        "train_tgt_tok_s_bf16": rate.get("ours_bf16"),
        "cpu_bf16_train_speedup": rate["ours_bf16"] / rate["ours"] if bf16 else None,
        "train_ratio_vs_nn_transformer_bf16":
            rate["ours_bf16"] / rate["ref_bf16"] if "ref_bf16" in rate else None,
    }


def bare_step(b: Bench) -> dict[str, Any]:
    """Training steps of our model on one fixed shape (the largest real batch, repeated): the ceiling
    of the loop, with no new shape, data or bookkeeping."""
    batch = max(b.batches, key=lambda x: x.src.numel() + x.tgt_in.numel())
    torch.manual_seed(0)
    model = build_model(b.cfg.model, b.data.vocab).to(b.device)
    seconds, tokens = time_training(model, [batch] * len(b.batches), b.device, b.dtype)
    return {"bare_step_tgt_tok_s": tokens / seconds,
            "bare_step_shape": [len(batch), batch.src.size(1), batch.tgt_in.size(1)]}


def padding(b: Bench) -> dict[str, Any]:
    """An epoch's distinct batch shapes and padded share of positions: with the device's
    training.pad_to_multiple, with 8 (compiling on a GPU), and in random batches for reference."""
    t = b.cfg.training
    multiple = pad_to_multiple(t.pad_to_multiple, b.device, b.cfg.device.compile)
    shapes, frac = epoch_shapes(b.data, t.batch_tokens, multiple)
    shapes8, frac8 = epoch_shapes(b.data, t.batch_tokens, 8)
    return {"pad_to_multiple": multiple, "distinct_shapes_per_epoch": shapes, "padding_frac": frac,
            "distinct_shapes_per_epoch_pad8": shapes8, "padding_frac_pad8": frac8,
            "padding_frac_fixed_random_batches": random_batch_padding(b.data)}


def host_syncs(b: Bench) -> dict[str, Any]:
    """How often one step of the real loop makes the host wait for the device (GPU code paths)."""
    amp = {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[b.dtype]
    return host_reads(b.cfg, b.size(20, 50), amp)


def loop(b: Bench) -> dict[str, Any]:
    """The real `train` loop over short epochs (first and later epochs), and its fixed costs
    (validation, checkpoint, logging, data) extrapolated to a full-corpus epoch at the bare rate."""
    amp = {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[b.dtype]  # as the bare steps
    found = train_loop(b.cfg, b.size(3, 10), b.size(2, 3), amp)
    rate = b.results["train_tgt_tok_s"]
    compute = found["loop_tgt_tokens"] / rate
    fixed = max(0.0, found["loop_wall_s"] - compute) / found["loop_epochs"]  # per epoch
    full_compute = float(b.data.train.tgt_lens.sum() + len(b.data.train)) / rate
    steady = found["train_loop_tgt_tok_s"]
    return {**found, "loop_short_epoch_s": found["loop_wall_s"] / found["loop_epochs"],
            "loop_overhead_frac_short_epoch": 1 - compute / found["loop_wall_s"],
            "loop_overhead_frac": fixed / (full_compute + fixed),
            "train_loop_vs_bare_step": steady / b.results["bare_step_tgt_tok_s"] if steady else None}


def compile_and_bf16(b: Bench) -> dict[str, Any]:
    """torch.compile against eager (with --cheap-wins only: slow)."""
    if not b.args.cheap_wins:
        return {}
    return cheap_wins(b.cfg.model, b.data, b.cfg.training.batch_tokens, b.cfg.seed, len(b.batches), b.device)


def decoding(b: Bench) -> dict[str, Any]:
    """Sentences/s of the searches on the run's own test sentences (the newest run's by default)."""
    checkpoint = b.args.checkpoint or newest_checkpoint(Path(b.cfg.checkpoint.root))
    if checkpoint is None:
        print("no checkpoint found: decoding figures skipped (train one or pass --checkpoint)",
              file=sys.stderr)
        return {"decode_checkpoint": None}
    speeds = decoding_speeds(checkpoint, b.size(200, 1000), b.device,
                             rounds=1 if b.args.quick else b.args.rounds,
                             bf16=b.device.type == "cpu" and (native_bf16() or b.args.cheap_wins))
    return {"decode_checkpoint": str(checkpoint), **speeds}


def memory(b: Bench) -> dict[str, Any]:
    """The peak memory of everything above on the device; on a CPU, also the peak resident memory of
    training alone and of translating alone, each in a child process of its own."""
    checkpoint = b.results.get("decode_checkpoint")
    cpu = b.device.type == "cpu"
    return {"peak_mem_gib": peak_memory_gib(b.device),
            "peak_rss_train_mib": child_peak_rss_mib("train", None, b.args.overrides) if cpu else None,
            "peak_rss_translate_mib":
                child_peak_rss_mib("translate", checkpoint, b.args.overrides) if cpu and checkpoint else None}


MEASUREMENTS: tuple[Callable[[Bench], dict[str, Any]], ...] = (
    about_machine, model_speeds, bare_step, padding, loop, host_syncs, compile_and_bf16, decoding, memory)


# -- memory of one job alone (child processes, so each peak is its own) ----------------------------
def child_peak_rss_mib(mode: str, checkpoint: str | None, overrides: list[str]) -> float:
    """Run this script as `--child MODE` and read back its peak RSS."""
    args = [sys.executable, __file__, "--child", mode]
    args += ["--checkpoint", checkpoint] if checkpoint else []
    out = subprocess.run([*args, "--", *overrides], capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def run_child(mode: str, cfg: TrainConfig, checkpoint: Path | None) -> None:
    """Train six batches, or translate 300 test sentences; print the peak RSS (MiB)."""
    if mode == "train":
        data = prepare_data(cfg.dataset, cfg.tokenizer)
        batches = real_batches(data, cfg.training.batch_tokens, cfg.seed, 6)
        time_training(build_model(cfg.model, data.vocab), batches, torch.device("cpu"))
    else:
        from transformer_mt.decoding.translator import Translator

        engine = Translator.from_checkpoint(checkpoint, device="cpu")
        engine.translate(run_test_pairs(engine, 300)[0])
    print(peak_rss_mib())


# -- the report ------------------------------------------------------------------------------------
LABELS = {  # key: (label in the table, format); other keys are shown by name
    "device_name": ("device", "s"),
    "train_tgt_tok_s": ("training, ours (target tokens/s)", ".0f"),
    "train_tgt_tok_s_nn_transformer": ("training, torch.nn.Transformer (target tokens/s)", ".0f"),
    "train_ratio_vs_nn_transformer": ("ratio ours / nn.Transformer", ".2f"),
    "train_ratio_vs_nn_transformer_no_dropout": ("the same with all dropout off", ".2f"),
    "matmul_peak_gflops": ("matmul peak (GFLOP/s)", ".0f"),
    "train_utilisation": ("utilisation of the matmul peak (MFU)", ".0%"),
    "bare_step_tgt_tok_s": ("bare training step, one fixed shape (target tokens/s)", ".0f"),
    "train_first_epoch_tgt_tok_s": ("train loop, first epoch (target tokens/s)", ".0f"),
    "train_loop_tgt_tok_s": ("train loop, later epochs (target tokens/s)", ".0f"),
    "train_loop_vs_bare_step": ("train loop / bare step", ".2f"),
    "loop_overhead_frac": ("train loop overhead (full epoch, extrapolated)", ".1%"),
    "distinct_shapes_per_epoch": ("batch shapes per epoch (this device's pad_to_multiple)", "d"),
    "padding_frac": ("padding: token buckets (this device's pad_to_multiple)", ".1%"),
    "distinct_shapes_per_epoch_pad8": ("batch shapes per epoch, pad_to_multiple=8", "d"),
    "padding_frac_pad8": ("padding: token buckets, pad_to_multiple=8", ".1%"),
    "padding_frac_fixed_random_batches": ("padding: random 128-sentence batches", ".1%"),
    "host_syncs_per_step": ("host reads of the device per training step", ".3f"),
    "train_tgt_tok_s_bf16": ("bf16 autocast training, ours (target tokens/s)", ".0f"),
    "cpu_bf16_train_speedup": ("bf16 speed-up over float32", ".2f"),
    "train_ratio_vs_nn_transformer_bf16": ("bf16: ratio ours / nn.Transformer", ".2f"),
    "greedy_nocache_sent_s": ("greedy without cache (sentences/s)", ".1f"),
    "greedy_sent_s": ("greedy (sentences/s)", ".1f"),
    "beam5_sent_s": ("beam 5 (sentences/s)", ".1f"),
    "ct2_int8_beam5_sent_s": ("CTranslate2 int8 beam 5 (sentences/s)", ".1f"),
    "torch_compile_dynamic_seconds": ("torch.compile, dynamic shapes: compile seconds", ".0f"),
    "torch_compile_dynamic_speedup": ("torch.compile, dynamic shapes: training speed vs eager", ".2f"),
    "torch_compile_static_shapes": ("torch.compile per shape (pad_to_multiple=8): shapes compiled", "d"),
    "torch_compile_static_seconds": ("torch.compile per shape: compile seconds", ".0f"),
    "torch_compile_static_speedup": ("torch.compile per shape: training speed vs eager", ".2f"),
    "peak_mem_gib": ("peak memory on the device (GiB)", ".2f"),
    "peak_rss_train_mib": ("peak RSS, training alone (MiB)", ".0f"),
    "peak_rss_translate_mib": ("peak RSS, translating alone (MiB)", ".0f"),
}


def report(results: dict[str, Any]) -> str:
    """The labelled figures as a Markdown table, in LABELS' order (those measured)."""
    rows = [[label, format(results[key], spec)] for key, (label, spec) in LABELS.items()
            if results.get(key) is not None]
    return f"Machine: {results['machine']}\n\n" + markdown_table(["measure", "value"], rows)


def newest_checkpoint(root: Path) -> Path | None:
    """The best checkpoint of the newest run under the checkpoint root, if any."""
    found = sorted(root.glob(f"*/{BEST}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer batches and sentences (< 2 min)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to measure")
    parser.add_argument("--checkpoint", type=Path, default=None, help="for decoding (default: newest)")
    parser.add_argument("--out", type=Path, default=Path("benchmark.json"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2,
                        help="training and decoding: best of this many interleaved rounds (1 with --quick)")
    parser.add_argument("--cheap-wins", action="store_true",
                        help="also time bf16 autocast and torch.compile against eager fp32 (slow)")
    parser.add_argument("--child", choices=["train", "translate"], help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="train overrides (after --), e.g. model=base")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda needs a CUDA GPU, and torch sees none here", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        cfg = tmt.compose("train", [*args.overrides, f"device.name={args.device}", "training.progress=false"])
        if args.child:
            run_child(args.child, cfg, args.checkpoint)
            return 0
        results = measure(args, cfg, device)
    except UserError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    return 0


def measure(args: argparse.Namespace, cfg: TrainConfig, device: torch.device) -> dict[str, Any]:
    """Every measurement of MEASUREMENTS, in order, on the config's real batches."""
    warning = load_warning()
    if warning:
        print(f"warning: {warning}; figures will be low", file=sys.stderr)
    torch.manual_seed(0)
    data = prepare_data(cfg.dataset, cfg.tokenizer)
    batches = real_batches(data, cfg.training.batch_tokens, cfg.seed, 4 if args.quick else 12)
    dtype = None if device.type == "cpu" else precision(cfg.device, device).dtype
    bench = Bench(args, cfg, device, dtype, data, [x.to(device) for x in batches], {"load_warning": warning})
    for measurement in MEASUREMENTS:
        bench.results.update(measurement(bench))
    return bench.results


if __name__ == "__main__":
    sys.exit(main())
