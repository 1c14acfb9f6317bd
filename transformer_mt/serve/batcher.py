"""Cross-request batching: one worker thread owns the model and decodes concurrent requests together.

Requests wait in a queue. The worker takes the oldest, waits up to `window_ms` for more to arrive,
and decodes every waiting request that asks for the same search (beam size, n-best, attention) in one
call, up to `max_sentences`; requests with prefixes (forced starts, one per text) batch only with each
other, so that the server's own decoding.prefix still applies to the rest. A request for attention is
decoded alone: its attention, bounded per request (limits.max_attention_values), is then bounded per
batch. `Translator` sorts that batch by length. Each request's future gets its own translations back,
in its own order. The event loop only enqueues and awaits, so it never blocks on decoding.

One client cannot harm another's answer or stall the server:
- A batch that fails is decoded again one request at a time, so only the request that causes the error
  gets it (a `UserError`, answered 4xx, when its input is at fault; any other error, 500).
- The worker outlives any exception a batch raises, BaseException included: native code raises those
  (tokenizers' `PanicException`). Only SystemExit and KeyboardInterrupt end it, and then `problem()`
  says so, for /health.
- A request is gone when its client disconnected (seen while it waits) or its deadline passed. Gone
  requests leave the queue, and a batch whose requests are all gone stops at its next decoding step. A
  batch with some requests gone decodes on: its live requests hold the worker for as many steps anyway,
  and a gone row costs a fraction of a batched step.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from transformer_mt.config import BatchingConfig
from transformer_mt.decoding.glossary import Glossary
from transformer_mt.decoding.search import DecodingStopped
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.errors import UserError

log = logging.getLogger(__name__)
SHUTDOWN = (SystemExit, KeyboardInterrupt)  # the only exceptions the worker lets end it
# The queue counts what a request costs to decode, in sentences of this many characters searched with the
# server's beam: a one-character text with a long prefix and a wide beam is not one sentence.
SENTENCE_CHARS = 100


@dataclass(frozen=True)
class Search:
    """What a request asks of the search: requests decode together only when these are equal."""

    beam_size: int | None = None  # None: the server's default
    n_best: int | None = None
    attention: bool = False
    alignment: bool | None = None  # None: the server's decoding.alignment
    tgt_lang: str | None = None  # a model of several target languages: None, the server's
    format: str = "text"  # markdown | html | srt: each text a document, translated with its structure
    glossary: tuple[tuple[str, str], ...] | None = None  # the request's own terms, over the server's


@dataclass
class Job:
    """One request's sentences waiting for the worker."""

    texts: list[str]
    search: Search
    future: asyncio.Future[list[list[Translation]]]
    loop: asyncio.AbstractEventLoop
    prefixes: list[str] | None = None  # each text's forced start, or None: the server's decoding.prefix
    deadline: float = math.inf  # time.monotonic() after which nobody waits for the answer
    cost: int = 0  # what it takes of batching.max_queue (Batcher.cost)
    abandoned: threading.Event = field(default_factory=threading.Event)  # set when its client is gone

    def gone(self) -> bool:
        """Nobody waits for this job's answer any more: its client left, or its deadline passed."""
        return self.abandoned.is_set() or time.monotonic() > self.deadline


class ClientGone(Exception):
    """The client disconnected while its request waited: there is nobody to answer."""


class DecodingFailed(RuntimeError):
    """Decoding raised an error that is not the request's fault (the server log has the traceback)."""


class QueueFull(Exception):
    """More sentences are waiting than `batching.max_queue` allows."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the server is busy ({waiting} sentences waiting); retry in {retry_after} s")
        self.retry_after = retry_after


class Batcher:
    """The queue and its decoding worker."""

    def __init__(self, engine: DocumentTranslator, cfg: BatchingConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self._jobs: collections.deque[Job] = collections.deque()
        self._waiting = 0  # the cost of the jobs in _jobs, in sentences (cost)
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="transformer-mt-decoder", daemon=True)
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # sentences per decoded batch
        self.decode_seconds = 0.0  # worker time spent decoding, for throughput and Retry-After
        self.decoded = 0  # sentences decoded
        self.busy_since: float | None = None  # time.monotonic() the batch in hand began, None when idle
        self.glossary = functools.lru_cache(maxsize=16)(self._glossary)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the batch in hand, fail what still waits, and end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        for job in self._jobs:
            _deliver(job, RuntimeError("the server is shutting down"))
        self._jobs.clear()

    @property
    def waiting(self) -> int:
        """What waits in the queue, in sentences (Batcher.cost)."""
        return self._waiting

    def cost(self, texts: list[str], prefixes: list[str] | None, search: Search) -> int:
        """What texts take of the queue: each counts one sentence per SENTENCE_CHARS characters begun (its
        prefix's too: a forced start is decoded as well), times its beam over the server's."""
        default = self.engine.decoding.beam_size
        scale = (search.beam_size or default) / max(1, default)
        chars = [len(t) + (len(prefixes[i]) if prefixes else 0) for i, t in enumerate(texts)]
        return sum(max(1, math.ceil(scale * max(1, math.ceil(c / SENTENCE_CHARS)))) for c in chars)

    def check_room(self, cost: int) -> None:
        """QueueFull unless a request of this cost would be queued now (one alone in an empty queue always
        is, so a request within the limits is never refused for good)."""
        with self._cond:
            if self._waiting and self._waiting + cost > self.cfg.max_queue:
                raise QueueFull(self._waiting, self._retry_after())

    def problem(self, stuck_after_s: float) -> str | None:
        """Why the worker cannot decode (it has stopped, or has held one batch for over stuck_after_s
        seconds), or None when it can."""
        if not self._thread.is_alive():
            return "the decoding worker has stopped; restart the server"
        since = self.busy_since
        if since is not None and time.monotonic() - since > stuck_after_s:
            return f"the decoding worker has been on one batch for {time.monotonic() - since:.0f} s"
        return None

    async def translate(self, texts: list[str], search: Search, prefixes: list[str] | None = None,
                        timeout_s: float | None = None,
                        client_gone: Callable[[], Awaitable[None]] | None = None) -> list[list[Translation]]:
        """Queue texts (with a forced start each when prefixes are given) and wait for their n-best
        lists. Raises QueueFull when the queue is full, ClientGone when `client_gone()` (awaited
        meanwhile) returns first; after timeout_s nobody waits, and the worker drops or stops the job."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s if timeout_s is not None else math.inf
        job = Job(texts, search, loop.create_future(), loop, prefixes, deadline,
                  cost=self.cost(texts, prefixes, search))
        with self._cond:  # re-entrant: check_room takes it again, and nothing comes between them
            self.check_room(job.cost)
            self._jobs.append(job)
            self._waiting += job.cost
            self._cond.notify()
        try:
            return await _wait_for_answer(job, client_gone)
        except (asyncio.CancelledError, ClientGone):  # timed out or the client went away
            self._abandon(job)
            raise

    def _abandon(self, job: Job) -> None:
        """Free a gone job's place in the queue at once, and let the worker stop decoding it."""
        job.abandoned.set()
        job.future.cancel()  # (called on the job's loop) so that a late answer is dropped unread
        with self._cond:
            if job in self._jobs:
                self._jobs.remove(job)
                self._waiting -= job.cost

    def _retry_after(self) -> int:
        """Seconds until the waiting sentences are likely decoded, from the throughput so far."""
        rate = self.decoded / self.decode_seconds if self.decode_seconds > 0 else 0.0
        return max(1, round(self._waiting / rate)) if rate > 0 else 1

    # -- the worker thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            jobs = self._next_batch()
            if jobs is None:
                return
            self.busy_since = time.monotonic()
            try:
                self._decode(jobs)
            except SHUTDOWN:  # the worker ends: nobody else will answer these
                for job in jobs:
                    _deliver(job, DecodingFailed("the decoding worker stopped"))
                raise
            finally:
                self.busy_since = None

    def _next_batch(self) -> list[Job] | None:
        """The oldest live job and, with batching, the jobs that may share its batch."""
        with self._cond:
            while True:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return None
                if self.cfg.enabled and self.cfg.window_ms > 0:
                    deadline = time.perf_counter() + self.cfg.window_ms / 1000
                    while self._waiting < self.cfg.max_sentences and not self._stopping:
                        left = deadline - time.perf_counter()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                batch = self._take()
                if batch:
                    return batch

    def _take(self) -> list[Job]:
        """Remove the jobs of the next batch from the queue (called with the lock held): the first job
        whole, then later jobs with the same search (and prefixes or none, as it) while they fit in
        max_sentences. Jobs whose client stopped waiting are dropped here."""
        first: Job | None = None
        taken: list[Job] = []
        kept: collections.deque[Job] = collections.deque()
        size = 0
        for job in self._jobs:
            if job.gone() or job.future.done():  # the client went away or timed out
                self._waiting -= job.cost
                continue
            fits = first is not None and self.cfg.enabled and job.search == first.search and \
                not job.search.attention and (job.prefixes is None) == (first.prefixes is None) and \
                size + len(job.texts) <= self.cfg.max_sentences
            if first is None or fits:
                first = first or job
                taken.append(job)
                size += len(job.texts)
                self._waiting -= job.cost
            else:
                kept.append(job)
        self._jobs = kept
        return taken

    def _decode(self, jobs: list[Job]) -> None:
        """Decode a batch and answer its jobs; when it fails, decode each job again alone, so that only
        the job whose input causes the error gets it."""
        outcome = self._attempt(jobs)
        if isinstance(outcome, BaseException) and len(jobs) > 1 and not isinstance(outcome, DecodingStopped):
            log.warning("a batch of %d requests failed; decoding each alone", len(jobs))
            for job in jobs:
                if not job.gone():
                    self._reply([job], self._attempt([job]))
            return
        self._reply(jobs, outcome)

    def _attempt(self, jobs: list[Job]) -> list[list[Translation]] | BaseException:
        """The jobs' texts decoded together, or the exception that stopped them."""
        texts = [t for job in jobs for t in job.texts]
        search = jobs[0].search
        prefixes = None if jobs[0].prefixes is None else [p for job in jobs for p in job.prefixes or ()]
        start = time.perf_counter()
        try:
            glossary = self.glossary(search.glossary)
            if search.format != "text":
                return self._documents(texts, search, glossary, lambda: all(job.gone() for job in jobs))
            return self.engine.translate_nbest(texts, return_attention=search.attention,
                                               beam_size=search.beam_size, n_best=search.n_best,
                                               alignment=search.alignment, aligned=1, prefixes=prefixes,
                                               tgt_lang=search.tgt_lang, glossary=glossary,
                                               should_stop=lambda: all(job.gone() for job in jobs))
        except SHUTDOWN:
            raise
        except (UserError, DecodingStopped) as ex:  # the request's fault, or nobody waits: no traceback
            return ex
        except BaseException as ex:  # noqa: BLE001 - native code raises BaseException too (PanicException)
            log.error("decoding a batch of %d sentences failed: %s", len(texts), ex, exc_info=ex)
            return ex
        finally:
            self.decode_seconds += time.perf_counter() - start
            self.decoded += len(texts)
            self.batch_sizes[len(texts)] += 1

    def _glossary(self, terms: tuple[tuple[str, str], ...] | None) -> Glossary | None:
        """The server's glossary with a request's terms over it (None: the server's, as the engine has it);
        through `self.glossary`, which keeps the last few built (a large glossary's patterns take a while)."""
        if terms is None:
            return None  # the engine's own
        server = self.engine.engine.glossary
        mine = Glossary.of(terms, "glossary")
        return server.merged(mine) if server is not None else mine

    def _documents(self, texts: list[str], search: Search, glossary: Glossary | None,
                   stop: Callable[[], bool]) -> list[list[Translation]]:
        """Documents translated whole, each as its one translation (the request checked that they parse)."""
        names = [f"text[{i}]" for i in range(len(texts))]
        done = self.engine.translate_documents(texts, search.format, names, beam_size=search.beam_size,
                                               tgt_lang=search.tgt_lang, should_stop=stop, glossary=glossary)
        return [[Translation(text, 0.0)] for text in done]

    def _reply(self, jobs: list[Job], outcome: list[list[Translation]] | BaseException) -> None:
        """Give each job its own slice of the results, or the error as its request should see it."""
        offset = 0
        for job in jobs:
            n = len(job.texts)
            if isinstance(outcome, DecodingStopped):  # nobody waits; a deadline the loop has not seen yet
                _deliver(job, asyncio.TimeoutError(str(outcome)))
            elif isinstance(outcome, UserError):
                _deliver(job, outcome)
            elif isinstance(outcome, BaseException):
                _deliver(job, DecodingFailed(f"decoding failed ({type(outcome).__name__}: {outcome})"))
            else:
                _deliver(job, outcome[offset:offset + n])
            offset += n


async def _wait_for_answer(job: Job,
                           client_gone: Callable[[], Awaitable[None]] | None) -> list[list[Translation]]:
    """The job's results once the worker delivers them; ClientGone if `client_gone()` returns first."""
    if client_gone is None:
        return await job.future
    watcher = asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if job.future.done():
        return job.future.result()
    raise ClientGone("the client disconnected")


def _deliver(job: Job, result: list[list[Translation]] | BaseException) -> None:
    """Hand a result to the job's event loop; a future already given up on is left alone."""

    def settle() -> None:
        if job.future.done():
            return
        if isinstance(result, BaseException):
            job.future.set_exception(result)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass
