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

from sidecar.bridge.registry import bridged_callers
from sidecar.config.models import SidecarConfig
from sidecar.routing.affinity import AffinityStore, Clock
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
from sidecar.routing.policy_version import policy_version
from sidecar.routing.request import RequestSummary
from sidecar.routing.strategies import (
    Context,
    DynamicScoreStrategy,
    ExternalAnswer,
    Strategy,
    strategy_for,
)
from sidecar.routing.trace import DecisionTrace


class Router:
    def __init__(self, config: SidecarConfig, clock: Clock = time.monotonic,
                 wall_clock: Clock = time.time) -> None:
        self._config = config
        # What depends on the configuration alone, resolved once per group.
        self._gates: dict[str, GroupGates] = {
            name: group_gates(group, config.target_dialects, bridged_callers)
            for name, group in config.models.items()
        }
        # Which policy decided: a hash of each group's configuration (policy_version).
        self._versions = {name: policy_version(group) for name, group in config.models.items()}
        # Each group's strategy with its state (strategies.py).
        self._strategies: dict[str, Strategy] = {
            name: strategy_for(group, clock, wall_clock)
            for name, group in config.models.items()
        }

    def decide(self, request: RequestSummary,
               observations: ObservationView = EMPTY_SNAPSHOT,
               external: ExternalAnswer | None = None) -> Decision | NoEligibleTarget:
        """`external`: for `strategy: external` groups, the routing service's answer (asked
        with `external_candidates`); without it the group's fallback strategy decides."""
        group = self._config.models[request.group]
        trace = DecisionTrace(strategy=group.strategy, target_count=len(group.targets),
                              policy_version=self._versions[request.group])
        if request.reasoning is not None:
            trace.reasoning = {"effort": request.reasoning.effort,
                               "budget_tokens": request.reasoning.budget_tokens}
        eligible = passing_targets(request, self._gates[request.group], trace)
        if not eligible:
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace)
        eligible, waits = admitted(eligible, observations, trace)
        trace.candidate_count = len(eligible)
        if not eligible:
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace,
                                    retry_after_s=min(waits))
        ordered = self._strategies[request.group].order(
            Context(request, observations, trace, external), eligible)
        if not ordered:  # a script rule required what no eligible target offers
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace)
        return Decision(request.group, group.strategy, tuple(ordered), trace)

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
        for name, group in self._config.models.items():
            before = previous._config.models.get(name)
            state = previous._strategies.get(name)
            if before is None or state is None:
                continue
            if before == group:
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
