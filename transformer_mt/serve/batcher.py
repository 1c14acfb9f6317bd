"""Cross-request batching: one worker thread owns the model and decodes concurrent requests together.

Requests wait in a queue. The worker takes the oldest, waits up to `window_ms` for more to arrive,
and decodes every waiting request that asks for the same search (beam size, n-best, attention) in one
call, up to `max_sentences`; requests with prefixes (forced starts, one per text) batch only with each
other, so that the server's own decoding.prefix still applies to the rest. `Translator` sorts that
batch by length. Each request's future gets its own translations back, in its own order. The event
loop only enqueues and awaits, so it never blocks on decoding, and a request whose client went away is
skipped (or its answer dropped), never an error.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from transformer_mt.config import BatchingConfig
from transformer_mt.errors import UserError
from transformer_mt.translator import TextTranslator, Translation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Search:
    """What a request asks of the search: requests decode together only when these are equal."""

    beam_size: int | None = None  # None: the server's default
    n_best: int | None = None
    attention: bool = False
    alignment: bool | None = None  # None: the server's decoding.alignment


@dataclass
class Job:
    """One request's sentences waiting for the worker."""

    texts: list[str]
    search: Search
    future: asyncio.Future[list[list[Translation]]]
    loop: asyncio.AbstractEventLoop
    prefixes: list[str] | None = None  # each text's forced start, or None: the server's decoding.prefix


class QueueFull(Exception):
    """More sentences are waiting than `batching.max_queue` allows."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the server is busy ({waiting} sentences waiting); retry in {retry_after} s")
        self.retry_after = retry_after


class Batcher:
    """The queue and its decoding worker."""

    def __init__(self, engine: TextTranslator, cfg: BatchingConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self._jobs: collections.deque[Job] = collections.deque()
        self._waiting = 0  # sentences in _jobs
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="transformer-mt-decoder", daemon=True)
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # sentences per decoded batch
        self.decode_seconds = 0.0  # worker time spent decoding, for throughput and Retry-After
        self.decoded = 0  # sentences decoded

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
        return self._waiting

    async def translate(self, texts: list[str], search: Search,
                        prefixes: list[str] | None = None) -> list[list[Translation]]:
        """Queue texts (with a forced start each when prefixes are given) and wait for their n-best
        lists (raises QueueFull when the queue is full)."""
        loop = asyncio.get_running_loop()
        job = Job(texts, search, loop.create_future(), loop, prefixes)
        with self._cond:
            if self._waiting + len(texts) > self.cfg.max_queue:
                raise QueueFull(self._waiting, self._retry_after())
            self._jobs.append(job)
            self._waiting += len(texts)
            self._cond.notify()
        try:
            return await job.future
        except asyncio.CancelledError:  # timed out or the client went away: free its place at once
            with self._cond:
                if job in self._jobs:
                    self._jobs.remove(job)
                    self._waiting -= len(texts)
            raise

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
            self._decode(jobs)

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
            if job.future.done():  # cancelled: the client went away or timed out
                self._waiting -= len(job.texts)
                continue
            fits = first is not None and self.cfg.enabled and job.search == first.search and \
                (job.prefixes is None) == (first.prefixes is None) and \
                size + len(job.texts) <= self.cfg.max_sentences
            if first is None or fits:
                first = first or job
                taken.append(job)
                size += len(job.texts)
                self._waiting -= len(job.texts)
            else:
                kept.append(job)
        self._jobs = kept
        return taken

    def _decode(self, jobs: list[Job]) -> None:
        texts = [t for job in jobs for t in job.texts]
        search = jobs[0].search
        prefixes = None if jobs[0].prefixes is None else [p for job in jobs for p in job.prefixes or ()]
        start = time.perf_counter()
        try:
            results: Any = self.engine.translate_nbest(texts, return_attention=search.attention,
                                                       beam_size=search.beam_size, n_best=search.n_best,
                                                       alignment=search.alignment, prefixes=prefixes)
        except UserError as ex:  # asked of an engine that cannot (prefixes on CTranslate2): no traceback
            results = ex
        except Exception as ex:  # noqa: BLE001 - the worker must outlive any one batch
            log.exception("decoding a batch of %d sentences failed", len(texts))
            results = ex
        self.decode_seconds += time.perf_counter() - start
        self.decoded += len(texts)
        self.batch_sizes[len(texts)] += 1
        offset = 0
        for job in jobs:
            n = len(job.texts)
            _deliver(job, results if isinstance(results, Exception) else results[offset:offset + n])
            offset += n


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
