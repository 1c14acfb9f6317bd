"""Where a model's decoding time goes: its encoder, its output projection onto the vocabulary, and the rest
(the decoder's layers and the search's own work: log-softmax, top-k, the beams' bookkeeping).

    python scripts/decoding_profile.py <run> [<run> ...] [--sentences 1000] [--beam 5] [--rounds 2]
        [--precision float32|bf16|int8] [--out f.json]

Every run translates the first --sentences of the first run's test split, batched as `transformer-mt
translate` does, --rounds times (the fastest round counts); the encoder's calls and the output projection's
are timed where the search makes them. What a shallower decoder can save is the third part alone: a student
whose encoder and projection match its teacher's decodes at most (teacher's time) / (its encoder +
projection) as fast. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from timing import load_warning, machine, native_bf16  # beside this script

from transformer_mt.config import DecodingConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.decoding.translator import Translator
from transformer_mt.model import Transformer
from transformer_mt.tables import markdown_table

PARTS = ("encoder", "output projection")


def engine(run: Path, precision: str, beam: int) -> Translator:
    """Our engine on the run in that precision, beam search of `beam` (1: greedy), no confidence pass."""
    quantize = "int8" if precision == "int8" else "none"
    decoding = DecodingConfig(beam_size=beam, confidence=False, quantize=quantize)
    return Translator.from_checkpoint(run, device="cpu", decoding=decoding,
                                      amp={"float32": "off", "bf16": "bf16", "int8": "auto"}[precision])


def timed(spent: dict[str, float], part: str, call: Callable) -> Callable:
    """`call`, adding the seconds each call takes to spent[part]."""
    def wrapper(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start
    return wrapper


def profile(translator: Translator, sentences: list[str], rounds: int) -> dict[str, float]:
    """The fastest of `rounds` translations of `sentences`: total seconds and each part's."""
    model = translator.model
    if not isinstance(model, Transformer):
        raise SystemExit(f"error: {translator.info['checkpoint']} decodes as an ensemble; profile one model")
    spent = dict.fromkeys(PARTS, 0.0)
    model.encode = timed(spent, "encoder", model.encode)  # type: ignore[method-assign]
    model._project = timed(spent, "output projection", model._project)  # type: ignore[method-assign]
    translator.translate(sentences[:50], input_case="model")  # warm-up: the kernels' first calls
    best: dict[str, float] | None = None
    for _ in range(rounds):
        spent.update(dict.fromkeys(PARTS, 0.0))
        start = time.perf_counter()
        translator.translate(sentences, input_case="model")
        row = {"total": time.perf_counter() - start, **spent}
        if best is None or row["total"] < best["total"]:
            best = row
    assert best is not None
    best["decoder and search"] = best["total"] - sum(best[p] for p in PARTS)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=5, help="beam size (1: greedy)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", choices=("float32", "bf16", "int8"), default="float32")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.precision == "bf16" and not native_bf16():
        print("error: --precision bf16 needs a CPU with native bf16; use float32 or int8", file=sys.stderr)
        return 2
    test = args.runs[0] / SPLIT_DIR / "test.tsv"
    if not test.is_file():
        print(f"error: no {test}: give a run trained by `transformer-mt train` first", file=sys.stderr)
        return 2
    sentences = load_split_tsv(test)[0][:args.sentences]
    if warning := load_warning():
        print(f"warning: {warning}", file=sys.stderr)
    rows = {}
    for run in args.runs:
        translator = engine(run, args.precision, args.beam)
        c, vocabulary = translator.model.config, translator.vocab.tgt_vocab_size
        shape = f"{c.encoder_layers}+{c.decoder_layers}, d {c.d_model}, {vocabulary} target tokens"
        rows[str(run)] = {"shape": shape, **profile(translator, sentences, args.rounds)}
    header = ["run", "shape", "sentences/s", *(f"{p} (s, share)" for p in (*PARTS, "decoder and search"))]
    table = [[run, r["shape"], f"{len(sentences) / r['total']:.0f}",
              *(f"{r[p]:.2f} ({r[p] / r['total']:.0%})" for p in (*PARTS, "decoder and search"))]
             for run, r in rows.items()]
    search = "greedy" if args.beam == 1 else f"beam {args.beam}"
    print(f"{len(sentences)} sentences, {search}, {args.precision}, {torch.get_num_threads()} threads, "
          f"{machine()}")
    print(markdown_table(header, table))
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "sentences": len(sentences), "beam": args.beam,
                                        "precision": args.precision, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
