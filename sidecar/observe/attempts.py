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
the request's own entry instead (`answered`: its target and its number of attempts).
That entry arrives on another stream, before, between or after the failures; until the
attempt count's failures have all arrived it waits (bounded like the failures). A caller's
hang-up flags that entry but not the attempt (the openai SDK closes at `[DONE]`), so it
still pairs (access_log.py). When the answering attempt is in the per-attempt log itself
(it carried a flag: a hedge's primary past the hedge deadline) or a hedge's cancelled
loser is, the request is *settled*: its own entry completes nothing and ends the wait
(`ended` for entries that pair nothing), so nothing stays behind whichever comes first.

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
        # request id → (its latest attempt, which failed; that attempt's number; when seen)
        self._pending: OrderedDict[str, tuple[Attempt, int, float]] = OrderedDict()
        # request id → (group, the target that answered, failures still to come, when seen)
        self._answers: OrderedDict[str, tuple[str, str, int, float]] = OrderedDict()
        # request id → when seen: requests of several attempts whose answering attempt (or
        # hedge loser) was in the per-attempt log, so their own entry, which ends the
        # wait (`answered` or `ended`), has nothing left to complete.
        self._settled: OrderedDict[str, float] = OrderedDict()
        self._max_pending = max_pending
        self.max_age_s = max_age_s  # a reload may change it (the longest deadline)
        self._clock = clock

    def __len__(self) -> int:
        """Entries waiting for their other half: failures, answered and settled requests."""
        return len(self._pending) + len(self._answers) + len(self._settled)

    def add(self, attempt: Attempt) -> list[Transition]:
        """Record one attempt's entry; returns the transitions it completes: from the
        failure before it, and, when it is the last failure of a request already
        answered, to the target that answered."""
        now = self._clock()
        self._expire(now)
        request_id = attempt.request_id
        if not request_id:
            return []
        previous = self._pending.pop(request_id, None)
        transitions = []
        number = 1
        if previous is not None and previous[0].group == attempt.group:
            failed, failed_number, _ = previous
            number = failed_number + 1
            transitions.append(Transition(failed.group, failed.target, attempt.target,
                                          failed.outcome.value, failed_number,
                                          failed.duration_ms, request_id))
        if attempt.outcome in _NOT_FAILURES:
            if number > 1 or request_id in self._answers:
                # The attempt that answered is in this log itself (it carried a flag): the
                # request's own entry has nothing to complete, before or after this one.
                self._settle(request_id, now)
            return transitions
        answer = self._answers.get(request_id)
        if answer is not None and answer[0] == attempt.group:
            group, target, to_come, seen = answer
            if to_come <= 1:
                del self._answers[request_id]
                transitions.append(Transition(group, attempt.target, target,
                                              attempt.outcome.value, number,
                                              attempt.duration_ms, request_id))
                return transitions
            self._answers[request_id] = (group, target, to_come - 1, seen)  # keeps its place
        self._pending[request_id] = (attempt, number, now)
        while len(self._pending) > self._max_pending:
            self._pending.popitem(last=False)
        return transitions

    def answered(self, request_id: str, group: str, target: str,
                 attempts: int) -> Transition | None:
        """The request's own entry: `target` answered it at attempt `attempts`. Completes
        the transition from its last failure, or waits for its failures to arrive."""
        now = self._clock()
        self._expire(now)
        if not request_id or attempts < 2 or self._settled.pop(request_id, None) is not None:
            return None
        to_come = attempts - 1
        previous = self._pending.get(request_id)
        if previous is not None and previous[0].group != group:
            del self._pending[request_id]  # a stale failure of a reused id
        elif previous is not None:
            failed, number, _ = previous
            if number >= to_come:
                del self._pending[request_id]
                return Transition(group, failed.target, target, failed.outcome.value,
                                  number, failed.duration_ms, request_id)
            # Later failures are still on their way (the streams interleave): the last
            # of them completes this answer, the one waiting pairs with the next.
            to_come -= number
        self._answers[request_id] = (group, target, to_come, now)
        while len(self._answers) > self._max_pending:
            self._answers.popitem(last=False)
        return None

    def ended(self, request_id: str, group: str, attempts: int) -> None:
        """The request's own entry, when it completes nothing (it was not answered
        cleanly): a settled request is done with, and a failure already here that was its
        last attempt has nothing to wait for. (A last failure that arrives after this
        entry waits out the window, as one that no entry ever ends.)"""
        if self._settled.pop(request_id, None) is not None:
            return
        pending = self._pending.get(request_id)
        if pending is not None and pending[0].group == group and pending[1] >= attempts:
            del self._pending[request_id]

    def forget(self, request_id: str) -> None:
        """A request whose attempts pair with nothing more (a hedge's cancelled loser):
        its own entry, if it comes later, completes nothing."""
        if self._answers.pop(request_id, None) is None and request_id:
            self._settle(request_id, self._clock())

    def _settle(self, request_id: str, now: float) -> None:
        if self._answers.pop(request_id, None) is not None:
            return  # the request's entry came first: nothing waits for it any more
        self._settled[request_id] = now
        self._settled.move_to_end(request_id)
        while len(self._settled) > self._max_pending:
            self._settled.popitem(last=False)

    def _expire(self, now: float) -> None:
        """Entries are in arrival order, so the stale ones are at the front."""
        oldest = now - self.max_age_s
        pending, answers, settled = self._pending, self._answers, self._settled
        while pending and next(iter(pending.values()))[2] < oldest:
            pending.popitem(last=False)
        while answers and next(iter(answers.values()))[3] < oldest:
            answers.popitem(last=False)
        while settled and next(iter(settled.values())) < oldest:
            settled.popitem(last=False)
