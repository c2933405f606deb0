"""Shadow policies (docs/policy-evaluation.md §3): sampled live decisions of a group with a
`shadow:` block are decided again under the candidate policy and compared, never acted on.

Off the decision path: the gateway only `offer`s the request summary and the live
decision's odds (an append to a bounded queue); `drain`, run by a background task on the
same event loop, decides them under the shadow's own router (its own rotation, pins and
ejections) on the same observation store, and adds to per-group tallies. Both policies
pick by deterministic rotations, so their primaries for one request are compared as
distributions: agreement is 1 − the total variation distance between the two decisions'
odds (the chance, under the best pairing, that both choose the same), and each difference
is the shadow's expected figure minus the live one's under their odds — estimated cost of
this request (prices, its size), p95 latency and error rate observed for each target."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.models import SidecarConfig, Target
from sidecar.evaluation.odds import decision_odds, total_variation
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.routing.decision import Decision
from sidecar.routing.observations import ObservationView
from sidecar.routing.policy_version import policy_version
from sidecar.routing.request import RequestSummary
from sidecar.routing.router import Router
from sidecar.routing.scores import estimated_cost_usd
from sidecar.telemetry.rows import ShadowRow

log = logging.getLogger("sidecar.shadow")
_limited = LogLimiter(log, burst=1, interval=60.0)
# Decisions waiting for their shadow at most (past it an offer is dropped and counted);
# each holds its request summary, with up to `max_scan_bytes` of prompt sample: 1,024 ×
# 16 KiB is 16 MiB at most (docs/security.md).
MAX_PENDING = 1024
DRAIN_BATCH = 256
_GOLDEN = 0x9E3779B1  # sampling: multiplicative hashing of the decision count


@dataclass(slots=True)
class ShadowTally:
    """One group's shadow figures since the last `take` (sums: divide by `decisions`)."""

    policy_version: str
    shadow_version: str
    decisions: int = 0
    agreements: float = 0.0          # Σ (1 − total variation) of the two decisions' odds
    # Shadow's expected figure minus live's, summed over decisions (a figure unknown for
    # a target it could choose — no price, no latency observed yet — counts as equal).
    cost_delta_usd: float = 0.0      # this request's estimated cost
    latency_delta_ms: float = 0.0    # p95 latency (the group's latency basis)
    error_rate_delta: float = 0.0    # observed error rate
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
        self._targets: dict[str, dict[str, Target]] = {
            name: {f"{t.provider}/{t.model_ref}": t for t in group.targets}
            for name, group in self._groups.items()}
        self._router = Router(config.model_copy(update={"models": shadows}), clock=clock)
        # Offer n of a group is shadowed when its hash falls under this (of 2^32).
        self._under = {name: int(group.shadow.sample_percent / 100 * 2**32)  # type: ignore[union-attr]
                       for name, group in self._groups.items()}
        self._seen = dict.fromkeys(shadows, 0)
        self._observations = observations
        self._pending: deque[tuple[RequestSummary, dict[str, float]]] = deque()
        self._max_pending = max_pending
        self.tallies = {name: ShadowTally(policy_version(self._groups[name].live_group()),
                                          policy_version(shadow))  # type: ignore[arg-type]
                        for name, shadow in shadows.items()}
        # Since the start, for /metrics (the tallies are taken for telemetry rollups).
        self.totals = {name: tally.fresh() for name, tally in self.tallies.items()}

    def __contains__(self, group: str) -> bool:
        return group in self._groups

    def offer(self, summary: RequestSummary, live: Decision) -> None:
        """On the decision path: O(1) but for the live odds' copy; nothing decided here.
        Sampled by hashing the group's decision count, not every n-th: a rotation repeats
        its picks with a short period, which an every-n-th sample would line up with."""
        group = summary.group
        seen = self._seen[group] = self._seen[group] + 1
        if (seen * _GOLDEN) & 0xFFFFFFFF >= self._under[group]:
            return
        if len(self._pending) >= self._max_pending:
            self.tallies[group].dropped += 1
            self.totals[group].dropped += 1
            return
        self._pending.append((summary, decision_odds(live)))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def drain(self, limit: int = DRAIN_BATCH) -> int:
        """Decide up to `limit` waiting offers under their shadows; how many were. A
        decision that cannot be compared (a bug) is logged and skipped, never raised: the
        loop that calls this must outlive it."""
        done = 0
        pending = self._pending
        while pending and done < limit:
            summary, live = pending.popleft()
            done += 1
            try:
                outcome = self._router.decide(summary, self._observations)
                if isinstance(outcome, Decision):
                    self._compare(summary, live, decision_odds(outcome))
            except Exception:
                _limited.exception("shadow_decision", "a shadow decision failed (skipped)")
        return done

    def take(self) -> dict[str, ShadowTally]:
        """The tallies since the last take (groups with something to say), reset."""
        taken = {name: tally for name, tally in self.tallies.items()
                 if tally.decisions or tally.dropped}
        for name in taken:
            self.tallies[name] = self.tallies[name].fresh()
        return taken

    def _compare(self, summary: RequestSummary, live: dict[str, float],
                 shadow: dict[str, float]) -> None:
        group = self._groups[summary.group]
        targets = self._targets[summary.group]
        policy = group.dynamic_score
        window, basis = policy.observation_window_seconds, policy.latency_basis
        agreement = 1.0 - total_variation(live, shadow)
        cost = latency = errors = 0.0
        for label in {*live, *shadow}:
            weight = shadow.get(label, 0.0) - live.get(label, 0.0)
            target = targets.get(label)
            if not weight or target is None:  # a target this group no longer has
                continue
            price = estimated_cost_usd(target, summary.estimated_input_tokens,
                                       summary.output_budget)
            seen = self._observations.get(label, window)
            latency_ms = seen.latency_ms(basis)
            cost += weight * (price or 0.0)
            latency += weight * (latency_ms or 0.0)
            errors += weight * seen.error_rate
        for tally in (self.tallies[summary.group], self.totals[summary.group]):
            tally.decisions += 1
            tally.agreements += agreement
            tally.cost_delta_usd += cost
            tally.latency_delta_ms += latency
            tally.error_rate_delta += errors


class ShadowLoop:
    """The background half: drains the gateway's current decider every `drain_s` (and the
    ones a reload replaced, until they are empty) and hands the tallies to telemetry every
    `rollup_s`. Runs on the sidecar's event loop, beside the requests; nothing it does can
    stop the sidecar's shutdown."""

    def __init__(self, current: Callable[[], ShadowDecider | None],
                 rollup: Callable[[ShadowRow], None] | None,
                 retired: Callable[[], list[ShadowDecider]] = list,
                 drain_s: float = 0.05, rollup_s: float = 10.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._current = current
        self._retired = retired
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
            with contextlib.suppress(BaseException):
                await self._task
        try:
            for decider in self._deciders():
                while decider.drain():
                    pass
            self.flush()
        except Exception:
            _limited.exception("shadow_stop", "shadow rollups lost at stop")

    def _deciders(self) -> list[ShadowDecider]:
        current = self._current()
        return [*self._retired(), *([current] if current is not None else [])]

    def flush(self) -> None:
        if self._rollup is None:
            return
        now = self._wall()
        retired = self._retired()
        for decider in self._deciders():
            for group, t in decider.take().items():
                self._rollup(ShadowRow(now, group, t.policy_version, t.shadow_version,
                                       t.decisions, t.agreements, t.cost_delta_usd,
                                       t.latency_delta_ms, t.error_rate_delta, t.dropped))
        for decider in list(retired):  # drained and rolled up: let it go
            if not decider.pending:
                retired.remove(decider)

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self._drain_s)
            try:
                for decider in self._deciders():
                    while decider.drain():  # a batch at a time, requests in between
                        await asyncio.sleep(0)
                        if time.monotonic() - last >= self._rollup_s:
                            break  # rollups do not wait for a queue that never empties
                if time.monotonic() - last >= self._rollup_s:
                    last = time.monotonic()
                    self.flush()
            except Exception:
                _limited.exception("shadow_loop", "shadow loop round failed")
