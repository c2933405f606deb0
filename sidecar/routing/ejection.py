"""Ejection with memory and recovery by probing (docs/routing-under-drift.md).

A threshold alone only filters the current window: when a drained target's bad evidence
ages out it would count as cold again and get its full configured share while still sick.
So a target that fails a threshold is *ejected* for a while (longer on repeated ejections,
as in Envoy's outlier detection, but never past a third of a window, so that a target that
recovered is back within one), then *probed*: one request at a time, at most one in
`PROBE_INTERVAL` decisions of its group (never a pinned conversation's turn), as the primary
of a decision whose usual targets follow as fallbacks (a failed probe costs the caller
nothing); as good answers accumulate, probes come faster and several may be in flight
(`probe_pace`, a slow start). Its probes are judged on exactly what was observed since
probing began (a tally of the observation store, not a window), as a sequential test with
the thresholds' standard of evidence both ways (routing/thresholds.py): it is ejected again
as soon as a rate's lower confidence bound is over its limit (a first probe that fails does
that), and re-enters once it has at least `PROBE_SUCCESSES` probes and every rate's *upper*
bound is under its limit (issue #31: three good probes in a row re-admitted a target
failing 10 % of its requests 73 % of the time). With `max_error_rate: 0.03` at 0.95 that
takes 88 good probes. A first probe unanswered for longer than the longest ejection has
failed. It re-enters warm with that evidence, so it gets its live score, not its cold
weight; until a whole window has passed it is judged by what it did since probing began.
While out, it is still the last fallback of decisions it is eligible for (dynamic_score.py).

Issue 41 bounds what a target that is still sick gets. A probing round ends on weaker
evidence than the thresholds' (futility: `judge_probes` at one-sided 84 %, not 95 %): a
target failing 10 % of its requests answered some thirty probes before the 95 % bound
showed it. And probes are paid for: a round
that ends in failure is followed by an ejection at least as long, in the group's decisions,
as its probes need to stay at `PROBE_SHARE` of the decisions since the target first left
(`_Ejected.hold`). So at the start of every probing round this replica's probes to a target
that left are at most `PROBE_SHARE` of its group's decisions since, whatever the number of
targets, and a fleet's replicas, each bound by its own decisions, are bound together.

State per group, on the router's injectable clock; pure (no I/O). Keyed by target label
(`provider/model_ref`), like the observations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from sidecar.routing.affinity import Clock
from sidecar.routing.observations import ObservationView, TargetObservations

# Probing starts one at a time, at most one in this many decisions of the group; no target
# re-enters on fewer observations than this.
PROBE_INTERVAL = 10
PROBE_SUCCESSES = 3
# How probing speeds up with its evidence, like a TCP slow start: the interval halves with
# every answer (never under MIN_PROBE_INTERVAL), and every answer lets one more probe be in
# flight (at most MAX_IN_FLIGHT). A target that answers well is probed at up to one
# decision in two within a few round trips; one that fails is ejected by its first failures
# (the sequential test), before many probes are out.
MIN_PROBE_INTERVAL = 2
MAX_IN_FLIGHT = 16
# The n-th ejection in a row lasts base × 2^(n−1), base = window / BASE_FRACTION (at least
# MIN_BASE_SECONDS), never more than window / MAX_FRACTION; a target ejected again within a
# window of its re-entry continues the count.
BASE_FRACTION = 6
MAX_FRACTION = 3
MIN_BASE_SECONDS = 5.0
# The most a target that left may take of its group's decisions in probes, over its time out
# (checked at the start of every probing round; docs/routing-under-drift.md states it). Half
# the goal of 1 %: the figure is measured from the drain on, and the round under way adds
# to it (bench/results/probe_share.md: 1 % gave 1.1-1.5 % at a 30 s window).
PROBE_SHARE = 0.005


def probe_pace(evidence: int) -> tuple[int, int]:
    """(one probe in this many decisions, at most this many in flight) after `evidence`
    answers: 1 in 10 and one at a time at first, 1 in 5 and two after one answer, 1 in 2
    and four after three (issue #31: one in ten, one at a time, took minutes to collect the
    evidence re-admission needs at a few requests a second)."""
    interval = max(MIN_PROBE_INTERVAL, PROBE_INTERVAL >> min(evidence, 8))
    return interval, min(MAX_IN_FLIGHT, 1 + evidence)


class Health(StrEnum):
    IN = "in"
    EJECTED = "ejected"
    PROBING = "probing"


@dataclass(slots=True)
class _Episode:
    """A target's time out, from when it first left (an ejection within a window of its
    re-entry continues it): the group's decision count then and this replica's probes since."""

    left_at: int
    spent: int = 0

    def hold(self) -> int:
        """The decision count before which no probing round may start: probes at most
        PROBE_SHARE of the decisions since the target left."""
        return self.left_at + math.ceil(self.spent / PROBE_SHARE)


@dataclass(slots=True)
class _Ejected:
    until: float
    count: int
    episode: _Episode
    hold: int = 0                 # out until the group's decision count reaches this too
    tally: object = None          # taken when probing begins
    probes: int = 0               # probes sent (counting evidence that came in regardless)
    probe_at: float = -math.inf   # when the last one was sent


@dataclass(slots=True)
class _Reentered:
    at: float
    count: int
    tally: object
    episode: _Episode


class Ejections:
    """One group's ejected, probing and recently re-entered targets."""

    def __init__(self, window_seconds: int, clock: Clock) -> None:
        self.base_seconds = max(MIN_BASE_SECONDS, window_seconds / BASE_FRACTION)
        self.max_seconds = max(self.base_seconds, window_seconds / MAX_FRACTION)
        self._window = window_seconds
        self._clock = clock
        self._ejected: dict[str, _Ejected] = {}
        self._reentered: dict[str, _Reentered] = {}
        self._decisions = 0   # decisions that could carry a probe (the probe pace's count)
        self._seen = 0        # every decision while anything is out (the probe share's count)
        # With fleet sharing (fleet/ejections.py): this replica's own ejections and
        # re-entries since the last round, as (label, ejected until or None: back in, count).
        self.journal: list[tuple[str, float | None, int]] | None = None

    def now(self) -> float:
        return self._clock()

    @property
    def idle(self) -> bool:
        """Nothing ejected, probing or recently re-entered: the common case, which costs a
        decision nothing more."""
        return not self._ejected and not self._reentered

    def decided(self) -> None:
        """Count one decision of the group (called while it is not idle): what the probe
        share is measured against."""
        self._seen += 1

    def health(self, label: str, now: float) -> Health:
        state = self._ejected.get(label)
        if state is None:
            return Health.IN
        if now < state.until or self._seen < state.hold:
            return Health.EJECTED
        return Health.PROBING

    def ejected_until(self, label: str) -> float:
        """When (this clock) `label`'s ejection ends (probing may start); -inf when in."""
        state = self._ejected.get(label)
        return -math.inf if state is None else state.until

    def probe_evidence(self, label: str, observations: ObservationView) -> TargetObservations:
        """What a probing target has done since probing began (the tally is taken at the
        first decision that finds it probing: late replies to requests sent before the
        ejection do not count)."""
        state = self._ejected[label]
        if state.tally is None:
            state.tally = observations.tally(label)
        return observations.since(label, state.tally)

    def observed(self, label: str, now: float, observations: ObservationView
                 ) -> TargetObservations | None:
        """A re-entered target's figures: what it did since probing began, until a whole
        window has passed (then None: its ordinary window applies)."""
        back = self._reentered.get(label)
        if back is None:
            return None
        if now - back.at >= self._window:
            del self._reentered[label]  # long since back: forgotten, the group goes idle
            return None
        if back.tally is None:  # re-entered on another replica's probes
            back.tally = observations.tally(label)
        return observations.since(label, back.tally)

    def reentered(self, label: str) -> bool:
        return label in self._reentered

    def eject(self, label: str, now: float) -> None:
        previous = self._ejected.get(label)
        back = self._reentered.pop(label, None)
        if previous is not None:
            count, episode = previous.count + 1, previous.episode
        elif back is not None:
            count, episode = back.count + 1, back.episode
        else:
            count, episode = 1, _Episode(self._seen)
        seconds = min(self.base_seconds * 2 ** min(count - 1, 16), self.max_seconds)
        self._ejected[label] = _Ejected(now + seconds, count, episode, episode.hold())
        if self.journal is not None:
            self.journal.append((label, now + seconds, count))

    def reenter(self, label: str, now: float) -> None:
        state = self._ejected.pop(label)
        self._reentered[label] = _Reentered(now, state.count, state.tally, state.episode)
        if self.journal is not None:
            self.journal.append((label, None, state.count))

    def ejected_elsewhere(self, label: str, until: float, count: int) -> None:
        """Another replica ejected `label` until `until` (this clock): out here too, at
        least as long (never longer than the longest ejection from now: what Redis says is
        not trusted further); its probes start here when that ejection ends."""
        until = min(until, self._clock() + self.max_seconds)
        state = self._ejected.get(label)
        if state is not None:
            if until > state.until:  # probing here, failed there: probing starts afresh
                self._ejected[label] = _Ejected(until, max(state.count, count),
                                                state.episode, state.episode.hold())
            return
        back = self._reentered.pop(label, None)
        episode = back.episode if back is not None else _Episode(self._seen)
        self._ejected[label] = _Ejected(until, count, episode, episode.hold())

    def reentered_elsewhere(self, label: str, now: float) -> None:
        """Another replica's probes brought `label` back: in here too, judged on what it
        does from now on (the tally is taken at the next decision) until a window passed."""
        state = self._ejected.pop(label, None)
        if state is not None:
            self._reentered[label] = _Reentered(now, state.count, None, state.episode)

    def probe_due(self, label: str, now: float, evidence: int) -> bool:
        """Whether this decision carries a probe to `label` (`evidence`: observations since
        probing began): at the pace `probe_pace` gives that evidence. A target that answers
        slowly is probed slowly (few in flight), and every probe in flight is a request it
        may fail, which the sequential test then sees."""
        self._decisions += 1
        interval, in_flight = probe_pace(evidence)
        if self._decisions % interval:
            return False
        state = self._ejected[label]
        if state.probes - evidence >= in_flight:
            return False
        state.probes = max(state.probes, evidence) + 1
        state.probe_at = now
        state.episode.spent += 1
        return True

    def probe_overdue(self, label: str, now: float, evidence: int) -> bool:
        """The last probe has gone unanswered for longer than the longest ejection: a
        failed probe (a target that slow is not well), so its late answer, which would
        land in the next probing's tally otherwise, cannot hold back a recovered target."""
        state = self._ejected[label]
        return evidence < state.probes and now - state.probe_at > self.max_seconds

    def ejected_count(self) -> int:
        return len(self._ejected)
