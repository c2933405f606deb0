"""Quota counters over UTC windows, and the admission check that reads them.

Pure and clocked: no I/O. A counter holds `known` (the total of all replicas at the last
reconciliation; 0 without Redis) and `unsynced` (what this process counted since). The
check compares their sum with the limit. With a shared store that answers, a request limit
is admitted from a *lease* instead: units this replica reserved in Redis, where the
reservations of all replicas together never pass the limit (quotas/shared.py); a replica
whose lease is empty may admit one request on credit per round while the fleet is under
the limit (as many as its last lease held, in a window's first round), so a caller's
first request on a replica is not refused (docs/quotas.md §3: the bound on
over-admission)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sidecar.config.models import SidecarConfig
from sidecar.config.quotas import QuotaLimits

WINDOW_S = {"requests_per_minute": 60, "tokens_per_day": 86_400, "spend_per_day_usd": 86_400}
ALL_GROUPS = "*"

# The suffix of a refusal's reason when the caller is under its limit but this replica has
# used its lease and its credit until its next lease arrives (the next round).
LEASE_PENDING = "_lease_pending"

# (caller, scope: a group or ALL_GROUPS, limit name, window number)
CounterKey = tuple[str, str, str, int]


@dataclass(slots=True)
class Counter:
    known: float = 0.0
    unsynced: float = 0.0
    # Request limits with a shared store: units reserved here and not yet used, requests
    # admitted since the last round (the next lease is sized on them), what may still be
    # admitted on credit until the next round (counted in `unsynced`), and the size of the
    # last lease asked for.
    lease: float = 0.0
    admitted: int = 0
    pending: int = 0   # refused for want of a lease since the last round (demand too)
    credit: float = 1.0
    # What all replicas have *used* of a request limit (the reservations, `known`, also
    # hold leases not yet used), and the rounds in a row this replica admitted nothing.
    used_known: float = 0.0
    idle_rounds: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not admitted (`caller_…` or `group_…` and the limit's name) and how
    long until it could be."""

    reason: str
    retry_after_s: int


class QuotaCounters:
    def __init__(self, config: SidecarConfig,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.configure(config)
        self._clock = wall_clock
        self.counters: dict[CounterKey, Counter] = {}
        self._last_size: dict[tuple[str, str, str], float] = {}
        # With a shared store that answers: a replica keeps within its slice.
        self.sliced = False

    def configure(self, config: SidecarConfig) -> None:
        """The limits (at start, and on a reload: what was counted stays)."""
        self._quotas = {caller.name: caller.quotas for caller in config.callers
                        if caller.quotas is not None}
        self._slice_percent = config.quotas.slice_percent

    def __contains__(self, caller: str) -> bool:
        return caller in self._quotas

    def admit(self, caller: str, group: str) -> Refusal | None:
        """Admit one request (and count it) or say which limit refuses it."""
        now = self._clock()
        request_counters = []
        for scope, limits in self._scopes(caller, group):
            for name, limit in limits.limits():
                window = WINDOW_S[name]
                counter = self._counter((caller, scope, name, int(now // window)))
                prefix = "caller" if scope == ALL_GROUPS else "group"
                leased = self.sliced and name == "requests_per_minute"
                if counter.lease >= 1:  # reserved in Redis: good while Redis is down too
                    request_counters.append(counter)
                    continue
                if not leased and counter.known + counter.unsynced >= limit:
                    return Refusal(f"{prefix}_{name}", _until_next(now, window))
                if leased and (counter.credit < 1
                               or counter.known + counter.unsynced >= limit):
                    if counter.used_known + counter.admitted >= limit:
                        return Refusal(f"{prefix}_{name}", _until_next(now, window))
                    # Not over the limit: this replica waits for its next lease, or for
                    # units other replicas reserved and will hand back (issue #30: it used
                    # to give the over-limit reason).
                    counter.pending += 1
                    return Refusal(f"{prefix}_{name}{LEASE_PENDING}", 1)
                if name == "requests_per_minute":
                    request_counters.append(counter)
        for counter in request_counters:
            counter.admitted += 1
            if counter.lease >= 1:
                counter.lease -= 1
            else:
                counter.unsynced += 1
                if self.sliced:
                    counter.credit -= 1
        return None

    def lease_size(self, limit: float, counter: Counter) -> float:
        """How many units the next lease should hold: four times what this replica was
        asked for in the last round (admitted, or refused waiting for this lease), and four
        more (a rate that jumps fourfold from one round to the next is still served); at
        most one slice of the limit, and at most a quarter of what the fleet has not
        reserved yet (near the limit leases shrink, so few units sit unused on one replica
        while another refuses)."""
        headroom = max(1, math.ceil((limit - counter.known) / 4))
        return float(min(_slice(limit, self._slice_percent),
                         4 * (counter.admitted + counter.pending) + 4,
                         headroom))

    def window_of(self, key: CounterKey) -> int:
        """The number of the window open now for `key`'s limit."""
        return int(self._clock() // WINDOW_S[key[2]])

    def limit_of(self, key: CounterKey) -> float | None:
        caller, scope, name, _window = key
        quotas = self._quotas.get(caller)
        if quotas is None:
            return None
        limits = quotas if scope == ALL_GROUPS else quotas.per_group.get(scope)
        value = getattr(limits, name, None) if limits is not None else None
        return None if value is None else float(value)

    def used(self, caller: str, group: str, tokens: int, cost_usd: float, at: float) -> None:
        """A finished request's tokens and spend, counted in the window it started in."""
        for scope, limits in self._scopes(caller, group):
            for name, amount in (("tokens_per_day", tokens), ("spend_per_day_usd", cost_usd)):
                if amount and getattr(limits, name) is not None:
                    window = WINDOW_S[name]
                    self._counter((caller, scope, name, int(at // window))).unsynced += amount

    def current(self) -> Iterator[tuple[CounterKey, Counter]]:
        """Counters of the windows still open; those of ended windows are dropped once
        nothing is left to reconcile."""
        now = self._clock()
        for key, counter in list(self.counters.items()):
            if key[3] == int(now // WINDOW_S[key[2]]) or counter.unsynced:
                yield key, counter
            else:
                del self.counters[key]

    def spend_pressure(self, caller: str, group: str) -> float:
        """How much of `caller`'s daily spend budget is used, 0–1 in steps of 0.01: the
        largest share over its `spend_per_day_usd` limits (over all groups, and over
        `group`), as counted so far (this replica's count and the fleet's last total); 0
        without such a limit. The `budget_pressure` score (routing/scores.py): read per
        request, a few dictionary lookups, never the network."""
        pressure = 0.0
        window = int(self._clock() // WINDOW_S["spend_per_day_usd"])
        for scope, limits in self._scopes(caller, group):
            limit = limits.spend_per_day_usd
            if limit is None:
                continue
            counter = self.counters.get((caller, scope, "spend_per_day_usd", window))
            if counter is not None:
                pressure = max(pressure, (counter.known + counter.unsynced) / limit)
        return min(1.0, math.floor(pressure * 100) / 100)

    def _scopes(self, caller: str, group: str) -> Iterator[tuple[str, QuotaLimits]]:
        quotas = self._quotas.get(caller)
        if quotas is None:
            return
        yield ALL_GROUPS, quotas
        per_group = quotas.per_group.get(group)
        if per_group is not None:
            yield group, per_group

    def remember_size(self, key: CounterKey, size: float) -> None:
        """The size of the lease a round asked for, kept past its window (bounded by the
        configured callers and their groups)."""
        self._last_size[key[:3]] = size

    def _counter(self, key: CounterKey) -> Counter:
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = Counter()
            # A new window starts with the credit of the last lease asked for, so a busy
            # replica is not held to one request on credit at every window's start.
            counter.credit = max(1.0, self._last_size.get(key[:3], 1.0))
        return counter


def _slice(limit: float, percent: float) -> float:
    return max(1.0, math.ceil(limit * percent / 100))


def _until_next(now: float, window: int) -> int:
    return max(1, math.ceil((int(now // window) + 1) * window - now))
