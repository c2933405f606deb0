"""Failed attempts within one request's fallback chain, told apart from the final attempt.

Envoy's router logs every attempt (its `upstream_log`), the HTTP connection manager logs the
request once, against the attempt that answered. The final attempt is therefore already an
observation; what this module adds is each *earlier* attempt, which failed and was followed
by an attempt at another target. It is known to have been followed only when the next
attempt's entry arrives, so a failed attempt waits here (bounded, by request id) until then.
A failed attempt that nobody followed was the final one: the request's own entry drops it
(`ended`), or, when that entry came first, it is evicted later.

Envoy 1.40 leaves the attempt count of per-attempt entries unset, so attempts are numbered
here by arrival: a request's attempts run one after another and are logged in that order
on one stream, and only a failure can be followed by another attempt.

Pairing keys on Envoy's request id. A failure waits at most `max_age_s` (the longest
deadline a request can have) and pairs only with an attempt of the same group, so an id
that comes back later (a client reusing one) cannot pair with a stale failure.

The per-attempt log leaves out attempts that answered without a failure flag
(envoy_config/observation_filters.py): the attempt after the last failure is known from
the request's own entry instead (`answered`: its target and its number of attempts). That
entry arrives on another stream, before, between or after the attempts' entries, so it
also says how many to expect: an answered request's attempts but the last (a caller's
hang-up flags only the request's entry: the openai SDK closes at `[DONE]`), every attempt
of a request that was not answered cleanly (`ended`: each failed or carried a flag). A
hedge's cancelled loser counts as one (`hedged_out`), its winner is never in the count
(access_log.py leaves it out). Each request waits here, bounded, until its count is
complete, whichever side comes first; then nothing of it is left.

Each followed failure yields one `Transition`: an observation against the failed target
(`failed_over`, so reliability signals see it) and the `fallback_transition` event.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.observe.records import Observation, Outcome

# Outcomes that end an attempt without an answer the caller can use: Envoy retries these.
_NOT_FAILURES = frozenset({Outcome.OK, Outcome.CLIENT_CANCEL, Outcome.CLIENT_ERROR})


@dataclass(frozen=True, slots=True)
class Attempt:
    request_id: str
    group: str
    target: str          # provider/model_ref
    outcome: Outcome
    duration_ms: float | None


@dataclass(frozen=True, slots=True)
class Transition:
    """One pre-commit failure and the target that took over; safe scalars only."""

    group: str
    from_target: str
    to_target: str
    error_class: str
    attempt: int
    failed_after_ms: float | None
    # Envoy's id of the request, for its telemetry row (not part of the event or equality).
    request_id: str = field(default="", compare=False)

    def observation(self) -> Observation:
        """Against the failed target; a prompt too long for its window is no failure of
        the target's, so it does not count in its fallback rate."""
        outcome = Outcome(self.error_class)
        return Observation(target=self.from_target, outcome=outcome,
                           latency_ms=self.failed_after_ms,
                           failed_over=outcome is not Outcome.CONTEXT_WINDOW)

    def event(self) -> dict[str, object]:
        failed_after = None if self.failed_after_ms is None else round(self.failed_after_ms, 1)
        return {"event": "fallback_transition", "group": self.group,
                "from_target": self.from_target, "to_target": self.to_target,
                "error_class": self.error_class, "attempt": self.attempt,
                "failed_after_ms": failed_after}


class AttemptTracker:
    def __init__(self, max_pending: int = 10_000, max_age_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # request id → entries that came before the request's own entry was complete:
        # (group, the latest failure if it was the latest entry, its number, entries, when)
        self._seen: OrderedDict[str, tuple[str, Attempt | None, int, int, float]] = (
            OrderedDict())
        # request id → (group, the target that answered — "" when none did —, attempts'
        # entries still to come, when its entry came)
        self._waiting: OrderedDict[str, tuple[str, str, int, float]] = OrderedDict()
        self._max_pending = max_pending
        self.max_age_s = max_age_s  # a reload may change it (the longest deadline)
        self._clock = clock

    def __len__(self) -> int:
        """Requests waiting for their other half: attempts' entries or the request's."""
        return len(self._seen) + len(self._waiting)

    def add(self, attempt: Attempt) -> list[Transition]:
        """One attempt's entry; returns the transitions it completes: from the failure
        before it, and, when it is the last failure of a request already answered, to
        the target that answered."""
        request_id = attempt.request_id
        if not request_id:
            return []
        now = self._clock()
        self._expire(now)
        transitions = []
        group, last, number, entries = self._taken(request_id, attempt.group)
        entries += 1
        if last is not None:
            transitions.append(Transition(group, last.target, attempt.target,
                                          last.outcome.value, number, last.duration_ms,
                                          request_id))
        failed = attempt if attempt.outcome not in _NOT_FAILURES else None
        answer = self._counted(request_id, group)
        if answer is not None:
            if failed is not None and answer:
                transitions.append(Transition(group, attempt.target, answer,
                                              attempt.outcome.value, entries,
                                              attempt.duration_ms, request_id))
            return transitions
        self._keep(request_id, (group, failed, entries, entries, now))
        return transitions

    def hedged_out(self, request_id: str, group: str) -> Transition | None:
        """A hedge's cancelled loser: one of the request's entries, and no link in its
        chain of failures (a failure before it still pairs with what comes next)."""
        if not request_id:
            return None
        now = self._clock()
        self._expire(now)
        group, last, number, entries = self._taken(request_id, group)
        answer = self._counted(request_id, group)
        if answer is None:
            self._keep(request_id, (group, last, number, entries + 1, now))
            return None
        if last is None or not answer:
            return None
        # The loser was the last entry counted: the failure before it pairs with the
        # target that answered (whichever came first, the same transition).
        return Transition(group, last.target, answer, last.outcome.value, number,
                          last.duration_ms, request_id)

    def answered(self, request_id: str, group: str, target: str,
                 attempts: int) -> Transition | None:
        """The request's own entry: `target` answered it at attempt `attempts`, after
        `attempts - 1` entries. Completes the transition from its last failure."""
        return self._request(request_id, group, target, attempts - 1)

    def ended(self, request_id: str, group: str, attempts: int) -> None:
        """The request's own entry, when it was not answered cleanly: each of its
        `attempts` is in the per-attempt log, and the last of them completes nothing."""
        self._request(request_id, group, "", attempts)

    def _request(self, request_id: str, group: str, target: str,
                 expected: int) -> Transition | None:
        if not request_id or expected < 1:
            return None
        now = self._clock()
        self._expire(now)
        seen = self._seen.get(request_id)
        if seen is not None and seen[0] != group:
            del self._seen[request_id]  # a stale entry of a reused id
            seen = None
        entries = seen[3] if seen is not None else 0
        if entries < expected:  # more on their way: the last of them completes this
            self._waiting.pop(request_id, None)  # (a reused id's goes to the back)
            self._waiting[request_id] = (group, target, expected - entries, now)
            while len(self._waiting) > self._max_pending:
                self._waiting.popitem(last=False)
            return None
        assert seen is not None
        del self._seen[request_id]
        _, last, number, _, _ = seen
        if last is None or not target or entries > expected:
            return None  # (more than expected: the answering attempt itself was logged)
        return Transition(group, last.target, target, last.outcome.value, number,
                          last.duration_ms, request_id)

    def _taken(self, request_id: str, group: str) -> tuple[str, Attempt | None, int, int]:
        """What came before of this request, taken out: (group, latest failure when it
        was the latest entry, its number, entries)."""
        seen = self._seen.pop(request_id, None)
        if seen is None or seen[0] != group:
            return group, None, 0, 0
        return seen[0], seen[1], seen[2], seen[3]

    def _counted(self, request_id: str, group: str) -> str | None:
        """One more entry of a request whose own entry came: None when none waits (or
        one of another group) or more are to come; for the last one, the target that
        answered ("" when none did)."""
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting[0] != group:
            return None
        _, target, to_come, when = waiting
        if to_come > 1:
            self._waiting[request_id] = (group, target, to_come - 1, when)  # keeps its place
            return None
        del self._waiting[request_id]
        return target

    def _keep(self, request_id: str, seen: tuple[str, Attempt | None, int, int, float]) -> None:
        self._seen[request_id] = seen
        while len(self._seen) > self._max_pending:
            self._seen.popitem(last=False)

    def _expire(self, now: float) -> None:
        """Entries are in arrival order, so the stale ones are at the front."""
        oldest = now - self.max_age_s
        seen, waiting = self._seen, self._waiting
        while seen and next(iter(seen.values()))[4] < oldest:
            seen.popitem(last=False)
        while waiting and next(iter(waiting.values()))[3] < oldest:
            waiting.popitem(last=False)
