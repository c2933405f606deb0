"""Issue 41's drained-target scenario, shared by the one-replica and the fleet tests: a
two-target `dynamic_score` group whose cheap target turns ten times slower with 10 % 503s;
once it is ejected, the share of upstream attempts it still gets (probes, their
same-target retries and last-resort fallbacks included) while it stays sick."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from sidecar.devstack.providers import Behaviour, FakeProvider

HEALTHY = Behaviour(latency_s=0.02)
# The degradation: ten times slower, 10 % 503s.
SICK = Behaviour(latency_s=0.2, error_rate=0.1, error_status=503)
GROUP_YAML = """\
  drained:
    strategy: dynamic_score
    targets:
      - {{provider: {cheap}, model_ref: cheap-m, weight: 50}}
      - {{provider: {dear}, model_ref: dear-m, weight: 50}}
    routing_policy:
      dynamic_score:
        min_observations: 10
        observation_window_seconds: 30
        affinity: {{enabled: false}}
        thresholds: {{max_error_rate: 0.03}}
"""


@dataclass(frozen=True)
class Share:
    sick: int
    total: int
    requests: int
    failed: int

    @property
    def share(self) -> float:
        return self.sick / max(1, self.total)


async def _send(ports: Sequence[int], token: str, count: int, rate: float | None) -> int:
    """`count` chat requests to the group, spread over `ports`, at `rate` a second (None: 16
    at a time, as fast as they are answered); the number that failed."""
    failed = 0
    async with httpx.AsyncClient(timeout=30) as client:
        async def one(index: int) -> None:
            nonlocal failed
            reply = await client.post(
                f"http://127.0.0.1:{ports[index % len(ports)]}/v1/chat/completions",
                headers={"authorization": f"Bearer {token}"},
                json={"model": "drained",
                      "messages": [{"role": "user", "content": f"question {index}"}]})
            failed += reply.status_code != 200

        if rate is None:
            queue = iter(range(count))

            async def worker() -> None:
                for index in queue:
                    await one(index)
            await asyncio.gather(*(worker() for _ in range(16)))
            return failed
        start = time.monotonic()
        tasks = []
        for index in range(count):  # open loop: a request every 1/rate s, answered or not
            await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)
    return failed


def send(ports: Sequence[int], token: str, count: int, rate: float | None = None) -> int:
    return asyncio.run(_send(ports, token, count, rate))


def sick_share_after_drain(cheap: FakeProvider, dear: FakeProvider, ports: Sequence[int],
                           token: str, drained: Callable[[], bool], requests: int,
                           rate: float) -> Share:
    """Warm both targets, make the cheap one sick, send until `drained()` says every
    replica ejected it, then `requests` more at `rate` a second: what it got of their
    attempts. The rate matters: an ejection measured in seconds (before issue 41) let a
    sick target in again every few seconds, so the fewer requests a second, the larger its
    share."""
    cheap.behaviour = dear.behaviour = HEALTHY
    assert send(ports, token, 200) == 0
    cheap.behaviour = SICK
    try:
        sent = 0
        while not drained():
            send(ports, token, 20)
            sent += 20
            assert sent < 2_000, "the sick target was never ejected"
        before = len(cheap.received), len(dear.received)
        failed = send(ports, token, requests, rate)
        sick = len(cheap.received) - before[0]
        return Share(sick, sick + len(dear.received) - before[1], requests, failed)
    finally:
        cheap.behaviour = HEALTHY


def probing_rounds(log: Path, group: str, target: str) -> tuple[list[tuple[int, int]], int, int]:
    """From a replica's decision log (`--log-decisions`): at the start of each probing round
    of `target` after it first left, (its probes so far, the group's decisions since it
    left); and the totals (probes, decisions)."""
    rounds: list[tuple[int, int]] = []
    probes = decisions = 0
    left, before = False, None
    for line in log.read_text().splitlines():
        if "sidecar.decision " not in line:
            continue
        event = json.loads(line.split("sidecar.decision ", 1)[1])
        if event.get("group") != group:
            continue
        trace = event["trace"]
        stages = {e["stage"] for e in trace.get("exclusions", []) if e["target"] == target}
        stage = next((s for s in stages if s.startswith("thresholds.")), None)
        if not left:
            left = stage is not None  # the decision that ejected it
            continue
        if stage == "thresholds.probing" and before == "thresholds.ejected":
            rounds.append((probes, decisions))
        before = stage
        decisions += 1
        probes += trace.get("probe") == target
    return rounds, probes, decisions
