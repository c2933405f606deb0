"""The stages every strategy shares, in order: scope → request eligibility (or, for
dynamic_score, its hard filters) → the group's contract → the caller's spend ceiling.
Each exclusion is recorded in the trace under the config key or rule that made it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sidecar.apis import Dialect
from sidecar.config.models import ModelGroup, Target
from sidecar.routing.contract import contract_violation
from sidecar.routing.decision import TargetChoice
from sidecar.routing.eligibility import CALLER_WORDS, active_rules
from sidecar.routing.request import RequestSummary
from sidecar.routing.scores import DEFAULT_OUTPUT_BUDGET_TOKENS, estimated_cost_usd
from sidecar.routing.trace import DecisionTrace

SPEND_CEILING = "spend_ceiling"

_CONTRACT_WORDS = "the group's contract excludes the rest"
_SPEND_WORDS = "the estimated cost exceeds your spend ceiling"


def output_budget(request: RequestSummary) -> int:
    return request.max_tokens_cap or DEFAULT_OUTPUT_BUDGET_TOKENS


def passing_targets(
    request: RequestSummary,
    group: ModelGroup,
    dialects_of: Callable[[Target], Sequence[Dialect]],
    trace: DecisionTrace,
) -> list[TargetChoice]:
    hard_filters = group.dynamic_score.hard_filters if group.strategy == "dynamic_score" else None
    rules = active_rules(hard_filters)
    passing: list[TargetChoice] = []
    for index, target in enumerate(group.targets):
        choice = TargetChoice(index, target)
        dialects = dialects_of(target)
        failed = next((name for name, rule in rules if not rule(request, target, dialects)), None)
        if failed is None and group.contract is not None:
            failed = contract_violation(group.contract, target)
        if failed is None and request.spend_ceiling_usd is not None:
            cost = estimated_cost_usd(target, request.estimated_input_tokens,
                                      output_budget(request))
            if cost is not None and cost > request.spend_ceiling_usd:
                failed = SPEND_CEILING
        if failed is None:
            passing.append(choice)
        else:
            trace.exclude(choice.label, failed)
    return passing


def refusal_reason(request: RequestSummary, trace: DecisionTrace) -> str:
    """Why nothing is left, in words a caller can act on."""
    reasons: list[str] = []
    for _, stage in trace.exclusions:
        if stage.startswith("contract."):
            words = _CONTRACT_WORDS
        elif stage == SPEND_CEILING:
            words = _SPEND_WORDS
        else:
            words = CALLER_WORDS.get(stage, "")
        text = words.format(dialect=request.dialect.value)
        if text and text not in reasons:
            reasons.append(text)
    detail = "; ".join(reasons) or "no target is eligible"
    return f"No target of model group '{request.group}' can serve this request: {detail}."
