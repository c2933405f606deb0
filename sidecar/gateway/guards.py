"""The guards a request meets before any routing decision (docs/cache.md, docs/quotas.md):
a quota that refuses it, and the response cache that may answer it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.cache.caches import ResponseCaches
from sidecar.config.models import ModelGroup
from sidecar.envoy_contract import CACHE_HEADER
from sidecar.gateway.outcome import Ask, Forward, LeaseWait, Reply
from sidecar.gateway.pending import Pending
from sidecar.quotas.admission import Quotas, refusal_error
from sidecar.quotas.counters import LEASE_PENDING, Refusal
from sidecar.routing.request import RequestSummary
from sidecar.telemetry.rows import DecisionFacts, DecisionSink

# Request fields that name state stored at the provider (OpenAI Responses).
PROVIDER_STATE_KEYS = ("previous_response_id", "conversation")


@dataclass(frozen=True, slots=True)
class CacheVisit:
    """A request of a group with a response cache that was not answered from it: `miss`
    (its answer will be stored under `slot`, unless the caller said no-store) or
    `bypass` (streamed, a stateful session, or cache-control forbade both)."""

    outcome: str
    slot: str | None = None


def cache_visit(caches: ResponseCaches | None, telemetry: DecisionSink | None, pending: Pending,
                model: str, summary: RequestSummary, payload: dict[str, Any],
                session: bool) -> CacheVisit | Reply:
    """A cached answer (a Reply: no decision, no upstream call), or how the miss or bypass
    goes on. Streamed requests, sessions and stored-state requests are never cached."""
    assert caches is not None
    stateful = any(payload.get(key) is not None for key in PROVIDER_STATE_KEYS)
    if (summary.stream or session or stateful
            or not (pending.cache_lookup or pending.cache_store)):
        return CacheVisit("bypass")
    key = caches.key(model, pending.caller.name, pending.dialect, payload,
                     pending.varying_headers)
    if pending.cache_lookup:
        answer = caches.lookup(model, key)
        if answer is not None:
            if telemetry is not None and pending.request_id:
                telemetry.decided(DecisionFacts(
                    pending.request_id, time.time(), pending.caller.name, model, None,
                    summary, pending.traceparent, cache="hit"))
            return Reply(200, answer.body, answer.content_type, ((CACHE_HEADER, "hit"),))
    slot = caches.slots.reserve(model, key) if pending.cache_store else None
    return CacheVisit("miss", slot)


def quota_guard(quotas: Quotas, telemetry: DecisionSink | None, pending: Pending,
                model: str, group: ModelGroup, refusal: Refusal,
                admitted: Callable[[], Reply | Forward | Ask]) -> Reply | LeaseWait:
    """A quota's 429, or, when only this replica's lease is spent while the caller is under
    its limit, a wait for the next lease and then the request as `admitted` goes on
    (docs/quotas.md §3)."""
    external_ms = group.external.timeout_ms if group.external is not None else 0
    budget_s = quotas.wait_budget_s(refusal, external_ms)
    if not budget_s:
        if refusal.reason.endswith(LEASE_PENDING):
            quotas.refused(refusal)
        return quota_refusal(telemetry, pending, model, refusal)
    caller, request_id = pending.caller.name, pending.request_id

    def resume(final: Refusal | None) -> Reply | Forward | Ask:
        if final is not None:
            return quota_refusal(telemetry, pending, model, final)
        return admitted()

    return LeaseWait(lambda: quotas.wait_for_lease(caller, model, request_id, budget_s),
                     resume)


def quota_refusal(telemetry: DecisionSink | None, pending: Pending, model: str,
                  refusal: Refusal) -> Reply:
    """Over a quota: 429 with retry-after, and a telemetry row naming the limit."""
    if telemetry is not None and pending.request_id:
        telemetry.decided(DecisionFacts(
            pending.request_id, time.time(), pending.caller.name, model, None, None,
            pending.traceparent, admission=refusal.reason))
    error = refusal_error(refusal)
    return Reply(error.status, error.render(pending.dialect.is_anthropic),
                 headers=(("retry-after", str(refusal.retry_after_s)),))
