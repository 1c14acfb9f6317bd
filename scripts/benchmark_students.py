"""A teacher and its students side by side, in one run: size on disk, BLEU and speed in every engine.

    python scripts/benchmark_students.py <teacher run> <student run> [...] [--sentences 1000] [--rounds 3]
        [--onnx-sentences 200] [--page-sentences 100] [--no-page] [--out f.json]

Every run is read on the teacher's test split (a student distilled from it holds out the same pairs). For
each run: its shape and parameters; megabytes on disk (our float32 weights, CTranslate2 int8, the ONNX int8
graphs); beam-5 BLEU on the whole split in our engine (float32, bf16 where the CPU has native bf16, int8:
`decoding.quantize=int8`) and in CTranslate2 int8 (its own batching and search, `exact=False`, on as many
threads as torch: CTranslate2 at its fastest, as benchmark_decoding.py times it), each engine also with
`decoding.shortlist=true` where the run has a shortlist.json (CTranslate2: its `use_vmap`); sentences/s on
the first --sentences, batched as `transformer-mt translate` does, greedy and beam 5 in each of those, best of
--rounds rounds alternated across runs and engines; ONNX Runtime int8 greedy one sentence at a time
(optimum, as the exports are read); and the exported page in headless Chromium with its int8 graphs
(`?dtype=q8`): seconds from opening it to its first translation, and sentences/s of --page-sentences
translated in one call. Each speed is also given as a ratio to the teacher's in the same engine. Nothing
else should run meanwhile.
Needs the hf, onnx and ct2 extras, and for the page npm (the page's packages) and Chromium.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from timing import best_of_rounds, load_warning, machine, native_bf16  # beside this script

from transformer_mt.config import DecodingConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.decoding.ct2 import VMAP_FILE, CT2Translator
from transformer_mt.decoding.metrics import score
from transformer_mt.decoding.shortlist import SHORTLIST_FILE
from transformer_mt.decoding.translator import Translator
from transformer_mt.interop.ct2_export import export_ctranslate2
from transformer_mt.interop.generate import ExportedModel
from transformer_mt.interop.onnx import export_onnx
from transformer_mt.interop.web import export_web
from transformer_mt.tables import markdown_table

GRAPHS = ("encoder_model", "decoder_model_merged")
CHROMIUM = "/usr/bin/chromium"


def engines(run: Path, bf16: bool) -> dict[str, tuple[Translator, bool]]:
    """Our engine on the run in each precision: float32, bf16 (native bf16 only), int8; each also over
    the run's shortlist where it has one (`decoding.shortlist=true`). Name → (engine, shortlist)."""
    made = {"float32": Translator.from_checkpoint(run, device="cpu", amp="off"),
            "int8": Translator.from_checkpoint(run, device="cpu", decoding=DecodingConfig(quantize="int8"))}
    if bf16:
        made["bf16"] = Translator.from_checkpoint(run, device="cpu", amp="bf16")
    listed = (False, True) if (run / SHORTLIST_FILE).is_file() else (False,)
    return {f"{name}{' shortlist' if shortlist else ''}": (engine, shortlist)
            for name, engine in made.items() for shortlist in listed}


def ours(engine: Translator, beam: int, texts: list[str], shortlist: bool = False) -> list[str]:
    """Translations as `translate` decodes (batched), without the confidence pass, as typed."""
    engine.decoding = DecodingConfig(beam_size=beam, confidence=False, quantize=engine.decoding.quantize,
                                     shortlist=shortlist)
    return engine.translate(texts, input_case="model")


def ct2_engines(ct2: CT2Translator, model_dir: Path) -> dict[str, CT2Translator]:
    """CTranslate2 int8, and with the run's shortlist (its `use_vmap`) where the export holds one."""
    found = {"CTranslate2 int8": ct2}
    if (model_dir / VMAP_FILE).is_file():
        found["CTranslate2 int8 shortlist"] = CT2Translator.from_dir(
            model_dir, exact=False, intra_threads=torch.get_num_threads(),
            decoding=DecodingConfig(shortlist=True, confidence=False))
    return found


def size_mb(*paths: Path) -> float:
    return round(sum(p.stat().st_size for p in paths) / 1e6, 1)


def describe(engine: Translator) -> dict[str, object]:
    """The model's shape and parameters, and its float32 weights' megabytes."""
    m = engine.model
    c = m.config
    count = sum(p.numel() for p in m.parameters())
    return {"shape": f"d{c.d_model} ffn{c.d_ff} {c.encoder_layers}+{c.decoder_layers}", "parameters": count,
            "float32 MB": round(count * 4 / 1e6, 1)}


def page_timing(page_dir: Path, sentences: list[str]) -> dict[str, float]:
    """The page with its int8 graphs in headless Chromium: seconds from opening it to its first translation
    (one sentence), and sentences/s of `sentences` in one call (the best of three)."""
    from playwright.sync_api import sync_playwright

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            opened = time.perf_counter()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/?dtype=q8", timeout=120_000)
            page.wait_for_function("window.pageReady === true", timeout=300_000)
            page.evaluate("async (s) => await window.translateSentences(s)", sentences[:1])
            first = time.perf_counter() - opened
            best = min(page.evaluate("""async (s) => {
                const t = performance.now(); await window.translateSentences(s); return performance.now() - t;
            }""", sentences) for _ in range(3)) / 1000
            browser.close()
    finally:
        server.shutdown()
    return {"page: first translation s": round(first, 2), "page int8 greedy": len(sentences) / best}


def measure(runs: list[Path], sources: list[str], refs: list[str], args: argparse.Namespace,
            where: Path) -> dict[str, dict[str, object]]:
    """Each run's sizes, BLEU and speeds (sentences/s), its speeds alternated with the other runs'."""
    head, bf16 = sources[:args.sentences], native_bf16()
    found: dict[str, dict[str, object]] = {}
    timed = {}
    for run in runs:
        name, out = run.name, where / run.name
        ct2 = CT2Translator.from_dir(export_ctranslate2(run, out / "ct2-int8", quantization="int8",
                                                        overwrite=True),
                                     exact=False, intra_threads=torch.get_num_threads())
        onnx_dir = export_onnx(run, out / "onnx", overwrite=True)
        ours_by = engines(run, bf16)
        row = found[name] = {**describe(ours_by["float32"][0]),
                             "CTranslate2 int8 MB": size_mb(out / "ct2-int8" / "model.bin"),
                             "ONNX int8 MB": size_mb(*(onnx_dir / "onnx" / f"{g}_quantized.onnx"
                                                       for g in GRAPHS))}
        for precision, (engine, shortlist) in ours_by.items():
            ours(engine, 1, head[:8], shortlist)  # warm-up: kernels, thread pool, int8 packing
            row[f"BLEU ours {precision}"] = round(score(ours(engine, 5, sources, shortlist), refs).bleu, 2)
            for beam in (1, 5):
                timed[f"{name}|ours {precision} {'greedy' if beam == 1 else 'beam 5'}"] = functools.partial(
                    ours, engine, beam, head, shortlist)
        for label, engine in ct2_engines(ct2, out / "ct2-int8").items():
            row[f"BLEU {label}"] = round(score(engine.translate(sources, beam_size=5), refs).bleu, 2)
            for beam in (1, 5):
                timed[f"{name}|{label} {'greedy' if beam == 1 else 'beam 5'}"] = functools.partial(
                    engine.translate, head, beam_size=beam)
        ort8 = ExportedModel.load(onnx_dir, runtime="onnx", int8=True)
        few = sources[:args.onnx_sentences]
        ort8.translate(few[:4])
        started = time.perf_counter()
        ort8.translate(few)
        row["ONNX Runtime int8 greedy (one at a time)"] = len(few) / (time.perf_counter() - started)
        ort8.close()
        if not args.no_page:
            page_dir = export_web(run, out / "web", overwrite=True)
            row.update(page_timing(page_dir, sources[:args.page_sentences]))
    for key, (seconds, _) in best_of_rounds(timed, args.rounds).items():
        name, engine = key.split("|")
        found[name][engine] = len(head) / seconds
    return found


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def report(found: dict[str, dict[str, object]], teacher: str) -> None:
    """One table of everything, then each speed as a ratio to the teacher's in the same engine."""
    columns = list(dict.fromkeys(k for row in found.values() for k in row))
    print(markdown_table(["run", *columns], [[name, *(_cell(row.get(c, "")) for c in columns)]
                                             for name, row in found.items()]))
    speeds = [c for c in columns if c.startswith(("ours", "CTranslate2 int8 g", "CTranslate2 int8 b",
                                                  "CTranslate2 int8 s", "ONNX Runtime", "page int8"))]
    print(markdown_table(["run (× the teacher's speed)", *speeds],
                         [[name, *(f"{row[c] / found[teacher][c]:.2f}×" if c in row and c in found[teacher]
                                   else "" for c in speeds)] for name, row in found.items()]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="the teacher's run directory, then its students'")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--onnx-sentences", type=int, default=200)
    parser.add_argument("--page-sentences", type=int, default=100)
    parser.add_argument("--no-page", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sources, refs = load_split_tsv(args.runs[0] / SPLIT_DIR / "test.tsv")
    warning = load_warning()
    with tempfile.TemporaryDirectory() as tmp:
        found = measure(args.runs, sources, refs, args, Path(tmp))
    print(f"machine: {machine()}; {len(sources)} test pairs of {args.runs[0]} (BLEU), the first "
          f"{args.sentences} (speed, best of {args.rounds} rounds)"
          + (f"; warning: {warning}" if warning else ""))
    report(found, args.runs[0].name)
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "warning": warning, "runs": found}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
