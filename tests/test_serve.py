"""`transformer-mt serve`: the JSON API against the Translator it wraps, cross-request batching, limits and
every bad input, and the real command on a real port."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import ROOT, missing, require, run_cli, wait_until
from transformer_mt.config import BatchingConfig, DecodingConfig
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.decoding.translator import Translator

require("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from transformer_mt.serve.app import create_app  # noqa: E402
from transformer_mt.serve.batcher import Batcher, Search  # noqa: E402

SENTENCES = ["He is sleeping.", "I am cold.", "Where is the station?", "", "Tom likes to read books."]


def serve_config(run: Path, *overrides: str):
    return tmt.compose("serve", [f"checkpoint={run}", "device=cpu", "device.num_threads=1",
                                 "allowed_hosts=[testserver]", *overrides])  # TestClient's Host


@pytest.fixture(scope="module")
def engine(tiny_run: Path) -> Translator:
    # float32: a barely trained model has near ties that bf16 rounding could break either way
    return Translator.from_checkpoint(tiny_run, device="cpu", decoding=serve_config(tiny_run).decoding,
                                      amp="off")


@pytest.fixture(scope="module")
def client(tiny_run: Path, engine: Translator) -> Iterator[TestClient]:
    with TestClient(create_app(engine, serve_config(tiny_run, "limits.max_texts=8", "limits.max_chars=200",
                                                    "limits.max_beam_size=6"))) as c:
        yield c


# -- answers -------------------------------------------------------------------------------------------
def test_translations_equal_the_translator_in_request_order(client: TestClient, engine: Translator) -> None:
    r = client.post("/translate", json={"text": SENTENCES})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == engine.translate(SENTENCES)
    assert set(r.json()) == {"translations", "confidence", "words"}  # confidence: decoding.confidence
    one = client.post("/translate", json={"text": SENTENCES[2], "beam_size": 1}).json()
    assert one["translations"] == [engine.translate(SENTENCES[2], beam_size=1)]


def test_nbest_scores_and_attention(client: TestClient, engine: Translator) -> None:
    body = client.post("/translate", json={"text": SENTENCES[:2], "beam_size": 4, "n_best": 3,
                                           "attention": "heads"}).json()
    expected = engine.translate_nbest(SENTENCES[:2], beam_size=4, n_best=3, return_attention=True)
    assert [[h["text"] for h in nbest] for nbest in body["nbest"]] == [[h.text for h in e] for e in expected]
    for nbest, exp in zip(body["nbest"], expected):
        assert [h["score"] for h in nbest] == pytest.approx([h.score for h in exp], abs=1e-5)
    layers, heads = engine.model.config.decoder_layers, engine.model.config.n_heads
    for text, amap in zip(SENTENCES[:2], body["attention"]):
        weights = torch.tensor(amap["weights"])
        assert weights.shape == (layers, heads, len(amap["target_tokens"]), len(amap["source_tokens"]))
        assert amap["source_tokens"] == engine.vocab.src_tokens(text, add_eos=True)
        assert amap["target_tokens"][-1] == "<eos>"
        assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-3)
    assert "nbest" not in client.post("/translate", json={"text": ["I am cold."]}).json()
    scored = client.post("/translate", json={"text": ["I am cold."], "scores": True}).json()
    assert len(scored["nbest"][0]) == 1 and isinstance(scored["nbest"][0][0]["score"], float)


def test_attention_head_average_is_the_searched_alignment(client: TestClient, engine: Translator) -> None:
    """The page's default view (last layer, heads averaged) is the attention_png/TensorBoard view."""
    from transformer_mt.decoding.search import alignment

    body = client.post("/translate", json={"text": ["I am cold."], "beam_size": 1,
                                           "attention": "heads"}).json()
    best = engine.translate_nbest(["I am cold."], return_attention=True, beam_size=1)[0][0]
    assert best.attention is not None
    view = torch.tensor(body["attention"][0]["weights"])[-1].mean(0)
    assert torch.allclose(view, alignment(best.attention), atol=1e-3)


def test_prefixes_equal_the_translator(client: TestClient, engine: Translator) -> None:
    prefixes = ["Il", "", "Où", "", "Tom"]
    r = client.post("/translate", json={"text": SENTENCES, "prefix": prefixes, "beam_size": 3})
    assert r.status_code == 200, r.text
    expected = engine.translate(SENTENCES, beam_size=3, prefixes=prefixes)
    assert r.json()["translations"] == expected
    assert expected[0].startswith("Il") and expected[2].startswith("Où") and expected[4].startswith("Tom")
    one = client.post("/translate", json={"text": SENTENCES[1], "prefix": "Je"}).json()
    assert one["translations"] == [engine.translate(SENTENCES[1], prefixes="Je")]


def test_an_ensemble_is_served(tiny_run: Path) -> None:
    members = f"{tiny_run / 'epoch_001.pt'},{tiny_run / 'epoch_002.pt'}"
    cfg = serve_config(Path(members))
    pair = Translator.from_checkpoint(members, device="cpu", decoding=cfg.decoding, amp="off")
    with TestClient(create_app(pair, cfg)) as c:
        assert c.get("/health").json()["model"] == [tiny_run.resolve().name] * 2  # runs' names, no paths
        body = c.post("/translate", json={"text": SENTENCES[:3], "prefix": ["Il", "Je", ""]}).json()
        assert body["translations"] == pair.translate(SENTENCES[:3], prefixes=["Il", "Je", ""])


def test_health_metrics_page_and_schema(client: TestClient, engine: Translator, tiny_run: Path) -> None:
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["engine"] == "pytorch"
    assert health["model"] == tiny_run.resolve().name and str(tiny_run) not in json.dumps(health)  # no path
    assert health["vocabulary"]["target_size"] == engine.vocab.tgt_vocab_size
    assert health["languages"] == {"source": "en", "target": "fr"}
    client.post("/translate", json={"text": ["I am cold.", "He is sleeping."]})
    metrics = client.get("/metrics").json()
    assert metrics["requests"]["200"] >= 1 and metrics["sentences"] >= 2 and metrics["batches"] >= 1
    assert set(metrics["latency_ms"]) == {"p50", "p95", "p99"}
    page = client.get("/")
    assert page.status_code == 200 and "<canvas" in page.text and "https://" not in page.text  # no CDN
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "text" in body["properties"] and "text" in body["required"]


def test_a_ctranslate2_export_is_served_the_same_way(tiny_run: Path, tmp_path: Path) -> None:
    require("ctranslate2")
    from transformer_mt.decoding.engine import load_engine
    from transformer_mt.interop.ct2_export import export_ctranslate2

    model_dir = export_ctranslate2(tiny_run, tmp_path / "ct2", quantization="float32")
    cfg = serve_config(tiny_run, "engine=ctranslate2", f"model_dir={model_dir}")
    engine = load_engine(cfg)
    with TestClient(create_app(engine, cfg)) as c:
        body = c.post("/translate", json={"text": SENTENCES[:3], "attention": "heads"}).json()
        assert body["translations"] == engine.translate(SENTENCES[:3])
        assert len(body["attention"][0]["weights"]) == 1  # CTranslate2 gives the last layer's average
        assert c.get("/health").json()["engine"] == "ctranslate2"
        r = c.post("/translate", json={"text": SENTENCES[:2], "prefix": ["Il", ""]})
        assert r.status_code == 422 and "engine=pytorch" in r.json()["error"]
        assert c.post("/translate", json={"text": SENTENCES[:2]}).json()["translations"] == \
            engine.translate(SENTENCES[:2])  # the worker goes on


# -- bad input ---------------------------------------------------------------------------------------
BAD = [
    (b"not json", 400, "not JSON"),
    ('{"text": ["caf\u00e9"]}'.encode("latin-1"), 400, "not UTF-8"),
    (b'["a list"]', 422, "JSON object"),
    (b"{}", 422, "text"),
    (b'{"text": 5}', 422, "text"),
    (b'{"text": ["ok", 7]}', 422, "text"),
    (b'{"text": []}', 422, "empty"),
    (json.dumps({"text": ["a"] * 9}).encode(), 413, "limits.max_texts"),
    (json.dumps({"text": ["a" * 201]}).encode(), 413, "limits.max_chars"),
    (b'{"text": ["a"], "beam_size": 7}', 422, "limit of 6"),
    (b'{"text": ["a"], "beam_size": 0}', 422, "beam_size"),
    (b'{"text": ["a"], "beam_size": "5"}', 422, "beam_size"),
    (b'{"text": ["a"], "beam_size": true}', 422, "beam_size"),
    (b'{"text": ["a"], "beam_size": 2, "n_best": 3}', 422, "n_best"),
    (b'{"text": ["a"], "colour": "red"}', 422, "colour"),
    (b'{"text": ["a", "b"], "prefix": ["x"]}', 422, "prefix has 1 items for 2 texts"),
    (b'{"text": ["a"], "prefix": [5]}', 422, "prefix"),
    (json.dumps({"text": ["a"], "prefix": ["a" * 201]}).encode(), 413, "prefix[0]"),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD, ids=[b[2] for b in BAD])
def test_bad_requests_get_one_line_errors_and_the_server_goes_on(client: TestClient, body: bytes, status: int,
                                                                 says: str) -> None:
    r = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert says in error and "\n" not in error and "Traceback" not in error
    assert client.post("/translate", json={"text": ["I am cold."]}).status_code == 200


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"text": [0] * 9000}, 413, "9000 texts in one request; the limit is 8"),
    ({"text": ["a"], "prefix": [0] * 9000}, 413, "9000 prefixes in one request"),
    ({"text": "a", **{f"k{i}": 0 for i in range(1500)}}, 422, "k0 (and 1499 more): not a field"),
    ({"text": [0] * 8, "beam_size": "x"}, 422, "; and 7 more"),
], ids=["texts", "prefixes", "keys", "errors"])
def test_a_body_of_many_errors_is_refused_in_a_short_line(client: TestClient, body: dict[str, object],
                                                          status: int, says: str) -> None:
    """Within the body limit, a body of thousands of bad items or keys would be as many errors, built on the
    event loop into a line of megabytes: it is refused before validation, or its errors cut to a few."""
    r = client.post("/translate", content=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == status and says in r.json()["error"], r.text[:300]  # not the body limit's 413
    assert len(r.content) < 600


def test_unknown_routes_and_methods_answer_json(client: TestClient) -> None:
    for r, status in ((client.get("/nothing"), 404), (client.get("/translate"), 405)):
        assert r.status_code == status and set(r.json()) == {"error"}


def test_curl_style_form_body_is_read_as_json(client: TestClient, engine: Translator) -> None:
    """`curl -d '{...}'` sends application/x-www-form-urlencoded; the body is JSON all the same."""
    r = client.post("/translate", content=b'{"text": ["He is sleeping."]}',
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.json()["translations"] == [engine.translate("He is sleeping.")]


# -- the batcher, with an engine that records its batches ----------------------------------------------
class WordPieces:
    """A vocabulary whose tokens are words: what the documents layer's length rule asks of a vocabulary."""

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return [[0] * len(t.split()) for t in texts]


class RecordingEngine(TextTranslator):
    """Translates by upper-casing; can hold the worker on its first batch; records every batch begun
    (`started`, before the hold) and done (`batches`)."""

    def __init__(self, hold: threading.Event | None = None, fail_on: str | None = None) -> None:
        self.decoding = DecodingConfig()
        self.vocab = WordPieces()  # type: ignore[assignment]
        self.limit_inputs(512, None)
        self.started: list[list[str]] = []
        self.batches: list[tuple[list[str], int | None]] = []
        self.prefixes: list[object] = []  # each batch's prefixes= argument
        self.hold, self.fail_on = hold, fail_on
        self.info = {}

    def unfit_inputs(self, texts: object, prefixes: object = None, tgt_lang: object = None) -> list:
        return []  # upper-casing takes any text

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        **options: object) -> list[list[Translation]]:
        self.started.append(list(sentences))
        if self.hold is not None:
            self.hold.wait(10)
        self.batches.append((list(sentences), options.get("beam_size")))  # type: ignore[arg-type]
        self.prefixes.append(options.get("prefixes"))
        if self.fail_on in sentences:
            raise RuntimeError("a bad batch")
        starts = options.get("prefixes") or [""] * len(sentences)
        return [[Translation(p + s.upper(), -1.0)] for s, p in zip(sentences, starts)]  # type: ignore[arg-type]


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait for `condition` while the event loop runs (the requests' tasks, the batcher's answers)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not so after {timeout} s"
        await asyncio.sleep(0.001)


def _holding(engine: RecordingEngine, batcher: Batcher, sentences: int) -> Callable[[], bool]:
    """True once the worker holds a batch and the rest of `sentences` wait in the queue."""
    return lambda: bool(engine.started) and sum(map(len, engine.started)) + batcher.waiting == sentences


async def _gather(batcher: Batcher, requests: list[tuple], release: threading.Event | None) -> list:
    """Each request: (texts, search) or (texts, search, prefixes)."""
    tasks = [asyncio.ensure_future(batcher.translate(*request)) for request in requests]
    if release is not None:
        engine = batcher.engine
        assert isinstance(engine, RecordingEngine)
        await _until(_holding(engine, batcher, sum(len(r[0]) for r in requests)),
                     "all queued while the worker is held")
        release.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def _run(engine: RecordingEngine, cfg: BatchingConfig, requests: list[tuple],
         release: threading.Event | None = None) -> list:
    batcher = Batcher(engine, cfg)
    batcher.start()
    try:
        return asyncio.run(_gather(batcher, requests, release))
    finally:
        batcher.stop()


def test_concurrent_requests_are_decoded_together_and_answered_in_their_own_order() -> None:
    hold = threading.Event()
    engine = RecordingEngine(hold)
    requests = [([f"r{i} a", f"r{i} b"], Search()) for i in range(6)]
    answers = _run(engine, BatchingConfig(window_ms=20, max_sentences=64), requests, hold)
    for (texts, _), nbests in zip(requests, answers):
        assert [n[0].text for n in nbests] == [t.upper() for t in texts]
    assert len(engine.batches) <= 2  # the first request alone (holding the worker), then all the rest
    assert sum(len(b[0]) for b in engine.batches) == 12


def test_batches_respect_max_sentences_and_never_mix_searches() -> None:
    hold = threading.Event()
    engine = RecordingEngine(hold)
    requests = [([f"g{i}"], Search()) for i in range(5)]
    requests += [([f"b{i}"], Search(beam_size=3)) for i in range(3)]
    answers = _run(engine, BatchingConfig(window_ms=1, max_sentences=2), requests, hold)
    assert all(not isinstance(a, BaseException) for a in answers)
    for texts, beam in engine.batches:
        assert len(texts) <= 2
        assert {t[0] for t in texts} == ({"b"} if beam == 3 else {"g"})


def test_prefixed_requests_batch_with_each_other_and_keep_their_prefixes() -> None:
    hold = threading.Event()
    engine = RecordingEngine(hold)
    requests = [([f"p{i} a", f"p{i} b"], Search(), [f"{i}:", ""]) for i in range(3)]
    requests += [([f"n{i}"], Search()) for i in range(3)]
    answers = _run(engine, BatchingConfig(window_ms=20, max_sentences=64), requests, hold)
    for (texts, _, *given), nbests in zip(requests, answers):
        starts = given[0] if given else [""] * len(texts)
        assert [n[0].text for n in nbests] == [p + t.upper() for t, p in zip(texts, starts)]
    for (texts, _), prefixes in zip(engine.batches, engine.prefixes):
        assert (prefixes is None) == all(t.startswith("n") for t in texts)  # never mixed
        assert prefixes is None or len(prefixes) == len(texts)


def test_batching_off_decodes_each_request_alone() -> None:
    hold = threading.Event()
    engine = RecordingEngine(hold)
    _run(engine, BatchingConfig(enabled=False), [([f"r{i}", "x"], Search()) for i in range(4)], hold)
    assert [len(b[0]) for b in engine.batches] == [2, 2, 2, 2]


def test_a_failing_batch_fails_its_requests_only_and_the_worker_goes_on() -> None:
    engine = RecordingEngine(fail_on="boom")
    batcher = Batcher(engine, BatchingConfig(enabled=False))
    batcher.start()

    async def scenario():
        bad = await asyncio.gather(batcher.translate(["boom"], Search()), return_exceptions=True)
        good = await batcher.translate(["fine"], Search())
        return bad, good

    try:
        bad, good = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert isinstance(bad[0], RuntimeError) and good[0][0].text == "FINE"


def test_a_client_that_goes_away_does_not_break_the_worker() -> None:
    hold = threading.Event()
    engine = RecordingEngine(hold)
    batcher = Batcher(engine, BatchingConfig(window_ms=1))
    batcher.start()

    async def scenario():
        first = asyncio.ensure_future(batcher.translate(["first"], Search()))  # being decoded, held
        gone = asyncio.ensure_future(batcher.translate(["gone"], Search(beam_size=2)))  # still queued
        await _until(_holding(engine, batcher, 2), "'first' held by the worker, 'gone' queued")
        first.cancel()
        gone.cancel()
        hold.set()
        return await batcher.translate(["after"], Search())

    try:
        after = asyncio.run(scenario())
    finally:
        batcher.stop()
    assert after[0][0].text == "AFTER"
    assert all("gone" not in texts for texts, _ in engine.batches)


def test_full_queue_answers_503_with_retry_after_and_slow_requests_time_out(tiny_run: Path) -> None:
    hold = threading.Event()
    engine = RecordingEngine(hold)
    cfg = serve_config(tiny_run, "batching.max_queue=2", "limits.max_texts=2", "limits.timeout_s=0.5")
    with TestClient(create_app(engine, cfg)) as c:
        results: list = []
        workers = [threading.Thread(target=lambda: results.append(c.post("/translate", json={"text": ["a"]})))
                   for _ in range(3)]
        for n, w in enumerate(workers, 1):  # the first held by the worker, the next two queued
            w.start()
            wait_until(_holding(engine, c.app.state.batcher, n), f"request {n} taken or queued")
        full = c.post("/translate", json={"text": ["b", "c"]})
        assert full.status_code == 503 and int(full.headers["Retry-After"]) >= 1
        assert "busy" in full.json()["error"]
        for w in workers:
            w.join()
        assert {r.status_code for r in results} == {503}  # waited past limits.timeout_s
        assert "limits.timeout_s" in results[0].json()["error"]
        hold.set()
        assert c.post("/translate", json={"text": ["d"]}).json() == {"translations": ["D"]}


class CountingEngine(RecordingEngine):
    """A RecordingEngine that counts the requests it was asked to check (tokenised)."""

    checked = 0

    def unfit_inputs(self, texts: object, prefixes: object = None, tgt_lang: object = None) -> list:
        self.checked += 1
        return []


def test_the_queue_weighs_a_request_by_its_cost_and_refuses_before_tokenising(tiny_run: Path) -> None:
    """A one-character text with a long prefix and the widest beam is not one sentence: it costs a sentence
    per SENTENCE_CHARS characters begun, times its beam over the server's; a full queue refuses it before
    it is tokenised."""
    hold = threading.Event()
    engine = CountingEngine(hold)
    cfg = serve_config(tiny_run, "batching.max_queue=8", "limits.max_texts=2", "limits.max_beam_size=16")
    with TestClient(create_app(engine, cfg)) as c:
        batcher = c.app.state.batcher
        beam = engine.decoding.beam_size
        assert batcher.cost(["I am cold."], None, Search()) == 1
        assert batcher.cost(["a"], ["x" * 999], Search(beam_size=16)) == math.ceil(16 / beam * 10) > 8
        assert batcher.cost(["a" * 250, "b"], None, Search(beam_size=1)) == 2  # a cheaper search: never < 1
        threads = [threading.Thread(target=lambda t=t: c.post("/translate", json={"text": [t]}))
                   for t in "ab"]
        for n, thread in enumerate(threads, 1):  # one held by the worker, one waiting
            thread.start()
            wait_until(_holding(engine, batcher, n), f"request {n} taken or queued")
        checked = engine.checked
        heavy = c.post("/translate", json={"text": ["c"], "beam_size": 16, "prefix": "x" * 999})
        assert heavy.status_code == 503 and engine.checked == checked  # refused untokenised
        hold.set()
        for thread in threads:
            thread.join()
        alone = c.post("/translate", json={"text": ["c"], "beam_size": 16, "prefix": "x" * 999})
        assert alone.status_code == 200  # an empty queue takes any request within the limits


# -- the real command ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_run: Path) -> Iterator[str]:
    """`transformer-mt serve` on a free port, as a user starts it; its URL."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "transformer_mt", "serve", f"checkpoint={tiny_run}", "port=0",
               "device=cpu"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        yield found.group(0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    # Ctrl-C is a graceful stop, not a crash
    assert proc.returncode == 0 and "server stopped" in out and "Traceback" not in err, err


def test_serve_command_answers_like_translate(server: str, tiny_run: Path, run_cli_here) -> None:
    # A body with no Content-Type header, as `curl -d` sends it.
    request = urllib.request.Request(server + "translate", data=b'{"text": ["He is sleeping."]}')
    with urllib.request.urlopen(request, timeout=30) as r:
        served = json.load(r)["translations"]
    cli = run_cli_here("translate", f"checkpoint={tiny_run}", "device=cpu", "decoding.beam_size=4",
                       "text=He is sleeping.")
    assert cli.returncode == 0, cli.stderr
    assert served == [cli.stdout.rstrip("\n")]
    with urllib.request.urlopen(server + "health", timeout=10) as r:
        assert json.load(r)["status"] == "ok"


@pytest.mark.parametrize(("override", "says"), [
    ("port=70000", "port=70000"),
    ("batching.window_ms=-1", "batching.window_ms"),
    ("decoding.beam_size=20", "limits.max_beam_size"),
])
def test_serve_config_errors_are_one_line(tiny_run: Path, override: str, says: str) -> None:
    result = run_cli("serve", f"checkpoint={tiny_run}", override)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr


def test_serve_needs_a_checkpoint() -> None:
    result = run_cli("serve")
    assert result.returncode != 0 and "checkpoint=" in result.stderr and "Traceback" not in result.stderr


# -- the page, in a real browser --------------------------------------------------------------------------
CHROMIUM = Path(os.environ.get("TMT_CHROMIUM", "/usr/bin/chromium"))  # as scripts/test.sh looks for it
SCREENSHOT_DIR = os.environ.get("TMT_SCREENSHOT_DIR")  # also keep the screenshot there (README, CI)


@pytest.mark.browser
def test_page_translates_and_draws_the_heatmap_in_chromium(server: str, tmp_path: Path) -> None:
    sync_api = require("playwright.sync_api")
    if not CHROMIUM.exists():
        missing(f"no {CHROMIUM}; to run this test: apt-get install chromium (Debian)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 900, "height": 700})
            page.goto(server, timeout=30_000)
            page.wait_for_function("document.getElementById('model').textContent.includes('pytorch')")
            page.fill("#source", "He is sleeping.")
            page.press("#source", "Enter")
            page.wait_for_selector("#heatmap[data-drawn]", timeout=30_000)
            shown = page.inner_text("#translation")
            drawn = page.get_attribute("#heatmap", "data-drawn")
            # Coloured cells, not a blank canvas: count pixels far from white.
            coloured = page.evaluate("""() => {
                const c = document.getElementById('heatmap'), d = c.getContext('2d')
                    .getImageData(0, 0, c.width, c.height).data;
                let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] + d[i+1] + d[i+2] < 600) n++;
                return n; }""")
            page.select_option("#layer", "0")  # the selectors redraw one layer's view
            page.select_option("#head", "1")
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            if SCREENSHOT_DIR:
                Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(SCREENSHOT_DIR) / "serve-page.png"), full_page=True)
        finally:
            browser.close()
    request = urllib.request.Request(server + "translate", data=b'{"text": ["He is sleeping."]}')
    with urllib.request.urlopen(request, timeout=30) as r:
        assert shown == json.load(r)["translations"][0]
    rows, cols = map(int, drawn.split("x"))
    assert cols >= 2 and rows >= 1
    assert coloured > rows * cols * 100  # each cell is ~33x33 pixels
    assert (tmp_path / "page.png").stat().st_size > 10_000
