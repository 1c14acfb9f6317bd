"""The server isolates its clients: a request that breaks decoding fails alone, the worker outlives any
exception (native panics included) and /health says when it cannot decode, work nobody waits for stops
within a decoding step, and attention in a response is bounded and built off the event loop. Also: beam
search keeps its attention history in memory linear in the output length."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.conftest import require, wait_until
from tests.test_search import BOS, EOS, random_model, source_batch
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.search import max_output_length
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import DataError

require("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from tests.test_serve import RecordingEngine, serve_config  # noqa: E402
from transformer_mt.serve import app as app_module  # noqa: E402
from transformer_mt.serve.app import create_app  # noqa: E402

LONG = ("Tom and Mary went to the station early this morning because they wanted to catch the first train "
        "to the city where their old friends live.")


class FaultyEngine(RecordingEngine):
    """A RecordingEngine whose batches raise `error` whenever they hold the text `offender`."""

    def __init__(self, hold: threading.Event | None, offender: str, error: BaseException) -> None:
        super().__init__(hold)
        self.offender, self.error = offender, error

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        **options: object) -> list[Any]:
        results = super().translate_nbest(sentences, return_attention, **options)
        if self.offender in sentences:
            raise self.error
        return results


class PanicException(BaseException):
    """What tokenizers (pyo3) raises on a Rust panic: a BaseException, not an Exception."""


def _post_all(client: TestClient, texts: list[str], results: dict[str, Any]) -> list[threading.Thread]:
    """Post each text as its own request, from its own thread; the responses land in results."""
    def post(text: str) -> None:
        results[text] = client.post("/translate", json={"text": [text]})
    threads = [threading.Thread(target=post, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    return threads


# -- 1. a failing batch fails its offender only ----------------------------------------------------------
@pytest.mark.parametrize(("error", "status"), [(DataError("text[0] cannot be tokenized"), 422),
                                               (RuntimeError("a fault of the server's"), 500)])
def test_a_failing_batch_is_decoded_again_request_by_request(tiny_run: Path, error: Exception,
                                                             status: int) -> None:
    hold = threading.Event()
    engine = FaultyEngine(hold, "bad", error)
    app = create_app(engine, serve_config(tiny_run, "batching.window_ms=50"))
    with TestClient(app, raise_server_exceptions=False) as c:
        results: dict[str, Any] = {}
        threads = _post_all(c, ["first"], results)  # holds the worker while the next two queue
        wait_until(lambda: bool(engine.started), "the first request taken")
        threads += _post_all(c, ["good", "bad"], results)
        wait_until(lambda: c.app.state.batcher.waiting == 2, "both queued")
        hold.set()
        for thread in threads:
            thread.join()
    assert sorted(map(sorted, engine.started)) == [["bad"], ["bad", "good"], ["first"], ["good"]]
    assert results["good"].status_code == 200 and results["good"].json() == {"translations": ["GOOD"]}
    assert results["bad"].status_code == status and "\n" not in results["bad"].json()["error"]
    assert results["first"].json() == {"translations": ["FIRST"]}


# -- 2. the worker outlives native panics; /health tells when it cannot decode ---------------------------
def _failing_on(engine: Translator, offender: str, error: BaseException,
                monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the engine raise `error` when asked to translate the text `offender`."""
    translate_nbest = engine.translate_nbest

    def faulty(sentences: list[str], *args: Any, **kwargs: Any) -> Any:
        if offender in sentences:
            raise error
        return translate_nbest(sentences, *args, **kwargs)

    monkeypatch.setattr(engine, "translate_nbest", faulty)


def test_a_native_panic_in_decoding_leaves_the_server_serving(tiny_run: Path, tiny_engine: Translator,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_on(tiny_engine, "panic", PanicException("regex could not match"), monkeypatch)
    app = create_app(tiny_engine, serve_config(tiny_run, "limits.timeout_s=3"))
    with TestClient(app, raise_server_exceptions=False) as c:
        panicked = c.post("/translate", json={"text": ["panic"]})
        assert panicked.status_code == 500 and "\n" not in panicked.json()["error"]
        assert c.post("/translate", json={"text": ["I am cold."]}).json()["translations"] == [
            tiny_engine.translate("I am cold.")]
        assert c.get("/health").json()["status"] == "ok"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the worker's SystemExit
def test_health_is_503_when_the_worker_has_stopped(tiny_run: Path, tiny_engine: Translator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_on(tiny_engine, "exit", SystemExit(1), monkeypatch)  # the one exception meant to end it
    app = create_app(tiny_engine, serve_config(tiny_run, "limits.timeout_s=3"))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.get("/health").status_code == 200
        assert c.post("/translate", json={"text": ["exit"]}).status_code == 500  # answered, not left waiting
        wait_until(lambda: not c.app.state.batcher._thread.is_alive(), "the worker ended")
        health = c.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == "unhealthy" and "\n" not in health.json()["error"]


# -- 3. work nobody waits for stops within a step --------------------------------------------------------
@pytest.fixture
def slow_engine(tiny_engine: Translator, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """tiny_engine made to decode the sentences of its first batch to their length limit (eos only when
    forced) at 50 ms a step; yields the steps of each batch decoded, in order."""
    steps: list[int] = []
    decode, translate_nbest = tiny_engine.model.decode, tiny_engine.translate_nbest

    def slow_decode(*args: Any, **kwargs: Any) -> Any:
        out = decode(*args, **kwargs)
        steps[-1] += 1
        if len(steps) == 1:
            logits = out[0] if isinstance(out, tuple) else out
            logits[..., EOS_ID] -= 50.0  # never chosen, until forced at the limit
            time.sleep(0.05)
        return out

    def counting(*args: Any, **kwargs: Any) -> Any:
        steps.append(0)
        return translate_nbest(*args, **kwargs)

    monkeypatch.setattr(tiny_engine.model, "decode", slow_decode)
    monkeypatch.setattr(tiny_engine, "translate_nbest", counting)
    yield steps


def _full_steps(engine: Translator, text: str) -> int:
    """The decoding steps of a sentence decoded to its length limit (its forced eos included)."""
    n_src = len(engine.encode([text])[0]) + 1
    d = engine.decoding
    return max_output_length(n_src, d.max_len_a, d.max_len_b, engine.model.config.max_positions) + 1


def test_a_timed_out_request_stops_decoding_within_a_step(tiny_run: Path, tiny_engine: Translator,
                                                          slow_engine: list[int]) -> None:
    full = _full_steps(tiny_engine, LONG)
    assert full * 0.05 > 2.0  # a full decode would hold the worker for seconds
    with TestClient(create_app(tiny_engine, serve_config(tiny_run, "limits.timeout_s=0.5"))) as c:
        late = c.post("/translate", json={"text": [LONG], "beam_size": 4})
        start = time.monotonic()
        after = c.post("/translate", json={"text": ["Hi."], "beam_size": 1})
        waited = time.monotonic() - start
    assert late.status_code == 503
    assert after.status_code == 200 and waited < 2.5, waited  # the rest of its full decode: over 3 s
    assert slow_engine[0] < full / 2, (slow_engine, full)


async def _post_then_hang_up(app: Any, body: bytes, after_s: float) -> list[dict[str, Any]]:
    """Send one POST /translate straight to the ASGI app, and disconnect after_s seconds later."""
    hang_up = time.monotonic() + after_s
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/translate", "raw_path": b"/translate", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        if time.monotonic() < hang_up:
            await asyncio.sleep(hang_up - time.monotonic())
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_a_client_that_hangs_up_stops_its_decoding(tiny_run: Path, tiny_engine: Translator,
                                                   slow_engine: list[int]) -> None:
    full = _full_steps(tiny_engine, LONG)
    app = create_app(tiny_engine, serve_config(tiny_run))
    with TestClient(app) as c:  # runs the app's lifespan: its decoding worker
        body = json.dumps({"text": [LONG], "beam_size": 4}).encode()
        asyncio.run(_post_then_hang_up(app, body, after_s=0.5))
        start = time.monotonic()
        after = c.post("/translate", json={"text": ["Hi."], "beam_size": 1})
        waited = time.monotonic() - start
    assert after.status_code == 200 and waited < 2.5, waited  # the rest of its full decode: over 3 s
    assert slow_engine[0] < full / 2, (slow_engine, full)


# -- 4. attention is bounded, and built off the event loop -----------------------------------------------
def test_attention_true_is_one_averaged_matrix_per_text(tiny_run: Path, tiny_engine: Translator) -> None:
    texts = ["I am cold.", "Where is the station?"]
    with TestClient(create_app(tiny_engine, serve_config(tiny_run))) as c:
        body = c.post("/translate", json={"text": texts, "beam_size": 3, "attention": True}).json()
    expected = tiny_engine.translate_nbest(texts, beam_size=3, return_attention=True)
    for amap, nbest in zip(body["attention"], expected, strict=True):
        weights = torch.tensor(amap["weights"])
        assert weights.shape == (len(amap["target_tokens"]), len(amap["source_tokens"]))
        assert nbest[0].attention is not None
        assert torch.allclose(weights, nbest[0].attention.mean(dim=(0, 1)), atol=1e-3)


def test_attention_beyond_the_cap_is_413_before_decoding(tiny_run: Path, tiny_engine: Translator) -> None:
    text = "I am cold."
    n_src = len(tiny_engine.encode([text])[0]) + 1
    averaged = n_src * _full_steps(tiny_engine, text)
    config = tiny_engine.model.config
    cap = averaged * config.decoder_layers * config.n_heads - 1  # the averaged map fits; all heads do not
    cfg = serve_config(tiny_run, f"limits.max_attention_values={cap}")
    with TestClient(create_app(tiny_engine, cfg)) as c:
        refused = c.post("/translate", json={"text": [text], "attention": "heads"})
        assert c.app.state.batcher.decoded == 0  # refused before it reached the worker
        heads_ok = c.post("/translate", json={"text": [text], "attention": True})
    assert refused.status_code == 413 and "limits.max_attention_values" in refused.json()["error"]
    assert heads_ok.status_code == 200


def test_an_answer_over_max_response_bytes_is_not_sent(tiny_run: Path, tiny_engine: Translator) -> None:
    cfg = serve_config(tiny_run, "limits.max_response_bytes=1024")
    texts = ["I am cold.", "Where is the station?", "He is sleeping.", "Tom is here."]
    with TestClient(create_app(tiny_engine, cfg)) as c:
        small = c.post("/translate", json={"text": texts[:1]})
        large = c.post("/translate", json={"text": texts, "attention": "heads"})
    assert small.status_code == 200 and len(small.content) < 1024
    assert large.status_code == 413 and "limits.max_response_bytes=1,024" in large.json()["error"], large.text


def test_health_answers_while_a_response_is_built(tiny_run: Path, tiny_engine: Translator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    building, respond = threading.Event(), app_module.respond

    def slow_respond(*args: Any) -> Any:
        building.set()
        time.sleep(1.5)  # as long as a large attention response can take to build
        return respond(*args)

    monkeypatch.setattr(app_module, "respond", slow_respond)
    results: dict[str, Any] = {}
    with TestClient(create_app(tiny_engine, serve_config(tiny_run))) as c:
        threads = _post_all(c, ["I am cold."], results)
        assert building.wait(30)
        start = time.monotonic()
        health = c.get("/health")
        waited = time.monotonic() - start
        for thread in threads:
            thread.join()
    assert health.status_code == 200 and waited < 0.5, waited
    assert results["I am cold."].json()["translations"] == [tiny_engine.translate("I am cold.")]


# -- 5. beam search's attention history is linear in the output length -----------------------------------
class Allocated(TorchDispatchMode):
    """Counts the bytes of every new tensor torch produces (views of an input excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.bytes += t.untyped_storage().nbytes()
        return out


def _attention_bytes(steps: int) -> int:
    """Bytes beam search allocates for attention (with it less without it) when forced to decode
    `steps` tokens (a prefix that long, then eos)."""
    model, src = random_model(), source_batch([6])
    counted = []
    for attention in (False, True):
        with Allocated() as allocated:
            beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, max_len_a=0, max_len_b=1,
                        return_attention=attention, prefixes=[[5] * steps])
        counted.append(allocated.bytes)
    return counted[1] - counted[0]


def test_beam_attention_memory_grows_linearly_with_the_output_length() -> None:
    assert _attention_bytes(40) / _attention_bytes(20) < 2.5  # O(steps²) copying gives over 3


def test_beam_attention_equals_the_attention_of_its_forced_decoding() -> None:
    """Read back from the step-by-step trail, each hypothesis's attention is that of the decoder run
    once over the hypothesis (teacher forcing, no cache)."""
    model, src = random_model(seed=4), source_batch([6, 3, 8], seed=2)
    result = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=3, return_attention=True)
    memory, src_pad = model.encode(src)
    for i, hyps in enumerate(result):
        for h in hyps:
            tgt = torch.tensor([[BOS, *h.tokens]])
            _, attn = model.decode(tgt, memory[i:i + 1], src_pad[i:i + 1], need_attention=True)
            expected = attn[0][..., ~src_pad[i]]  # (layers, H, T, n_src)
            assert h.attention is not None
            assert torch.allclose(h.attention.double(), expected.double(), atol=1e-6)
