"""Tokens and spend of admitted requests, counted when their access-log entry arrives.

The access log names the request by Envoy's request id and the serving target, not the
caller: the ledger remembers, per admitted request, its caller, group and start, and drops
what no entry claims within the longest request deadline (or beyond `max_pending`, the
oldest first). Prices are the serving target's `pricing`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from sidecar.config.models import SidecarConfig
from sidecar.observe.attempts import Transition
from sidecar.quotas.counters import QuotaCounters
from sidecar.telemetry.results import RequestResult, usage_charged
from sidecar.telemetry.rows import cost_usd


class QuotaLedger:
    def __init__(self, config: SidecarConfig, counters: QuotaCounters, max_age_s: float,
                 max_pending: int = 65_536,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._counters = counters
        self.configure(config)
        self.max_age_s = max_age_s
        self._max_pending = max_pending
        self._clock = clock
        self._wall = wall_clock
        # request id → (caller, group, wall-clock start, monotonic start)
        self._pending: OrderedDict[str, tuple[str, str, float, float]] = OrderedDict()
        # request id → (estimated input, output budget): charged when no usage is read
        self._estimates: dict[str, tuple[int, int]] = {}
        self.unclaimed = 0

    def configure(self, config: SidecarConfig, max_age_s: float | None = None) -> None:
        """Prices, and after a reload the longest a request can now take."""
        self._prices = config.target_prices
        if max_age_s is not None:
            self.max_age_s = max_age_s

    def __len__(self) -> int:
        return len(self._pending)

    def admitted(self, request_id: str, caller: str, group: str) -> None:
        if not request_id:
            return
        now = self._clock()
        self._pending[request_id] = (caller, group, self._wall(), now)
        while self._pending:
            oldest, entry = next(iter(self._pending.items()))
            if len(self._pending) <= self._max_pending and now - entry[3] < self.max_age_s:
                break
            del self._pending[oldest]
            self._estimates.pop(oldest, None)
            self.unclaimed += 1

    def expect(self, request_id: str, estimate: tuple[int, int]) -> None:
        """The decision's estimate of an admitted request (telemetry/rows.py,
        usage_charged): what it is charged if its reply's usage cannot be read."""
        if request_id in self._pending:
            self._estimates[request_id] = estimate

    def wants(self, request_id: str) -> bool:
        """Only requests of callers with quotas are pending here."""
        return request_id in self._pending

    def finished(self, result: RequestResult) -> None:
        """The access log's entry for a request (the TelemetrySink interface)."""
        entry = self._pending.pop(result.request_id, None)
        estimate = self._estimates.pop(result.request_id, None)
        if entry is None:
            return
        caller, group, started, _ = entry
        result, _source = usage_charged(result, estimate)
        tokens = (result.input_tokens or 0) + (result.output_tokens or 0)
        cost = cost_usd(self._prices.get(result.serving_target or ""), result) or 0.0
        self._counters.used(caller, group, tokens, cost, started)

    def fallback(self, transition: Transition) -> None:
        """Fallback transitions cost nothing by themselves."""
