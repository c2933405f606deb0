"""Sharing quota counters across sidecar replicas through Redis (docs/quotas.md §3).

A background task, never the request path: every `reconcile_ms` it adds what this process
counted since the last round to one Redis key per counter (`INCRBYFLOAT`, with an expiry
past the window's end), reads back the total of all replicas, and hands it to the
counters. While Redis answers, each replica stays within one slice of a request limit past
that total; when it does not, admission goes on against the local counters (fail open to
local limits) and `up` says so."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sidecar.config.quotas import QuotaSettings
from sidecar.dependency_names import redis_endpoint
from sidecar.fleet.redis_client import ROUND_TIMEOUT_S, redis_client
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.quotas.counters import WINDOW_S, CounterKey, QuotaCounters

log = logging.getLogger("sidecar.quotas")
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
        if not items:  # nothing to add: still learn whether Redis answers
            pipe.ping()
        for key, _counter, amount in items:
            name = redis_key(self._prefix, key)
            if amount:
                pipe.incrbyfloat(name, amount)
                pipe.expire(name, WINDOW_S[key[2]] + 60)
            else:
                pipe.get(name)
        try:
            results = await asyncio.wait_for(pipe.execute(), ROUND_TIMEOUT_S)
        except Exception as exc:
            self._failed(exc)
            return False
        answers = iter(results[1:] if not items else results)
        for _key, counter, amount in items:
            total = next(answers)
            if amount:
                next(answers)  # the expiry's answer
                counter.unsynced -= amount
            counter.known = float(total or 0.0)
        self.up = True
        self._counters.sliced = True
        self.rounds += 1
        return True

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
