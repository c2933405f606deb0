"""The console's recent decisions: a bounded in-memory ring, per replica (docs/console.md).

Fed where the gateway has just decided (one append of references already built: the
decision's trace, its primary's label) and by the access log's results, which say who
served, how it ended and which attempts failed on the way. Nothing of a request's text is
held: the trace carries labels, bucket names and numbers only (routing/trace.py), the
rest are the caller's configured name, the group and Envoy's request id. Bounded twice:
`capacity` decisions (the oldest leaves), and `MAX_ATTEMPTS` failed attempts each.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sidecar.observe.attempts import Transition
from sidecar.observe.records import Outcome, request_failed
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.trace import DecisionTrace
from sidecar.telemetry.results import RequestResult

CAPACITY = 2_000
MAX_ATTEMPTS = 8

MAX_ID_CHARS = 128  # Envoy's request id is a UUID; a caller may send a longer one

# A decision's outcome, as the console filters it: `failed` by the rule the canary guards
# and reports use (observe/records.request_failed: a caller's hang-up, its own 4xx and a
# prompt too long for the window are not the target's failures); `cancelled` the caller
# hung up; `hedged` another target of the decision answered first, nothing failed.
PENDING, SERVED, FALLBACK, HEDGED, CANCELLED, FAILED, REFUSED = (
    "pending", "served", "fallback", "hedged", "cancelled", "failed", "refused")
OUTCOMES = (PENDING, SERVED, FALLBACK, HEDGED, CANCELLED, FAILED, REFUSED)


@dataclass(slots=True)
class RecentDecision:
    request_id: str
    at: float                 # wall clock, when decided
    caller: str
    group: str
    trace: DecisionTrace
    primary: str | None       # None: no target could serve (`refusal` says why)
    refusal: str | None = None
    status: int | None = None
    served_by: str | None = None
    attempts: int = 0
    error_class: str | None = None
    latency_ms: float | None = None
    ttfb_ms: float | None = None
    failed_attempts: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.primary is None:
            return REFUSED
        if self.status is None:
            return PENDING
        if request_failed(self.status, self.error_class):
            return FAILED
        if self.error_class == Outcome.CLIENT_CANCEL:
            return CANCELLED
        if self.failed_attempts:
            return FALLBACK
        if self.served_by not in (None, self.primary):
            return HEDGED
        return SERVED


class DecisionRing:
    """The last `capacity` decisions and how they ended; an access-log sink (FanOut)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, RecentDecision] = OrderedDict()
        self.decided_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def decided(self, request_id: str, at: float, caller: str,
                decision: Decision | NoEligibleTarget) -> None:
        if not request_id or len(request_id) > MAX_ID_CHARS:
            return
        if isinstance(decision, Decision):
            entry = RecentDecision(request_id, at, caller, decision.group, decision.trace,
                                   decision.primary.label)
        else:
            entry = RecentDecision(request_id, at, caller, decision.group, decision.trace,
                                   None, refusal=decision.reason)
        entries = self._entries
        entries.pop(request_id, None)  # an id seen twice: the later decision stands
        entries[request_id] = entry
        if len(entries) > self._capacity:
            entries.popitem(last=False)
        self.decided_total += 1

    def wants(self, request_id: str) -> bool:
        return request_id in self._entries

    def finished(self, result: RequestResult) -> None:
        entry = self._entries.get(result.request_id)
        if entry is None:
            return
        entry.status = result.status
        entry.served_by = result.serving_target
        entry.attempts = result.attempts
        entry.error_class = result.error_class
        entry.latency_ms = result.latency_ms
        entry.ttfb_ms = result.ttfb_ms

    def fallback(self, transition: Transition) -> None:
        entry = self._entries.get(transition.request_id)
        if entry is not None and len(entry.failed_attempts) < MAX_ATTEMPTS:
            entry.failed_attempts.append((transition.from_target, transition.error_class,
                                          transition.to_target))

    def recent(self) -> list[RecentDecision]:
        """Newest first; a copy of the references (the page is built off the event loop,
        while the ring goes on changing)."""
        return list(reversed(self._entries.values()))

    def get(self, request_id: str) -> RecentDecision | None:
        return self._entries.get(request_id)
