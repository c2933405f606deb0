"""Rate-limited logging: whatever a peer does, it cannot make the server write more than a
few lines a minute.

One token bucket per kind of message (protocol errors, undecodable messages, handler
failures, ...): `burst` lines at once, refilled at `burst` per `interval`. A line that finds
its bucket empty is dropped and counted; the next line of that kind that gets through is
preceded by one "suppressed N similar messages" line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol


class _SuppressedCounter(Protocol):
    log_lines_suppressed: int


class _Bucket:
    __slots__ = ("stamp", "suppressed", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp
        self.suppressed = 0


class LogLimiter:
    def __init__(self, logger: logging.Logger, burst: int, interval: float,
                 clock: Callable[[], float] = time.monotonic,
                 counters: _SuppressedCounter | None = None) -> None:
        self._logger = logger
        self._burst = float(burst)
        self._rate = burst / interval
        self._clock = clock
        self._counters = counters
        self._buckets: dict[str, _Bucket] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        if self.allow(kind):
            self._logger.warning(message, *args)

    def exception(self, kind: str, message: str, *args: object) -> None:
        """ERROR with the traceback of the exception being handled."""
        if self.allow(kind):
            self._logger.error(message, *args, exc_info=True)

    def allow(self, kind: str) -> bool:
        """Whether a line of `kind` may be written now (if so, after the summary of what
        was held back before it)."""
        now = self._clock()
        bucket = self._buckets.get(kind)
        if bucket is None:
            bucket = self._buckets[kind] = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self._rate)
            bucket.stamp = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            self._summarize(kind, bucket)
            return True
        bucket.suppressed += 1
        if self._counters is not None:
            self._counters.log_lines_suppressed += 1
        return False

    def flush(self) -> None:
        """Write the summary of every kind with lines held back (e.g. at stop)."""
        for kind, bucket in self._buckets.items():
            self._summarize(kind, bucket)

    def _summarize(self, kind: str, bucket: _Bucket) -> None:
        if bucket.suppressed:
            self._logger.warning("suppressed %d similar messages (%s)", bucket.suppressed, kind)
            bucket.suppressed = 0
