"""The fleet channel against a real Redis (Debian's redis-server, one per test): three
replicas in one process, each with its own stores and its own monotonic clock, one wall
clock. What one learns, the others hold after one round each; nothing counts twice; Redis
down means each keeps its own evidence and says so; garbage in Redis is skipped."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from sidecar.fleet.channel import FleetChannel
from sidecar.fleet.ejections import EjectionSharing
from sidecar.fleet.observations import ObservationSharing
from sidecar.fleet.pins import PinSharing
from sidecar.gateway.sessions import SessionStore
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.routing.affinity import AffinityStore
from sidecar.routing.ejection import Ejections, Health
from tests.clock import ManualClock
from tests.redis_server import RedisServer

LABELS = ("p/fast", "p/slow")
WALL = 1_800_000_000.0


class Replica:
    def __init__(self, name: str, redis: RedisServer, wall: ManualClock, mono: float) -> None:
        self.clock = ManualClock(mono)
        self.store = ObservationStore(retention_seconds=60, slice_seconds=10,
                                      refresh_seconds=0, clock=self.clock)
        self.ejections = Ejections(60, self.clock)
        self.pins = AffinityStore(ttl_seconds=100, max_entries=100, clock=self.clock)
        self.sessions = SessionStore(ttl_seconds=100, max_entries=100, clock=self.clock)
        self.observations = ObservationSharing(self.store, "t:", name, lambda: LABELS,
                                               wall_clock=wall)
        self.shared_ejections = EjectionSharing(
            "t:", name, lambda: {"g": (self.ejections, frozenset(LABELS))}, self.clock, wall)
        self.shared_pins = PinSharing("t:", name, lambda: {"g": (self.pins, LABELS)},
                                      lambda: self.sessions, 1000, self.clock, wall)
        self.channel = FleetChannel(redis.url, 500, [
            self.observations, self.shared_ejections, self.shared_pins], name, wall)

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds


async def rounds(*replicas: Replica) -> None:
    for replica in replicas:
        assert await replica.channel.round()


def fleet(redis: RedisServer) -> tuple[ManualClock, list[Replica]]:
    wall = ManualClock(WALL)
    return wall, [Replica(name, redis, wall, mono) for name, mono in
                  (("a", 1_000.0), ("b", 52_345.5), ("c", 7.25))]


def failures(replica: Replica, n: int, label: str = "p/slow") -> None:
    for _ in range(n):
        replica.store.record(Observation(label, Outcome.SERVER_ERROR))


def test_observations_merge_once_whatever_the_rounds(redis: RedisServer) -> None:
    async def run() -> None:
        wall, (a, b, c) = fleet(redis)
        await rounds(a, b, c)  # the first rounds switch journals on
        failures(a, 10)
        b.store.record(Observation("p/slow", Outcome.OK, latency_ms=100))
        for _ in range(3):  # repeated rounds: replacements, never additions
            await rounds(a, b, c)
        for replica in (a, b, c):
            figures = replica.store.get("p/slow", 60)
            assert figures.count == 11 and figures.error_rate == pytest.approx(10 / 11)
        failures(a, 5)
        for replica in (a, b, c):  # the clocks move on together, into the next slice
            replica.advance(10)
        wall.now += 10
        failures(b, 2)
        await rounds(a, b, c)
        await rounds(a, b, c)
        assert {r.store.get("p/slow", 60).count for r in (a, b, c)} == {18}
        for replica in (a, b, c):  # past the window: everything ages out everywhere
            replica.advance(100)
        wall.now += 100
        await rounds(a, b, c)
        assert {r.store.get("p/slow", 60).count for r in (a, b, c)} == {0}
        for replica in (a, b, c):
            await replica.channel.stop()

    asyncio.run(run())


def test_holds_ejections_pins_and_sessions_reach_every_replica(redis: RedisServer) -> None:
    async def run() -> None:
        wall, (a, b, c) = fleet(redis)
        await rounds(a, b, c)
        a.store.rate_limited("p/fast", 5.0)
        a.ejections.eject("p/slow", a.clock())
        key = hashlib.sha256(b"caller\0g\0conversation").digest()
        a.pins.pin(key, 1)
        session = hashlib.sha256(b"caller\0g\0session").hexdigest()
        a.sessions.pin(session, 0)
        a.sessions.answered(session, "resp_123")
        await rounds(a, b, c)
        for replica in (b, c):
            assert replica.store.retry_after_s("p/fast") == pytest.approx(5.0, abs=0.01)
            assert replica.ejections.health("p/slow", replica.clock()) is Health.EJECTED
            assert replica.pins.lookup(key) == (1, False)
            held = replica.sessions.get(session)
            assert held is not None and (held.target_index, held.response_id) == (0, "resp_123")
        # TTL as written: the pin expires on every replica when it does on the first.
        for replica in (a, b, c):
            replica.advance(100)
        wall.now += 100
        assert {r.pins.lookup(key) for r in (a, b, c)} == {(1, True)}
        # b's probes bring the target back: a and c follow.
        b.ejections.reenter("p/slow", b.clock())
        await rounds(b, a, c)
        for replica in (a, c):
            assert replica.ejections.health("p/slow", replica.clock()) is Health.IN
            assert replica.ejections.reentered("p/slow")
        for replica in (a, b, c):
            await replica.channel.stop()

    asyncio.run(run())


def test_redis_down_means_own_evidence_and_a_signal(redis: RedisServer) -> None:
    async def run() -> None:
        _wall, (a, b, _c) = fleet(redis)
        await rounds(a, b)
        redis.stop()
        failures(a, 4)
        assert not await a.channel.round()
        assert a.channel.gauges()["fleet_up"] == 0.0 and a.channel.rounds["failed"] == 1
        assert b.store.get("p/slow", 60).count == 0 and a.store.get("p/slow", 60).count == 4
        redis.start()
        for replica in (a, b):  # a pooled connection of the old server may fail one round
            await replica.channel.round()
        await rounds(a, b)
        assert b.store.get("p/slow", 60).count == 4 and a.channel.gauges()["fleet_up"] == 1.0
        for replica in (a, b):
            await replica.channel.stop()

    asyncio.run(run())


def test_garbage_in_redis_is_skipped(redis: RedisServer) -> None:
    async def run() -> None:
        import redis.asyncio as aioredis
        _wall, (a, b, _c) = fleet(redis)
        await rounds(a, b)
        raw = aioredis.Redis.from_url(redis.url)
        slice_key = f"t:obs|10|{int(WALL // 10)}"
        await raw.hset(slice_key, mapping={"x|p/slow": b"{not json", "x|p/unknown": b"{}",
                                           "y|p/slow": b'{"n":1,"o":{"server_error":1}}'})
        await raw.hset("t:ej|g", mapping={"p/slow": b"[]", "p/other": b"{}"})
        await raw.xadd("t:pins", {"g": "g", "k": b"short", "t": "p/slow", "c": "1", "r": "x"})
        await raw.xadd("t:sessions", {"k": "zz", "i": "0", "p": "", "u": "nan", "r": "x"})
        await raw.aclose()
        await rounds(b)
        assert b.store.get("p/slow", 60).count == 1  # only the well-formed entry
        assert b.observations.unreadable == 1 and b.shared_ejections.unreadable == 1
        assert len(b.pins) == 0 and len(b.sessions) == 0
        for replica in (a, b):
            await replica.channel.stop()

    asyncio.run(run())


def test_cached_answers_reach_the_other_replicas_with_their_ttl(redis: RedisServer) -> None:
    from sidecar.cache.caches import ResponseCaches
    from sidecar.cache.keys import cache_key
    from sidecar.dialects.apis import Dialect
    from sidecar.fleet.answers import AnswerSharing
    from tests.unit.routing.helpers import config

    cfg = config("""
providers: {p: {base_url: "http://127.0.0.1:9/v1"}}
quotas: {redis_url: {env: R}}
models:
  g: {targets: [{provider: p, model_ref: m}], response_cache: {fleet: true, ttl_seconds: 60}}
  local: {targets: [{provider: p, model_ref: m}], response_cache: {}}
""")

    async def run() -> None:
        wall = ManualClock(WALL)
        clocks = [ManualClock(100.0), ManualClock(9_000.0)]
        caches = [ResponseCaches(cfg, 60.0, clock) for clock in clocks]
        channels = [FleetChannel(redis.url, 500, [AnswerSharing(
            "t:", name, lambda c=c: c, clock, wall)], name, wall)
            for name, c, clock in zip("ab", caches, clocks, strict=True)]
        for channel in channels:
            assert await channel.round()
        key = cache_key("g", "caller", Dialect.OPENAI_CHAT, {"messages": []})
        caches[0].stores["g"].put(key, b'{"answer": 1}', "application/json")
        caches[0].stores["local"].put(key, b'{"answer": 2}', "application/json")
        for channel in channels:
            assert await channel.round()
        held = caches[1].stores["g"].get(key)
        assert held is not None and held.body == b'{"answer": 1}'
        assert caches[1].stores["local"].get(key) is None  # that group did not opt in
        clocks[1].now += 60  # the TTL from the first storage, on the other replica too
        assert caches[1].stores["g"].get(key) is None
        for channel in channels:
            await channel.stop()

    asyncio.run(run())


def test_replicas_whose_slices_start_at_different_phases_miss_nothing(
        redis: RedisServer) -> None:
    """Slice boundaries 8 s apart in wall time on two replicas: every observation of one
    reaches the other (a replica publishes its last three slices and reads one ahead)."""
    async def run() -> None:
        wall = ManualClock(WALL + 1.0)
        a = Replica("a", redis, wall, 98.0)
        wall.now = WALL + 9.0
        b = Replica("b", redis, wall, 2001.5)
        wall.now = WALL + 9.0
        for _ in range(60):  # 30 s of rounds every 0.5 s, one failure a round on a
            failures(a, 1)
            await rounds(a, b)
            for replica in (a, b):
                replica.advance(0.5)
            wall.now += 0.5
        await rounds(a, b)
        assert a.store.get("p/slow", 60).count == 60
        assert b.store.get("p/slow", 60).count == 60
        for replica in (a, b):
            await replica.channel.stop()

    asyncio.run(run())
