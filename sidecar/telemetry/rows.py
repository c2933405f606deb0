"""The telemetry rows: what a decision and its outcome become, as safe scalars only.

A `RequestRow` is built at join time (routing/trace.py already holds only labels, bucket
names and numbers), never on the request path. Columns are configuration names, bucket
names, numbers and timestamps: no prompt text, images, tool output, caller tokens or their
digests, provider keys or headers (docs/telemetry.md §2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.config.models import Pricing
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.request import RequestSummary
from sidecar.routing.signals import request_shape_buckets
from sidecar.routing.trace import bucket

# W3C trace context, version 00; anything else (or all-zero ids) is not kept.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
# Hard-filter stage that removes targets ignoring a caller's max-token cap.
MAX_TOKENS_STAGE = "hard_filters.require_honors_max_tokens_when_caller_capped"


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


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What Envoy's per-request access log says about the request."""

    request_id: str
    status: int
    serving_target: str | None     # provider/model_ref of the attempt that answered
    attempts: int
    error_class: str               # the observation outcome (`ok`, `server_error`, ...)
    latency_ms: float | None = None
    ttfb_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None


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


@dataclass(frozen=True, slots=True)
class FallbackRow:
    request_id: str
    at: float
    group: str
    from_target: str
    to_target: str
    attempt: int
    failure: str


@dataclass(slots=True)
class JoinedRequest:
    """A decision and/or its outcome, paired by the join and not yet made into a row: the
    row is built on the writer thread, off the event loop (`RowBuilder`)."""

    facts: DecisionFacts | None
    result: RequestResult | None
    join: str
    at: float


class RowBuilder:
    """Makes the rows the join hands over, with the configured prices."""

    __slots__ = ("_prices",)

    def __init__(self, prices: Mapping[str, Pricing]) -> None:
        self._prices = prices

    def reprice(self, prices: Mapping[str, Pricing]) -> None:
        """A reloaded configuration's prices (one reference swap: the writer thread reads
        either the old or the new map, never a mix)."""
        self._prices = prices

    def __call__(self, item: JoinedRequest | FallbackRow) -> RequestRow | FallbackRow:
        if isinstance(item, FallbackRow):
            return item
        return request_row(item.facts, item.result, self._prices, item.join, item.at)


def status_class(status: int | None) -> str:
    if status is None or status <= 0:
        return "unknown"
    return f"{status // 100}xx"


def cost_usd(pricing: Pricing | None, result: RequestResult) -> float | None:
    """The serving target's price for what it reported; None when unpriced or unreported."""
    if pricing is None or (result.input_tokens is None and result.output_tokens is None):
        return None
    return ((result.input_tokens or 0) * pricing.input_per_mtok
            + (result.output_tokens or 0) * pricing.output_per_mtok) / 1e6


def request_row(facts: DecisionFacts | None, result: RequestResult | None,
                prices: Mapping[str, Pricing], join: str, at: float = 0.0) -> RequestRow:
    """One row from a decision and/or its outcome (either may be missing: `join` says)."""
    assert facts is not None or result is not None
    trace = facts.outcome.trace if facts is not None and facts.outcome is not None else None
    selected = (facts.outcome.primary.label
                if facts is not None and isinstance(facts.outcome, Decision) else None)
    row = trace.candidate(selected) if trace and selected else None
    shape = dict(trace.request_shape) if trace else {}
    if not shape and facts is not None and facts.summary is not None:
        shape = request_shape_buckets(facts.summary)
    reasoning = (trace.reasoning or {}) if trace else {}
    serving = result.serving_target if result is not None else None
    return RequestRow(
        request_id=facts.request_id if facts is not None else result.request_id,  # type: ignore[union-attr]
        started_at=facts.at if facts is not None else at,
        caller=facts.caller if facts is not None else "",
        group=facts.group if facts is not None else "",
        strategy=trace.strategy if trace else "",
        cold_start=trace.cold_start if trace else None,
        signals=",".join(trace.signals) if trace else "",
        request_shape=shape,
        complexity=trace.complexity if trace else None,
        prompt_features=",".join(trace.prompt_features) if trace else "",
        selected_scores={name: bucket(value) for name, value in row.scores.items()} if row else {},
        term_value_bucket=None if row is None or row.term_value is None else bucket(row.term_value),
        final_share_bucket=bucket(row.final_share) if row else None,
        exclusions=",".join(f"{t}:{s}" for t, s in trace.exclusions) if trace else "",
        max_tokens_filtered=bool(trace) and any(s == MAX_TOKENS_STAGE for _, s in trace.exclusions),
        max_tokens_bucket=_text(shape.get("max_tokens_cap")),
        input_size_bucket=_text(shape.get("input_size")),
        admission=facts.admission if facts is not None else None,
        observation_count=row.observations if row else None,
        candidate_count=trace.candidate_count if trace else 0,
        reasoning_effort=_text(reasoning.get("effort")),
        reasoning_budget_tokens=_int(reasoning.get("budget_tokens")),
        affinity=trace.affinity if trace else "not_applicable",
        probe=trace.probe if trace else None,
        selected_target=selected,
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
        cost_usd=cost_usd(prices.get(serving or ""), result) if result is not None else None,
        join=join,
        traceparent=_trace(facts.traceparent) if facts is not None else None,
        external=trace.external if trace else None,
        cache=facts.cache if facts is not None else None,
    )


def _trace(value: str) -> str | None:
    return value if len(value) == 55 and _TRACEPARENT.fullmatch(value) else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
