"""`export format=onnx` and `format=web` (interop/onnx.py, web.py): the graphs ONNX Runtime runs translate
as our greedy search does, token for token; their int8 copies translate; the page, in Chromium, translates
as ONNX Runtime does. Each needs its extra (and npm and Chromium for the page): skipped without."""

from __future__ import annotations

import functools
import http.server
import json
import math
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import held_out_pairs, missing
from transformer_mt.config import DecodingConfig
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ExportError

pytest.importorskip("onnxruntime")
pytest.importorskip("optimum.exporters.onnx")
CHROMIUM = Path(os.environ.get("TMT_CHROMIUM", "/usr/bin/chromium"))
GREEDY = DecodingConfig(beam_size=1)


@pytest.fixture(scope="module")
def onnx_dir(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformer_mt.interop.onnx import export_onnx

    return export_onnx(tiny_run, tmp_path_factory.mktemp("onnx") / "model")


def ort_greedy(model_dir: Path, sentences: list[str], quantized: bool = False) -> list[str]:
    """ONNX Runtime's greedy translations through optimum's ORTModelForSeq2SeqLM, one sentence at a time
    with our length limit (transformer_mt.json). The int8 graphs are read under the float32 names from a
    folder of links (optimum finds the merged decoder by its standard name only)."""
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from transformers import AutoTokenizer

    folder = model_dir
    if quantized:
        folder = model_dir.parent / f"{model_dir.name}-int8"
        if not folder.exists():
            shutil.copytree(model_dir, folder, ignore=shutil.ignore_patterns("*.onnx"))
            for name in ("encoder_model", "decoder_model_merged"):
                os.link(model_dir / "onnx" / f"{name}_quantized.onnx", folder / "onnx" / f"{name}.onnx")
    model = ORTModelForSeq2SeqLM.from_pretrained(str(folder), subfolder="onnx")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    rule = json.loads((model_dir / "transformer_mt.json").read_text())["decoding"]
    positions = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    out = []
    for sentence in sentences:
        inputs = tokenizer(sentence, return_tensors="pt")
        n = inputs["input_ids"].shape[1]
        limit = max(0, min(math.floor(rule["max_len_a"] * n + rule["max_len_b"]), positions - 1))
        ids = model.generate(**inputs, max_new_tokens=limit + 1, num_beams=1, do_sample=False)
        out.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    return out


def test_onnx_runtime_greedy_is_ours_token_for_token(onnx_dir: Path, tiny_run: Path) -> None:
    names = {p.name for p in (onnx_dir / "onnx").iterdir()}
    assert names == {"encoder_model.onnx", "decoder_model_merged.onnx", "encoder_model_quantized.onnx",
                     "decoder_model_merged_quantized.onnx"}
    sources = held_out_pairs(tiny_run, 40)[0]
    ours = Translator.from_checkpoint(tiny_run, device="cpu", amp="off", decoding=GREEDY)
    expected = ours.translate(sources, all_caps="model")  # the graphs translate text as typed
    assert ort_greedy(onnx_dir, sources) == expected
    int8 = ort_greedy(onnx_dir, sources, quantized=True)
    assert len(int8) == len(sources) and sum(a == b for a, b in zip(int8, expected)) >= len(sources) // 2


def test_an_existing_output_dir_is_refused_unless_overwrite(onnx_dir: Path, tiny_run: Path) -> None:
    from transformer_mt.interop.onnx import export_onnx

    before = sorted(p.name for p in onnx_dir.rglob("*"))
    with pytest.raises(ExportError, match="overwrite=true") as info:
        export_onnx(tiny_run, onnx_dir)
    assert "\n" not in str(info.value) and sorted(p.name for p in onnx_dir.rglob("*")) == before


@pytest.fixture(scope="module")
def web_dir(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("npm") is None:
        missing("no npm: format=web fetches Transformers.js with it (apt-get install npm)")
    from transformer_mt.interop.web import export_web

    return export_web(tiny_run, tmp_path_factory.mktemp("web") / "page")


@pytest.fixture
def static_server(web_dir: Path) -> Iterator[str]:
    """The folder on a static file server, as a user would serve it (`python -m http.server`)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(web_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.browser
def test_the_page_translates_in_chromium_as_onnx_runtime(web_dir: Path, static_server: str,
                                                         tiny_run: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        missing(f"no {CHROMIUM}; to run this test: apt-get install chromium (Debian)")
    sources = held_out_pairs(tiny_run, 20)[0]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            page = browser.new_page()
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(static_server, timeout=60_000)
            page.wait_for_function("window.pageReady === true", timeout=120_000)
            shown = page.evaluate("(lines) => window.translateLines(lines)", sources)
        finally:
            browser.close()
    assert shown == ort_greedy(web_dir / "models" / "model", sources)
    assert all(url.startswith(static_server) for url in requests), [u for u in requests
                                                                     if not u.startswith(static_server)]
