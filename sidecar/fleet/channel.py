"""The fleet channel: one pipelined Redis round trip every `publish_ms`, in which each
part of the shared state (observations, ejections, pins and sessions) writes what this
replica learned and reads what the others wrote.

A round never runs on the request path: decisions read only memory, which a round
updates between them (everything runs on the sidecar's one event loop). When Redis does
not answer, the round is lost, this replica routes on its own evidence, `/metrics` says so
(`sidecar_fleet_up 0`), and the first round that works again reads every live slice the
others published (a resync); what a replica learned during the outage in slices older than
its last three stays its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sidecar.dependency_names import redis_endpoint
from sidecar.fleet.redis_client import ROUND_TIMEOUT_S, redis_client
from sidecar.grpcwire.ratelimit import LogLimiter

log = logging.getLogger("sidecar.fleet")
_limited = LogLimiter(log, burst=3, interval=60.0)

Absorb = Callable[[Sequence[Any]], None]


class Part(Protocol):
    """One kind of shared state. `queue` adds its commands to the round's pipeline and
    returns how many it added and what to do with their answers (in order)."""

    name: str

    def queue(self, pipe: Any, resync: bool) -> tuple[int, Absorb]: ...


class FleetChannel:
    def __init__(self, url: str, publish_ms: int, parts: Sequence[Part], replica: str = "",
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.replica = replica  # this process's name in the shared keys
        self.parts = parts
        self._client = redis_client(url, "fleet.redis_url")
        self.where = redis_endpoint(url)  # for log lines: no password
        self.interval_s = publish_ms / 1000
        self._parts = parts
        self._wall = wall_clock
        self.up = False
        self.rounds: Counter[str] = Counter()
        # Wall time of the newest round that worked (of the start, before the first).
        self.last_merge = wall_clock()
        self._resync = True
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """A last round (what this replica learned last), then close, in a bounded time."""
        self._stopping.set()
        if self._task is not None:
            _done, pending = await asyncio.wait({self._task}, timeout=3 * ROUND_TIMEOUT_S)
            for task in pending:
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._client.aclose(), ROUND_TIMEOUT_S)

    async def _run(self) -> None:
        while not self._stopping.is_set():  # never cancelled mid-round (see quotas/shared.py)
            await self.round()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)
        await self.round()

    async def round(self) -> bool:
        pipe = self._client.pipeline(transaction=False)
        pipe.ping()  # so that a round with nothing to say still learns whether Redis answers
        try:
            queued = [part.queue(pipe, self._resync) for part in self._parts]
            # One bad answer (a key of another type) is that part's problem, not the round's.
            answers = await asyncio.wait_for(pipe.execute(raise_on_error=False),
                                             ROUND_TIMEOUT_S)
            if isinstance(answers[0], Exception):
                raise answers[0]
        except Exception as exc:
            self._failed(exc)
            return False
        at = 1
        for (count, absorb), part in zip(queued, self._parts, strict=True):
            try:
                absorb(answers[at:at + count])
            except Exception as exc:  # another replica's entry we cannot read: skip it
                self.rounds["unreadable"] += 1
                _limited.warning("fleet_unreadable", "fleet channel: %s entries not "
                                 "merged (%s)", part.name, type(exc).__name__)
            at += count
        if not self.up:
            log.info("fleet channel %s up: merging the other replicas' state", self.where)
        self.up, self._resync = True, False
        self.rounds["ok"] += 1
        self.last_merge = self._wall()
        return True

    def _failed(self, exc: Exception) -> None:
        self.rounds["failed"] += 1
        if self.up or self.rounds["failed"] == 1:
            _limited.warning("fleet_down", "fleet channel %s unreachable (%s): routing on "
                             "this replica's own evidence", self.where, type(exc).__name__)
        self.up, self._resync = False, True

    def gauges(self) -> dict[str, float]:
        return {"fleet_up": 1.0 if self.up else 0.0,
                "fleet_merge_age_seconds": max(0.0, self._wall() - self.last_merge)}
