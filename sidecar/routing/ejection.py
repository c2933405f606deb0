"""Ejection with memory and recovery by probing (docs/routing-under-drift.md).

A threshold alone only filters the current window: when a drained target's bad evidence
ages out it would count as cold again and get its full configured share while still sick.
So a target that fails a threshold is *ejected* for a while (longer on repeated ejections,
as in Envoy's outlier detection), then *probed*: it gets at most one request in
`PROBE_INTERVAL` decisions of its group, as the primary of a decision whose usual targets
follow as fallbacks (a failed probe costs the caller nothing). After `PROBE_SUCCESSES`
probes within the thresholds it re-enters at once, judged from then on by what it has done
since (its window restarts), not after its old observations expire; a failed probe ejects
it again for longer.

State per group, on the router's injectable clock; pure (no I/O). Keyed by target label
(`provider/model_ref`), like the observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.routing.affinity import Clock

# Probing: one decision in this many may carry a probe (per group), and this many probes
# within the thresholds bring a target back.
PROBE_INTERVAL = 20
PROBE_SUCCESSES = 3
# An ejection lasts base × 2^(n−1) for the n-th in a row, at most base × MAX_BACKOFF; a
# target that stayed in for MAX_BACKOFF × base since it re-entered starts again from 1.
MAX_BACKOFF = 8
MIN_BASE_SECONDS = 5.0


class Health(StrEnum):
    IN = "in"
    EJECTED = "ejected"
    PROBING = "probing"


@dataclass(slots=True)
class _Ejected:
    until: float
    count: int


@dataclass(slots=True)
class _Reentered:
    at: float
    count: int


class Ejections:
    """One group's ejected, probing and recently re-entered targets."""

    def __init__(self, window_seconds: int, clock: Clock) -> None:
        # Half a window: long enough not to flap, short enough that a target that recovered
        # is probed well within one window.
        self.base_seconds = max(MIN_BASE_SECONDS, window_seconds / 2)
        self._window = window_seconds
        self._clock = clock
        self._ejected: dict[str, _Ejected] = {}
        self._reentered: dict[str, _Reentered] = {}
        self._decisions = 0

    def now(self) -> float:
        return self._clock()

    @property
    def idle(self) -> bool:
        """Nothing ejected, probing or recently re-entered: the common case, which costs a
        decision nothing more."""
        return not self._ejected and not self._reentered

    def health(self, label: str, now: float) -> Health:
        state = self._ejected.get(label)
        if state is None:
            return Health.IN
        return Health.EJECTED if now < state.until else Health.PROBING

    def probing_seconds(self, label: str, now: float) -> int:
        """How far back a probing target's evidence reaches: since its ejection ended."""
        return max(1, int(now - self._ejected[label].until) + 1)

    def window_for(self, label: str, now: float) -> int:
        """The observation window to judge `label` by: since it re-entered, until a whole
        window has passed (so old evidence from before its ejection does not count)."""
        back = self._reentered.get(label)
        if back is None:
            return self._window
        if now - back.at >= max(self._window, MAX_BACKOFF * self.base_seconds):
            del self._reentered[label]  # long since back: forgotten, the group goes idle
            return self._window
        since = int(now - back.at) + 1
        return self._window if since >= self._window else max(1, since)

    def eject(self, label: str, now: float) -> None:
        previous = self._ejected.get(label)
        back = self._reentered.pop(label, None)
        if previous is not None:
            count = previous.count + 1
        elif back is not None and now - back.at < MAX_BACKOFF * self.base_seconds:
            count = back.count + 1
        else:
            count = 1
        factor = min(2 ** (count - 1), MAX_BACKOFF)
        self._ejected[label] = _Ejected(now + self.base_seconds * factor, count)

    def reenter(self, label: str, now: float) -> None:
        state = self._ejected.pop(label)
        self._reentered[label] = _Reentered(now, state.count)

    def probe_due(self) -> bool:
        """Whether this decision of the group may carry a probe (one in PROBE_INTERVAL)."""
        self._decisions += 1
        return self._decisions % PROBE_INTERVAL == 0

    def ejected_count(self) -> int:
        return len(self._ejected)
