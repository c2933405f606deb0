"""Everything the gateway needs at request time, computed once from the configuration:
caller token digests, per-target upstream cluster, path and model, and each group's attempt
bounds as the Envoy headers that carry them.

Provider keys are not here: Envoy injects them per target cluster
(envoy_config/credentials.py), so the sidecar never holds a key it could hand out.
`provider_key_problems` only checks, for start-up, that each key can be read, and keeps
nothing (config/secrets.py, which also checks for `check-config --secrets` and a reload)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from sidecar.bridge.registry import Translator, processed_routes
from sidecar.config.models import Caller, SidecarConfig, Target
from sidecar.config.references import config_view
from sidecar.config.secrets import caller_digests, unreadable_provider_keys
from sidecar.dialects.apis import Dialect
from sidecar.envoy_contract import (
    ROUTE_CLASS_HEADER,
    bridge_cluster_name,
    hedge_listener_name,
    hedge_pairs,
    target_cluster_name,
)
from sidecar.gateway.scan import scan_limit
from sidecar.header_policy import (
    answer_varying_headers,
    credential_headers,
    forwarded_request_headers,
)
from sidecar.routing.router import Router


class StartupError(Exception):
    """The configuration is valid but cannot be served (for example a secret is missing)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("cannot start:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True, slots=True)
class TargetRoute:
    cluster: str
    path: str
    model_ref: str


@dataclass(frozen=True, slots=True)
class BridgeRoute:
    """A bridge cluster: the target it reaches, and the translation from its caller's API."""

    route: TargetRoute
    translator: Translator
    group: str
    session: bool = False
    # A response-cache miss in the caller's own API: the answer passes through unchanged.
    passthrough: bool = False


PER_TRY_TIMEOUT_HEADER = "x-envoy-upstream-rq-per-try-timeout-ms"


def _ms(seconds: float) -> str:
    return str(max(1, round(seconds * 1000)))


def attempt_headers(config: SidecarConfig, group: str) -> tuple[tuple[str, str], ...]:
    """The group's time bounds as Envoy router headers (the route is shared by all groups):
    the per-attempt timeout to response headers, and the deadline of the whole request;
    and the group's route class, where it needs one (a stream idle timeout or a wait for
    a 429's retry-after: settings of Envoy's route, not of a request)."""
    fallback = config.models[group].fallback
    deadline = config.deadline_seconds(config.models[group])
    route_class = config.route_class_name(group)
    return (
        (PER_TRY_TIMEOUT_HEADER, _ms(fallback.per_try_timeout_seconds)),
        ("x-envoy-upstream-rq-timeout-ms", _ms(deadline)),
        *(((ROUTE_CLASS_HEADER, route_class),) if route_class else ()),
    )


def stream_attempt_headers(config: SidecarConfig, group: str) -> tuple[tuple[str, str], ...]:
    """A stream's bounds where the group commits at the first event: the reply gate holds
    the headers until then, so the router's per-try timeout is the first-token deadline."""
    fallback = config.models[group].fallback
    if not fallback.commit_at_first_event:
        return attempt_headers(config, group)
    return ((PER_TRY_TIMEOUT_HEADER, _ms(fallback.first_event_wait_seconds)),
            *attempt_headers(config, group)[1:])


def on_route(headers: tuple[tuple[str, str], ...], route: str
             ) -> tuple[tuple[str, str], ...]:
    """`headers` naming the route `route` instead of their own."""
    return (*((name, value) for name, value in headers if name != ROUTE_CLASS_HEADER),
            (ROUTE_CLASS_HEADER, route))


def provider_key_problems(config: SidecarConfig,
                          environ: Mapping[str, str] | None = None) -> list[str]:
    """Each provider key a target needs that cannot be read, named by where it was
    expected (variable or file), never by value. The values read are dropped at once."""
    environ = os.environ if environ is None else environ
    return [str(problem) for problem in unreadable_provider_keys(config_view(config), environ)]


class Runtime:
    def __init__(self, config: SidecarConfig, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.config = config
        # Which configuration decided a request (GENERATION_HEADER): random, so it says
        # nothing of when or how often the sidecar reloaded.
        self.generation = secrets.token_hex(8)
        self.router = Router(config)
        # How much prompt text each group's requests scan (its own and its shadow's need).
        self.scan_limits = {name: scan_limit(group) for name, group in config.models.items()}
        # Groups whose score terms read `budget_pressure`: only their requests look it up.
        self.pressure_groups = frozenset(
            name for name, group in config.models.items()
            if any(policy.strategy == "dynamic_score" and any(
                "budget_pressure" in term.expression
                for term in policy.dynamic_score.score_terms)
                for policy in (group, group.shadow_group()) if policy is not None))
        self.callers_by_digest: dict[str, Caller]
        self.callers_by_digest, problems = caller_digests(config.callers, environ)
        if problems:
            raise StartupError([str(problem) for problem in problems])
        # Keyed by (group, target index, dialect): the path depends on the dialect the
        # caller speaks; the cluster does not (providers are single-origin).
        self.routes: dict[tuple[str, int, Dialect], TargetRoute] = {}
        # The same routes by (cluster, dialect), for retargeting a retry to its cluster.
        self.cluster_routes: dict[tuple[str, Dialect], TargetRoute] = {}
        # Envoy cluster name → ``provider/model_ref`` and → model group, for access logs.
        self.cluster_targets: dict[str, str] = {}
        self.cluster_groups: dict[str, str] = {}
        # Bridge clusters, and per (group, caller API) the translations its bridged targets
        # need (docs/dialects.md).
        self.bridges: dict[str, BridgeRoute] = {}
        self.bridge_translators: dict[tuple[str, Dialect], tuple[Translator, ...]] = {}
        # Per group, the targets a Chat caller's stateful session may use (target index →
        # session route): those speaking OpenAI Responses natively.
        self.session_routes: dict[str, dict[int, TargetRoute]] = {}
        # Per (group, target index, caller API), the route of a response-cache miss in the
        # caller's own API: through the sidecar, which stores the answer (docs/cache.md).
        self.cache_routes: dict[tuple[str, int, Dialect], TargetRoute] = {}
        for group_name, group in config.models.items():
            for index, target in enumerate(group.targets):
                provider = config.providers[target.provider]
                cluster = target_cluster_name(group_name, index, target.provider)
                self.cluster_targets[cluster] = f"{target.provider}/{target.model_ref}"
                self.cluster_groups[cluster] = group_name
                for dialect in config.target_dialects(target):
                    base_path = urlsplit(provider.base_url_for(dialect)).path.rstrip("/")
                    route = TargetRoute(cluster=cluster, path=base_path + dialect.endpoint,
                                        model_ref=target.model_ref)
                    self.routes[(group_name, index, dialect)] = route
                    self.cluster_routes[(cluster, dialect)] = route
                self._add_processed(config, group_name, index, target, group.bridges,
                                    group.caches_responses)
            if group.hedge is not None:
                self._add_hedging(config, group_name)
        self.forwarded_headers = forwarded_request_headers(config)
        self.varying_headers = answer_varying_headers(config)
        # Envoy withholds these from the retry hook (forward_rules); seeing one means the
        # bootstrap is not the rendered one, and a key reached the sidecar.
        self.credential_headers = frozenset(credential_headers(config))
        self.attempt_headers = {name: attempt_headers(config, name) for name in config.models}
        self.stream_attempt_headers = {name: stream_attempt_headers(config, name)
                                       for name in config.models}
        # The same on the group's route for decisions of one target (retries_lone_target).
        lone = {name: config.lone_route_classes[group.fallback.route_class]
                for name, group in config.models.items()}
        self.lone_attempt_headers = {name: on_route(headers, lone[name])
                                     for name, headers in self.attempt_headers.items()}
        self.lone_stream_attempt_headers = {
            name: on_route(headers, lone[name])
            for name, headers in self.stream_attempt_headers.items()}

    def _add_hedging(self, config: SidecarConfig, group_name: str) -> None:
        """A hedging group's internal listeners name their targets in the access log (a
        pair cluster's entries carry the listener that served), and a pair cluster's
        second attempt is retargeted for its second target (docs/hedging.md)."""
        group = config.models[group_name]
        for index, target in enumerate(group.targets):
            listener = hedge_listener_name(target_cluster_name(group_name, index, target.provider))
            self.cluster_targets[listener] = f"{target.provider}/{target.model_ref}"
            self.cluster_groups[listener] = group_name
        for _, second, pair in hedge_pairs(group_name, [t.provider for t in group.targets]):
            self.cluster_groups[pair] = group_name
            for dialect in config.target_dialects(group.targets[second]):
                self.cluster_routes[(pair, dialect)] = self.routes[(group_name, second, dialect)]

    def _add_processed(self, config: SidecarConfig, group_name: str, index: int,
                       target: Target, bridges: bool, cached: bool) -> None:
        """Routes through the sidecar's response processing: bridges, Responses requests to
        Responses targets (unary upstream) and stateful sessions (bridge/registry.py)."""
        provider = config.providers[target.provider]
        for processed in processed_routes(config.target_dialects(target), bridges, cached):
            cluster = bridge_cluster_name(group_name, index, target.provider, processed.suffix)
            base_path = urlsplit(provider.base_url_for(processed.speaks)).path.rstrip("/")
            route = TargetRoute(cluster=cluster, path=base_path + processed.speaks.endpoint,
                                model_ref=target.model_ref)
            session = processed.kind == "session"
            self.bridges[cluster] = BridgeRoute(route, processed.translator, group_name, session,
                                                passthrough=processed.kind == "cache")
            self.cluster_targets[cluster] = f"{target.provider}/{target.model_ref}"
            self.cluster_groups[cluster] = group_name
            if session:
                self.session_routes.setdefault(group_name, {})[index] = route
                continue
            if processed.kind == "cache":  # taken instead of the native route on a miss
                self.cache_routes[(group_name, index, processed.caller)] = route
                continue
            self.routes[(group_name, index, processed.caller)] = route
            if processed.kind == "bridge":
                key = (group_name, processed.caller)
                known = self.bridge_translators.get(key, ())
                if processed.translator not in known:
                    self.bridge_translators[key] = (*known, processed.translator)

    def groups_for(self, caller: Caller) -> list[str]:
        return [name for name in self.config.models if caller.may_use(name)]
