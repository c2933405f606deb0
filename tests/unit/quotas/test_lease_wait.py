"""A request whose caller is under its limit while this replica's lease is spent waits for
the next quota round (asked for at once) instead of being refused (issue #30: a burst
from a standing start was refused with `…_lease_pending`). Real Redis (Debian's
redis-server), three replicas in one process, each running its own quota rounds."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from sidecar.quotas.admission import Quotas
from sidecar.quotas.counters import LEASE_PENDING, Refusal
from tests.clock import ManualClock
from tests.redis_server import RedisServer
from tests.unit.quotas.test_counters import CALLERS, GROUPS, MIDNIGHT
from tests.unit.routing.helpers import config


def fleet(redis: RedisServer, limit: int, lease_wait_ms: int = 500,
          count: int = 3) -> list[Quotas]:
    cfg = config(GROUPS + CALLERS.replace("requests_per_minute: 3",
                                          f"requests_per_minute: {limit}")
                 + f"quotas: {{redis_url: {{env: R}}, lease_wait_ms: {lease_wait_ms}}}\n")
    return [Quotas(cfg, 60.0, environ={"R": redis.url},
                   wall_clock=ManualClock(MIDNIGHT + 5)) for _ in range(count)]


async def started(replicas: list[Quotas]) -> None:
    for quotas in replicas:
        quotas.start()
    deadline = time.monotonic() + 10
    while not all(q.shared is not None and q.shared.up for q in replicas):
        assert time.monotonic() < deadline, "Redis rounds did not start"
        await asyncio.sleep(0.01)


async def request(quotas: Quotas, number: int) -> Refusal | None:
    """What the gateway does (gateway/guards.py, quota_guard): admit, else wait if the
    refusal is only this replica's spent lease."""
    refusal = quotas.admit("team", "basic", f"r{number}")
    if refusal is None:
        return None
    budget_s = quotas.wait_budget_s(refusal)
    if not budget_s:
        if refusal.reason.endswith(LEASE_PENDING):
            quotas.refused(refusal)
        return refusal
    return await quotas.wait_for_lease("team", "basic", f"r{number}", budget_s)


async def stopped(replicas: list[Quotas]) -> None:
    for quotas in replicas:
        await quotas.stop()


def test_a_burst_from_a_standing_start_is_admitted_whole(redis: RedisServer) -> None:
    async def run() -> tuple[list[Refusal | None], Quotas]:
        replicas = fleet(redis, limit=200)
        await started(replicas)
        first = replicas[0]
        burst = await asyncio.gather(*(request(first, n) for n in range(40)))
        await stopped(replicas)
        return burst, first

    burst, first = asyncio.run(run())
    assert burst == [None] * 40
    assert first.refusals == Counter()
    # The first request went on credit; the others waited for the lease it asked for.
    assert first.lease_waits[("admitted",)] >= 30, first.lease_waits
    assert first.waiting == 0


def test_over_the_limit_the_refusal_says_so_after_the_wait(redis: RedisServer) -> None:
    """Bursts on three replicas together well past the limit: admitted at most
    `limit + replicas`, and every refusal names the limit (the fleet has used it), none a
    lease still pending."""
    async def run() -> list[Refusal | None]:
        replicas = fleet(redis, limit=60, lease_wait_ms=1500)
        await started(replicas)
        outcomes = await asyncio.gather(*(request(quotas, n) for quotas in replicas
                                          for n in range(40)))
        await stopped(replicas)
        return outcomes

    outcomes = asyncio.run(run())
    admitted = outcomes.count(None)
    assert 60 <= admitted <= 63, admitted
    reasons = Counter(refusal.reason for refusal in outcomes if refusal is not None)
    assert reasons == {"caller_requests_per_minute": len(outcomes) - admitted}, reasons


def test_without_a_wait_a_spent_lease_refuses_at_once(redis: RedisServer) -> None:
    """`lease_wait_ms: 0`: the old behaviour, with its own reason."""
    async def run() -> list[Refusal | None]:
        replicas = fleet(redis, limit=200, lease_wait_ms=0, count=1)
        await started(replicas)
        burst = [await request(replicas[0], n) for n in range(5)]
        await stopped(replicas)
        return burst

    burst = asyncio.run(run())
    assert burst[0] is None
    assert {refusal.reason for refusal in burst[1:] if refusal is not None} == {
        "caller_requests_per_minute_lease_pending"}


def test_with_redis_down_nothing_waits(redis: RedisServer) -> None:
    """No shared store answering: local limits, no lease, so never a wait."""
    async def run() -> tuple[list[Refusal | None], Quotas]:
        replicas = fleet(redis, limit=3, count=1)
        await started(replicas)
        redis.stop()
        quotas = replicas[0]
        deadline = time.monotonic() + 10
        while quotas.shared is not None and quotas.shared.up:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        outcomes = [await request(quotas, n) for n in range(5)]
        await stopped(replicas)
        return outcomes, quotas

    outcomes, quotas = asyncio.run(run())
    assert outcomes[:3] == [None] * 3
    assert {refusal.reason for refusal in outcomes[3:] if refusal is not None} == {
        "caller_requests_per_minute"}
    assert quotas.lease_waits == Counter()
