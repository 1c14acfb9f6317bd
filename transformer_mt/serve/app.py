"""The HTTP API and the page: FastAPI routes in front of one `TextTranslator` and its `Batcher`.

Every error a client can cause is answered with a 4xx and one line of JSON, `{"error": "..."}`, that
says what to change; nothing a client sends can produce a traceback in a response. The request body is
parsed by messages.py rather than by FastAPI, so that `curl -d` (sent as a form) works like a JSON client
and a non-UTF-8 or non-JSON body gets its own message; the OpenAPI schema still describes it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from transformer_mt.config import DecodingConfig, ServeConfig
from transformer_mt.decoding.alignment import pharaoh
from transformer_mt.decoding.confidence import shown, verdict, words_json
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.errors import UserError
from transformer_mt.serve.attention_maps import attention_map, check_attention_size
from transformer_mt.serve.batcher import Batcher, ClientGone, QueueFull, Search
from transformer_mt.serve.document_requests import check_documents
from transformer_mt.serve.guard import RequestGuard, max_body_bytes, read_body
from transformer_mt.serve.messages import (
    ERRORS,
    ErrorResponse,
    ScoredText,
    TermReport,
    TranslateRequest,
    TranslateResponse,
    one_line,
    parse_request,
)

log = logging.getLogger(__name__)
LATENCY_WINDOW = 10_000  # latest /translate latencies kept for the percentiles
# /health calls the worker stuck when one batch outlasts limits.timeout_s by this much: a batch whose
# requests have all timed out stops at its next decoding step, which takes far less.
STUCK_GRACE_S = 30.0
CHECKING_THREADS = 2  # threads tokenising requests and parsing their documents


# -- what the server counts -----------------------------------------------------------------------------
class Metrics:
    """Counters for GET /metrics."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: collections.Counter[str] = collections.Counter()  # by status code
        self.sentences = 0
        self.low_confidence = 0  # best translations below decoding.min_confidence (marked or withheld)
        self.latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)

    def report(self, batcher: Batcher) -> dict[str, Any]:
        sizes = batcher.batch_sizes
        batches = sum(sizes.values())
        lat = sorted(self.latencies)
        cuts = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
        return {
            "uptime_s": round(time.time() - self.started, 1),
            "requests": dict(self.requests), "sentences": self.sentences,
            "low_confidence": self.low_confidence,
            "queue": {"waiting_sentences": batcher.waiting, "max": batcher.cfg.max_queue},
            "batches": batches,
            "batch_sentences": {"mean": round(batcher.decoded / batches, 2) if batches else 0.0,
                                "max": max(sizes, default=0),
                                "histogram": {str(k): sizes[k] for k in sorted(sizes)}},
            "decoding_sentences_per_s": round(batcher.decoded / batcher.decode_seconds, 1)
            if batcher.decode_seconds else 0.0,
            "latency_ms": {f"p{p}": round(1000 * cuts[p - 1], 1) for p in (50, 95, 99)} if lat else {},
        }


# -- the app --------------------------------------------------------------------------------------------
@dataclass
class Service:
    """What POST /translate works with: the engine, the server's config, the queue and its worker, the
    threads that check requests, and the counters."""

    engine: TextTranslator
    cfg: ServeConfig
    batcher: Batcher
    metrics: Metrics
    checking: concurrent.futures.Executor | None = None  # started with the app (None: asyncio's threads)

    async def translate(self, request: Request) -> Response:
        """One request: its body read and parsed, refused at once when the queue is full, checked against
        the model (in the checking threads), queued and decoded, and answered (off the event loop: a large
        answer takes a while to build, and /health must answer meanwhile)."""
        start, limits = time.perf_counter(), self.cfg.limits
        raw = await read_body(request, max_body_bytes(self.cfg), limits.body_timeout_s)
        body = await asyncio.to_thread(parse_request, raw, self.cfg)  # a body at the limit takes a while
        texts = [body.text] if isinstance(body.text, str) else body.text
        search = body.search()
        prefixes = [body.prefix] if isinstance(body.prefix, str) else body.prefix
        try:  # before tokenising: a full queue costs a refused request nothing
            self.batcher.check_room(self.batcher.cost(texts, prefixes, search))
        except QueueFull as ex:
            raise busy(ex) from None
        await check_fit(self.engine, body, texts, prefixes, self.checking)
        await asyncio.get_running_loop().run_in_executor(self.checking, check_attention_size, self.engine,
                                                         texts, prefixes, body.attention, self.cfg)
        try:
            results = await decode(self.batcher, request, texts, search, prefixes, limits.timeout_s)
        except ClientGone:  # nobody to answer; 499 as nginx logs it, for /metrics
            return JSONResponse({"error": "the client closed the connection"}, status_code=499)
        self.metrics.sentences += len(texts)
        self.metrics.latencies.append(time.perf_counter() - start)
        actions = screened(results, self.engine.decoding)
        self.metrics.low_confidence += sum(a is not None for a in actions)
        return await asyncio.to_thread(respond_json, self.engine, texts, results, body,
                                       limits.max_response_bytes, actions)


def create_app(engine: TextTranslator, cfg: ServeConfig) -> FastAPI:
    """The FastAPI app serving `engine` with cfg's batching and limits."""
    batcher = Batcher(DocumentTranslator.for_engine(engine, cfg.document), cfg.batching)
    metrics = Metrics()
    page = resources.files("transformer_mt.serve").joinpath("page.html").read_text(encoding="utf-8")
    service = Service(engine, cfg, batcher, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Requests are tokenised (and documents parsed) in threads of their own, not those that build
        # answers: a flood of texts to check cannot hold up the answers of requests already decoded.
        service.checking = concurrent.futures.ThreadPoolExecutor(CHECKING_THREADS, thread_name_prefix="check")
        batcher.start()
        yield
        batcher.stop()
        service.checking.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="transformer-mt", version="1", lifespan=lifespan,
                  description="Machine translation with a from-scratch Transformer. `POST /translate` "
                              "decodes the texts of concurrent requests together.")
    app.state.batcher, app.state.metrics = batcher, metrics
    app.add_middleware(RequestGuard, cfg=cfg)  # added before `count`, so its refusals are counted too

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        metrics.requests[str(response.status_code)] += 1
        return response

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, ex: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(ex.detail)}, status_code=ex.status_code, headers=ex.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, ex: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": one_line(ex.errors())}, status_code=422)

    @app.exception_handler(Exception)
    async def internal(_: Request, ex: Exception) -> JSONResponse:
        log.error("internal error: %s", ex, exc_info=ex)
        return JSONResponse({"error": "internal error; the server log has the details"}, status_code=500)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> str:
        return page

    @app.get("/health", responses={503: {"model": ErrorResponse, "description": "the worker cannot decode"}})
    async def health() -> Any:
        """The model, device and vocabulary being served, and the server's uptime; 503 with status
        "unhealthy" when the decoding worker has stopped or is stuck."""
        problem = batcher.problem(cfg.limits.timeout_s + STUCK_GRACE_S)
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "error": problem}, status_code=503)
        return {"status": "ok", **describe(engine, cfg), "uptime_s": round(time.time() - metrics.started, 1)}

    @app.get("/metrics")
    async def report() -> dict[str, Any]:
        """Request counts by status, sentences, decoding batch sizes and latency percentiles."""
        return {**metrics.report(batcher), "documents": dataclasses.asdict(batcher.engine.tally)}

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
              responses=ERRORS, openapi_extra={"requestBody": {
                  "required": True, "content": {"application/json": {
                      "schema": TranslateRequest.model_json_schema()}}}})
    async def translate(request: Request) -> Response:
        """Translate a list of texts: the best translation of each, in order (n-best, scores and
        cross-attention on request)."""
        return await service.translate(request)

    return app


async def decode(batcher: Batcher, request: Request, texts: list[str], search: Search,
                 prefixes: list[str] | None, timeout_s: float) -> list[list[Translation]]:
    """The texts' n-best lists from the batcher, or the HTTPException its refusal means (ClientGone
    when the client hangs up meanwhile)."""
    try:
        return await asyncio.wait_for(batcher.translate(texts, search, prefixes, timeout_s,
                                                        lambda: _hang_up(request)), timeout_s)
    except QueueFull as ex:
        raise busy(ex) from None
    except UserError as ex:  # the request's own fault, or what this engine cannot do (CTranslate2: prefixes)
        raise HTTPException(422, str(ex)) from None
    except asyncio.TimeoutError:
        waited = f"not translated within {timeout_s:g} s (limits.timeout_s)"
        raise HTTPException(503, f"{waited}; the server is overloaded, retry later",
                            headers={"Retry-After": "5"}) from None


def busy(ex: QueueFull) -> HTTPException:
    """A full queue's 503, with when to retry."""
    return HTTPException(503, str(ex), headers={"Retry-After": str(ex.retry_after)})


async def check_fit(engine: TextTranslator, body: TranslateRequest, texts: list[str],
                    prefixes: list[str] | None, pool: concurrent.futures.Executor | None = None) -> None:
    """A 413 naming the first text or prefix with more tokens than the model's positions, or a 422 naming
    one the tokenizer cannot encode. Tokenised in `pool`'s threads (None: asyncio's): a request at the
    limits took 0.35 s on two CPU cores, which on the event loop would stall every other request and
    /health. Documents are parsed there too (document_requests.py)."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(pool, check_documents, body, texts)
    try:
        unfit = await loop.run_in_executor(pool, engine.unfit_inputs, texts, prefixes, body.tgt_lang)
    except UserError as ex:  # a language the model lacks
        raise HTTPException(422, str(ex)) from None
    if not unfit:
        return
    # A text too long is cut into sentences and parts the model takes; only attention wants it whole.
    unfit = [u for u in unfit if u.side == "prefix" or not u.too_long or body.attention is not False]
    if not unfit:
        return
    first = unfit[0]
    name = first.side if isinstance(getattr(body, first.side), str) else f"{first.side}[{first.index}]"
    if first.too_long:
        raise HTTPException(413, f"{name} {first.reason}: split or shorten it")
    raise HTTPException(422, f"{name} {first.reason}; send valid UTF-8 text")


async def _hang_up(request: Request) -> None:
    """Return once the client has disconnected: ASGI's http.disconnect, the one message left to receive
    after the body (uvicorn sends it as soon as the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def screened(results: list[list[Translation]], decoding: DecodingConfig) -> list[str | None]:
    """decoding.min_confidence applied to each text's best translation: what it did to each (`verdict`);
    a withheld one's list is replaced by one empty translation that keeps its score and confidence."""
    actions = [verdict(nbest[0].confidence, decoding.min_confidence, decoding.low_confidence)
               for nbest in results]
    for i, action in enumerate(actions):
        if action == "withhold":
            best = results[i][0]
            results[i] = [Translation("", best.score, alignment=None if best.alignment is None else [],
                                      confidence=best.confidence, word_confidences=[])]
    return actions


def respond_json(engine: TextTranslator, texts: list[str], results: list[list[Translation]],
                 body: TranslateRequest, max_bytes: int,
                 actions: list[str | None] | None = None) -> JSONResponse:
    """The response for one request's results, rendered to JSON (the slow part for large attention), or
    a 413 when it is over `max_bytes` (limits.max_response_bytes)."""
    response = JSONResponse(respond(engine, texts, results, body, actions).model_dump(exclude_none=True))
    if len(response.body) > max_bytes:
        return JSONResponse({"error": f"the answer is {len(response.body):,} bytes, over this server's "
                                      f"limits.max_response_bytes={max_bytes:,}; ask for fewer texts, "
                                      "hypotheses or attention values at a time"}, status_code=413)
    return response


def respond(engine: TextTranslator, texts: list[str], results: list[list[Translation]],
            body: TranslateRequest, actions: list[str | None] | None = None) -> TranslateResponse:
    """The response for one request's results (each a best-first n-best list), and what
    decoding.min_confidence did to each (`screened`)."""
    out = TranslateResponse(translations=[nbest[0].text for nbest in results])
    if any(nbest[0].terms is not None for nbest in results):
        out.terms = [[TermReport(source=u.source, target=u.target, status=u.status, reason=u.reason or None)
                      for u in nbest[0].terms or ()] for nbest in results]
    if body.scores or (body.n_best or 1) > 1:
        out.nbest = [[ScoredText(text=h.text, score=_finite(h.score)) for h in nbest] for nbest in results]
    if body.attention is not False:
        heads = body.attention == "heads"
        out.attention = [attention_map(engine, text, nbest[0], heads) for text, nbest in zip(texts, results)]
    if any(nbest[0].alignment is not None for nbest in results):
        out.alignments = [pharaoh(nbest[0].alignment or []) for nbest in results]
    if any(nbest[0].confidence is not None for nbest in results):
        out.confidence = [None if n[0].confidence is None else shown(n[0].confidence) for n in results]
        out.words = [words_json(nbest[0].word_confidences) for nbest in results]
    if actions is not None and engine.decoding.min_confidence is not None:
        out.low_confidence = [a is not None for a in actions]
        if engine.decoding.low_confidence == "withhold":
            out.withheld = [a == "withhold" for a in actions]
    return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -1e9  # JSON has no infinity


def run_name(checkpoint: str) -> str:
    """The name of the run a checkpoint file belongs to (its directory): what visitors see of the
    model, rather than a path on the server."""
    return Path(checkpoint).resolve().parent.name


def describe(engine: TextTranslator, cfg: ServeConfig) -> dict[str, Any]:
    """What /health reports about the model being served: the run (each run of an ensemble), not where
    its files are."""
    info = engine.info
    dataset = (info.get("config") or {}).get("dataset") or {}
    vocab = engine.vocab
    return {
        "model": ([run_name(p) for p in info["ensemble"]] if "ensemble" in info
                  else run_name(info["checkpoint"])),
        "engine": cfg.engine, "step": info.get("step"),
        "device": str(getattr(engine, "device", info.get("device"))),
        "precision": str(getattr(engine, "precision", info.get("compute_type"))),
        "languages": {"source": dataset.get("src_lang"), "target": engine.tgt_lang or dataset.get("tgt_lang"),
                      **({"targets": list(vocab.target_languages)} if vocab.target_languages else {})},
        "vocabulary": {"kind": vocab.kind, "joint": vocab.joint, "source_size": vocab.src_vocab_size,
                       "target_size": vocab.tgt_vocab_size},
        "decoding": {"beam_size": engine.decoding.beam_size, "n_best": engine.decoding.n_best,
                     "max_beam_size": cfg.limits.max_beam_size},
        "confidence": {"on": engine.decoding.confidence, "calibrated": engine.rater.calibration is not None,
                       "min_confidence": engine.decoding.min_confidence},
        "limits": {"max_texts": cfg.limits.max_texts, "max_chars": cfg.limits.max_chars},
        "api_key": cfg.api_key is not None or cfg.api_key_file is not None,  # the page asks for it
        "batching": {"enabled": cfg.batching.enabled, "window_ms": cfg.batching.window_ms,
                     "max_sentences": cfg.batching.max_sentences},
    }
