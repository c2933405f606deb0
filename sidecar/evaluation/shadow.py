"""Shadow policies (docs/policy-evaluation.md §3): every sampled live decision of a group
with a `shadow:` block is decided again under the candidate policy and compared, never
acted on.

Off the decision path: the gateway only `offer`s the request summary and the live primary
(an append to a bounded queue); `drain`, run by a background task on the same event loop,
decides them under the shadow's own router (its own rotation, pins and ejections) on the
same observation store, and adds to per-group tallies: decisions, agreements (the same
primary), and the estimated differences of the shadow's primary from the live one —
estimated cost of this request (prices, its size), p95 latency and error rate observed for
each target. The tallies feed `/metrics` and, as rollup rows, the decisions report."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.models import SidecarConfig
from sidecar.routing.decision import Decision
from sidecar.routing.observations import ObservationView
from sidecar.routing.policy_version import policy_version
from sidecar.routing.request import RequestSummary
from sidecar.routing.router import Router
from sidecar.routing.scores import estimated_cost_usd
from sidecar.telemetry.rows import ShadowRow

# Decisions waiting for their shadow at most (past it an offer is dropped and counted):
# a burst of this many requests between two drains costs at most ~this many summaries.
MAX_PENDING = 4096
DRAIN_BATCH = 512


@dataclass(slots=True)
class ShadowTally:
    """One group's shadow figures since the last `take` (sums: divide by `decisions`)."""

    policy_version: str
    shadow_version: str
    decisions: int = 0
    agreements: int = 0
    # Shadow's primary minus live's, summed over decisions (0 where they agree, or where a
    # figure is unknown for either: no price, no latency observed yet).
    cost_delta_usd: float = 0.0      # this request's estimated cost on each
    latency_delta_ms: float = 0.0    # p95 latency (the group's latency basis) of each
    error_rate_delta: float = 0.0    # observed error rate of each
    dropped: int = 0

    def fresh(self) -> ShadowTally:
        return ShadowTally(self.policy_version, self.shadow_version)


def shadow_decider(config: SidecarConfig, observations: ObservationView
                   ) -> ShadowDecider | None:
    """The decider of a configuration's shadow policies, or None when it has none."""
    if not any(group.shadow is not None for group in config.models.values()):
        return None
    return ShadowDecider(config, observations)


class ShadowDecider:
    def __init__(self, config: SidecarConfig, observations: ObservationView,
                 clock: Callable[[], float] = time.monotonic,
                 max_pending: int = MAX_PENDING) -> None:
        shadows = {name: group.shadow_group() for name, group in config.models.items()
                   if group.shadow is not None}
        self._groups = {name: config.models[name] for name in shadows}
        self._targets = {name: {f"{t.provider}/{t.model_ref}": t for t in group.targets}
                         for name, group in self._groups.items()}
        self._router = Router(config.model_copy(update={"models": shadows}), clock=clock)
        self._every = {name: max(1, round(100 / group.shadow.sample_percent))  # type: ignore[union-attr]
                       for name, group in self._groups.items()}
        self._seen = dict.fromkeys(shadows, 0)
        self._observations = observations
        self._pending: deque[tuple[RequestSummary, str]] = deque()
        self._max_pending = max_pending
        self.tallies = {name: ShadowTally(policy_version(self._groups[name]),
                                          policy_version(shadow))  # type: ignore[arg-type]
                        for name, shadow in shadows.items()}
        # Since the start, for /metrics (the tallies are taken for telemetry rollups).
        self.totals = {name: tally.fresh() for name, tally in self.tallies.items()}

    def __contains__(self, group: str) -> bool:
        return group in self._groups

    def offer(self, summary: RequestSummary, live: Decision) -> None:
        """On the decision path: O(1), nothing decided here."""
        group = summary.group
        seen = self._seen[group] = self._seen[group] + 1
        if seen % self._every[group]:
            return
        if len(self._pending) >= self._max_pending:
            self.tallies[group].dropped += 1
            self.totals[group].dropped += 1
            return
        self._pending.append((summary, live.primary.label))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def drain(self, limit: int = DRAIN_BATCH) -> int:
        """Decide up to `limit` waiting offers under their shadows; how many were."""
        done = 0
        pending = self._pending
        while pending and done < limit:
            summary, live = pending.popleft()
            outcome = self._router.decide(summary, self._observations)
            done += 1
            if isinstance(outcome, Decision):
                self._compare(summary, live, outcome.primary.label)
        return done

    def take(self) -> dict[str, ShadowTally]:
        """The tallies since the last take (groups with something to say), reset."""
        taken = {name: tally for name, tally in self.tallies.items()
                 if tally.decisions or tally.dropped}
        for name in taken:
            self.tallies[name] = self.tallies[name].fresh()
        return taken

    def _compare(self, summary: RequestSummary, live: str, shadow: str) -> None:
        group = self._groups[summary.group]
        for tally in (self.tallies[summary.group], self.totals[summary.group]):
            tally.decisions += 1
            if shadow == live:
                tally.agreements += 1
        if shadow == live:
            return
        targets = self._targets[summary.group]
        live_cost = estimated_cost_usd(targets[live], summary.estimated_input_tokens,
                                       summary.output_budget)
        shadow_cost = estimated_cost_usd(targets[shadow], summary.estimated_input_tokens,
                                         summary.output_budget)
        policy = group.dynamic_score
        window, basis = policy.observation_window_seconds, policy.latency_basis
        live_seen = self._observations.get(live, window)
        shadow_seen = self._observations.get(shadow, window)
        live_latency = live_seen.latency_ms(basis)
        shadow_latency = shadow_seen.latency_ms(basis)
        for tally in (self.tallies[summary.group], self.totals[summary.group]):
            if live_cost is not None and shadow_cost is not None:
                tally.cost_delta_usd += shadow_cost - live_cost
            if live_latency is not None and shadow_latency is not None:
                tally.latency_delta_ms += shadow_latency - live_latency
            tally.error_rate_delta += shadow_seen.error_rate - live_seen.error_rate


class ShadowLoop:
    """The background half: drains the gateway's current decider every `drain_s` and hands
    its tallies to telemetry every `rollup_s` (a reload gives the gateway a new decider;
    the loop follows it). Runs on the sidecar's event loop, beside the requests."""

    def __init__(self, current: Callable[[], ShadowDecider | None],
                 rollup: Callable[[ShadowRow], None] | None,
                 drain_s: float = 0.05, rollup_s: float = 10.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._current = current
        self._rollup = rollup
        self._drain_s = drain_s
        self._rollup_s = rollup_s
        self._wall = wall_clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()

    def flush(self) -> None:
        decider = self._current()
        if decider is None or self._rollup is None:
            return
        now = self._wall()
        for group, t in decider.take().items():
            self._rollup(ShadowRow(now, group, t.policy_version, t.shadow_version,
                                   t.decisions, t.agreements, t.cost_delta_usd,
                                   t.latency_delta_ms, t.error_rate_delta, t.dropped))

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self._drain_s)
            decider = self._current()
            if decider is None:
                continue
            while decider.drain():  # a batch at a time, letting requests in between
                await asyncio.sleep(0)
            if time.monotonic() - last >= self._rollup_s:
                last = time.monotonic()
                self.flush()
