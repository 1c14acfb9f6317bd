"""Decoding and training speed of model shapes against a trained teacher, before any of them is trained.

    python scripts/benchmark_shapes.py saved_weights/<run> [--sentences 500] [--rounds 3]
        [--shapes 256/4/1024/6+1 256/4/1024/6+1@4000 ...] [--corpus data/fra-eng.zip]
        [--train-seconds 10] [--threads 1 --clock cpu] [--out shapes.json]

Each shape is d_model/heads/d_ff/encoder+decoder layers, with the teacher's other settings and tokenizer,
or `@N` a tokenizer of N tokens like the teacher's, trained on --corpus. An untrained model of each shape
decodes the run's first test sentences with beam 5, each output forced to its reference's tokens
(training/decoding_speed.py: what the plan's `training.decode_speedup` measures), and trains for a few
seconds on batches of the test pairs (the Trainer's own step, at the run's batch size and training
precision). The teacher itself is timed two ways: its real beam 5 (its outputs end by themselves) and
forced as the untrained shapes are, which shows how far forcing moves the figure. Speeds are reported
over the teacher shape's (untrained, forced, like the others). Every figure is the best of interleaved
rounds after an untimed one. `--clock cpu` counts this process's CPU time instead of the wall clock:
with `--threads 1`, what another process on a shared machine takes does not count.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from timing import load_warning, machine  # beside this script

from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import DatasetConfig, DecodingConfig, DeviceConfig, ModelConfig, TokenizerConfig
from transformer_mt.data import EncodedSplit, Ragged, TokenBatchSampler, load_pairs, load_split_tsv
from transformer_mt.data.cache import sample_indices
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.data.tokenizer import Vocabulary, train_tokenizers
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.runtime.device import precision
from transformer_mt.tables import markdown_table
from transformer_mt.training.decoding_speed import forced_seconds, untrained
from transformer_mt.training.throughput import time_training

TEACHER = "teacher"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclasses.dataclass
class Candidate:
    """A shape to time: its model config, the tokenizer it decodes with and its test pairs so encoded."""

    config: ModelConfig
    vocab: Vocabulary
    pairs: EncodedSplit

    @property
    def spec(self) -> str:
        c, size = self.config, self.vocab.tgt_vocab_size
        return f"{c.d_model}/{c.n_heads}/{c.d_ff}/{c.encoder_layers}+{c.decoder_layers}@{size}"


def shape(spec: str, base: ModelConfig) -> tuple[ModelConfig, int | None]:
    """`base` with the shape of a spec `d_model/heads/d_ff/encoder+decoder[@N]` (e.g. 256/4/1024/6+1 or
    256/4/1024/6+1@4000), and the spec's vocabulary size N (None: the teacher's tokenizer)."""
    layout, _, vocabulary = spec.partition("@")
    d_model, heads, d_ff, layers = layout.split("/")
    encoder, decoder = layers.split("+")
    config = dataclasses.replace(base, d_model=int(d_model), n_heads=int(heads), d_ff=int(d_ff),
                                 encoder_layers=int(encoder), decoder_layers=int(decoder))
    return config, int(vocabulary) if vocabulary else None


def encoded(vocab: Vocabulary, sources: list[str], references: list[str]) -> EncodedSplit:
    """The pairs as `vocab` encodes them."""
    return EncodedSplit(Ragged.from_lists(vocab.encode_src(sources)),
                        Ragged.from_lists(vocab.encode_tgt(references)), sources, references)


def tokenizer(corpus: Path | None, like: Vocabulary, size: int, sentences: int) -> Vocabulary:
    """A tokenizer of the teacher's kind with another vocabulary size, trained on the corpus's pairs."""
    if corpus is None:
        raise SystemExit("a shape with its own vocabulary size (@N) needs --corpus")
    english, french = load_pairs(DatasetConfig(path=str(corpus), url=None))
    keep = sample_indices(len(english), min(sentences, len(english)), 0).tolist()
    cfg = TokenizerConfig(kind=like.kind, vocab_size=size, joint=like.joint)
    return train_tokenizers(cfg, [english[i] for i in keep], [french[i] for i in keep])


def fastest(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each run's least seconds over interleaved rounds (a run returns its own seconds)."""
    best = dict.fromkeys(runs, math.inf)
    for _ in range(rounds):
        for name, run in runs.items():
            best[name] = min(best[name], run())
    return best


def timed(run: Callable[[], object], clock: Callable[[], float]) -> float:
    """The seconds `run` takes on `clock`."""
    start = clock()
    run()
    return clock() - start


def training_seconds(model: torch.nn.Module, batches: list, amp: torch.dtype | None, seconds: float,
                     clock: Callable[[], float]) -> float:
    """Seconds per target token of the Trainer's step (time_training's timed steps; on the CPU clock,
    their wall time scaled by the whole call's CPU over wall time)."""
    wall, cpu = time.perf_counter(), clock()
    elapsed, tokens = time_training(model, batches, torch.device("cpu"), amp, seconds=seconds)
    share = (clock() - cpu) / (time.perf_counter() - wall)
    return elapsed * share / tokens


def candidates_of(args: argparse.Namespace, teacher: ModelConfig, vocab: Vocabulary, sources: list[str],
                  references: list[str]) -> dict[str, Candidate]:
    """The teacher's shape first, then each of --shapes, with its tokenizer and its encoded test pairs."""
    found = {TEACHER: Candidate(teacher, vocab, encoded(vocab, sources, references))}
    vocabularies: dict[int | None, Vocabulary] = {None: vocab}
    for spec in args.shapes:
        config, size = shape(spec, teacher)
        if size not in vocabularies:
            vocabularies[size] = tokenizer(args.corpus, vocab, size, args.tokenizer_sentences)
        found[spec] = Candidate(config, vocabularies[size], encoded(vocabularies[size], sources, references))
    return found


def measure(args: argparse.Namespace, teacher: torch.nn.Module, candidates: dict[str, Candidate],
            batch_tokens: int) -> tuple[dict[str, float], dict[str, float]]:
    """Beam sentences/s (the teacher's real and forced ones too) and training target tokens/s."""
    device, clock = torch.device("cpu"), CLOCKS[args.clock]
    search = DecodingConfig(beam_size=args.beam)
    amp = precision(DeviceConfig(), device, training=False).dtype
    models = {name: untrained({name: c.config}, c.vocab, device)[name] for name, c in candidates.items()}
    own = candidates[TEACHER].pairs
    sources = [s.tolist() for s in own.src_ids]
    runs = {"real": functools.partial(timed, lambda: decode_ids(teacher, sources, search, device, amp=amp),
                                      clock),
            "trained": functools.partial(timed, lambda: forced_seconds(teacher, own, search, device, amp),
                                         clock)}
    for name, c in candidates.items():
        runs[name] = functools.partial(timed, functools.partial(forced_seconds, models[name], c.pairs, search,
                                                                device, amp), clock)
    for run in runs.values():  # untimed: oneDNN builds its kernels for each new shape on first use
        run()
    beam = {name: len(own) / s for name, s in fastest(runs, args.rounds).items()}
    if args.train_seconds <= 0:
        return beam, {}
    train_amp = precision(DeviceConfig(), device, training=True).dtype
    steps = {}
    for name, c in candidates.items():
        sampler = TokenBatchSampler(c.pairs.lengths(), batch_tokens, shuffle=True, seed=0)
        batches = [c.pairs.batch(b) for b in sampler.batches(0)]
        steps[name] = functools.partial(training_seconds, models[name], batches, train_amp,
                                        args.train_seconds, clock)
    return beam, {name: 1 / s for name, s in fastest(steps, args.rounds).items()}


def result(c: Candidate, beam: dict[str, float], train: dict[str, float], name: str) -> dict[str, object]:
    """One shape's figures, its speeds also over the teacher shape's."""
    params = parameter_count(c.config, c.vocab.src_vocab_size, c.vocab.tgt_vocab_size)
    found = {"shape": c.spec, "params": params,
             "reference_tokens": int(c.pairs.tgt_lens.sum()), "beam_sent_s": beam[name],
             "beam_speedup": beam[name] / beam[TEACHER]}
    if train:
        found |= {"train_tok_s": train[name], "train_speed": train[name] / train[TEACHER]}
    return found


def table(results: dict[str, dict], train: bool) -> str:
    """The shapes' figures as a Markdown table."""
    header = ["", "shape@vocabulary", "params", "reference tokens", "beam sent/s (forced)", "over teacher's"]
    rows = [[name if name == TEACHER else "", r["shape"], f"{r['params'] / 1e6:.1f}M",
             str(r["reference_tokens"]), f"{r['beam_sent_s']:.1f}", f"{r['beam_speedup']:.2f}×",
             *([f"{r['train_tok_s']:.0f}", f"{r['train_speed']:.2f}×"] if train else [])]
            for name, r in results.items()]
    return markdown_table(header + (["train tok/s", "over teacher's"] if train else []), rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="the teacher: a checkpoint file or run directory")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many interleaved rounds")
    parser.add_argument("--shapes", nargs="+", default=["256/4/1024/6+1"],
                        help="d_model/heads/d_ff/encoder+decoder[@vocabulary size]")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="a Tatoeba zip: trains the tokenizers of shapes with their own vocabulary size")
    parser.add_argument("--tokenizer-sentences", type=int, default=100_000)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--train-seconds", type=float, default=10.0, help="0: no training speeds")
    parser.add_argument("--batch-tokens", type=int, default=None, help="default: the teacher run's")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    file, state, teacher, vocab = model_from_checkpoint(args.checkpoint)
    test = load_split_tsv(file.parent / SPLIT_DIR / "test.tsv")
    sources, references = test[0][:args.sentences], test[1][:args.sentences]
    candidates = candidates_of(args, teacher.config, vocab, sources, references)
    warning = load_warning()
    beam, train = measure(args, teacher, candidates,
                          args.batch_tokens or int(state["config"]["training"]["batch_tokens"]))
    results = {name: result(c, beam, train, name) for name, c in candidates.items()}
    print(f"machine: {machine()}; {len(sources)} test sentences of {file}; beam {args.beam}; best of "
          f"{args.rounds} interleaved rounds on the {args.clock} clock" + (f"; {warning}" if warning else ""))
    print(f"the teacher's own beam {args.beam}: {beam['real']:.1f} sentences/s; forced to the references: "
          f"{beam['trained']:.1f}; untrained, forced: {beam[TEACHER]:.1f}")
    print(table(results, bool(train)))
    if args.out:
        summary = {"machine": machine(), "checkpoint": str(file), "sentences": len(sources),
                   "beam": args.beam, "rounds": args.rounds, "clock": args.clock,
                   "teacher_real_sent_s": beam["real"], "teacher_forced_sent_s": beam["trained"],
                   "shapes": results, "warning": warning}
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
