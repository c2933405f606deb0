"""Quota counters shared through a real Redis (Debian's redis-server, started per test):
two replicas enforce one limit within the documented over-admission; with Redis down each
admits against its own counters and says so; when Redis is back, what was counted
meanwhile reaches it."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.quotas.counters import QuotaCounters
from sidecar.quotas.shared import RedisReconciler
from tests.clock import ManualClock
from tests.redis_server import RedisServer
from tests.unit.quotas.test_counters import CALLERS, GROUPS, MIDNIGHT
from tests.unit.routing.helpers import config

LIMIT = 50


def replicas(redis: RedisServer, count: int = 2, limit: int = LIMIT
             ) -> list[tuple[QuotaCounters, RedisReconciler]]:
    cfg = config(GROUPS + CALLERS.replace("requests_per_minute: 3",
                                          f"requests_per_minute: {limit}"))
    made = []
    for _ in range(count):
        counters = QuotaCounters(cfg, ManualClock(MIDNIGHT + 5))
        made.append((counters, RedisReconciler(counters, cfg.quotas, redis.url)))
    return made


@pytest.mark.parametrize(("count", "limit"), [(2, LIMIT), (3, 200)])
def test_replicas_enforce_one_limit_within_the_bound(redis: RedisServer, count: int,
                                                     limit: int) -> None:
    async def run() -> int:
        fleet = replicas(redis, count, limit)
        for _, shared in fleet:
            assert await shared.reconcile()  # nothing counted yet: an empty round
        admitted = 0
        for _ in range(60):  # rounds: each replica takes what it may, then reconciles
            for counters, _ in fleet:
                for _ in range(10):
                    admitted += counters.admit("team", "basic") is None
            for _, shared in fleet:
                await shared.reconcile()
        for _, shared in fleet:
            await shared.close()
        return admitted

    admitted = asyncio.run(run())
    # Leases never pass the limit; each replica may add one request on credit in the
    # round that reaches it (issue #30: the fixed slice allowed limit + replicas × slice;
    # three replicas over 200: 216 observed, 260 allowed; now at most 203, 1.5 %).
    assert limit <= admitted <= limit + count, admitted
    print(f"admitted {admitted} of a limit of {limit} (bound {limit + count})")


def test_no_refusal_while_the_caller_is_under_its_limit(redis: RedisServer) -> None:
    """Three replicas, a caller at a steady rate well under its limit (issue #30.3: with
    the fixed slice, one replica refused such a caller with the over-limit reason)."""
    async def run() -> tuple[int, int]:
        trio = replicas(redis, 3, limit=600)
        for _, shared in trio:
            assert await shared.reconcile()
        refused = admitted = 0
        for round_number in range(40):  # 4 s of 100 ms rounds; 3 requests a round a replica
            for counters, _ in trio:
                # A first request (one on credit), then steady, with bursts.
                for _ in range(1 if round_number == 0 else 5 if round_number % 5 == 0 else 3):
                    if counters.admit("team", "basic") is None:
                        admitted += 1
                    else:
                        refused += 1
            for _, shared in trio:
                await shared.reconcile()
        for _, shared in trio:
            await shared.close()
        return admitted, refused

    admitted, refused = asyncio.run(run())
    assert (admitted, refused) == (3 * (1 + 32 * 3 + 7 * 5), 0)


def test_an_idle_replica_hands_its_lease_back(redis: RedisServer) -> None:
    async def run() -> None:
        (busy, busy_shared), (idle, idle_shared) = replicas(redis)
        for shared in (busy_shared, idle_shared):
            assert await shared.reconcile()
        for _ in range(3):  # the idle one takes a lease once, then stops
            assert idle.admit("team", "basic") is None
            await idle_shared.reconcile()
        key = ("team", "*", "requests_per_minute", int((MIDNIGHT + 5) // 60))
        assert idle.counters[key].lease > 0
        for _ in range(9):  # rounds with nothing admitted: kept for a while ...
            await idle_shared.reconcile()
        assert idle.counters[key].lease > 0
        await idle_shared.reconcile()  # ... and handed back after a second (10 rounds)
        assert idle.counters[key].lease == 0
        # The busy replica can now reach the whole limit.
        admitted = 0
        for _ in range(40):
            admitted += sum(busy.admit("team", "basic") is None for _ in range(5))
            await busy_shared.reconcile()
        assert admitted + 3 >= LIMIT, admitted
        for shared in (busy_shared, idle_shared):
            await shared.close()

    asyncio.run(run())


def test_redis_down_means_local_limits_and_a_signal(redis: RedisServer) -> None:
    async def run() -> None:
        (counters, shared), = replicas(redis, 1)
        counters.admit("team", "basic")
        assert await shared.reconcile() and shared.up and counters.sliced
        redis.stop()
        counters.admit("team", "basic")
        assert not await shared.reconcile()
        assert not shared.up and shared.errors == 1 and not counters.sliced
        # Fail open to local limits: what is left of its lease, then the whole limit on
        # this replica's counts (its lease counted in them).
        admitted = sum(counters.admit("team", "basic") is None for _ in range(100))
        assert admitted == LIMIT - 2
        key = ("team", "*", "requests_per_minute", int((MIDNIGHT + 5) // 60))
        counted_locally = counters.counters[key].unsynced
        redis.start()
        assert await shared.reconcile() and shared.up
        # What was counted during the outage reached the new (empty) server, beside the
        # next lease.
        counter = counters.counters[key]
        assert counted_locally > 0 and counter.known == counted_locally + counter.lease
        await shared.close()

    asyncio.run(run())


@pytest.mark.parametrize("round_first", [False, True])
def test_a_new_window_starts_without_refusals(redis: RedisServer, round_first: bool) -> None:
    """At a window's start each counter is new; it inherits the last lease's size as
    credit, so a busy replica is not held to one request on credit each minute, whether
    the window's first request or its first round comes first."""
    async def run() -> int:
        trio = replicas(redis, 3, limit=6000)
        clocks = [counters._clock for counters, _ in trio]
        for clock in clocks:
            clock.now = MIDNIGHT + 58.05
        refused = 0
        for round_number in range(40):  # 2 s before the minute's end to 2 s after
            if round_first:
                for _, shared in trio:
                    await shared.reconcile()
            for counters, _ in trio:
                wanted = 1 if round_number == 0 else 8
                refused += sum(counters.admit("team", "basic") is not None
                               for _ in range(wanted))
            if not round_first:
                for _, shared in trio:
                    await shared.reconcile()
            for clock in clocks:
                clock.now += 0.1
        for _, shared in trio:
            await shared.close()
        return refused

    assert asyncio.run(run()) == 0


def test_a_caller_with_a_pause_between_requests_is_not_refused(redis: RedisServer) -> None:
    """Two requests at once every second (review finding: a lease handed back after one
    idle round left one request on credit, and the second was refused each time)."""
    async def run() -> int:
        (counters, shared), = replicas(redis, 1, limit=600)
        assert await shared.reconcile()
        refused = 0
        for round_number in range(100):  # 10 s of 100 ms rounds
            if round_number % 10 == 0:
                refused += sum(counters.admit("team", "basic") is not None for _ in range(2))
            await shared.reconcile()
            counters._clock.now += 0.1
        await shared.close()
        return refused

    assert asyncio.run(run()) <= 1  # the very first pair: one request on credit only
