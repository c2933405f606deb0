"""The demo's providers differ and drift on schedule (devstack/demo_world.py), and its
traffic mixes simple, code, multi-turn and Anthropic requests (devstack/demo_traffic.py)."""

from __future__ import annotations

import asyncio
import random

from sidecar.devstack.demo import demo_provider_server
from sidecar.devstack.demo_traffic import TURNS, DemoTraffic
from sidecar.devstack.demo_world import STEADY, Drift, run_drift, steady
from tests.clock import ManualClock


def test_the_drift_slows_and_fails_one_provider_then_it_recovers() -> None:
    drift = Drift(provider="baseten", start_s=10, end_s=40, period_s=100, slowdown=4,
                  error_rate=0.5)
    assert [drift.active(t) for t in (0, 9.9, 10, 39, 40, 110, 150)] == [
        False, False, True, True, False, True, False]
    late = Drift(start_s=650, end_s=770, period_s=600)  # starts after the first period
    assert [late.active(t) for t in (100, 649, 650, 769, 770, 1250, 1371)] == [
        False, False, True, True, False, True, False]
    server = demo_provider_server("127.0.0.1", 0, None)
    steady(server)
    latencies = {name: p.behaviour.latency_s for name, p in server.providers.items()}
    assert len(set(latencies.values())) == len(latencies)  # every provider its own pace
    clock = ManualClock(1000.0)

    async def walk() -> list[tuple[float, float]]:
        task = asyncio.ensure_future(run_drift(server, drift, clock, tick_s=0))
        seen = []
        for at in (5, 15, 45):
            clock.now = 1000.0 + at
            for _ in range(3):
                await asyncio.sleep(0)
            baseten = server.providers["baseten"].behaviour
            seen.append((baseten.latency_s, baseten.error_rate))
        task.cancel()
        return seen

    normal = STEADY["baseten"]
    assert asyncio.run(walk()) == [(normal.latency_s, normal.error_rate),
                                   (normal.latency_s * 4, 0.5),
                                   (normal.latency_s, normal.error_rate)]


def test_the_traffic_mixes_kinds_and_conversations_grow_turn_by_turn() -> None:
    traffic = DemoTraffic("http://127.0.0.1:9", "t")
    traffic._turns = [[] for _ in range(6)]
    chance = random.Random(1)
    kinds = [traffic._next(chance) for _ in range(400)]
    assert {k for k, _, _ in kinds} == {"simple", "code", "conversation", "anthropic"}
    assert any(body.get("stream") for _, _, body in kinds)
    assert {p for k, p, _ in kinds if k == "anthropic"} == {"/v1/messages"}
    # Every first turn but the multi-turn conversations' is an opening of its own: affinity
    # pins an opening, and a pinned turn never carries a probe.
    openings = [body["messages"][0]["content"] for k, _, body in kinds
                if k in ("simple", "code", "anthropic")]
    assert len(set(openings)) == len(openings)
    traffic._turns[0].clear()
    turns = [traffic._turn(0) for _ in range(len(TURNS) + 1)]
    assert [len(t) for t in turns] == [1, 3, 5, 7, 9, 11, 1]  # then it starts over
    assert turns[1][0] == turns[0][0]  # the same opening: affinity pins the conversation
