"""The exports of one checkpoint against our own search, on its run's held-out test split, in one run.

    python scripts/benchmark_export.py saved_weights/<run> [--sentences 1000] [--out f.json] [--keep DIR]

Exports the run as format=onnx (which holds format=hf's directory) and as CTranslate2 int8, then:
- parity, on the first --sentences of the test split: Hugging Face `generate` greedy and ONNX Runtime greedy
  (float32) against our greedy search in float32: how many outputs are identical;
- BLEU on the whole test split: `generate` beam 5 against ours (and how many of its 1-bests are ours),
  ONNX Runtime int8 greedy against float32;
- speed on the same --sentences (one round; nothing else should run): ours greedy and beam 5 (batched, as
  `transformer-mt translate`, and greedy one sentence at a time), `generate` greedy, ONNX Runtime float32
  and int8 greedy (one at a time, with our length rule), CTranslate2 int8 greedy and beam 5 (batched);
  sentences/s and each format's size on disk.
Needs the hf, onnx and ct2 extras.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from timing import load_warning, machine  # beside this script

from transformer_mt.config import DecodingConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.decoding.ct2 import CT2Translator
from transformer_mt.decoding.metrics import score
from transformer_mt.decoding.translator import Translator
from transformer_mt.interop.ct2_export import export_ctranslate2
from transformer_mt.interop.generate import ExportedModel
from transformer_mt.interop.onnx import export_onnx
from transformer_mt.tables import markdown_table

PARITY = ("HF generate greedy (one at a time)", "ONNX Runtime float32 greedy (one at a time)",
          "ours greedy (one at a time)")


def timed(run: Callable[[], list[str]], n: int) -> tuple[float, list[str]]:
    """(sentences/s, outputs) of one call."""
    start = time.perf_counter()
    out = run()
    return n / (time.perf_counter() - start), out


def size_mb(*paths: Path) -> float:
    return sum(p.stat().st_size for p in paths) / 1e6


def disk_sizes(run: Path, onnx_dir: Path, ct2_dir: Path) -> dict[str, float]:
    """Megabytes on disk of each format's weights."""
    graphs = ("encoder_model", "decoder_model_merged")
    return {"ours (best.pt)": size_mb(run / "best.pt"),
            "HF (model.safetensors)": size_mb(onnx_dir / "model.safetensors"),
            "ONNX float32": size_mb(*(onnx_dir / "onnx" / f"{g}.onnx" for g in graphs)),
            "ONNX int8": size_mb(*(onnx_dir / "onnx" / f"{g}_quantized.onnx" for g in graphs)),
            "CTranslate2 int8": size_mb(ct2_dir / "model.bin")}


def report(summary: dict, bleu: dict, differing: list[tuple[str, str, str]]) -> None:
    """Print the run's tables: speeds, agreement with ours, BLEU, sizes, and a few differing outputs."""
    print(f"machine: {summary['machine']}; {summary['checkpoint']}; {summary['sentences']} test sentences "
          f"(speed, parity), {summary['test_pairs']} (BLEU); one round")
    if summary['warning']:
        print(f"warning: {summary['warning']}")
    print(markdown_table(["engine", "sentences/s"], [[k, f"{v:.1f}"] for k, v in summary['speeds'].items()]))
    print(markdown_table(["against ours (greedy; beam 5)", "identical"],
                         [[k, str(v)] for k, v in summary['identical_to_ours'].items()]))
    print(markdown_table(["search", "BLEU", "chrF"],
                         [[k, f"{v.bleu:.2f}", f"{v.chrf:.2f}"] for k, v in bleu.items()]))
    print(markdown_table(["format", "MB on disk"], [[k, f"{v:.1f}"] for k, v in summary['size_mb'].items()]))
    for source, a, b in differing:
        print(f"differs: {source!r}\n  ours:  {a!r}\n  export: {b!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", help="a run directory (its split/test.tsv is read)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--bleu-sentences", type=int, default=None, help="BLEU on this many (default: all)")
    parser.add_argument("--keep", type=Path, default=None, help="write the exports here (default: temp)")
    args = parser.parse_args(argv)
    run = Path(args.checkpoint)
    sources, refs = load_split_tsv(run / SPLIT_DIR / "test.tsv")
    sources, refs = sources[:args.bleu_sentences], refs[:args.bleu_sentences]
    head = sources[:args.sentences]
    warning = load_warning()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        onnx_dir = export_onnx(run, where / "onnx", overwrite=True)
        ct2_dir = export_ctranslate2(run, where / "ct2-int8", quantization="int8", overwrite=True)
        ours = Translator.from_checkpoint(run, device="cpu", amp="off")
        greedy, beam5 = DecodingConfig(beam_size=1), DecodingConfig(beam_size=5)

        def our(decoding: DecodingConfig, texts: list[str]) -> list[str]:
            ours.decoding = decoding
            return ours.translate(texts, input_case="model")  # as typed: the exports do not fold case

        hf = ExportedModel.load(onnx_dir)
        ort = ExportedModel.load(onnx_dir, runtime="onnx")
        ort8 = ExportedModel.load(onnx_dir, runtime="onnx", int8=True)
        ct2 = CT2Translator.from_dir(ct2_dir)
        for engine in (hf, ort, ort8):
            engine.translate(head[:8])  # warm up: first calls build kernels and caches
        our(greedy, head[:8])
        speeds: dict[str, float] = {}
        outputs: dict[str, list[str]] = {}
        runs = {"ours greedy (batched)": lambda: our(greedy, head),
                "ours greedy (one at a time)": lambda: [our(greedy, [s])[0] for s in head],
                "ours beam 5 (batched)": lambda: our(beam5, head),
                "HF generate greedy (one at a time)": lambda: hf.translate(head),
                "ONNX Runtime float32 greedy (one at a time)": lambda: ort.translate(head),
                "ONNX Runtime int8 greedy (one at a time)": lambda: ort8.translate(head),
                "CTranslate2 int8 greedy (batched)": lambda: ct2.translate(head, beam_size=1),
                "CTranslate2 int8 beam 5 (batched)": lambda: ct2.translate(head, beam_size=5)}
        for name, call in runs.items():
            speeds[name], outputs[name] = timed(call, len(head))
            print(f"{name}: {speeds[name]:.1f} sentences/s", flush=True)
        reference = outputs["ours greedy (batched)"]
        parity = {name: sum(a == b for a, b in zip(outputs[name], reference)) for name in PARITY}
        differing = [(s, a, b) for name in PARITY[:2] for s, a, b in zip(head, reference, outputs[name])
                     if a != b][:5]
        beams = {"ours": our(beam5, sources), "HF generate": hf.translate(sources, num_beams=5)}
        parity["HF generate beam 5 (of the BLEU sentences)"] = sum(a == b for a, b in zip(*beams.values()))
        bleu = {"ours beam 5": score(beams["ours"], refs),
                "HF generate beam 5": score(beams["HF generate"], refs),
                "ONNX Runtime float32 greedy": score(ort.translate(sources), refs),
                "ONNX Runtime int8 greedy": score(ort8.translate(sources), refs),
                "ours greedy": score(our(greedy, sources), refs)}
        sizes = disk_sizes(run, onnx_dir, ct2_dir)
        ort8.close()
    summary = {"machine": machine(), "checkpoint": str(run), "sentences": len(head),
               "test_pairs": len(sources),
               "warning": warning, "speeds": speeds, "identical_to_ours": parity,
               "differing_examples": differing,
               "bleu": {k: v.bleu for k, v in bleu.items()}, "chrf": {k: v.chrf for k, v in bleu.items()},
               "size_mb": sizes}
    report(summary, bleu, differing)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
