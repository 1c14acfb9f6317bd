"""The next training epoch built in a worker process while the current one trains (data/epochs.py).

On a GPU, the host's seconds spent drawing an epoch's input variants or segmentation would leave the
device idle between epochs. A thread does not help: that work is Python, and would hold the interpreter
lock the training loop needs to launch its kernels. A worker process builds the epoch instead, spawned
(CUDA state is never forked), from a copy of what builds epochs. An epoch depends on its number and the
run's seed alone, so one built there is the one the trainer would have built.
"""

from __future__ import annotations

import multiprocessing
import weakref
from collections.abc import Callable
from multiprocessing.pool import AsyncResult
from typing import Any

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
        self._pool = multiprocessing.get_context("spawn").Pool(1, _keep, (builder,))
        self._pending: tuple[int, AsyncResult] | None = None
        self._closed = weakref.finalize(self, self._pool.terminate)  # (a run that ends does not wait)

    def start(self, epoch: int) -> None:
        self._pending = (epoch, self._pool.apply_async(_build, (epoch,)))

    def take(self, epoch: int) -> tuple[Any, Said] | None:
        """`epoch` as the worker built it and the lines it would have logged, or None when it was not
        the epoch started (a resumed run asks for another). A failure there is raised here."""
        if self._pending is None or self._pending[0] != epoch:
            return None
        result, self._pending = self._pending[1], None
        return result.get()

    def close(self) -> None:
        self._closed()
