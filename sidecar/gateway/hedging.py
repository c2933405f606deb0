"""Which decisions hedge, with what deadline, within what budget (docs/hedging.md).

A hedging group's decision hedges when its first two targets are distinct native routes
and the group's bucket has a token. The bucket starts empty and fills by `budget_percent`
of a token per such decision, up to `burst`; a hedging decision takes one, and gets it
back when its request ended on one upstream request (the access log says so). Tokens are
only ever made by decisions, so the extra upstream requests never exceed the budget's
share of the group's decisions, whatever the targets do — a target that turns slow
cannot double the load on the others. While hedges fire less often than the budget
allows, the unspent share piles up (to `burst`) as the float that decisions in flight
hold, so at steady state every decision can hedge.

The deadline is the primary's rolling p95 time to first byte, at most `max_over_median`
times its median, within the group's bounds: about one request in twenty of a steady
target reaches it. The cap is for a target with a slow tail of about that share: the p95
then falls inside the tail, and a deadline there would hedge none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.config.hedge_policy import HedgePolicy
from sidecar.config.models import SidecarConfig
from sidecar.dialects.apis import Dialect
from sidecar.envoy_contract import hedge_pairs
from sidecar.gateway.runtime import PER_TRY_TIMEOUT_HEADER, Runtime, on_route
from sidecar.routing.decision import TargetChoice
from sidecar.routing.observations import ObservationView
from sidecar.telemetry.metrics import Metrics


@dataclass(frozen=True, slots=True)
class HedgePlan:
    """A hedged decision: its one cluster (the pair), and the router headers that replace
    the group's: the hedge deadline as the per-try timeout, the hedging route."""

    cluster: str
    headers: tuple[tuple[str, str], ...]


@dataclass
class HedgeTally:
    """Per group since the configuration was loaded (`/metrics`)."""

    decisions: int = 0
    hedged: int = 0          # decisions sent to a pair cluster
    no_budget: int = 0       # decisions that would have hedged but found no token
    fired: int = 0           # of the hedged, those that used a second upstream request
    #                          (the hedge, or a fallback after the first failed)
    second_won: int = 0      # of those, served by the second target


class _Bucket:
    def __init__(self, policy: HedgePolicy) -> None:
        self.share = policy.budget_percent / 100
        self.size = float(policy.burst)
        # Empty at first: every token is earned by decisions, so hedges never exceed the
        # budget's share; the unspent part becomes the float in-flight hedges hold.
        self.tokens = 0.0

    def fill(self) -> None:
        self.tokens = min(self.size, self.tokens + self.share)

    def take(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def give_back(self) -> None:
        self.tokens = min(self.size, self.tokens + 1.0)


class Hedges:
    def __init__(self, config: SidecarConfig, previous: Hedges | None = None) -> None:
        """`previous`: the hedges of the configuration a reload replaces; a group whose
        hedge policy and targets did not change keeps its bucket and tally."""
        self._groups = {name: group for name, group in config.models.items()
                        if group.hedge is not None}
        self._policies = {name: group.hedge for name, group in self._groups.items()}
        self._buckets = {name: _Bucket(policy) for name, policy in self._policies.items()}
        self.totals = {name: HedgeTally() for name in self._policies}
        if previous is not None:
            for name, group in self._groups.items():
                before = previous._groups.get(name)
                if (before is not None and before.hedge == group.hedge
                        and before.targets == group.targets
                        and before.fallback == group.fallback):
                    self._buckets[name] = previous._buckets[name]
                    self.totals[name] = previous.totals[name]
        self._evidence = {name: (group.dynamic_score.observation_window_seconds,
                                 group.dynamic_score.min_observations)
                          for name, group in self._groups.items()}
        self._routes = {name: config.hedge_route_classes[group.fallback.route_class]
                        for name, group in self._groups.items()}
        # (group, first, second) → pair cluster, and pair cluster → (group, the second
        # target's label)
        self._names = {(name, first, second): pair for name, group in self._groups.items()
                       for first, second, pair in hedge_pairs(
                           name, [t.provider for t in group.targets])}
        self._pairs = {pair: (name, f"{self._groups[name].targets[second].provider}/"
                                    f"{self._groups[name].targets[second].model_ref}")
                       for (name, _, second), pair in self._names.items()}

    def __contains__(self, group: str) -> bool:
        return group in self._policies

    def plan(self, runtime: Runtime, group: str, ordered: Sequence[TargetChoice],
             dialect: Dialect, stream: bool, observations: ObservationView
             ) -> HedgePlan | None:
        """The hedge of a decision whose distinct targets are `ordered`, or None: fewer
        than two, either reached through the sidecar (a bridge: it has no pair), or no
        token in the budget."""
        if len(ordered) < 2:
            return None
        first, second = ordered[0], ordered[1]
        for choice in (first, second):
            route = runtime.routes.get((group, choice.index, dialect))
            if route is None or route.cluster in runtime.bridges:
                return None
        deadline = self.deadline_ms(group, first.label, observations, stream)
        if deadline is None:
            return None
        base = (runtime.stream_attempt_headers if stream else runtime.attempt_headers)[group]
        headers = on_route(((PER_TRY_TIMEOUT_HEADER, str(deadline)),
                            *((name, value) for name, value in base
                              if name != PER_TRY_TIMEOUT_HEADER)), self._routes[group])
        return HedgePlan(self._names[(group, first.index, second.index)], headers)

    def deadline_ms(self, group: str, primary: str, observations: ObservationView,
                    stream: bool = False) -> int | None:
        """The hedge deadline for a decision of `group` whose primary is `primary`
        (`provider/model_ref`), or None when the budget has no token for it. Never later
        than an unhedged attempt would be abandoned (the first-token deadline of a gated
        stream, else the per-try timeout): hedging must not wait longer than fallback."""
        tally = self.totals[group]
        bucket = self._buckets[group]
        tally.decisions += 1
        bucket.fill()
        if not bucket.take():
            tally.no_budget += 1
            return None
        tally.hedged += 1
        policy = self._policies[group]
        window, needed = self._evidence[group]
        observed = observations.get(primary, window)
        fallback = self._groups[group].fallback
        latest = (fallback.first_event_wait_seconds if stream and fallback.commit_at_first_event
                  else fallback.per_try_timeout_seconds)
        highest = min(policy.max_deadline_seconds, latest) * 1000
        if observed.count < needed or observed.p95_ttfb_ms is None:
            return round(highest)
        deadline = observed.p95_ttfb_ms
        if observed.p50_ttfb_ms is not None:
            deadline = min(deadline, observed.p50_ttfb_ms * policy.max_over_median)
        return round(min(highest, max(policy.min_deadline_ms, deadline)))

    def ended(self, cluster: str, attempts: int, served_by: str | None) -> None:
        """A request of a pair cluster ended (the access log's entry): on one upstream
        request, its token goes back; on two, the hedge (or a fallback) was spent."""
        pair = self._pairs.get(cluster)
        if pair is None:  # a pair of a configuration before a reload
            return
        group, second = pair
        if attempts <= 1:
            self._buckets[group].give_back()
            return
        tally = self.totals[group]
        tally.fired += 1
        tally.second_won += int(served_by == second)


_COUNTERS = (
    ("hedge_decisions", "decisions of hedging groups that could hedge (two native targets)",
     "decisions"),
    ("hedge_hedged", "decisions sent hedged (to a pair cluster)", "hedged"),
    ("hedge_no_budget", "decisions not hedged: the group's hedge budget had no token",
     "no_budget"),
    ("hedge_second_attempts", "hedged requests that made a second upstream request "
     "(the hedge, or a fallback after a failure)", "fired"),
    ("hedge_second_won", "hedged requests served by the second target", "second_won"),
)


def add_hedge_metrics(metrics: Metrics, current: Callable[[], Hedges]) -> None:
    """Per hedging group, since the configuration was loaded (a reload starts again)."""
    for name, text, attribute in _COUNTERS:
        metrics.add_counter(name, text, ("group",), lambda attribute=attribute: {
            (group,): getattr(tally, attribute) for group, tally in current().totals.items()})
