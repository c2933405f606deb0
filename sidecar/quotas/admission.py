"""Quotas as the gateway and the sidecar's assembly see them: the counters, the ledger
that feeds them from the access log, the optional Redis reconciliation, and the 429."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping

from sidecar.config.models import SidecarConfig
from sidecar.config.secrets import read_secret
from sidecar.dialects.errors import ClientError
from sidecar.quotas.counters import LEASE_PENDING, QuotaCounters, Refusal
from sidecar.quotas.ledger import QuotaLedger
from sidecar.quotas.shared import ROUND_TIMEOUT_S, RedisReconciler

_LOCAL_SWEEP_S = 5.0


def has_quotas(config: SidecarConfig) -> bool:
    return any(caller.quotas is not None for caller in config.callers)


class Quotas:
    def __init__(self, config: SidecarConfig, max_request_s: float,
                 environ: Mapping[str, str] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.counters = QuotaCounters(config, wall_clock)
        self.ledger = QuotaLedger(config, self.counters, max_request_s, wall_clock=wall_clock)
        self.refusals: Tally[tuple[str]] = Tally()
        source = config.quotas.redis_url
        self.shared: RedisReconciler | None = None
        if source is not None:
            url = read_secret(source.env, source.file,
                              os.environ if environ is None else environ)
            self.shared = RedisReconciler(self.counters, config.quotas, url)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def reconfigure(self, config: SidecarConfig) -> None:
        """A reload's limits and prices; counts so far stay (the Redis settings need a
        restart)."""
        self.counters.configure(config)
        self.ledger.configure(config)

    def admit(self, caller: str, group: str, request_id: str) -> Refusal | None:
        if caller not in self.counters:
            return None
        refusal = self.counters.admit(caller, group)
        if refusal is not None:
            self.refusals[(refusal.reason,)] += 1
            return refusal
        self.ledger.admitted(request_id, caller, group)
        return None

    def expect(self, request_id: str, estimate: tuple[int, int]) -> None:
        """An admitted request's estimate, charged if its usage cannot be read."""
        self.ledger.expect(request_id, estimate)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self.shared.run_until(self._stopping)
                                      if self.shared is not None else self._sweep())

    async def _sweep(self) -> None:
        while not self._stopping.is_set():  # without Redis, only ended windows go
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), _LOCAL_SWEEP_S)
            for _ in self.counters.current():
                pass

    async def stop(self) -> None:
        """Ends the background rounds after a last one, within a bounded wait."""
        self._stopping.set()
        if self._task is not None:
            _done, pending = await asyncio.wait({self._task}, timeout=3 * ROUND_TIMEOUT_S)
            for task in pending:
                task.cancel()
        if self.shared is not None:
            await self.shared.close()

    def gauges(self) -> dict[str, float]:
        figures = {"quota_pending_usage": float(len(self.ledger))}
        if self.shared is not None:
            figures["quota_redis_up"] = 1.0 if self.shared.up else 0.0
        return figures


def refusal_error(refusal: Refusal) -> ClientError:
    if refusal.reason.endswith(LEASE_PENDING):
        return ClientError(429, "This gateway replica is waiting for its next share of this "
                                "caller's requests_per_minute (at its last count of all "
                                "replicas, the caller was under its limit); retry after "
                                f"{refusal.retry_after_s} s.", code="rate_limit_exceeded")
    scope, _, limit = refusal.reason.partition("_")
    which = "this caller's" if scope == "caller" else "this caller's limit for this model group:"
    return ClientError(429, f"Quota exceeded ({which} {limit}); retry after "
                            f"{refusal.retry_after_s} s.", code="rate_limit_exceeded")
