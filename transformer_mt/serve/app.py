"""The HTTP API and the page: FastAPI routes in front of one `TextTranslator` and its `Batcher`.

Every error a client can cause is answered with a 4xx and one line of JSON, `{"error": "..."}`, that
says what to change; nothing a client sends can produce a traceback in a response. The request body is
parsed here rather than by FastAPI, so that `curl -d` (sent as a form) works like a JSON client and a
non-UTF-8 or non-JSON body gets its own message; the OpenAPI schema still describes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from transformer_mt.config import ServeConfig
from transformer_mt.config.checks import n_best_in_beam
from transformer_mt.decoding.alignment import pharaoh
from transformer_mt.decoding.translator import TextTranslator, Translation
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.errors import UserError
from transformer_mt.serve.attention_maps import AttentionMap, attention_map, check_attention_size
from transformer_mt.serve.batcher import Batcher, ClientGone, QueueFull, Search
from transformer_mt.serve.document_requests import check_documents
from transformer_mt.serve.guard import RequestGuard, max_body_bytes, read_body

log = logging.getLogger(__name__)
LATENCY_WINDOW = 10_000  # latest /translate latencies kept for the percentiles
# /health calls the worker stuck when one batch outlasts limits.timeout_s by this much: a batch whose
# requests have all timed out stops at its next decoding step, which takes far less.
STUCK_GRACE_S = 30.0


# -- the API's schema ---------------------------------------------------------------------------------
class TranslateRequest(BaseModel):
    """POST /translate: texts and, optionally, how to search and what to return."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] | str = Field(description="the sentences to translate (or one sentence)")
    beam_size: int | None = Field(None, ge=1, description="1 = greedy; default: the server's")
    n_best: int | None = Field(None, ge=1, description="hypotheses per text, at most beam_size")
    scores: bool = Field(False, description="also return each hypothesis with its model score")
    attention: bool | Literal["heads"] = Field(False, description="also return cross-attention: true = "
                                                "averaged over layers and heads, \"heads\" = per layer and "
                                                "head")
    alignment: bool | None = Field(None, description="also return word alignments (`0-0 1-2 ...`, source-"
                                   "target word indices) of each best translation; default: the server's")
    prefix: list[str] | str | None = Field(None, description="forced start of each translation (prefix "
                                           "decoding): one per text, \"\" for none; default: the server's")
    tgt_lang: str | None = Field(None, description="the language to translate into, for a model of several "
                                 "(GET /health lists them); default: the server's")
    format: Literal["text", "markdown", "html", "srt"] = Field(
        "text", description="text: each text split into sentences; markdown, html, srt: each text a "
        "document, translated with its structure (markup, code, cue numbers and timings) as it was")

    def search(self) -> Search:
        """What the request asks of the search (requests that ask the same decode together)."""
        return Search(self.beam_size, self.n_best, self.attention is not False, self.alignment, self.tgt_lang,
                      self.format)


class ScoredText(BaseModel):
    """One of a text's n best translations and its score."""

    text: str
    score: float


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="the best translation of each text, in request order")
    nbest: list[list[ScoredText]] | None = None
    attention: list[AttentionMap] | None = None
    alignments: list[str] | None = Field(None, description="the best translation's word alignment of each "
                                         "text (`0-0 1-2 ...`), when asked")


class ErrorResponse(BaseModel):
    error: str


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": why} for code, why in (
        (400, "the body is not UTF-8 JSON, or the Host is not in allowed_hosts"),
        (408, "the body did not arrive within limits.body_timeout_s"),
        (413, "too many texts, a text or prefix too long, the body too large, or more attention than "
              "limits.max_attention_values"),
        (415, "a browser sent a body that is not application/json"),
        (422, "a field is missing, of the wrong type or out of range, or a text cannot be encoded"),
        (431, "the request line and headers are over limits.max_header_bytes"),
        (503, "the queue is full (see Retry-After) or the request waited too long"))}


# -- what the server counts -----------------------------------------------------------------------------
class Metrics:
    """Counters for GET /metrics."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: collections.Counter[str] = collections.Counter()  # by status code
        self.sentences = 0
        self.latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)

    def report(self, batcher: Batcher) -> dict[str, Any]:
        sizes = batcher.batch_sizes
        batches = sum(sizes.values())
        lat = sorted(self.latencies)
        cuts = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
        return {
            "uptime_s": round(time.time() - self.started, 1),
            "requests": dict(self.requests), "sentences": self.sentences,
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
def create_app(engine: TextTranslator, cfg: ServeConfig) -> FastAPI:
    """The FastAPI app serving `engine` with cfg's batching and limits."""
    batcher = Batcher(DocumentTranslator.for_engine(engine, cfg.document), cfg.batching)
    metrics = Metrics()
    page = resources.files("transformer_mt.serve").joinpath("page.html").read_text(encoding="utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        batcher.stop()

    app = FastAPI(title="transformer-mt", version="1", lifespan=lifespan,
                  description="Machine translation with a from-scratch Transformer. `POST /translate` "
                              "decodes the texts of concurrent requests together.")
    app.state.batcher, app.state.metrics = batcher, metrics
    app.add_middleware(RequestGuard, cfg=cfg)  # added before `count`, so its refusals are counted too
    body_limit = max_body_bytes(cfg)

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
        return JSONResponse({"error": _one_line(ex.errors())}, status_code=422)

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
        start = time.perf_counter()
        body = parse_request(await read_body(request, body_limit, cfg.limits.body_timeout_s), cfg)
        texts = [body.text] if isinstance(body.text, str) else body.text
        search = body.search()
        prefixes = [body.prefix] if isinstance(body.prefix, str) else body.prefix
        await check_fit(engine, body, texts, prefixes)
        await asyncio.to_thread(check_attention_size, engine, texts, prefixes, body.attention, cfg)
        try:
            results = await decode(batcher, request, texts, search, prefixes, cfg.limits.timeout_s)
        except ClientGone:  # nobody to answer; 499 as nginx logs it, for /metrics
            return JSONResponse({"error": "the client closed the connection"}, status_code=499)
        metrics.sentences += len(texts)
        metrics.latencies.append(time.perf_counter() - start)
        # Off the event loop: a large response takes a while to build, and /health must answer meanwhile.
        return await asyncio.to_thread(respond_json, engine, texts, results, body)

    return app


async def decode(batcher: Batcher, request: Request, texts: list[str], search: Search,
                 prefixes: list[str] | None, timeout_s: float) -> list[list[Translation]]:
    """The texts' n-best lists from the batcher, or the HTTPException its refusal means (ClientGone
    when the client hangs up meanwhile)."""
    try:
        return await asyncio.wait_for(batcher.translate(texts, search, prefixes, timeout_s,
                                                        lambda: _hang_up(request)), timeout_s)
    except QueueFull as ex:
        raise HTTPException(503, str(ex), headers={"Retry-After": str(ex.retry_after)}) from None
    except UserError as ex:  # the request's own fault, or what this engine cannot do (CTranslate2: prefixes)
        raise HTTPException(422, str(ex)) from None
    except asyncio.TimeoutError:
        waited = f"not translated within {timeout_s:g} s (limits.timeout_s)"
        raise HTTPException(503, f"{waited}; the server is overloaded, retry later",
                            headers={"Retry-After": "5"}) from None


def parse_request(raw: bytes, cfg: ServeConfig) -> TranslateRequest:
    """The request body as a TranslateRequest within the server's limits, or the HTTPException saying
    what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as ex:
        raise HTTPException(400, f"the body is not UTF-8 (byte {ex.start}); send UTF-8 JSON") from None
    except json.JSONDecodeError as ex:
        raise HTTPException(400, f"the body is not JSON ({ex.msg} at line {ex.lineno} column {ex.colno}); "
                            'send {"text": ["..."]}') from None
    except RecursionError:
        raise HTTPException(400, "the body's JSON nests too deeply; send a flat object such as "
                            '{"text": ["..."]}') from None
    except ValueError:  # an integer past Python's limit on digits: reading it would take quadratic time
        raise HTTPException(400, f"the body holds a number of more than {sys.get_int_max_str_digits()} "
                            "digits; send a smaller one") from None
    if not isinstance(data, dict):
        raise HTTPException(422, 'the body must be a JSON object such as {"text": ["..."]}')
    try:
        body = TranslateRequest.model_validate(data)
    except ValidationError as ex:
        raise HTTPException(422, _one_line(ex.errors())) from None
    texts = [body.text] if isinstance(body.text, str) else body.text
    limits = cfg.limits
    if not texts:
        raise HTTPException(422, "text is an empty list; send at least one text")
    if len(texts) > limits.max_texts:
        raise HTTPException(413, f"{len(texts)} texts in one request; the limit is {limits.max_texts} "
                            "(limits.max_texts): split the request")
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise HTTPException(413, f"text[{i}] has {len(text)} characters; the limit is {limits.max_chars} "
                                "(limits.max_chars): split it into sentences")
    _check_prefixes(body, len(texts), limits.max_chars)
    beam = body.beam_size or cfg.decoding.beam_size
    if beam > limits.max_beam_size:
        raise HTTPException(422, f"beam_size={beam} is above this server's limit of {limits.max_beam_size}")
    too_many = n_best_in_beam(body.n_best or 1, beam, prefix="")
    if too_many:
        raise HTTPException(422, too_many[0])
    return body


async def check_fit(engine: TextTranslator, body: TranslateRequest, texts: list[str],
                    prefixes: list[str] | None) -> None:
    """A 413 naming the first text or prefix with more tokens than the model's positions, or a 422 naming
    one the tokenizer cannot encode. Tokenised in a thread: a request at the limits took 0.35 s on two
    CPU cores, which on the event loop would stall every other request and /health. Documents are
    parsed there too (document_requests.py)."""
    await asyncio.to_thread(check_documents, body, texts)
    try:
        unfit = await asyncio.to_thread(engine.unfit_inputs, texts, prefixes, body.tgt_lang)
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


def _check_prefixes(body: TranslateRequest, n_texts: int, max_chars: int) -> None:
    """One prefix per text (a string for one text), each within limits.max_chars."""
    if body.prefix is None:
        return
    prefixes = [body.prefix] if isinstance(body.prefix, str) else body.prefix
    if len(prefixes) != n_texts:
        raise HTTPException(422, f"prefix has {len(prefixes)} items for {n_texts} texts; give one per text "
                            '("" for none)')
    for i, prefix in enumerate(prefixes):
        if len(prefix) > max_chars:
            raise HTTPException(413, f"prefix[{i}] has {len(prefix)} characters; the limit is {max_chars} "
                                "(limits.max_chars)")


def _one_line(errors: Any) -> str:
    """Pydantic's error list as one line: `field: message` of each."""
    parts = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


async def _hang_up(request: Request) -> None:
    """Return once the client has disconnected: ASGI's http.disconnect, the one message left to receive
    after the body (uvicorn sends it as soon as the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def respond_json(engine: TextTranslator, texts: list[str], results: list[list[Translation]],
                 body: TranslateRequest) -> JSONResponse:
    """The response for one request's results, rendered to JSON (the slow part for large attention)."""
    return JSONResponse(respond(engine, texts, results, body).model_dump(exclude_none=True))


def respond(engine: TextTranslator, texts: list[str], results: list[list[Translation]],
            body: TranslateRequest) -> TranslateResponse:
    """The response for one request's results (each a best-first n-best list)."""
    out = TranslateResponse(translations=[nbest[0].text for nbest in results])
    if body.scores or (body.n_best or 1) > 1:
        out.nbest = [[ScoredText(text=h.text, score=_finite(h.score)) for h in nbest] for nbest in results]
    if body.attention is not False:
        heads = body.attention == "heads"
        out.attention = [attention_map(engine, text, nbest[0], heads) for text, nbest in zip(texts, results)]
    if any(nbest[0].alignment is not None for nbest in results):
        out.alignments = [pharaoh(nbest[0].alignment or []) for nbest in results]
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
        "limits": {"max_texts": cfg.limits.max_texts, "max_chars": cfg.limits.max_chars},
        "batching": {"enabled": cfg.batching.enabled, "window_ms": cfg.batching.window_ms,
                     "max_sentences": cfg.batching.max_sentences},
    }
