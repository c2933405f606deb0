"""The telemetry rows: what a decision and its outcome become, as safe scalars only.

A `RequestRow` is built at join time (routing/trace.py already holds only labels, bucket
names and numbers), never on the request path. Columns are configuration names, bucket
names, numbers and timestamps: no prompt text, images, tool output, caller tokens or their
digests, provider keys or headers (docs/telemetry.md §2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from sidecar.billing import Rates, Usage
from sidecar.billing import cost_usd as billed
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.request import RequestSummary
from sidecar.routing.signals import request_shape_buckets
from sidecar.routing.trace import bucket
from sidecar.telemetry.results import (
    RequestResult,
    usage_charged,
)

# W3C trace context, version 00; anything else (or all-zero ids) is not kept.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
# The stages that remove targets ignoring a caller's max-token cap: the dynamic-score hard
# filter, and the baseline rule every strategy applies when that filter is off (issue 42:
# only the first was counted, so with the filter off the column said "no" while targets
# were removed for the cap).
MAX_TOKENS_STAGES = frozenset({"hard_filters.require_honors_max_tokens_when_caller_capped",
                               "eligibility.honors_max_tokens"})


# Not frozen: a frozen dataclass sets each field through object.__setattr__, several
# times slower for these wide records, and they are never shared before they are written.
@dataclass(slots=True)
class DecisionFacts:
    """What the ext_proc handler keeps for the join: references to what it already built."""

    request_id: str
    at: float                      # wall-clock seconds (UTC epoch) of the decision
    caller: str                    # the configured caller name
    group: str
    # None: answered before any decision (a response-cache hit, a quota refusal).
    outcome: Decision | NoEligibleTarget | None
    # The request's summary, for its shape buckets when the strategy did not compute them.
    summary: RequestSummary | None = None
    traceparent: str = ""          # as the caller or Envoy sent it; checked at join time
    admission: str | None = None   # why a quota refused the request (quotas/)
    cache: str | None = None       # hit, miss or bypass, in groups with a response cache


class DecisionSink(Protocol):
    """Where the gateway hands its decisions (telemetry/handoff.py)."""

    def decided(self, facts: DecisionFacts) -> None: ...


@dataclass(slots=True)
class RequestRow:
    request_id: str
    started_at: float
    caller: str
    group: str
    strategy: str
    cold_start: str | None
    signals: str                   # enabled signal names, comma-separated
    request_shape: Mapping[str, str | bool]
    complexity: str | None
    prompt_features: str
    selected_scores: Mapping[str, str]   # score name → bucket, for the selected target
    term_value_bucket: str | None
    final_share_bucket: str | None
    exclusions: str                # "target:stage" pairs, comma-separated
    max_tokens_filtered: bool
    max_tokens_bucket: str | None
    input_size_bucket: str | None
    admission: str | None
    observation_count: int | None
    candidate_count: int
    reasoning_effort: str | None
    reasoning_budget_tokens: int | None
    affinity: str
    probe: str | None
    selected_target: str | None
    serving_target: str | None
    attempts: int | None
    status: int | None
    status_class: str
    error_class: str | None
    latency_ms: float | None
    ttfb_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    cost_usd: float | None
    join: str                      # joined | decision_only | log_only | duplicate_id | evicted
    traceparent: str | None = None  # a valid W3C traceparent only, for linking to traces
    external: str | None = None    # strategy: external: answered, or why it fell back
    cache: str | None = None       # response cache: hit, miss, bypass (no-store)
    cache_write_tokens: int | None = None  # prompt-cache writes (input_tokens includes them)
    usage_source: str | None = None  # reported, estimated (usage_charged), or none served
    # Issue #31: thresholds over their limit on too little evidence ("target:threshold"
    # pairs), the decision's odds and the policy that made it, and the request's size as
    # routing saw it (replay re-decides with these; docs/policy-evaluation.md).
    unproven: str = ""
    policy_version: str | None = None
    selection_probability: float | None = None
    selection_reason: str | None = None
    candidate_odds: Mapping[str, float] | None = None
    estimated_input_tokens: int | None = None
    output_budget: int | None = None
    origin: str | None = None      # rollout_check: sent by `sidecar rollout check` (#42)
    canary: str | None = None      # in a group with a canary: canary, live or withdrawn


@dataclass(frozen=True, slots=True)
class ShadowRow:
    """A group's shadow policy against its live one over a few seconds of one replica
    (evaluation/shadow.py): sums, so periods add up; divide by `decisions`."""

    at: float
    group: str
    policy_version: str
    shadow_version: str
    decisions: int
    agreements: float              # Σ (1 − total variation) of the two decisions' odds
    cost_delta_usd: float          # shadow's expected minus live's: estimated request cost
    latency_delta_ms: float        # the same of the p95 latency observed
    error_rate_delta: float        # the same of the error rate observed
    dropped: int                   # decisions not shadowed (the queue was full)


@dataclass(frozen=True, slots=True)
class CanaryEventRow:
    """A canary's event (rollout/canary_guard.py): `withdrawn`, with the guard it breached,
    the figure judged (a rate's lower confidence bound) and the window's counts."""

    at: float
    group: str
    policy_version: str            # the live side's
    canary_version: str
    event: str
    guard: str
    figure: float
    limit: float
    requests: int
    errors: int


@dataclass(slots=True)
class MirrorRow:
    """A mirrored request (rollout/shadow_traffic.py) paired with its live answer: what
    each side did, and agreement that needs no judge. Safe scalars only: the candidate's
    finish class, the names of the tools it called (the request's own tool names), and
    whether its tool arguments and its text parse as JSON — never the text."""

    at: float
    group: str
    live_request_id: str
    candidate: str
    stream: bool
    shadow_status: int
    shadow_error_class: str | None
    shadow_latency_ms: float | None
    shadow_ttft_ms: float | None
    shadow_input_tokens: int | None
    shadow_output_tokens: int | None
    shadow_cost_usd: float | None
    shadow_finish: str | None
    shadow_tools: str
    shadow_tool_arguments_valid: bool | None
    shadow_json_valid: bool | None
    live_target: str | None = None
    live_status: int | None = None
    live_error_class: str | None = None
    live_latency_ms: float | None = None
    live_ttfb_ms: float | None = None
    live_input_tokens: int | None = None
    live_output_tokens: int | None = None
    live_cost_usd: float | None = None
    both_answered: bool = False
    output_ratio: float | None = None   # the candidate's output tokens over the live one's
    # The live answer's finish class and declared tool names (Envoy read them:
    # envoy_config/answer_facts.py), and whether the candidate's are the same (None when
    # not both answered, or a side's is unknown).
    live_finish: str | None = None
    live_tools: str | None = None
    same_finish: bool | None = None
    same_tools: bool | None = None


@dataclass(frozen=True, slots=True)
class FallbackRow:
    request_id: str
    at: float
    group: str
    from_target: str
    to_target: str
    attempt: int
    failure: str


class DecisionRecord(NamedTuple):
    """A decision as plain values (`decision_record`): what crosses from the sidecar to the
    telemetry worker process (worker.py), and what a request row is made from."""

    request_id: str
    at: float
    caller: str
    group: str
    admission: str | None
    cache: str | None
    traceparent: str
    strategy: str                  # "" when answered before any decision
    cold_start: str | None
    signals: tuple[str, ...]
    request_shape: dict[str, str | bool]
    complexity: str | None
    prompt_features: tuple[str, ...]
    exclusions: list[tuple[str, str]]
    candidate_count: int
    reasoning: dict[str, str | int | None] | None
    affinity: str
    probe: str | None
    external: str | None
    selected: str | None
    scores: dict[str, float] | None  # the selected target's, when it has a candidate row
    term_value: float | None
    final_share: float | None
    observations: int | None
    # (target, threshold) over its limit on too little evidence (routing/thresholds.py).
    unproven: Sequence[tuple[str, str]] = ()
    # The decision's odds (routing/trace.py): the primary's probability and why, each
    # candidate's probability, and the hash of the group's configuration that decided.
    selection: tuple[float, str] | None = None
    odds: tuple[tuple[str, float], ...] = ()
    policy_version: str = ""
    # What a served reply without readable usage is charged (usage_charged), and what
    # replay re-decides with: (estimated input tokens, output budget).
    estimate: tuple[int, int] | None = None
    canary: str | None = None      # the side of a group's canary (routing/canary.py)


def estimate_of(summary: RequestSummary | None) -> tuple[int, int] | None:
    """(estimated input tokens, output budget) of a request, for usage_charged."""
    if summary is None:
        return None
    return summary.estimated_input_tokens, summary.output_budget


def decision_record(facts: DecisionFacts) -> tuple:
    """`facts` as a plain tuple in `DecisionRecord`'s order (marshal takes tuples, dicts,
    strings and numbers only). References, not copies: the trace is not changed once the
    decision is made. Only the selected target's candidate row is built."""
    outcome = facts.outcome
    trace = outcome.trace if outcome is not None else None
    if trace is None:
        shape = request_shape_buckets(facts.summary) if facts.summary is not None else {}
        return (facts.request_id, facts.at, facts.caller, facts.group, facts.admission,
                facts.cache, facts.traceparent, "", None, (), shape, None, (), [], 0, None,
                "not_applicable", None, None, None, None, None, None, None, [], None, (), "",
                estimate_of(facts.summary), None)
    selected = outcome.primary.label if isinstance(outcome, Decision) else None
    figures = trace.figures(selected) if selected is not None else None
    shape = trace.request_shape
    if not shape and facts.summary is not None:
        shape = request_shape_buckets(facts.summary)
    return (facts.request_id, facts.at, facts.caller, facts.group, facts.admission,
            facts.cache, facts.traceparent, trace.strategy, trace.cold_start, trace.signals,
            shape, trace.complexity,
            tuple(map(str, trace.prompt_features)) if trace.prompt_features else (),
            trace.exclusions,
            trace.candidate_count, trace.reasoning, str(trace.affinity), trace.probe,
            trace.external, selected, *(figures or (None, None, None, None)),
            trace.unproven, trace.selection, trace.odds, trace.policy_version,
            estimate_of(facts.summary), trace.canary)


# A target's price as the worker receives it: every price resolved (billing.Rates).
Price = Rates
Prices = Mapping[str, Rates]


def price_records(prices: Mapping[str, Rates]) -> dict[str, tuple[float, ...]]:
    """Each target's prices as a plain tuple (`Rates(*record)`), for the worker."""
    return {target: tuple(price) for target, price in prices.items()}


@dataclass(slots=True)
class JoinedRequest:
    """A decision and/or its outcome, paired by the join and not yet made into a row: the
    row is made on the worker's writer thread (encode.py)."""

    record: DecisionRecord | None
    result: RequestResult | None
    join: str
    at: float


def status_class(status: int | None) -> str:
    if status is None or status <= 0:
        return "unknown"
    return f"{status // 100}xx"


def cost_usd(price: Rates | None, result: RequestResult) -> float | None:
    """The serving target's price for what it reported; None when unpriced or unreported."""
    if price is None:
        return None
    return billed(price, Usage(result.input_tokens, result.output_tokens,
                               result.cached_tokens, result.cache_write_tokens))


def request_row(decision: DecisionRecord | None, result: RequestResult | None,
                prices: Prices, join: str, at: float = 0.0) -> RequestRow:
    """One row from a decision and/or its outcome (either may be missing: `join` says)."""
    assert decision is not None or result is not None
    d = decision
    source = None
    if result is not None:
        result, source = usage_charged(result, d.estimate if d is not None else None)
    scores = d.scores if d is not None else None
    shape = dict(d.request_shape) if d is not None else {}
    reasoning = (d.reasoning or {}) if d is not None else {}
    serving = result.serving_target if result is not None else None
    return RequestRow(
        request_id=d.request_id if d is not None else result.request_id,  # type: ignore[union-attr]
        started_at=d.at if d is not None else at,
        caller=d.caller if d is not None else "",
        group=d.group if d is not None else "",
        strategy=d.strategy if d is not None else "",
        cold_start=d.cold_start if d is not None else None,
        signals=",".join(d.signals) if d is not None else "",
        request_shape=shape,
        complexity=d.complexity if d is not None else None,
        prompt_features=",".join(d.prompt_features) if d is not None else "",
        selected_scores=({name: score_bucket(value) for name, value in scores.items()} if scores
                         else {}),
        term_value_bucket=None if d is None or d.term_value is None else score_bucket(d.term_value),
        final_share_bucket=(None if d is None or d.final_share is None
                            else score_bucket(d.final_share)),
        exclusions=pairs_text(d.exclusions) if d is not None else "",
        max_tokens_filtered=d is not None and any(s in MAX_TOKENS_STAGES
                                                  for _, s in d.exclusions),
        max_tokens_bucket=plain_text(shape.get("max_tokens_cap")),
        input_size_bucket=plain_text(shape.get("input_size")),
        admission=d.admission if d is not None else None,
        observation_count=d.observations if d is not None else None,
        candidate_count=d.candidate_count if d is not None else 0,
        reasoning_effort=plain_text(reasoning.get("effort")),
        reasoning_budget_tokens=plain_int(reasoning.get("budget_tokens")),
        affinity=d.affinity if d is not None else "not_applicable",
        probe=d.probe if d is not None else None,
        selected_target=d.selected if d is not None else None,
        serving_target=serving,
        attempts=result.attempts if result is not None else None,
        status=result.status if result is not None else None,
        status_class=status_class(result.status if result is not None else None),
        error_class=result.error_class if result is not None else None,
        latency_ms=result.latency_ms if result is not None else None,
        ttfb_ms=result.ttfb_ms if result is not None else None,
        input_tokens=result.input_tokens if result is not None else None,
        output_tokens=result.output_tokens if result is not None else None,
        cached_tokens=result.cached_tokens if result is not None else None,
        cache_write_tokens=result.cache_write_tokens if result is not None else None,
        cost_usd=cost_usd(prices.get(serving or ""), result) if result is not None else None,
        join=join,
        traceparent=valid_traceparent(d.traceparent) if d is not None else None,
        external=d.external if d is not None else None,
        cache=d.cache if d is not None else None,
        usage_source=source,
        unproven=pairs_text(d.unproven) if d is not None else "",
        policy_version=(d.policy_version or None) if d is not None else None,
        selection_probability=d.selection[0] if d is not None and d.selection else None,
        selection_reason=d.selection[1] if d is not None and d.selection else None,
        candidate_odds=dict(d.odds) if d is not None and d.odds else None,
        estimated_input_tokens=d.estimate[0] if d is not None and d.estimate else None,
        output_budget=d.estimate[1] if d is not None and d.estimate else None,
        origin=origin(d.traceparent) if d is not None else None,
        canary=d.canary if d is not None else None,
    )


_BUCKETS: dict[float, str] = {}


def score_bucket(value: float) -> str:
    """As `sidecar explain` shows it: rounded to six places, then bucketed. Remembered: the
    same scores recur until the observations move (bounded, cleared past 65,536)."""
    found = _BUCKETS.get(value)
    if found is None:
        if len(_BUCKETS) >= 65_536:
            _BUCKETS.clear()
        found = _BUCKETS[value] = bucket(round(value, 6))
    return found


def valid_traceparent(value: str) -> str | None:
    return value if len(value) == 55 and _TRACEPARENT.fullmatch(value) else None


# `sidecar rollout check` begins its trace ids with this (issue 42): its requests are traffic
# like any other (quotas, costs, observations) and their rows say where they came from
# (`origin`), so reports can set them apart. Anyone may send such a trace id; it only
# labels the row.
CHECK_TRACE_PREFIX = "c4ec1157"
_CHECK_TRACEPARENT = "00-" + CHECK_TRACE_PREFIX


def origin(traceparent: str) -> str | None:
    """`rollout_check` for a request `sidecar rollout check` sent, else None."""
    if traceparent.startswith(_CHECK_TRACEPARENT) and valid_traceparent(traceparent):
        return "rollout_check"
    return None


def pairs_text(pairs: Sequence[tuple[str, str]]) -> str:
    """`target:stage` pairs, comma-separated (exclusions, unproven thresholds)."""
    return ",".join(f"{t}:{s}" for t, s in pairs)


def plain_text(value: object) -> str | None:
    return None if value is None else str(value)


def plain_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
