"""The join: a decision (ext_proc) and its outcome (Envoy's access log), by Envoy's request id.

It runs in the telemetry worker process (worker.py), which receives the decisions and the
access log's results from the sidecar in the order they happened, and hands each pair on
unbuilt (`JoinedRequest`): rows are made on the worker's writer thread. The pending map is
bounded twice: by size (`max_pending`; the oldest decision is written without its outcome,
`evicted`) and by age (`max_age_s`, the longest a request can take; then `decision_only`).
An outcome with no decision (Envoy answered before ext_proc, or the decision was evicted)
is written as `log_only` (a request no target served and no decision saw, e.g. one refused
for its token, makes no row); an id decided twice is a collision (`duplicate_id`), never
one request. The clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from sidecar.observe.attempts import Transition
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import DecisionRecord, FallbackRow, JoinedRequest

Clock = Callable[[], float]
Emit = Callable[[JoinedRequest | FallbackRow], object]


class Joiner:
    def __init__(self, emit: Emit, max_pending: int = 65_536, max_age_s: float = 3600.0,
                 clock: Clock = time.monotonic, wall_clock: Clock = time.time) -> None:
        self._emit = emit
        self._max_pending = max_pending
        self.max_age_s = max_age_s  # a reload may lengthen it
        self._clock = clock
        self._wall = wall_clock
        self._pending: OrderedDict[str, tuple[float, DecisionRecord]] = OrderedDict()
        self.evicted = 0
        self.expired = 0
        self.log_only = 0
        self.duplicates = 0
        self.unrouted = 0

    def __len__(self) -> int:
        return len(self._pending)

    def decided(self, decision: DecisionRecord) -> None:
        """Remember the decision until its outcome comes."""
        earlier = self._pending.pop(decision.request_id, None)
        if earlier is not None:
            self.duplicates += 1
            self._write(earlier[1], None, "duplicate_id")
        elif len(self._pending) >= self._max_pending:
            _, (_, oldest) = self._pending.popitem(last=False)
            self.evicted += 1
            self._write(oldest, None, "evicted")
        self._pending[decision.request_id] = (self._clock(), decision)

    def wants(self, request_id: str) -> bool:
        return True  # every request has a row, joined or log-only

    def finished(self, result: RequestResult) -> None:
        """The request's access-log entry arrived: one joined row (or a log-only one)."""
        entry = self._pending.pop(result.request_id, None)
        if entry is not None:
            self._write(entry[1], result, "joined")
        elif result.serving_target is not None:
            self.log_only += 1
            self._write(None, result, "log_only")
        else:  # refused before any decision (authentication, unknown path …): no row
            self.unrouted += 1

    def fallback(self, transition: Transition) -> None:
        """A pre-commit failure another target took over: one fallback row."""
        self._emit(FallbackRow(transition.request_id, self._wall(), transition.group,
                               transition.from_target, transition.to_target,
                               transition.attempt, transition.error_class))

    def sweep(self, everything: bool = False) -> None:
        """Write the decisions whose outcome can no longer come (called periodically), or
        all that wait (`everything`: the sidecar stopped)."""
        horizon = float("inf") if everything else self._clock() - self.max_age_s
        while self._pending:
            request_id, (since, decision) = next(iter(self._pending.items()))
            if since > horizon:
                break
            del self._pending[request_id]
            self.expired += 1
            self._write(decision, None, "decision_only")

    def _write(self, decision: DecisionRecord | None, result: RequestResult | None,
               join: str) -> None:
        self._emit(JoinedRequest(decision, result, join, self._wall()))
