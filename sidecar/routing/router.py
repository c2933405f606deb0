"""The routing core: a request summary in, a decision with its reasons out.

Pure: no gRPC, no Envoy types, no I/O. The only state is the per-group round-robin position,
owned here, so that a decision is reproducible from configuration, that state and the request.
"""

from __future__ import annotations

from sidecar.config.models import ModelGroup, SidecarConfig
from sidecar.routing.decision import Decision, NoEligibleTarget, TargetChoice
from sidecar.routing.eligibility import split_eligible
from sidecar.routing.request import RequestSummary
from sidecar.routing.weighted import SmoothWeightedRoundRobin


class Router:
    def __init__(self, config: SidecarConfig) -> None:
        self._config = config
        self._rotations = {
            name: SmoothWeightedRoundRobin([t.weight for t in group.targets])
            for name, group in config.models.items()
        }

    def decide(self, request: RequestSummary) -> Decision | NoEligibleTarget:
        group = self._config.models[request.group]
        eligible, excluded = split_eligible(request, group.targets, self._config.target_dialects)
        trace = [f"strategy={group.strategy}", f"candidates={len(group.targets)}"]
        trace += [exclusion.describe() for exclusion in excluded]
        if not eligible:
            return NoEligibleTarget(
                request.group,
                f"no target of model group '{request.group}' serves the "
                f"{request.dialect.value} API",
                tuple(trace),
            )
        if group.strategy == "failover":
            ordered = eligible
            trace.append("order=declared")
        else:
            ordered = self._weighted_order(request.group, group, eligible)
            if group.strategy == "dynamic_score":
                trace.append("dynamic_score=not_scored_yet:configured_weight_order")
            trace.append("order=smooth_weighted_round_robin")
        return Decision(request.group, group.strategy, tuple(ordered), tuple(trace))

    def _weighted_order(
        self, name: str, group: ModelGroup, eligible: list[TargetChoice]
    ) -> list[TargetChoice]:
        """Primary by smooth weighted round-robin; fallbacks by descending weight, then
        declared order, so the fallback order is stable and favours the declared mix."""
        primary_index = self._rotations[name].pick([choice.index for choice in eligible])
        primary = next(c for c in eligible if c.index == primary_index)
        rest = sorted(
            (c for c in eligible if c.index != primary_index),
            key=lambda c: (-c.target.weight, c.index),
        )
        return [primary, *rest]
