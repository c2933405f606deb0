"""A decision made into Envoy's instructions for the request: the attempt order (and its
clusters, hedged or not), the body rewritten for the primary, and the headers that bound
and mark the attempts (docs/fallback-and-streaming.md, docs/hedging.md)."""

from __future__ import annotations

from sidecar.config.models import ModelGroup
from sidecar.dialects.apis import DEFAULT_ANTHROPIC_VERSION, Dialect
from sidecar.dialects.body import ParsedBody
from sidecar.envoy_contract import (
    CACHE_SLOT_HEADER,
    CALLER_API_HEADER,
    GENERATION_HEADER,
    USAGE_UNASKED_HEADER,
)
from sidecar.gateway.first_event_deadline import primary_deadline_s
from sidecar.gateway.guards import PROVIDER_STATE_KEYS
from sidecar.gateway.hedging import Hedges
from sidecar.gateway.outcome import Forward, body_size
from sidecar.gateway.pending import Pending
from sidecar.gateway.runtime import Runtime
from sidecar.routing.decision import Decision
from sidecar.routing.observations import ObservationView
from sidecar.routing.request import RequestSummary

MAX_RETRIES_HEADER = "x-envoy-max-retries"


def forward_decision(runtime: Runtime, model: str, group: ModelGroup, pending: Pending,
                     parsed: ParsedBody, summary: RequestSummary, decision: Decision,
                     slot: str | None, hedges: Hedges | None,
                     observations: ObservationView) -> Forward:
    """`hedges` None: not hedged (a request decided under a configuration a reload replaced
    is not: its pair clusters may be gone)."""
    routes = runtime.routes
    # A Responses request that continues a stored response or conversation lives at one
    # provider: another target has no such id, so it gets no fallback.
    stateful = any(parsed.payload.get(key) is not None for key in PROVIDER_STATE_KEYS)
    cache_routes = runtime.cache_routes if slot else {}
    ordered = (decision.ordered[:1] if stateful
               else group.fallback.attempt_order(decision.ordered))
    chosen = [cache_routes.get((model, choice.index, pending.dialect))
              or routes[(model, choice.index, pending.dialect)] for choice in ordered]
    attempts = tuple(target.cluster for target in chosen)
    hedge = (hedges.plan(runtime, model, decision.ordered, pending.dialect, summary.stream,
                         observations)
             if hedges is not None and model in hedges and not stateful and not slot else None)
    if hedge is not None:  # docs/hedging.md
        attempts = (hedge.cluster, hedge.cluster)
    route = chosen[0]
    # A Chat stream's usage is not left to the caller: asked for here, and taken back
    # out of its stream by Envoy (envoy_config/unasked_usage.py).
    ask_usage = (summary.stream and pending.dialect is Dialect.OPENAI_CHAT
                 and runtime.config.observations.enabled and not parsed.usage_asked())
    new_body = parsed.model_replaced(route.model_ref, ask_usage)
    set_headers = [
        (":path", route.path),
        ("content-length", str(body_size(new_body))),
        # Retries walk `attempts`; never more of them than there are targets left.
        (MAX_RETRIES_HEADER, str(len(attempts) - 1)),
        *(hedge.headers if hedge is not None else _attempt_headers(
            runtime, model, summary.stream,
            lone=group.fallback.retries_lone_target(len(decision.ordered))
            and not stateful)),
        (GENERATION_HEADER, runtime.generation),
    ]
    if pending.dialect.is_anthropic and not pending.has_anthropic_version:
        set_headers.append(("anthropic-version", DEFAULT_ANTHROPIC_VERSION))
    if group.bridges:  # a retry after a bridged attempt cannot read it from the path
        set_headers.append((CALLER_API_HEADER, pending.dialect.value))
    if slot:
        set_headers.append((CACHE_SLOT_HEADER, slot))
    if ask_usage:
        set_headers.append((USAGE_UNASKED_HEADER, "1"))
    # The caller's other headers went at the header phase (by allowlist).
    repeats = 0 if hedge is not None or stateful else group.fallback.retry_same_target
    deadline = (_first_event_deadline(group, ordered[0].label, summary, observations)
                if summary.stream and hedge is None and any(
                    cluster != attempts[0] for cluster in attempts[1:]) else None)
    return Forward(attempts, tuple(set_headers), (), new_body, decision, repeats,
                   group.fallback.same_target_wait_seconds if repeats else 0.0,
                   deadline or 0)


def _first_event_deadline(group: ModelGroup, primary: str, summary: RequestSummary,
                          observations: ObservationView) -> int | None:
    """The primary's own first-event deadline (gateway/first_event_deadline.py), from its
    recent time to first byte."""
    observed = observations.get(primary, group.dynamic_score.observation_window_seconds)
    return primary_deadline_s(group.fallback, observed, summary.estimated_input_tokens)


def _attempt_headers(runtime: Runtime, model: str, stream: bool, lone: bool
                     ) -> tuple[tuple[str, str], ...]:
    """The group's router headers: its time bounds and route (runtime.py)."""
    if lone:
        return (runtime.lone_stream_attempt_headers if stream
                else runtime.lone_attempt_headers)[model]
    return (runtime.stream_attempt_headers if stream else runtime.attempt_headers)[model]
