"""The speed of text as people have it: the same test sentences translated one a line by the engine
alone, one a line through the documents layer, and as paragraphs of several sentences through it, in
one run with the same batch settings.

    python scripts/benchmark_documents.py saved_weights/<run> [--sentences 1000] [--rounds 5] [--out f.json]

Paragraphs hold 2 to 5 consecutive sentences (seeded), joined with a space. The target: paragraphs at no
less than 90% of the sentences per second of the engine one a line. Sentences per second are the best of
a few interleaved rounds; the ratio is the median over the rounds of each round's own ratio, since a shared
machine of two cores drifts by more from one round to the next than the layer costs (timing.timed_rounds).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from timing import load_warning, machine, timed_rounds  # beside this script

from transformer_mt.config import DecodingConfig, DocumentConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.decoding.translator import Translator
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.tables import markdown_table

TARGET = 0.9  # paragraphs' sentences/s over the engine's one a line


def paragraphs(sentences: list[str], seed: int = 1) -> list[str]:
    """The sentences in order, 2 to 5 a paragraph, joined with a space."""
    rng, out, at = random.Random(seed), [], 0
    while at < len(sentences):
        k = rng.randint(2, 5)
        out.append(" ".join(sentences[at:at + k]))
        at += k
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    warning = load_warning()
    engine = Translator.from_checkpoint(args.checkpoint, device="cpu",
                                        decoding=DecodingConfig(beam_size=args.beam))
    sources, _ = load_split_tsv(Path(engine.info["checkpoint"]).parent / SPLIT_DIR / "test.tsv")
    sentences = sources[: args.sentences]
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    texts = paragraphs(sentences)
    times = timed_rounds({
        "engine, one a line": lambda: engine.translate_nbest(sentences),
        "documents layer, one a line": lambda: docs.translate_nbest(sentences),
        "documents layer, paragraphs": lambda: docs.translate_nbest(texts),
    }, args.rounds)
    speed = {name: len(sentences) / min(seconds) for name, seconds in times.items()}
    ratio = statistics.median(e / p for e, p in zip(times["engine, one a line"],
                                                     times["documents layer, paragraphs"], strict=True))
    print(f"{machine()}; beam {args.beam}; {len(sentences)} sentences, {len(texts)} paragraphs; best of "
          f"{args.rounds} rounds; the ratio: their median" + (f"; warning: {warning}" if warning else ""))
    print(markdown_table(["input", "sentences/s", "of the engine one a line"],
                         [[name, f"{s:.1f}", f"{s / speed['engine, one a line']:.1%}"]
                          for name, s in speed.items()]))
    print(f"paragraphs at {ratio:.1%} of one a line, the median of the rounds (target >= {TARGET:.0%}): "
          f"{'met' if ratio >= TARGET else 'missed'}")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "sentences": len(sentences),
                                        "paragraphs": len(texts), "beam": args.beam, "rounds": args.rounds,
                                        "sentences_per_s": speed, "seconds": times, "ratio": ratio,
                                        "warning": warning},
                                       indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
