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
from sidecar.config.models import ModelGroup, SidecarConfig
from sidecar.routing.affinity import AffinityStore, Clock
from sidecar.routing.decision import Decision, NoEligibleTarget, TargetChoice
from sidecar.routing.dynamic_score import DynamicScore
from sidecar.routing.ejection import Ejections
from sidecar.routing.gates import GroupGates, group_gates, passing_targets, refusal_reason
from sidecar.routing.observations import EMPTY_SNAPSHOT, ObservationView
from sidecar.routing.request import RequestSummary
from sidecar.routing.trace import CandidateTrace, DecisionTrace
from sidecar.routing.weighted import WeightedRotation


class Router:
    def __init__(self, config: SidecarConfig, clock: Clock = time.monotonic) -> None:
        self._config = config
        self._affinity = {
            name: AffinityStore(group.dynamic_score.affinity.ttl_seconds,
                                group.dynamic_score.affinity.max_entries, clock)
            for name, group in config.models.items()
            if group.strategy == "dynamic_score" and group.dynamic_score.affinity.enabled
        }
        # One rotation per (group, candidate set): requests that can use the same targets
        # share a rotation, so each class of request gets exactly its mix. At most 2^targets
        # sets per group, created on first use.
        self._rotations: dict[tuple[str, tuple[int, ...]], WeightedRotation] = {}
        # What depends on the configuration alone, resolved once per group.
        self._gates: dict[str, GroupGates] = {
            name: group_gates(group, config.target_dialects, bridged_callers)
            for name, group in config.models.items()
        }
        self._dynamic: dict[str, DynamicScore] = {
            name: DynamicScore(group)
            for name, group in config.models.items() if group.strategy == "dynamic_score"
        }
        # Targets a threshold ejected, and their probing (routing/ejection.py).
        self._ejections: dict[str, Ejections] = {
            name: Ejections(group.dynamic_score.observation_window_seconds, clock)
            for name, group in config.models.items() if group.strategy == "dynamic_score"
        }

    def decide(self, request: RequestSummary,
               observations: ObservationView = EMPTY_SNAPSHOT) -> Decision | NoEligibleTarget:
        group = self._config.models[request.group]
        trace = DecisionTrace(strategy=group.strategy, target_count=len(group.targets))
        if request.reasoning is not None:
            trace.reasoning = {"effort": request.reasoning.effort,
                               "budget_tokens": request.reasoning.budget_tokens}
        eligible = passing_targets(request, self._gates[request.group], trace)
        trace.candidate_count = len(eligible)
        if not eligible:
            return NoEligibleTarget(request.group, refusal_reason(request, trace), trace)
        if group.strategy == "failover":
            trace.order = "declared"
            ordered = eligible
        elif group.strategy == "dynamic_score":
            ordered = self._dynamic[request.group].order(
                request, eligible, observations,
                lambda indices: self._rotation(request.group, indices), trace,
                self._affinity.get(request.group), self._ejections[request.group])
        else:
            ordered = self._weighted_order(request.group, group, eligible, trace)
        return Decision(request.group, group.strategy, tuple(ordered), trace)

    def ejections(self, group: str) -> Ejections | None:
        """The group's ejection state, for diagnostics and tests."""
        return self._ejections.get(group)

    def affinity_store(self, group: str) -> AffinityStore | None:
        """The group's pins (digests only), for diagnostics and tests."""
        return self._affinity.get(group)

    def _rotation(self, group: str, indices: tuple[int, ...]) -> WeightedRotation:
        key = (group, indices)
        rotation = self._rotations.get(key)
        if rotation is None:
            rotation = self._rotations[key] = WeightedRotation(
                len(self._config.models[group].targets))
        return rotation

    def _weighted_order(self, name: str, group: ModelGroup, eligible: list[TargetChoice],
                        trace: DecisionTrace) -> list[TargetChoice]:
        """Primary by the weighted rotation; fallbacks by descending weight, then declared
        order, so the fallback order is stable and favours the declared mix."""
        trace.order = "weighted_rotation"
        weights = [c.target.weight for c in eligible]
        total = sum(weights) or 1
        trace.defer_candidates(lambda only: [
            CandidateTrace(c.label, round(c.target.weight / total, 6),
                           final_share=round(c.target.weight / total, 6))
            for c in eligible if only is None or c.label == only])
        indices = tuple(c.index for c in eligible)
        primary_index = self._rotation(name, indices).pick(indices, weights)
        primary = next(c for c in eligible if c.index == primary_index)
        rest = sorted((c for c in eligible if c.index != primary_index),
                      key=lambda c: (-c.target.weight, c.index))
        return [primary, *rest]
