"""The stages every strategy shares, in order: scope → request eligibility (or, for
dynamic_score, its hard filters) → the group's contract → the caller's spend ceiling →
the providers' `retry-after`. Each exclusion is recorded in the trace under the config key
or rule that made it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.config.models import ModelGroup, Target
from sidecar.dialects.apis import Dialect
from sidecar.routing.contract import contract_violation
from sidecar.routing.decision import TargetChoice
from sidecar.routing.eligibility import BRIDGE_STAGE, CALLER_WORDS, Reach, Rule, active_rules
from sidecar.routing.observations import ObservationView
from sidecar.routing.request import RequestSummary
from sidecar.routing.scores import estimated_cost_usd
from sidecar.routing.trace import DecisionTrace

SPEND_CEILING = "spend_ceiling"
# A target whose provider answered 429 with a time to wait, during that time
# (observations.max_retry_after_seconds bounds it).
PROVIDER_RETRY_AFTER = "provider_retry_after"

_CONTRACT_WORDS = "the group's contract excludes the rest"
_SPEND_WORDS = "the estimated cost exceeds your spend ceiling"


def output_budget(request: RequestSummary) -> int:
    return request.output_budget


@dataclass(frozen=True, slots=True)
class GateTarget:
    """One target as the gates see it."""

    choice: TargetChoice
    reach: Reach
    contract_violation: str | None  # depends on the target alone


@dataclass(frozen=True, slots=True)
class GroupGates:
    """A group's gates, resolved once at configuration load: its targets and the named
    eligibility rules (hard filters) its strategy applies."""

    targets: tuple[GateTarget, ...]
    rules: tuple[tuple[str, Rule], ...]


def group_gates(group: ModelGroup, dialects_of: Callable[[Target], Sequence[Dialect]],
                bridged_of: Callable[[Sequence[Dialect]], Sequence[Dialect]] = lambda _: ()
                ) -> GroupGates:
    """`bridged_of(native)`: the caller dialects a bridge brings to a target speaking
    `native` (asked only when the group has `bridges: true`)."""
    hard_filters = group.dynamic_score.hard_filters if group.strategy == "dynamic_score" else None
    contract = group.contract

    def reach(target: Target) -> Reach:
        native = tuple(dialects_of(target))
        return Reach(native, tuple(bridged_of(native)) if group.bridges else ())

    return GroupGates(
        targets=tuple(
            GateTarget(TargetChoice(index, target), reach(target),
                       contract_violation(contract, target) if contract is not None else None)
            for index, target in enumerate(group.targets)),
        rules=tuple(active_rules(hard_filters)),
    )


def passing_targets(request: RequestSummary, gates: GroupGates,
                    trace: DecisionTrace) -> list[TargetChoice]:
    ceiling = request.spend_ceiling_usd
    budget = output_budget(request) if ceiling is not None else 0
    passing: list[TargetChoice] = []
    for gate in gates.targets:
        target = gate.choice.target
        failed = gate.contract_violation  # unless an eligibility rule fails first
        for name, rule in gates.rules:
            if not rule(request, target, gate.reach):
                failed = name
                break
        if failed is None and ceiling is not None:
            cost = estimated_cost_usd(target, request.estimated_input_tokens, budget)
            if cost is not None and cost > ceiling:
                failed = SPEND_CEILING
        if failed is None:
            passing.append(gate.choice)
        else:
            trace.exclude(gate.choice.label, failed)
    return passing


def admitted(eligible: list[TargetChoice], observations: ObservationView,
             trace: DecisionTrace) -> tuple[list[TargetChoice], list[float]]:
    """The targets whose provider did not ask to wait, and the waits of those that did."""
    waits: list[float] = []
    kept: list[TargetChoice] = []
    for choice in eligible:
        wait = observations.retry_after_s(choice.label)
        if wait > 0:
            waits.append(wait)
            trace.exclude(choice.label, PROVIDER_RETRY_AFTER)
        else:
            kept.append(choice)
    return kept, waits


def refusal_reason(request: RequestSummary, trace: DecisionTrace) -> str:
    """Why nothing is left, in words a caller can act on."""
    reasons: list[str] = []
    for _, stage in trace.exclusions:
        if stage.startswith("contract."):
            words = _CONTRACT_WORDS
        elif stage == SPEND_CEILING:
            words = _SPEND_WORDS
        elif stage == PROVIDER_RETRY_AFTER:
            words = "every target that could serve it is rate limited by its provider"
        elif stage.startswith("script."):
            words = "the group's routing rules exclude the rest"
        elif stage == BRIDGE_STAGE:
            words = (f"the request cannot be bridged to another API "
                     f"({request.bridge_refusal})").replace("{", "{{").replace("}", "}}")
        else:
            words = CALLER_WORDS.get(stage, "")
        text = words.format(dialect=request.dialect.value)
        if text and text not in reasons:
            reasons.append(text)
    detail = "; ".join(reasons) or "no target is eligible"
    return f"No target of model group '{request.group}' can serve this request: {detail}."
