"""The next training epoch built in a worker process while the current one trains (data/epochs.py).

On a GPU, the host's seconds spent drawing an epoch's input variants or segmentation would leave the
device idle between epochs. A thread does not help: that work is Python, and would hold the interpreter
lock the training loop needs to launch its kernels. A worker process builds the epoch instead, spawned
(CUDA state is never forked), from a copy of what builds epochs. An epoch depends on its number and the
run's seed alone, so one built there is the one the trainer would have built; where the worker fails
(it ran out of memory, say), the trainer builds the epoch itself, and a fault of the building shows there.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

Said = list[tuple[Any, ...]]  # log lines: (format, *args)
Builder = Callable[[int, Callable[..., None]], Any]  # (epoch, say) -> what the epoch holds

_builder: Builder | None = None  # the worker's own copy


def _keep(builder: Builder) -> None:
    global _builder
    _builder = builder


def _build(epoch: int) -> tuple[Any, Said]:
    assert _builder is not None
    said: Said = []
    return _builder(epoch, lambda *line: said.append(line)), said


class EpochsAhead:
    """One worker process that builds the epoch asked for with `start`, for `take` to collect."""

    def __init__(self, builder: Builder) -> None:
        self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), _keep, (builder,))
        self._pending: tuple[int, Future[tuple[Any, Said]]] | None = None

    def start(self, epoch: int) -> None:
        """Build `epoch` (unless it is the one being built already)."""
        if self._pending is not None and self._pending[0] == epoch:
            return
        try:
            self._pending = (epoch, self._pool.submit(_build, epoch))
        except RuntimeError as e:  # a worker failed before: the trainer builds each epoch itself
            log.debug("no epoch built ahead: %s", e)
            self._pending = None

    def take(self, epoch: int) -> tuple[Any, Said] | None:
        """`epoch` as the worker built it and the lines it would have logged; None when it was not the
        epoch started (a resumed run asks for another first) or the worker failed."""
        if self._pending is None or self._pending[0] != epoch:
            return None
        future, self._pending = self._pending[1], None
        try:
            return future.result()
        except Exception as e:  # noqa: BLE001 - built here instead, where a fault of its own shows
            log.warning("epoch %d could not be built ahead (%s: %s); building it here", epoch + 1,
                        type(e).__name__, e)
            return None

    def close(self) -> None:
        """No more epochs: an epoch in the making is left to finish (seconds), none is started."""
        self._pool.shutdown(wait=False, cancel_futures=True)
