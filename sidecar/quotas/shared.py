"""Sharing quota counters across sidecar replicas through Redis (docs/quotas.md §3).

A background task, never the request path: every `reconcile_ms` it adds what this process
counted since the last round to one Redis key per counter (`INCRBYFLOAT`, with an expiry
past the window's end), reads back the total of all replicas, and hands it to the
counters. For request limits it also renews this replica's lease: one Lua script reserves
up to the lease size in the same key, never past the limit, so the leases of all replicas
together never exceed it; a second key counts what was admitted (used, not only reserved),
so a refusal says "over the limit" only when the fleet has used it; a replica that admitted
nothing for about a second hands its lease back, so an idle replica cannot starve busy
ones. A request that found its lease spent asks for the next round at once
(`next_round`) and waits for it instead of being refused. When Redis does not answer,
admission goes on against the local counters (fail open to local limits) and `up` says
so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.config.quotas import QuotaSettings
from sidecar.dependency_names import redis_endpoint
from sidecar.fleet.redis_client import ROUND_TIMEOUT_S, redis_client
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.quotas.counters import WINDOW_S, Counter, CounterKey, QuotaCounters

log = logging.getLogger("sidecar.quotas")

# KEYS[1]: the counter; ARGV: units wanted (negative: handed back), the limit, the expiry.
# Returns the units granted and the new total, as strings (Lua numbers would be truncated).
_LEASE = """
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
local grant = want
if want > 0 then
  grant = math.max(0, math.min(want, math.floor(tonumber(ARGV[2]) - total)))
end
if grant ~= 0 then
  total = tonumber(redis.call('INCRBYFLOAT', KEYS[1], grant))
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {tostring(grant), tostring(total)}
"""
_limited = LogLimiter(log, burst=3, interval=60.0)
# Rounds asked for by waiting requests start at least this long after the last one, so a
# replica under a burst sends Redis at most a few hundred rounds a second.
_MIN_GAP_S = 0.005


def redis_key(prefix: str, key: CounterKey) -> str:
    """`<prefix><caller>|<group or *>|<limit>|<window>`: names only, never a token (`|` is
    in no group name)."""
    caller, scope, name, window = key
    return f"{prefix}{caller}|{scope}|{name}|{window}"


@dataclass(slots=True)
class _Plan:
    """One counter's part of a round: what it sent (snapshots taken when the round was
    queued; admissions during the round trip count in the next), and how to read the
    answers."""

    counter: Counter
    unsynced: float
    admitted: int
    pending: int
    leased: bool = False
    handed_back: float = 0.0

    def absorb(self, answers: Iterator[Any]) -> None:
        counter = self.counter
        if self.unsynced:
            added, _expiry = next(answers), next(answers)
            if not isinstance(added, Exception):
                counter.unsynced -= self.unsynced
        if not self.leased:
            total = next(answers)
            if not isinstance(total, Exception):
                counter.known = float(total or 0.0)
            return
        used = next(answers)
        if self.admitted:
            next(answers)  # its expiry
        if not isinstance(used, Exception):
            counter.used_known = float(used or 0.0)
        lease = next(answers)
        if isinstance(lease, Exception):
            counter.lease += self.handed_back
        else:
            granted, total = lease
            if not self.handed_back:
                counter.lease += float(granted)
            counter.known = float(total)
        idle = not (self.admitted or self.pending)
        counter.idle_rounds = counter.idle_rounds + 1 if idle and not self.handed_back else 0
        counter.admitted -= self.admitted
        counter.pending -= self.pending
        counter.credit = 1.0


class RedisReconciler:
    def __init__(self, counters: QuotaCounters, settings: QuotaSettings, url: str) -> None:
        self._counters = counters
        self._prefix = settings.key_prefix
        self.where = redis_endpoint(url)  # for log lines: host and port, no password
        self.interval_s = settings.reconcile_ms / 1000
        # Rounds in a row without an admission before a replica hands its lease back.
        self._idle_rounds = max(1, math.ceil(1000 / settings.reconcile_ms))
        self._client = redis_client(url, "quotas.redis_url")
        self.up = False
        self.errors = 0
        self.rounds = 0
        # Set by a waiting request (and by stop): start the next round now.
        self.wake = asyncio.Event()
        self._next: asyncio.Future[bool] | None = None

    async def run_until(self, stopping: asyncio.Event) -> None:
        """Rounds until `stopping` is set (and `wake` with it), then a last one (what this
        replica counted last). Never cancelled mid-round: a cancelled Redis call can hang
        its cleanup."""
        while not stopping.is_set():
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.interval_s)
            if self.wake.is_set() and not stopping.is_set():
                await asyncio.sleep(_MIN_GAP_S)
        await self.reconcile()

    async def next_round(self) -> bool:
        """Wait for the end of a round that starts after this call (so it sees what the
        caller counted as pending) and say whether Redis answered it."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        future = self._next
        self.wake.set()
        return await asyncio.shield(future)

    async def reconcile(self) -> bool:
        """One round; False (and local limits only) when Redis did not answer. Requests
        waiting for a round that had not started learn its outcome."""
        waiting, self._next = self._next, None
        self.wake.clear()
        answered = False
        try:
            answered = await self._round()
        finally:
            if waiting is not None and not waiting.done():
                waiting.set_result(answered)
        return answered

    async def _round(self) -> bool:
        pipe = self._client.pipeline(transaction=False)
        pipe.ping()  # so that a round with nothing to count still learns whether Redis answers
        plans = [self._queue(pipe, key, counter) for key, counter in self._counters.current()]
        try:
            # One bad answer (a key of another type) costs that counter its round only.
            results = await asyncio.wait_for(pipe.execute(raise_on_error=False),
                                             ROUND_TIMEOUT_S)
            if isinstance(results[0], Exception):
                raise results[0]
        except Exception as exc:
            for plan in plans:
                plan.counter.lease += plan.handed_back  # not handed back after all
            self._failed(exc)
            return False
        answers = iter(results[1:])
        for plan in plans:
            plan.absorb(answers)
        self.up = True
        self._counters.sliced = True
        self.rounds += 1
        return True

    def _queue(self, pipe: Any, key: CounterKey, counter: Counter) -> _Plan:
        name = redis_key(self._prefix, key)
        expiry = WINDOW_S[key[2]] + 60
        plan = _Plan(counter, counter.unsynced, counter.admitted, counter.pending)
        if plan.unsynced:
            pipe.incrbyfloat(name, plan.unsynced)
            pipe.expire(name, expiry)
        limit = self._counters.limit_of(key) if key[2] == "requests_per_minute" else None
        if limit is None or key[3] != self._counters.window_of(key):
            pipe.get(name)
            return plan
        plan.leased = True
        used = f"{name}|used"
        if plan.admitted:
            pipe.incrbyfloat(used, plan.admitted)
            pipe.expire(used, expiry)
        else:
            pipe.get(used)
        if plan.admitted or plan.pending:
            size = self._counters.lease_size(limit, counter)
            self._counters.remember_size(key, size)
            wanted = max(0.0, size - counter.lease)
        elif counter.idle_rounds + 1 >= self._idle_rounds and counter.lease:
            # Idle for about a second: hand the lease back so busy replicas can have it
            # (taken off now: what is admitted meanwhile cannot spend it).
            wanted, plan.handed_back = -counter.lease, counter.lease
            counter.lease = 0.0
        else:
            wanted = 0.0
        pipe.eval(_LEASE, 1, name, wanted, limit, expiry)
        return plan

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.up or self.errors == 1:
            _limited.warning("redis_down", "quota store %s unreachable (%s): admitting "
                             "against this replica's own counters", self.where,
                             type(exc).__name__)
        self.up = False
        self._counters.sliced = False

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._client.aclose(), ROUND_TIMEOUT_S)
