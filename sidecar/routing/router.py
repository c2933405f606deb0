"""The routing core: a request summary and the observation state in, a decision with its
reasons out.

Pure: no gRPC, no Envoy types, no I/O. Its state is the weighted-rotation position per
group and candidate set, the conversation pins and the ejected targets, so a decision is
reproducible from configuration, observation state, that state and the request. (Per-group
memos of scoring results only save work: they hold what the same inputs would compute
again.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sidecar.bridge.registry import bridged_callers
from sidecar.config.models import SHADOW_ONLY, ModelGroup, SidecarConfig
from sidecar.routing.affinity import AffinityStore, Clock
from sidecar.routing.canary import CANARY, CanarySplit
from sidecar.routing.decision import Decision, NoEligibleTarget, TargetChoice
from sidecar.routing.ejection import Ejections
from sidecar.routing.gates import (
    GroupGates,
    admitted,
    group_gates,
    passing_targets,
    refusal_reason,
)
from sidecar.routing.observations import EMPTY_SNAPSHOT, ObservationView
from sidecar.routing.policy_version import canary_version, policy_version
from sidecar.routing.request import RequestSummary
from sidecar.routing.strategies import (
    Context,
    DynamicScoreStrategy,
    ExternalAnswer,
    Strategy,
    strategy_for,
)
from sidecar.routing.trace import DecisionTrace


@dataclass(slots=True)
class _Canary:
    """A group's canary: which side decides, and the candidate's own gates, strategy
    (with its own state: pins, rotation, ejections) and version."""

    split: CanarySplit
    strategy_name: str
    gates: GroupGates
    strategy: Strategy
    config: ModelGroup


class Router:
    def __init__(self, config: SidecarConfig, clock: Clock = time.monotonic,
                 wall_clock: Clock = time.time) -> None:
        self._config = config
        # What depends on the configuration alone, resolved once per group.
        self._gates: dict[str, GroupGates] = {
            name: group_gates(group, config.target_dialects, bridged_callers)
            for name, group in config.models.items()
        }
        # Which policy decided: a hash of each group's configuration (policy_version), its
        # live side's where it has a canary.
        self._versions = {name: policy_version(group.live_group())
                          for name, group in config.models.items()}
        # Each group's strategy with its state (strategies.py).
        self._strategies: dict[str, Strategy] = {
            name: strategy_for(group, clock, wall_clock)
            for name, group in config.models.items()
        }
        # Targets a rollout withholds from the live side (index → exclusion), from a
        # canary's candidate (a shadow-only candidate), and each group's canary.
        self._withheld = {name: group.withheld for name, group in config.models.items()
                          if group.withheld}
        self._withheld_from_canary = {
            name: {i: stage for i, stage in withheld.items() if stage == SHADOW_ONLY}
            for name, withheld in self._withheld.items()}
        self._canaries: dict[str, _Canary] = {}
        for name, group in config.models.items():
            candidate = group.canary_group()
            if candidate is None:
                continue
            canary = group.rollout.canary  # type: ignore[union-attr]
            self._canaries[name] = _Canary(
                CanarySplit(canary.share_percent / 100, canary_version(canary),
                            policy_version(candidate)),
                candidate.strategy,
                group_gates(candidate, config.target_dialects, bridged_callers),
                strategy_for(candidate, clock, wall_clock), candidate)

    def decide(self, request: RequestSummary,
               observations: ObservationView = EMPTY_SNAPSHOT,
               external: ExternalAnswer | None = None) -> Decision | NoEligibleTarget:
        """`external`: for `strategy: external` groups, the routing service's answer (asked
        with `external_candidates`); without it the group's fallback strategy decides."""
        name = request.group
        group = self._config.models[name]
        strategy_name, gates = group.strategy, self._gates[name]
        strategy, version = self._strategies[name], self._versions[name]
        canary = self._canaries.get(name)
        side = canary.split.side(request) if canary is not None else None
        if side == CANARY:
            strategy_name, gates = canary.strategy_name, canary.gates
            strategy, version = canary.strategy, canary.split.policy_version
        trace = DecisionTrace(strategy=strategy_name, target_count=len(group.targets),
                              policy_version=version, canary=side)
        if request.reasoning is not None:
            trace.reasoning = {"effort": request.reasoning.effort,
                               "budget_tokens": request.reasoning.budget_tokens}
        eligible = passing_targets(request, gates, trace)
        withheld = (self._withheld_from_canary if side == CANARY else self._withheld).get(name)
        if withheld:
            for choice in eligible:
                if choice.index in withheld:
                    trace.exclude(choice.label, withheld[choice.index])
            eligible = [choice for choice in eligible if choice.index not in withheld]
        if not eligible:
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace)
        eligible, waits = admitted(eligible, observations, trace)
        trace.candidate_count = len(eligible)
        if not eligible:
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace,
                                    retry_after_s=min(waits))
        ordered = strategy.order(Context(request, observations, trace, external), eligible)
        if not ordered:  # a script rule required what no eligible target offers
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace)
        return Decision(request.group, strategy_name, tuple(ordered), trace)

    def live_version(self, group: str) -> str:
        """The policy version of the group's live side."""
        return self._versions[group]

    def canary(self, group: str) -> CanarySplit | None:
        """The group's canary split (None without a canary): its version, and whether it
        was withdrawn (rollout/canary_guard.py sets that, once)."""
        canary = self._canaries.get(group)
        return canary.split if canary is not None else None

    def external_candidates(self, request: RequestSummary) -> list[TargetChoice]:
        """The targets an external routing service may name for `request`: those passing
        the shared filter stage, in declared order (what `decide` will accept)."""
        trace = DecisionTrace(strategy="external", target_count=0)
        return passing_targets(request, self._gates[request.group], trace)

    def carry_over(self, previous: Router) -> None:
        """After a reload, keep what `previous` learned where it still holds: a group whose
        configuration did not change keeps its whole state (rotation, pins, ejections); a
        changed dynamic-score group keeps the pins to targets that did not change.
        (Observations live in the store, keyed by target, and need nothing here.)"""
        for name, canary in self._canaries.items():
            earlier = previous._canaries.get(name)
            if earlier is not None and earlier.split.version == canary.split.version:
                canary.split.withdrawn = earlier.split.withdrawn
                if earlier.config == canary.config:
                    canary.strategy = earlier.strategy
        for name, group in self._config.models.items():
            before = previous._config.models.get(name)
            state = previous._strategies.get(name)
            if before is None or state is None:
                continue
            if _without_rollout(before) == _without_rollout(group):  # a canary is apart
                self._strategies[name] = state
                continue
            fresh = self._strategies[name]
            if (isinstance(fresh, DynamicScoreStrategy) and isinstance(state, DynamicScoreStrategy)
                    and fresh.affinity is not None and state.affinity is not None):
                same = {old: new for old, target in enumerate(before.targets)
                        for new, other in enumerate(group.targets) if target == other}
                fresh.affinity.adopt(state.affinity, same)

    def ejections(self, group: str) -> Ejections | None:
        """The group's ejection state, for diagnostics and tests."""
        strategy = self._strategies.get(group)
        return strategy.ejections if isinstance(strategy, DynamicScoreStrategy) else None

    def affinity_store(self, group: str) -> AffinityStore | None:
        """The group's pins (digests only), for diagnostics and tests."""
        strategy = self._strategies.get(group)
        return strategy.affinity if isinstance(strategy, DynamicScoreStrategy) else None


def _without_rollout(group: ModelGroup) -> ModelGroup:
    return group if group.rollout is None else group.model_copy(update={"rollout": None})
