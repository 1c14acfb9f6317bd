"""`export format=onnx` and `format=web` (interop/onnx.py, web.py): the graphs ONNX Runtime runs translate
as our greedy search does, token for token; their int8 copies translate; the page, in Chromium, translates
as ONNX Runtime does, in one batched call as one by one, and splits texts into sentences and keeps their
spans as DocumentTranslator does; with a glossary, it writes the tokens our greedy search with terms
writes; for the post-norm (Marian) and pre-norm (Pegasus) models alike. Each needs its extra (and npm and
Chromium for the page): skipped without, failed under CI."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import missing, require
from transformer_mt.config import DecodingConfig, DocumentConfig
from transformer_mt.decoding.constraints import term_variants
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.glossary import Glossary
from transformer_mt.decoding.translator import Translator
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.documents.spans import find_spans
from transformer_mt.errors import ExportError
from transformer_mt.interop.generate import ExportedModel

require("onnxruntime")
require("optimum.exporters.onnx")
CHROMIUM = Path(os.environ.get("TMT_CHROMIUM", "/usr/bin/chromium"))
GREEDY = DecodingConfig(beam_size=1)


# The pre-norm model (Pegasus, what the plan trains) runs in the page under Transformers.js's Marian runner.
# Its graphs are checked in the quick suite; the post-norm model's (the same export code, the Marian
# mapping that tests/test_hf_directory.py checks token for token in the quick suite) under `slow`.
@pytest.fixture(scope="module", params=["pegasus", pytest.param("marian", marks=pytest.mark.slow)])
def fitted(request: pytest.FixtureRequest, fitted_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fitted model (real words out) of each architecture."""
    return fitted_model(request.param, tmp_path_factory.mktemp(request.param))


# The page's own glossary: source terms no other test's sentence holds, so that those translate as without.
EXPORTED = [("blorpt", "le chat noir"), ("Zorblax machine", "machine à laver")]


# The page's code is one for both architectures, and the graphs it runs are checked for both above, without
# it: the page runs the pre-norm model (what the plan trains) in the quick suite, the post-norm one (like
# its graphs above) under `slow` (CI runs it).
@pytest.fixture(scope="module", params=["pegasus", pytest.param("marian", marks=pytest.mark.slow)])
def page_fitted(request: pytest.FixtureRequest, fitted_model,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fitted model of each architecture, for the page."""
    return fitted_model(request.param, tmp_path_factory.mktemp(f"page-{request.param}"))


@pytest.fixture(scope="module")
def web_dir(page_fitted: Path) -> Path:
    """format=web's folder of the fitted model, with a glossary; its models/model is format=onnx's
    directory."""
    if shutil.which("npm") is None:
        missing("no npm: format=web fetches Transformers.js with it (apt-get install npm)")
    from transformer_mt.interop.web import export_web

    terms = page_fitted / "terms.tsv"
    terms.write_text("".join(f"{s}\t{t}\n" for s, t in EXPORTED), encoding="utf-8")
    return export_web(page_fitted, page_fitted / "page", glossary=terms)


@pytest.fixture(scope="module")
def onnx_dir(fitted: Path) -> Path:
    """format=onnx's directory of the fitted model (no npm needed)."""
    from transformer_mt.interop.onnx import export_onnx

    return export_onnx(fitted, fitted / "onnx")


def ort_greedy(model_dir: Path, sentences: list[str], int8: bool = False) -> list[str]:
    """ONNX Runtime's greedy translations (optimum's ORTModelForSeq2SeqLM), with our length rule."""
    engine = ExportedModel.load(model_dir, runtime="onnx", int8=int8)
    try:
        return engine.translate(sentences)
    finally:
        engine.close()


def test_onnx_runtime_greedy_is_ours_token_for_token(onnx_dir: Path, fitted: Path,
                                                     fit_pairs: tuple[list[str], list[str]]) -> None:
    names = {p.name for p in (onnx_dir / "onnx").iterdir()}
    assert names == {"encoder_model.onnx", "decoder_model_merged.onnx", "encoder_model_quantized.onnx",
                     "decoder_model_merged_quantized.onnx"}
    sources = fit_pairs[0][-40:]
    ours = Translator.from_checkpoint(fitted, device="cpu", amp="off", decoding=GREEDY)
    expected = ours.translate(sources, input_case="model")  # the graphs translate text as typed
    assert sum(bool(t) for t in expected) >= 30  # real outputs, not empty ones that agree trivially
    assert ort_greedy(onnx_dir, sources) == expected
    int8 = ort_greedy(onnx_dir, sources, int8=True)
    assert sum(bool(t) for t in int8) >= 30
    import sacrebleu

    agreement = sacrebleu.corpus_chrf(int8, [expected]).score  # int8 rounds near ties otherwise
    print(f"int8 vs float32: chrF {agreement:.1f}, {sum(a == b for a, b in zip(int8, expected))} identical")
    # ONNX Runtime's int8 kernels round by the CPU's instruction set (AVX2 without VNNI more than
    # AVX-512), so the floor leaves room for AVX2 machines; a broken graph scores far below it.
    assert agreement >= 60, agreement


def test_an_existing_output_dir_is_refused_unless_overwrite(web_dir: Path, page_fitted: Path) -> None:
    from transformer_mt.interop.onnx import export_onnx
    from transformer_mt.interop.web import export_web

    for export in (export_onnx, export_web):
        before = sorted(p.name for p in web_dir.rglob("*"))
        with pytest.raises(ExportError, match="overwrite=true") as info:
            export(page_fitted, web_dir)
        assert "\n" not in str(info.value) and sorted(p.name for p in web_dir.rglob("*")) == before


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def chromium_page(static_server: str) -> Iterator[tuple[Any, list[str]]]:
    """The page open in headless Chromium, its model loaded, and the list of every URL it requests: opened
    once for each architecture's page tests, which use it in turn (a page and its model load for
    seconds)."""
    sync_api = require("playwright.sync_api")
    if not CHROMIUM.exists():
        missing(f"no {CHROMIUM}; to run this test: apt-get install chromium (Debian)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        try:
            page = browser.new_page()
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(static_server, timeout=60_000)
            page.wait_for_function("window.pageReady === true", timeout=120_000)
            yield page, requests
        finally:
            browser.close()


# Each sentence in one call of generate, then one by one, timed after a first call that loads the graphs.
TIMED = """async (sentences) => {
  await window.translateSentences(sentences.slice(0, 2));
  let started = performance.now();
  const batched = await window.translateSentences(sentences);
  const batchedMs = performance.now() - started;
  started = performance.now();
  const single = await window.translateSentences(sentences, false);
  return { batched, single, batchedMs, singleMs: performance.now() - started };
}"""


@pytest.mark.browser
def test_the_page_translates_in_chromium_as_onnx_runtime(web_dir: Path, static_server: str, chromium_page,
                                                         fit_pairs: tuple[list[str], list[str]]) -> None:
    """In one batched call as one by one, each sentence as ONNX Runtime translates it alone; every URL
    the page asked for (here and in the other page tests) is its own server's."""
    sources = fit_pairs[0][-20:]
    page, requests = chromium_page
    shown = page.evaluate(TIMED, sources)
    expected = ort_greedy(web_dir / "models" / "model", sources)
    assert sum(bool(t) for t in expected) >= 15
    assert shown["batched"] == expected and shown["single"] == expected
    print(f"{len(sources)} sentences: {shown['batchedMs']:.0f} ms in one call, "
          f"{shown['singleMs']:.0f} ms one by one")
    local = (static_server, f"blob:{static_server}")  # blob: the page's own worker script
    assert all(url.startswith(local) for url in requests), [u for u in requests if not u.startswith(local)]


def one_sentence(text: str) -> bool:
    """A sentence that every segmenter reads as one (a capital first, its only full stop at its end), with
    no span of its own."""
    return re.fullmatch(r"[A-Z][^.!?]*[.!?]", text) is not None and not find_spans(text)


@pytest.mark.browser
def test_the_page_splits_and_keeps_spans_as_the_document_translator(
        page_fitted: Path, chromium_page, fit_pairs: tuple[list[str], list[str]]) -> None:
    """Lines of several sentences with a number and an e-mail address, and an ALL CAPS one: the page
    gives DocumentTranslator's translation of each (the same model, greedy in both)."""
    plain = [s for s in fit_pairs[0][-150:] if one_sentence(s)][:8]
    assert len(plain) == 8
    lines = [f"{a} I have 45 cats. Write to anna7@mail.com!  {b}" for a, b in zip(plain[::2], plain[1::2])]
    lines += [f"{plain[0].upper()} CALL 0585738843 AT 10:30.", "", f"\n{plain[1]}\n\n{plain[2]} "]
    page, _ = chromium_page
    shown = page.evaluate("([texts, fold]) => window.translateTexts(texts, fold)", [lines, True])
    engine = Translator.from_checkpoint(page_fitted, device="cpu", amp="off", decoding=GREEDY)
    docs = DocumentTranslator(engine, DocumentConfig(), src_lang="en")
    expected = [n[0].text for n in docs.translate_nbest(lines, input_case="fold")]
    assert shown["sentences"] == docs.tally.sentences == 4 * 4 + 2 + 2
    assert shown["spans"] == docs.tally.spans == 4 * 2 + 2
    assert [shown["retried"], shown["placed"]] == [docs.tally.retried, docs.tally.placed]
    assert all(s in t for t in shown["translations"][:4] for s in ("45", "anna7@mail.com"))
    assert shown["translations"] == expected


@pytest.mark.browser
def test_the_pages_button_translates_what_is_typed_in_all_caps(
        page_fitted: Path, chromium_page, fit_pairs: tuple[list[str], list[str]]) -> None:
    """Through the page as a person uses it: ALL CAPS text of two sentences with a number typed into the
    box, the button clicked; the box below shows DocumentTranslator's translation (folded as
    `transformer-mt translate` folds it), and the status line counts the sentences and spans."""
    plain = [s for s in fit_pairs[0][-150:] if one_sentence(s)][:2]
    typed = f"{plain[0].upper()} I HAVE 45 CATS."
    page, _ = chromium_page
    page.fill("#source", typed)
    page.click("#translate")  # its handler says 'Translating…' at once, and 'translated in' when done
    page.wait_for_function("document.getElementById('status').textContent.includes('translated in')",
                           timeout=60_000)
    shown = page.eval_on_selector("#target", "e => e.value")
    status = page.text_content("#status") or ""
    engine = Translator.from_checkpoint(page_fitted, device="cpu", amp="off", decoding=GREEDY)
    docs = DocumentTranslator(engine, DocumentConfig(), src_lang="en")
    assert shown == docs.translate_nbest([typed], input_case="fold")[0][0].text
    assert shown == shown.upper() and "45" in shown  # written back in the case it was typed in
    assert status.startswith("2 sentences translated in") and "1 spans kept as written" in status


def glossary_cases(pairs: tuple[list[str], list[str]], engine: Translator) -> list[tuple[str, list[str]]]:
    """Sentences, each with one or two target terms from its own reference: a word of several subwords,
    and two words."""
    cases = []
    for source, reference in zip(*pairs, strict=True):
        words = [w for w in reference.rstrip(".!?").split() if w.isalpha()]
        split = [w for w in words if len(engine.vocab.encode_tgt([w])[0]) >= 2]
        if one_sentence(source) and split and len(words) >= 4:
            pair = " ".join(words[-2:]) if split[0] not in words[-2:] else " ".join(words[:2])
            cases.append((source, [split[0]] if len(cases) % 2 else [split[0], pair]))
    return cases[:8]


# The glossary's pieces in the page: token ids of target terms, greedy with terms (cached and not), the
# source terms of texts, and texts translated with the exported glossary and pasted lines; one at a time.
WITH_TERMS = """async ([targets, cases, texts, pasted]) => {
  const [cached, uncached] = [[], []];
  for (const [s, terms] of cases) {
    cached.push(await window.glossary.search(s, terms));
    uncached.push(await window.glossary.search(s, terms, false));
  }
  return { variants: targets.map((t) => window.glossary.variants(t)), cached, uncached,
           found: texts.map((t) => window.glossary.find(t, pasted)),
           translated: await window.translateTexts(texts, false, pasted) };
}"""


@pytest.mark.browser
def test_the_page_translates_with_a_glossary_as_greedy_search_with_terms(
        web_dir: Path, page_fitted: Path, chromium_page, fit_pairs: tuple[list[str], list[str]]) -> None:
    """Sentences with one and two terms (several subwords, several words): the page's search, with and
    without its key/value cache, writes the tokens PyTorch's greedy search with terms writes; the page
    finds the exported glossary's and the pasted lines' source terms where Glossary.find does, and
    translates texts holding them as that search does."""
    engine = Translator.from_checkpoint(page_fitted, device="cpu", amp="off", decoding=GREEDY)
    cases = glossary_cases((fit_pairs[0][-150:], fit_pairs[1][-150:]), engine)
    assert len(cases) == 8
    variants = {t: term_variants(engine.vocab, t) for _, terms in cases for t in terms}
    searches = [[s, [variants[t] for t in terms]] for s, terms in cases]
    pasted_pairs: list[tuple[str, str]] = []
    for source, terms in cases[:4]:  # each sentence's longest word, to the sentence's first term
        word = max((w for w in source.rstrip(".!?").split() if w.isalpha()
                    and w.lower() not in {s.lower() for s, _ in pasted_pairs}), key=len)
        pasted_pairs.append((word, terms[0]))
    pasted = "".join(f"{s}\t{t}\n" for s, t in pasted_pairs)
    sentences = [cases[4][0], "I saw blorpt and the Zorblax machine.", *(s for s, _ in cases[:4])]
    texts = [f"{sentences[0]} {sentences[1]}", *sentences[2:]]
    page, _ = chromium_page
    shown = page.evaluate(WITH_TERMS, [list(variants), searches, texts, pasted])
    page.fill("#source", texts[2])  # through the page's boxes: a line it cannot use, then good ones
    page.fill("#terms", f"{pasted}no tab here\n")
    page.click("#translate")  # its handler says 'Translating…' at once, then what it did
    page.wait_for_function("document.getElementById('status').textContent.includes('glossary')")
    refused = page.text_content("#status")
    page.fill("#terms", pasted)
    page.click("#translate")
    page.wait_for_function("document.getElementById('status').textContent.includes('translated in')",
                           timeout=60_000)
    boxed, status = page.eval_on_selector("#target", "e => e.value"), page.text_content("#status") or ""
    assert refused == ("the pasted glossary: line 5 has no tab; write `source term<TAB>target term`, one "
                       "pair a line")
    assert boxed == shown["translated"]["translations"][2] and "glossary terms, " in status
    assert shown["variants"] == list(variants.values())
    expected = [decode_ids(engine.model, engine.encode([s]), GREEDY, engine.device, terms=[terms],
                           edges=engine.edges())[0] for s, terms in searches]
    tokens = [h[0].tokens if h else None for h in expected]
    assert [h and h["tokens"] for h in shown["cached"]] == tokens
    assert [h and h["tokens"] for h in shown["uncached"]] == tokens
    assert sum(t is not None for t in tokens) >= 6
    assert [h["score"] for h in shown["cached"] if h] == pytest.approx([h[0].score for h in expected if h],
                                                                       abs=1e-3)
    plain = decode_ids(engine.model, engine.encode([s for s, _ in cases]), GREEDY, engine.device)
    changed = sum(t is not None and t != p[0].tokens for t, p in zip(tokens, plain))
    assert changed >= 4  # the terms changed them
    glossary = Glossary.read(page_fitted / "terms.tsv").merged(Glossary.of(pasted_pairs))
    for text, found in zip(texts, shown["found"], strict=True):
        assert found == [{"start": m.start, "end": m.end, "source": m.entry.source, "target": m.entry.target}
                         for m in glossary.find(text)], text
    docs = DocumentTranslator(engine, DocumentConfig(), src_lang="en")
    translated = docs.translate_nbest(texts, glossary=glossary, input_case="model")
    assert shown["translated"]["translations"] == [n[0].text for n in translated]
    fields = ("sentences", "spans", "terms", "terms_met", "terms_refused")
    assert [shown["translated"][k] for k in fields] == [getattr(docs.tally, k) for k in fields]
    assert docs.tally.terms >= 6 and docs.tally.terms_met >= 4


@pytest.mark.browser
def test_the_page_rates_each_sentence_as_the_translator_does(
        page_fitted: Path, chromium_page, fit_pairs: tuple[list[str], list[str]]) -> None:
    """The page's confidences, from the probabilities its greedy search computed as it went, against the
    Translator's from its forced pass (no calibration: the model's own probabilities, words and all)."""
    sources = fit_pairs[0][-12:]
    page, _ = chromium_page
    shown = page.evaluate("(s) => window.rateSentences(s)", sources)
    engine = Translator.from_checkpoint(page_fitted, device="cpu", amp="off", decoding=GREEDY)
    expected = [n[0] for n in engine.translate_nbest(sources, input_case="model")]
    assert engine.rater.calibration is None
    for got, t in zip(shown, expected, strict=True):
        assert got["text"] == t.text
        assert got["confidence"] == pytest.approx(t.confidence, abs=1e-3)
        assert [w for w, _ in got["words"]] == [w for w, _ in t.word_confidences]
        assert [c for _, c in got["words"]] == pytest.approx([c for _, c in t.word_confidences], abs=1e-3)
