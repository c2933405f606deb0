"""Sharing quota counters across sidecar replicas through Redis (docs/quotas.md §3).

A background task, never the request path: every `reconcile_ms` it adds what this process
counted since the last round to one Redis key per counter (`INCRBYFLOAT`, with an expiry
past the window's end), reads back the total of all replicas, and hands it to the
counters. For request limits it also renews this replica's lease: one Lua script reserves
up to the lease size in the same key, never past the limit, so the leases of all replicas
together never exceed it; a replica that admitted nothing in the last round hands its
lease back, so an idle replica cannot starve busy ones. When Redis does not answer,
admission goes on against the local counters (fail open to local limits) and `up` says
so."""

from __future__ import annotations

import asyncio
import contextlib
import logging

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



def redis_key(prefix: str, key: CounterKey) -> str:
    """`<prefix><caller>|<group or *>|<limit>|<window>`: names only, never a token (`|` is
    in no group name)."""
    caller, scope, name, window = key
    return f"{prefix}{caller}|{scope}|{name}|{window}"


class RedisReconciler:
    def __init__(self, counters: QuotaCounters, settings: QuotaSettings, url: str) -> None:
        self._counters = counters
        self._prefix = settings.key_prefix
        self.where = redis_endpoint(url)  # for log lines: host and port, no password
        self.interval_s = settings.reconcile_ms / 1000
        self._client = redis_client(url, "quotas.redis_url")
        self.up = False
        self.errors = 0
        self.rounds = 0

    async def run_until(self, stopping: asyncio.Event) -> None:
        """Rounds until `stopping` is set, then a last one (what this replica counted
        last). Never cancelled mid-round: a cancelled Redis call can hang its cleanup."""
        while not stopping.is_set():
            await self.reconcile()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.interval_s)
        await self.reconcile()

    async def reconcile(self) -> bool:
        """One round; False (and local limits only) when Redis did not answer."""
        items = [(key, counter, counter.unsynced) for key, counter in self._counters.current()]
        pipe = self._client.pipeline(transaction=False)
        pipe.ping()  # so that a round with nothing to count still learns whether Redis answers
        plans = []
        for key, counter, amount in items:
            name = redis_key(self._prefix, key)
            expiry = WINDOW_S[key[2]] + 60
            if amount:
                pipe.incrbyfloat(name, amount)
                pipe.expire(name, expiry)
            limit = self._counters.limit_of(key) if key[2] == "requests_per_minute" else None
            if limit is not None and key[3] == self._counters.window_of(key):
                wanted = self._wanted(limit, counter)
                pipe.eval(_LEASE, 1, name, wanted, limit, expiry)
            else:
                wanted = None
                pipe.get(name)
            plans.append((counter, amount, wanted))
        try:
            results = await asyncio.wait_for(pipe.execute(), ROUND_TIMEOUT_S)
        except Exception as exc:
            self._failed(exc)
            return False
        answers = iter(results[1:])
        for counter, amount, wanted in plans:
            if amount:
                next(answers), next(answers)  # the addition and the expiry
                counter.unsynced -= amount
            answer = next(answers)
            if wanted is None:
                counter.known = float(answer or 0.0)
            else:
                granted, total = answer
                counter.lease += float(granted)
                counter.known = float(total)
            counter.admitted, counter.pending, counter.credit = 0, 0, 1.0
        self.up = True
        self._counters.sliced = True
        self.rounds += 1
        return True

    def _wanted(self, limit: float, counter: Counter) -> float:
        """Units to reserve (negative: to hand back) for a request limit's lease."""
        if counter.admitted == 0 and counter.pending == 0:
            return -counter.lease  # idle: give the lease back (0 when there is none)
        counter.size = self._counters.lease_size(limit, counter)
        return max(0.0, counter.size - counter.lease)

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
