"""Routing strategies behind one interface, and the registry that names them
(docs/strategies.md).

A decision runs in stages, in the manner of an endpoint picker: the shared **filter**
(gates.py: eligibility or hard filters, contract, spend ceiling — the same for every
strategy), then the strategy's own **score and pick** (`Strategy.order`), which returns the
eligible targets in attempt order: the primary first, then the fallbacks. A strategy keeps
whatever state it needs per group (a rotation, pins, ejections) and records its reasons in
the trace. Adding a strategy means one class and one registry entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sidecar.config.models import ModelGroup
from sidecar.config.policy import Signals
from sidecar.config.strategy_policies import TargetSelector
from sidecar.routing.affinity import AffinityStore, Clock
from sidecar.routing.conditions import compile_condition
from sidecar.routing.decision import TargetChoice
from sidecar.routing.dynamic_score import DynamicScore
from sidecar.routing.ejection import Ejections
from sidecar.routing.observations import ObservationView
from sidecar.routing.request import RequestSummary
from sidecar.routing.signals import (
    FeatureDetector,
    complexity,
    prompt_feature_detector,
    request_shape_buckets,
)
from sidecar.routing.trace import CandidateTrace, DecisionTrace
from sidecar.routing.weighted import WeightedRotation


@dataclass(frozen=True, slots=True)
class Context:
    """What one decision's score-and-pick stage sees."""

    request: RequestSummary
    observations: ObservationView
    trace: DecisionTrace
    # `strategy: external` only: the routing service's answer, or why there is none.
    external: ExternalAnswer | None = None


@dataclass(frozen=True, slots=True)
class ExternalAnswer:
    """What the external routing service said (target labels in attempt order), or
    `failure`: why it said nothing usable (`timeout`, `error`, `busy`)."""

    targets: tuple[str, ...] = ()
    failure: str | None = None


class Strategy(Protocol):
    def order(self, context: Context, eligible: list[TargetChoice]) -> list[TargetChoice]:
        """The eligible targets in attempt order (never empty, never another target)."""
        ...


class Rotations:
    """One weighted rotation per candidate set of a group: requests that can use the same
    targets share a rotation, so each class of request gets exactly its mix. At most
    2^targets sets, created on first use."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._rotations: dict[tuple[int, ...], WeightedRotation] = {}

    def __call__(self, indices: tuple[int, ...]) -> WeightedRotation:
        rotation = self._rotations.get(indices)
        if rotation is None:
            rotation = self._rotations[indices] = WeightedRotation(self._size)
        return rotation


class Failover:
    """Declared order: the first eligible target, then the next ones."""

    def order(self, context: Context, eligible: list[TargetChoice]) -> list[TargetChoice]:
        trace = context.trace
        trace.order = "declared"
        trace.odds = _certain(eligible[0], eligible)
        trace.chose(1.0, "declared_order")
        return eligible


class Weighted:
    """Primary by the weighted rotation; fallbacks by descending weight, then declared
    order, so the fallback order is stable and favours the declared mix."""

    def __init__(self, rotations: Rotations) -> None:
        self._rotations = rotations
        # The odds of each candidate set (a function of the weights alone).
        self._odds: dict[tuple[int, ...], tuple[tuple[str, float], ...]] = {}

    def order(self, context: Context, eligible: list[TargetChoice]) -> list[TargetChoice]:
        trace = context.trace
        trace.order = "weighted_rotation"
        weights = [c.target.weight for c in eligible]
        total = sum(weights) or 1
        trace.defer_candidates(lambda only: [
            CandidateTrace(c.label, round(c.target.weight / total, 6),
                           final_share=round(c.target.weight / total, 6))
            for c in eligible if only is None or c.label == only])
        indices = tuple(c.index for c in eligible)
        primary_index = self._rotations(indices).pick(indices, weights)
        primary = next(c for c in eligible if c.index == primary_index)
        odds = self._odds.get(indices)
        if odds is None:
            odds = self._odds[indices] = weight_odds(eligible)
        trace.odds = odds  # aligned with `eligible`, so the primary's is at its position
        trace.chose(odds[indices.index(primary_index)][1], "weights")
        rest = sorted((c for c in eligible if c.index != primary_index),
                      key=lambda c: (-c.target.weight, c.index))
        return [primary, *rest]


class DynamicScoreStrategy:
    """dynamic_score (dynamic_score.py): thresholds and ejection, scores, the capped blend,
    affinity and probes, over the shared rotation."""

    def __init__(self, group: ModelGroup, rotations: Rotations, clock: Clock) -> None:
        policy = group.dynamic_score
        self.core = DynamicScore(group)
        self.rotations = rotations
        self.affinity = (AffinityStore(policy.affinity.ttl_seconds, policy.affinity.max_entries,
                                       clock) if policy.affinity.enabled else None)
        self.ejections = Ejections(policy.observation_window_seconds, clock)

    def order(self, context: Context, eligible: list[TargetChoice]) -> list[TargetChoice]:
        return self.core.order(context.request, eligible, context.observations,
                               self.rotations, context.trace, self.affinity, self.ejections)


class Script:
    """`script`: the base order (weighted or failover), then the group's rules in order;
    each rule whose condition holds requires, excludes, prefers or orders targets
    (docs/strategies.md). Rules read the request's features (`script_features`) only."""

    def __init__(self, group: ModelGroup, base: Strategy, wall_clock: Clock) -> None:
        assert group.script is not None
        self._base = base
        self._base_name = group.script.base
        self._rules = [(compile_condition(rule.when), rule) for rule in group.script.rules]
        self._signals = group.dynamic_score.signals
        self._detect = prompt_feature_detector(self._signals)
        self._wall = wall_clock

    def order(self, context: Context, eligible: list[TargetChoice]) -> list[TargetChoice]:
        trace = context.trace
        current = self._base.order(context, eligible)
        base_primary = current[0]
        features = script_features(context.request, self._detect, self._signals, self._wall())
        applied = []
        for index, (condition, rule) in enumerate(self._rules):
            if not condition(features):
                continue
            applied.append(str(index))
            where = f"script.rules[{index}]"
            if rule.require is not None:
                current = _keep(current, rule.require, True, f"{where}.require", trace)
            if rule.exclude is not None:
                current = _keep(current, rule.exclude, False, f"{where}.exclude", trace)
            if rule.prefer is not None:
                current = ([c for c in current if _matches(c, rule.prefer)]
                           + [c for c in current if not _matches(c, rule.prefer)])
            if rule.order:
                rank = {label: position for position, label in enumerate(rule.order)}
                current = sorted(current, key=lambda c: rank.get(c.label, len(rank)))
        trace.order = (f"script({self._base_name}): rules "
                       f"{', '.join(applied) if applied else 'none'} applied")
        if current and current[0] is not base_primary:
            trace.odds = _certain(current[0], current)  # the rules chose it, not chance
            trace.chose(1.0, "script_rule")
        return current


class External:
    """`external`: the attempt order an operator-run service returned for this request
    (the gateway asks it before deciding: gateway/external_calls.py). Without a usable
    answer, the group's fallback strategy decides and the trace says why."""

    def __init__(self, group: ModelGroup, fallback: Strategy) -> None:
        self._fallback = fallback
        self._labels = frozenset(f"{t.provider}/{t.model_ref}" for t in group.targets)

    def order(self, context: Context, eligible: list[TargetChoice]) -> list[TargetChoice]:
        trace = context.trace
        ordered, failure = self._answered(context.external, eligible)
        if failure is None:
            trace.external = "answered"
            trace.order = "external"
            trace.odds = _certain(ordered[0], ordered)
            trace.chose(1.0, "external")
            return ordered
        trace.external = failure
        ordered = self._fallback.order(context, eligible)
        trace.order = f"external fallback ({failure}): {trace.order}"
        return ordered

    def _answered(self, answer: ExternalAnswer | None,
                  eligible: list[TargetChoice]) -> tuple[list[TargetChoice], str | None]:
        if answer is None:
            return [], "not_asked"
        if answer.failure is not None:
            return [], answer.failure
        if not answer.targets:
            return [], "empty"
        by_label = {choice.label: choice for choice in eligible}
        ordered: list[TargetChoice] = []
        for label in answer.targets:
            choice = by_label.get(label)
            if choice is None:
                return [], "ineligible_target" if label in self._labels else "unknown_target"
            if choice not in ordered:
                ordered.append(choice)
        return ordered, None


def weight_odds(eligible: list[TargetChoice]) -> tuple[tuple[str, float], ...]:
    """Each candidate's weight share: its probability of being the rotation's pick."""
    weights = [c.target.weight for c in eligible]
    total = sum(weights)
    if total <= 0:
        return _certain(eligible[0], eligible)
    return tuple((c.label, round(w / total, 6)) for c, w in zip(eligible, weights, strict=True))


def _certain(chosen: TargetChoice,
             candidates: list[TargetChoice]) -> tuple[tuple[str, float], ...]:
    return tuple((c.label, 1.0 if c is chosen else 0.0) for c in candidates)


def script_features(request: RequestSummary, detect: FeatureDetector, signals: Signals,
                    now: float) -> dict[str, object]:
    """What a script condition may read: the request's buckets, never its text."""
    features = detect(request)
    result = complexity(request, features, signals)
    shape = request_shape_buckets(request)
    moment = datetime.fromtimestamp(now, UTC)
    return {**shape, "complexity": result.bucket.value if result else "none",
            "features": frozenset(f.value for f in features), "caller": request.caller,
            "hour_utc": float(moment.hour), "weekday": moment.strftime("%a").lower(),
            "prompt_chars": float(request.prompt_chars)}


def _matches(choice: TargetChoice, selector: TargetSelector) -> bool:
    return (choice.label in selector.targets
            or not set(selector.tags).isdisjoint(choice.target.tags))


def _keep(current: list[TargetChoice], selector: TargetSelector, matching: bool, stage: str,
          trace: DecisionTrace) -> list[TargetChoice]:
    kept = []
    for choice in current:
        if _matches(choice, selector) == matching:
            kept.append(choice)
        else:
            trace.exclude(choice.label, stage)
    return kept


Factory = Callable[[ModelGroup, Clock, Clock], Strategy]


def _weighted(group: ModelGroup, _clock: Clock, _wall: Clock) -> Strategy:
    return Weighted(Rotations(len(group.targets)))


def _failover(_group: ModelGroup, _clock: Clock, _wall: Clock) -> Strategy:
    return Failover()


def _dynamic(group: ModelGroup, clock: Clock, _wall: Clock) -> Strategy:
    return DynamicScoreStrategy(group, Rotations(len(group.targets)), clock)


def _script(group: ModelGroup, clock: Clock, wall: Clock) -> Strategy:
    assert group.script is not None
    return Script(group, REGISTRY[group.script.base](group, clock, wall), wall)


def _external(group: ModelGroup, clock: Clock, wall: Clock) -> Strategy:
    assert group.external is not None
    return External(group, REGISTRY[group.external.fallback_strategy](group, clock, wall))


REGISTRY: dict[str, Factory] = {
    "weighted": _weighted,
    "failover": _failover,
    "dynamic_score": _dynamic,
    "script": _script,
    "external": _external,
}


def strategy_for(group: ModelGroup, clock: Clock, wall_clock: Clock = time.time) -> Strategy:
    """`clock`: monotonic (TTLs, windows); `wall_clock`: time of day, for script rules."""
    return REGISTRY[group.strategy](group, clock, wall_clock)
