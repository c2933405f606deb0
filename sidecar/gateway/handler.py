"""Handle one exchange in two steps, mirroring what Envoy sends: headers, then the body.

Headers are enough to authenticate and to answer `/v1/models`; the body names the model
group and carries what routing needs. Every error is a `Reply` in the caller's dialect.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sidecar.cache.caches import ResponseCaches
from sidecar.cache.keys import cache_directives
from sidecar.config.models import Caller, ModelGroup
from sidecar.config.secrets import token_digest
from sidecar.console.decision_ring import DecisionRing
from sidecar.dialects import errors
from sidecar.dialects.apis import CALLER_PATHS, Dialect
from sidecar.dialects.body import BodyError, ParsedBody, parse_body
from sidecar.dialects.conversation import conversation_key
from sidecar.dialects.errors import ClientError
from sidecar.dialects.models_list import model_list, single_model
from sidecar.dialects.shape import request_shape
from sidecar.envoy_contract import (
    ANSWER_FACTS_HEADER,
    CACHE_SLOT_HEADER,
    CALLER_API_HEADER,
    GENERATION_HEADER,
    SESSION_KEY_HEADER,
)
from sidecar.evaluation.shadow import ShadowDecider, shadow_decider
from sidecar.external.client import ExternalCalls
from sidecar.gateway.bridging import BridgeAttempt, bridge_refusal
from sidecar.gateway.decision_log import log_decision
from sidecar.gateway.forwarding import MAX_RETRIES_HEADER, forward_decision
from sidecar.gateway.guards import CacheVisit, cache_visit, quota_guard
from sidecar.gateway.hedging import Hedges
from sidecar.gateway.outcome import Ask, Forward, LeaseWait, Reply, Retarget, body_size
from sidecar.gateway.pending import Pending
from sidecar.gateway.retarget import (
    RetargetError,
    attempt_dialect,
    attempt_route,
    retarget,
)
from sidecar.gateway.runtime import Runtime, TargetRoute
from sidecar.gateway.sessions import (
    MAX_SESSION_ID_CHARS,
    SessionStore,
    session_key,
    valid_session_id,
)
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.quotas.admission import Quotas
from sidecar.rollout.canary_guard import CanaryGuard
from sidecar.routing.canary import CANARY
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.observations import EMPTY_SNAPSHOT, ObservationView
from sidecar.routing.request import RequestSummary
from sidecar.routing.strategies import ExternalAnswer
from sidecar.telemetry.rows import DecisionFacts, DecisionSink, estimate_of

if TYPE_CHECKING:  # a module that imports the gateway's runtime itself
    from sidecar.rollout.shadow_traffic import ShadowTraffic

log = logging.getLogger("sidecar.gateway")
_limited = LogLimiter(log, burst=10, interval=60.0)

# An explicit stateful-session marker: such requests keep out of conversation affinity.
SESSION_HEADER = "x-session-id"
_MODELS_PATH = "/v1/models"
# Configurations before the current one whose clusters a retry may still name.
RETIRED_KEPT = 2


class Gateway:
    def __init__(self, runtime: Runtime, observations: ObservationView = EMPTY_SNAPSHOT,
                 log_decisions: bool = False, telemetry: DecisionSink | None = None,
                 external: ExternalCalls | None = None,
                 caches: ResponseCaches | None = None, quotas: Quotas | None = None) -> None:
        self._runtime = runtime
        # The routing services of `strategy: external` groups (None: none configured, or a
        # test without them; such groups then decide by their fallback strategy).
        self.external = external
        # The response caches of groups that have one (docs/cache.md).
        self.caches = caches
        # Caller quotas (docs/quotas.md): always there in a running sidecar (a reload may
        # give a caller quotas); None only where a test leaves them out.
        self.quotas = quotas
        self._retired: tuple[Runtime, ...] = ()
        self._observations = observations
        self._log_decisions = log_decisions
        self._telemetry = telemetry
        sessions = runtime.config.sessions
        self.sessions = SessionStore(sessions.ttl_seconds, sessions.max_entries)
        # Groups' shadow policies, decided off the decision path (evaluation/shadow.py).
        self.shadows = shadow_decider(runtime.config, observations)
        # Hedging groups' budgets and deadlines (gateway/hedging.py).
        self.hedges = Hedges(runtime.config)
        # The guards of groups' canaries (rollout/canary_guard.py), and groups' shadow
        # traffic (rollout/shadow_traffic.py), set by the assembly.
        self.canary: CanaryGuard | None = None
        self.mirror: ShadowTraffic | None = None
        # The operator console's recent decisions (console/decision_ring.py), set by the
        # assembly: one append of references per decision.
        self.recent: DecisionRing | None = None
        # Deciders a reload replaced, until the shadow loop has drained and rolled them up.
        self.retired_shadows: list[ShadowDecider] = []
        # Retries whose headers carried a credential (should stay 0: docs/security.md).
        self.retry_credentials_received = 0

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    def swap(self, runtime: Runtime, external: ExternalCalls | None,
             caches: ResponseCaches | None) -> None:
        """A reloaded configuration (operations/reload.py): requests from now on use it;
        requests already under way keep theirs (`Pending.runtime`), and their retries still
        find the clusters they were given (the last RETIRED_KEPT configurations)."""
        self._retired = (self._runtime, *self._retired)[:RETIRED_KEPT]
        self._runtime = runtime
        self.external = external
        self.caches = caches
        if self.shadows is not None:
            self.retired_shadows = [*self.retired_shadows, self.shadows][-RETIRED_KEPT:]
        self.shadows = shadow_decider(runtime.config, self._observations)
        self.hedges = Hedges(runtime.config, previous=self.hedges)

    @property
    def forwarded_headers(self) -> frozenset[str]:
        """Caller headers that may travel upstream (sidecar/header_policy.py)."""
        return self._runtime.forwarded_headers

    @property
    def max_body_bytes(self) -> int:
        return self._runtime.config.limits.max_request_body_bytes

    def on_headers(self, headers: Mapping[str, str], end_of_stream: bool) -> Reply | Pending:
        path = headers.get(":path", "/").split("?", 1)[0]
        method = headers.get(":method", "GET")
        dialect = CALLER_PATHS.get(path)
        anthropic = dialect.is_anthropic if dialect else "anthropic-version" in headers

        token = _presented_token(headers)
        if token is None:
            return _error(errors.missing_token(), anthropic)
        caller = self._runtime.callers_by_digest.get(token_digest(token))
        if caller is None:
            return _error(errors.unknown_token(), anthropic)

        if path == _MODELS_PATH or path.startswith(_MODELS_PATH + "/"):
            if method != "GET":
                return _error(ClientError(405, f"{method} is not allowed on {path}; use GET"),
                              anthropic)
            return self._models(caller, path, anthropic)
        if dialect is None:
            served = ", ".join(sorted([*CALLER_PATHS, _MODELS_PATH]))
            unknown = ClientError(404, f"Unknown endpoint {path}; this gateway serves {served}")
            return _error(unknown, anthropic)
        if method != "POST":
            return _error(ClientError(405, f"{method} is not allowed on {path}; use POST"),
                          anthropic)
        if end_of_stream:
            return _error(ClientError(400, "Request body is required (a JSON object)"), anthropic)
        session_id = headers.get(SESSION_HEADER, "")
        if session_id and not valid_session_id(session_id):
            return _error(ClientError(400, f"{SESSION_HEADER} must be 1 to "
                                           f"{MAX_SESSION_ID_CHARS} printable ASCII characters"),
                          anthropic)
        control = headers.get("cache-control")
        lookup, store = cache_directives(control) if control else (True, True)
        varying = tuple((name, headers[name]) for name in self._runtime.varying_headers
                        if name in headers)
        return Pending(caller, dialect, "anthropic-version" in headers,
                       SESSION_HEADER in headers, headers.get("x-request-id", ""),
                       headers.get("traceparent", ""), session_id, lookup, store,
                       self._runtime, varying)

    def on_body(self, pending: Pending, body: bytes) -> Reply | Forward | Ask | LeaseWait:
        runtime = pending.runtime or self._runtime
        anthropic = pending.dialect.is_anthropic
        limit = runtime.config.limits.max_request_body_bytes
        if len(body) > limit:  # Envoy's buffer enforces only limits above its 1 MiB default
            return _error(ClientError(413, f"Request body is larger than {limit} bytes"),
                          anthropic)
        try:
            parsed = parse_body(body)
        except BodyError as exc:
            return _error(ClientError(400, str(exc)), anthropic)
        payload = parsed.payload
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            return _error(
                ClientError(400, "Missing required parameter: 'model' (a model group name)",
                            param="model"),
                anthropic,
            )
        if model not in runtime.config.models or not pending.caller.may_use(model):
            return _error(errors.model_not_found(model), anthropic)

        if self.quotas is not None:
            refusal = self.quotas.admit(pending.caller.name, model, pending.request_id)
            if refusal is not None:
                group = (pending.runtime or self._runtime).config.models[model]
                return quota_guard(self.quotas, self._telemetry, pending, model, group, refusal,
                                   lambda: self._admitted(pending, model, parsed))
        return self._admitted(pending, model, parsed)

    def _admitted(self, pending: Pending, model: str, parsed: ParsedBody
                  ) -> Reply | Forward | Ask:
        runtime = pending.runtime or self._runtime
        payload = parsed.payload
        group = runtime.config.models[model]
        shape = request_shape(pending.dialect, payload, runtime.scan_limits[model])
        refusal = (bridge_refusal(runtime.bridge_translators.get((model, pending.dialect)),
                                  payload) if group.bridges else None)
        pressure = (self.quotas.counters.spend_pressure(pending.caller.name, model)
                    if self.quotas is not None and model in runtime.pressure_groups else 0.0)
        summary = shape.summary(model, pending.caller.name, pending.dialect,
                                pending.caller.spend_ceiling_usd,
                                affinity_key(pending.caller.name, model, group, pending.dialect,
                                             payload, pending.stateful_session), refusal,
                                group.output_budget_tokens, pressure)
        session = (bool(pending.session_id) and pending.dialect is Dialect.OPENAI_CHAT
                   and model in runtime.session_routes)
        if session:  # routed as the Responses request it becomes (docs/dialects.md §13)
            summary = replace(summary, dialect=Dialect.OPENAI_RESPONSES)
        cache: CacheVisit | None = None
        if self.caches is not None and model in self.caches:
            cache = cache_visit(self.caches, self._telemetry, pending, model, summary,
                                payload, session)
            if isinstance(cache, Reply):
                return cache
        if group.strategy == "external" and self.external is not None and (
                model in self.external):
            candidates = runtime.router.external_candidates(summary)
            if candidates:  # none: `_decided` answers the 400 at once
                query = self.external.builder(model)(summary, candidates, self._observations)
                return Ask(model, query, lambda answer: self._decided(
                    pending, model, group, parsed, summary, session, answer, cache),
                    self.external)
        return self._decided(pending, model, group, parsed, summary, session, None, cache)

    def store_answer(self, slot: str, body: bytes, content_type: str) -> None:
        """A cache miss's answer, as the caller receives it (gateway/bridging.py)."""
        if self.caches is not None:
            self.caches.store(slot, body, content_type)

    def _decided(self, pending: Pending, model: str, group: ModelGroup, parsed: ParsedBody,
                 summary: RequestSummary, session: bool, external: ExternalAnswer | None,
                 cache: CacheVisit | None) -> Reply | Forward:
        runtime = pending.runtime or self._runtime
        anthropic = pending.dialect.is_anthropic
        decision = runtime.router.decide(summary, self._observations, external)
        if self.external is not None and decision.trace.external is not None:
            self.external.outcomes[(model, decision.trace.external)] += 1
        if self._log_decisions:
            log_decision(decision, pending.caller.name)
        if decision.trace.canary is not None and self.canary is not None:
            self.canary.decided(pending.request_id, model, decision.trace.canary,
                                runtime.router.canary(model).version)  # type: ignore[union-attr]
        now = time.time()
        if self.recent is not None:
            self.recent.decided(pending.request_id, now, pending.caller.name, decision)
        if self._telemetry is not None and pending.request_id:
            self._telemetry.decided(DecisionFacts(
                pending.request_id, now, pending.caller.name, model, decision,
                summary, pending.traceparent, cache=cache.outcome if cache else None))
        if self.quotas is not None and pending.request_id and isinstance(decision, Decision):
            self.quotas.expect(pending.request_id, estimate_of(summary))  # type: ignore[arg-type]
        shadows = self.shadows
        if (shadows is not None and model in shadows and isinstance(decision, Decision)
                and decision.trace.canary != CANARY):  # shadow policies judge the live side
            shadows.offer(summary, decision)
        if isinstance(decision, NoEligibleTarget):
            if decision.retry_after_s is not None:
                wait = max(1, math.ceil(decision.retry_after_s))
                error = ClientError(429, f"{decision.reason} Retry after {wait} s.",
                                    code="rate_limit_exceeded")
                return Reply(429, error.render(anthropic), headers=(("retry-after", str(wait)),))
            return _error(ClientError(400, decision.reason, param="model"), anthropic)

        if session:
            return self._session_forward(pending, model, parsed, decision)
        mirror = self.mirror
        mirrored = mirror is not None and model in mirror.groups and mirror.offer(
            model, pending.request_id, pending.dialect, summary, decision,
            lambda ref, ask: b"".join(parsed.model_replaced(ref, ask)), runtime.routes,
            parsed.payload, runtime.bridge_translators.get((model, pending.dialect), ()))
        hedges = self.hedges if runtime is self._runtime else None
        forward = forward_decision(runtime, model, group, pending, parsed, summary, decision,
                                   cache.slot if cache is not None else None, hedges,
                                   self._observations)
        if mirrored:  # Envoy reads how the live answer finished, for the agreement figures
            forward = replace(forward, set_headers=(*forward.set_headers,
                                                    (ANSWER_FACTS_HEADER, "1")))
        return forward

    def on_attempt_headers(self, cluster: str, headers: Mapping[str, str]) -> TargetRoute | Reply:
        """A retry to `cluster` (Envoy asks only for retries, never for first attempts)."""
        if not self._runtime.credential_headers.isdisjoint(headers):
            self.retry_credentials_received += 1
            _limited.warning("retry_credentials", "a retry's headers carried a credential "
                             "header; Envoy's bootstrap should withhold them")
        path = headers.get(":path", "")
        refused = RetargetError("no such cluster")
        # A request that started before a reload retries with the configuration it was
        # decided with (its targets, their model_refs), else the newest that knows the
        # cluster.
        generation = headers.get(GENERATION_HEADER)
        runtimes = sorted((self._runtime, *self._retired),
                          key=lambda runtime: runtime.generation != generation)
        for runtime in runtimes:
            try:
                return attempt_route(runtime, cluster, path, headers.get(CALLER_API_HEADER))
            except RetargetError as exc:
                refused = exc
        return _retry_refused(refused, path)

    def _session_forward(self, pending: Pending, model: str, parsed: ParsedBody,
                         decision: Decision) -> Reply | Forward:
        """A Chat caller's stateful session: one target for its lifetime, one attempt per
        turn (the provider holds the state), the previous response threaded in upstream."""
        runtime = pending.runtime or self._runtime
        routes = runtime.session_routes[model]
        key = session_key(pending.caller.name, model, pending.session_id)
        eligible = [choice.index for choice in decision.ordered]
        session = self.sessions.get(key)
        if session is not None:
            if session.target_index not in eligible:
                self.sessions.forget(key)
                return _error(ClientError(409, "This session's target can no longer serve "
                                               "this request; start a new session (a new "
                                               f"{SESSION_HEADER})."), False)
            index = session.target_index
        else:
            index = next((i for i in eligible if i in routes), -1)
            if index < 0:
                return _error(ClientError(400, "A stateful session needs an eligible target "
                                               "that speaks the OpenAI Responses API."), False)
            self.sessions.pin(key, index)
        route = routes[index]
        new_body = parsed.model_replaced(route.model_ref)
        set_headers = (
            (":path", route.path),
            ("content-length", str(body_size(new_body))),
            (MAX_RETRIES_HEADER, "0"),
            *runtime.attempt_headers[model],
            (SESSION_KEY_HEADER, key),
        )
        return Forward((route.cluster,), set_headers, (), new_body, decision)

    def bridge_attempt(self, cluster: str, headers: Mapping[str, str]) -> BridgeAttempt | None:
        """An attempt through a bridge cluster (every attempt asks, first ones included)."""
        bridge = next((runtime.bridges[cluster] for runtime in (self._runtime, *self._retired)
                       if cluster in runtime.bridges), None)
        if bridge is None:
            return None
        if not self._runtime.credential_headers.isdisjoint(headers):
            self.retry_credentials_received += 1
        key = headers.get(SESSION_KEY_HEADER) if bridge.session else None
        return BridgeAttempt(bridge, session_key=key,
                             cache_slot=headers.get(CACHE_SLOT_HEADER) or None)

    def on_attempt_body(self, route: TargetRoute, body: bytes) -> Retarget | Reply:
        try:
            return retarget(route, body)
        except RetargetError as exc:
            return _retry_refused(exc, route.path)

    def _models(self, caller: Caller, path: str, anthropic: bool) -> Reply:
        allowed = self._runtime.groups_for(caller)
        if path == _MODELS_PATH:
            return Reply(200, model_list(allowed, anthropic))
        name = path[len(_MODELS_PATH) + 1:]
        if name not in allowed:
            return _error(errors.model_not_found(name), anthropic)
        return Reply(200, single_model(name, anthropic))


def affinity_key(caller: str, model: str, group: ModelGroup, dialect: Dialect,
                 payload: dict, stateful_session: bool = False) -> bytes | None:
    """Only dynamic-score groups with affinity on pin conversations; explicit stateful
    sessions (session header, Responses `previous_response_id`) never touch affinity.
    A group with a canary keys every conversation: its side is taken by the key
    (routing/canary.py), whatever the strategies. Shared with `sidecar explain`, so it
    shows the outcome live traffic would have."""
    canary = group.rollout is not None and group.rollout.canary is not None
    if not canary and (group.strategy != "dynamic_score"
                       or not group.dynamic_score.affinity.enabled):
        return None
    if stateful_session or payload.get("previous_response_id") is not None:
        return None
    return conversation_key(caller, model, dialect, payload)


def _presented_token(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    api_key = headers.get("x-api-key", "").strip()
    return api_key or None


def _retry_refused(exc: RetargetError, path: str) -> Reply:
    _limited.warning("retry_refused", "fallback attempt refused: %s", exc)
    dialect = attempt_dialect(path)
    anthropic = dialect.is_anthropic if dialect else False
    return _error(ClientError(502, "The fallback target could not be prepared for this "
                                   "request"), anthropic)


def _error(error: ClientError, anthropic: bool) -> Reply:
    return Reply(error.status, error.render(anthropic))
