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
# Requests one process holds waiting for a lease at once (each also holds its parsed body,
# at most limits.max_request_body_bytes); past it, a spent lease refuses at once.
MAX_LEASE_WAITERS = 1024
# What Envoy's wait for the sidecar keeps back for the rest of the decision and the reply.
_DECISION_MARGIN_MS = 200


def has_quotas(config: SidecarConfig) -> bool:
    return any(caller.quotas is not None for caller in config.callers)


class Quotas:
    def __init__(self, config: SidecarConfig, max_request_s: float,
                 environ: Mapping[str, str] | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.counters = QuotaCounters(config, wall_clock)
        self.ledger = QuotaLedger(config, self.counters, max_request_s, wall_clock=wall_clock)
        self.refusals: Tally[tuple[str]] = Tally()
        # Requests that waited for a lease, by how it ended (admitted, refused, timeout).
        self.lease_waits: Tally[tuple[str]] = Tally()
        self.waiting = 0
        self._configure_wait(config)
        source = config.quotas.redis_url
        self.shared: RedisReconciler | None = None
        if source is not None:
            url = read_secret(source.env, source.file,
                              os.environ if environ is None else environ)
            self.shared = RedisReconciler(self.counters, config.quotas, url)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def reconfigure(self, config: SidecarConfig, max_request_s: float) -> None:
        """A reload's limits, prices and longest request; counts so far stay (the Redis
        settings need a restart)."""
        self.counters.configure(config)
        self.ledger.configure(config, max_request_s)
        self._configure_wait(config)

    def _configure_wait(self, config: SidecarConfig) -> None:
        self._lease_wait_ms = config.quotas.lease_wait_ms
        self._message_timeout_ms = config.limits.sidecar_message_timeout_ms

    def admit(self, caller: str, group: str, request_id: str) -> Refusal | None:
        """Admit and count, or the refusal. A refusal for a spent lease is not counted yet:
        the caller may still wait for it (`wait_budget_s`, `wait_for_lease`)."""
        if caller not in self.counters:
            return None
        refusal = self.counters.admit(caller, group)
        if refusal is not None:
            if not refusal.reason.endswith(LEASE_PENDING):
                self.refusals[(refusal.reason,)] += 1
            return refusal
        self.ledger.admitted(request_id, caller, group)
        return None

    def refused(self, refusal: Refusal) -> None:
        """A lease-pending refusal that is final after all."""
        self.refusals[(refusal.reason,)] += 1

    def wait_budget_s(self, refusal: Refusal, reserved_ms: int = 0) -> float:
        """How long a request refused for a spent lease may wait for the next one: 0 unless
        Redis answered the last round and fewer than MAX_LEASE_WAITERS wait; at most
        `quotas.lease_wait_ms`, and short enough that Envoy's wait for the sidecar
        (`limits.sidecar_message_timeout_ms`) also covers `reserved_ms` (an external
        group's routing service) and the rest of the decision."""
        if (self.shared is None or not self.shared.up or self.waiting >= MAX_LEASE_WAITERS
                or not refusal.reason.endswith(LEASE_PENDING)):
            return 0.0
        room = self._message_timeout_ms - reserved_ms - _DECISION_MARGIN_MS
        return max(0, min(self._lease_wait_ms, room)) / 1000

    async def wait_for_lease(self, caller: str, group: str, request_id: str,
                             budget_s: float) -> Refusal | None:
        """Wait for the quota rounds that renew the lease (each asked for at once) and admit
        the request, within `budget_s`; else the refusal then in force (a lease still
        pending, or over the limit). Never raises: the stream must be answered."""
        assert self.shared is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        self.waiting += 1
        outcome = "timeout"
        try:
            while (remaining := deadline - loop.time()) > 0:
                try:
                    answered = await asyncio.wait_for(self.shared.next_round(), remaining)
                except TimeoutError:
                    answered = False
                refusal = self.admit(caller, group, request_id)
                if refusal is None or not refusal.reason.endswith(LEASE_PENDING):
                    outcome = "admitted" if refusal is None else "refused"
                    return refusal
                if not answered:
                    break
            refusal = self.admit(caller, group, request_id)  # the wait is over: as it stands
            if refusal is None:
                outcome = "admitted"
            elif refusal.reason.endswith(LEASE_PENDING):
                self.refused(refusal)
            else:
                outcome = "refused"
            return refusal
        finally:
            self.waiting -= 1
            self.lease_waits[(outcome,)] += 1

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
        if self.shared is not None:
            self.shared.wake.set()
        if self._task is not None:
            _done, pending = await asyncio.wait({self._task}, timeout=3 * ROUND_TIMEOUT_S)
            for task in pending:
                task.cancel()
        if self.shared is not None:
            await self.shared.close()

    def gauges(self) -> dict[str, float]:
        figures = {"quota_pending_usage": float(len(self.ledger)),
                   "quota_lease_waiting": float(self.waiting)}
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
