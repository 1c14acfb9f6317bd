"""What stops a run besides its epochs: the budget's clock, and the signals that ask it to stop."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Interrupt:
    """First SIGINT/SIGTERM: `requested` is set, so the loop finishes its step and saves; a second one
    stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. some launchers): no graceful stop
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("interrupt received: saving a checkpoint after this step (again to quit now)")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class TrainingClock:
    """Seconds of training, validation and checkpointing over every session of a run: what
    `training.max_minutes` budgets and the linear/cosine schedules follow. It moves only at `tick`, so
    a decision taken on it and the checkpoint written after that decision see the same time."""

    def __init__(self, max_minutes: float | None, seconds: float = 0.0,
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.max_minutes, self.seconds, self._now = max_minutes, seconds, now
        self._last = now()

    def start(self) -> None:
        """Count from now (a session's setup time is not training)."""
        self._last = self._now()

    def tick(self) -> None:
        """Add the time since the last tick."""
        now = self._now()
        self.seconds += now - self._last
        self._last = now

    def used(self) -> float:
        """The fraction of the budget spent (0 without one)."""
        return 0.0 if self.max_minutes is None else self.seconds / (self.max_minutes * 60)
