"""Quota counters shared through a real Redis (Debian's redis-server, started per test):
two replicas enforce one limit within the documented over-admission; with Redis down each
admits against its own counters and says so; when Redis is back, what was counted
meanwhile reaches it."""

from __future__ import annotations

import asyncio

from sidecar.quotas.counters import QuotaCounters
from sidecar.quotas.shared import RedisReconciler
from tests.clock import ManualClock
from tests.redis_server import RedisServer
from tests.unit.quotas.test_counters import CALLERS, GROUPS, MIDNIGHT
from tests.unit.routing.helpers import config

LIMIT = 50
SLICE = 5  # 10 % of 50


def replicas(redis: RedisServer, count: int = 2) -> list[tuple[QuotaCounters, RedisReconciler]]:
    cfg = config(GROUPS + CALLERS.replace("requests_per_minute: 3",
                                          f"requests_per_minute: {LIMIT}"))
    made = []
    for _ in range(count):
        counters = QuotaCounters(cfg, ManualClock(MIDNIGHT + 5))
        made.append((counters, RedisReconciler(counters, cfg.quotas, redis.url)))
    return made


def test_two_replicas_enforce_one_limit_within_the_bound(redis: RedisServer) -> None:
    async def run() -> int:
        pair = replicas(redis)
        for _, shared in pair:
            assert await shared.reconcile()  # nothing counted yet: an empty round
        admitted = 0
        for _ in range(30):  # rounds: each replica takes what it may, then reconciles
            for counters, _ in pair:
                for _ in range(10):
                    admitted += counters.admit("team", "basic") is None
            for _, shared in pair:
                await shared.reconcile()
        for _, shared in pair:
            await shared.close()
        return admitted

    admitted = asyncio.run(run())
    assert LIMIT <= admitted <= LIMIT + 2 * SLICE, admitted
    print(f"admitted {admitted} of a limit of {LIMIT} (bound {LIMIT + 2 * SLICE})")


def test_redis_down_means_local_limits_and_a_signal(redis: RedisServer) -> None:
    async def run() -> None:
        (counters, shared), = replicas(redis, 1)
        counters.admit("team", "basic")
        assert await shared.reconcile() and shared.up and counters.sliced
        redis.stop()
        counters.admit("team", "basic")
        assert not await shared.reconcile()
        assert not shared.up and shared.errors == 1 and not counters.sliced
        # Fail open to local limits: no slice, the whole limit on this replica's counts.
        admitted = sum(counters.admit("team", "basic") is None for _ in range(100))
        assert admitted == LIMIT - 2
        redis.start()
        assert await shared.reconcile() and shared.up
        key = ("team", "*", "requests_per_minute", int((MIDNIGHT + 5) // 60))
        # What was counted during the outage reached the new (empty) server.
        assert counters.counters[key].known == LIMIT - 1
        await shared.close()

    asyncio.run(run())
