"""Configuration models: providers, targets, model groups, callers, server limits.

One pydantic model per YAML block; every default is declared here and nowhere else.
Cross-references (a target's provider, a script rule's targets, a caller's groups) are
checked after validation, in references.py, so that `check-config` reports every problem
with its YAML path, also those of the blocks that did validate beside one that did not.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, AliasChoices, Field, field_validator, model_validator

from sidecar.billing import Rates, rates
from sidecar.config.catalog import BUILTIN_PROVIDERS
from sidecar.config.fallback_policy import (
    DEFAULT_ROUTE_CLASS,
    Fallback,
    RouteClass,
)
from sidecar.config.fields import (
    EnvName,
    Fraction,
    HeaderName,
    NonBlank,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretSource,
    Sha256Hex,
    StrictModel,
    bounded,
)
from sidecar.config.fleet import FleetSettings
from sidecar.config.hedge_policy import HedgePolicy
from sidecar.config.policy import DynamicScorePolicy, RoutingPolicy
from sidecar.config.quotas import CallerQuotas, QuotaSettings
from sidecar.config.rollout import Rollout
from sidecar.config.service_settings import Limits, Observations, Sessions, Telemetry
from sidecar.config.shadow import ShadowPolicy
from sidecar.config.strategy_policies import ExternalPolicy, ResponseCache, ScriptPolicy
from sidecar.dialects.apis import Dialect


def _check_base_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.query or parts.fragment:
        raise ValueError("must not contain a query string or fragment")
    return value.rstrip("/")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


class Credential(SecretSource):
    """Where the provider key comes from and which header carries it upstream.

    Exactly one of `env` or `file`. The header defaults by dialect: `authorization` with a
    `Bearer ` prefix for OpenAI dialects, `x-api-key` with no prefix for Anthropic.
    """

    header: HeaderName | None = None
    prefix: str | None = None


class Provider(StrictModel):
    base_url: str
    dialects: list[Dialect] = Field(default_factory=lambda: [Dialect.OPENAI_CHAT], min_length=1)
    dialect_base_urls: dict[Dialect, str] = Field(default_factory=dict)
    credential: Credential | None = None
    connect_timeout_seconds: Annotated[PositiveFloat, bounded(0.001, 300)] = 5.0
    # How Envoy talks to the provider: HTTP/1.1, or HTTP/2 (over TLS by ALPN, over plain
    # http with prior knowledge, as vLLM and other servers behind an HTTP/2 proxy take it).
    protocol: Literal["http1", "http2"] = "http1"
    # Beyond the built-in allowlists (sidecar/header_policy.py): caller headers this
    # provider gets, and this provider's response headers callers get.
    pass_request_headers: list[HeaderName] = Field(default_factory=list)
    pass_response_headers: list[HeaderName] = Field(default_factory=list)

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _check_base_url(value)

    @field_validator("dialect_base_urls")
    @classmethod
    def _check_urls(cls, value: dict[Dialect, str]) -> dict[Dialect, str]:
        return {dialect: _check_base_url(url) for dialect, url in value.items()}

    @model_validator(mode="after")
    def _same_origin(self) -> Provider:
        """One Envoy cluster serves every dialect of a target, so only paths may differ."""
        origin = _origin(self.base_url)
        for dialect, url in self.dialect_base_urls.items():
            if _origin(url) != origin:
                raise ValueError(
                    f"dialect_base_urls.{dialect} must share the scheme, host and port of "
                    "base_url (only the path may differ)"
                )
        return self

    def base_url_for(self, dialect: Dialect) -> str:
        return self.dialect_base_urls.get(dialect, self.base_url)


class Pricing(StrictModel):
    """USD per million tokens, as the provider bills them (sidecar/billing.py): input not
    read from the provider's prompt cache, output, cache reads and (Anthropic) cache writes.
    An unset cache price is the input price."""

    input_per_mtok: NonNegativeFloat
    output_per_mtok: NonNegativeFloat
    cached_input_per_mtok: NonNegativeFloat | None = None
    cache_write_per_mtok: NonNegativeFloat | None = None

    @cached_property
    def rates(self) -> Rates:
        """Every price resolved, once (routing prices each candidate of every decision)."""
        return rates(self)


class Evaluation(StrictModel):
    quality_score: Fraction | None = None
    pass_rate: Fraction | None = None


class Validation(StrictModel):
    status: Literal["passed", "failed", "pending"] | None = None
    pass_rate: Fraction | None = None
    suite: str | None = None
    validated_at: str | None = None


Modality = Literal["text", "image"]


class Target(StrictModel):
    """One provider model in a group. Capability fields are tri-state: `null` (the default)
    means unknown, which the baseline eligibility rules tolerate and the dynamic-score hard
    filters do not. The tags `tool_capable`, `vision`, `reasoning` and `structured_output`
    stand in for unknown `supports_tools`, `input_modalities: [text, image]`,
    `supports_reasoning` and `supports_structured_output`."""

    provider: NonBlank
    model_ref: NonBlank
    weight: NonNegativeInt = 1
    tags: list[str] = Field(default_factory=list)
    api: Dialect | None = None
    pricing: Pricing | None = None
    input_modalities: list[Modality] | None = None
    supports_tools: bool | None = None
    supports_reasoning: bool | None = None
    # JSON mode / JSON schema output (`response_format`, `text.format`, `output_config`)
    supports_structured_output: bool | None = None
    honors_max_tokens: bool = True
    # Tokens the model holds, prompt and output together: a request whose estimated prompt
    # plus output cap exceeds it is not sent here (`context_window` is the older name).
    context_window_tokens: PositiveInt | None = Field(
        default=None, validation_alias=AliasChoices("context_window_tokens", "context_window"))
    evaluation: Evaluation | None = None
    validation: Validation | None = None


class Contract(StrictModel):
    """A group's hard requirements and quality floors, checked before any scoring."""

    require_tags: list[str] = Field(default_factory=list)
    require_input_modalities: list[Modality] = Field(default_factory=list)
    min_context_window: PositiveInt | None = None
    min_eval_quality_score: Fraction | None = None
    min_validation_pass_rate: Fraction | None = None
    require_validation_status: Literal["passed"] | None = None


Strategy = Literal["weighted", "failover", "dynamic_score", "script", "external"]


_DEFAULT_DYNAMIC_SCORE = DynamicScorePolicy()
# Exclusions of targets a rollout withholds from the live side (ModelGroup.withheld).
CANARY_ONLY, SHADOW_ONLY = "rollout.canary_only", "rollout.shadow_only"


class ModelGroup(StrictModel):
    strategy: Strategy = "weighted"
    description: str | None = None
    targets: list[Target] = Field(min_length=1)
    contract: Contract | None = None
    routing_policy: RoutingPolicy = RoutingPolicy()
    fallback: Fallback = Fallback()
    script: ScriptPolicy | None = None
    external: ExternalPolicy | None = None
    response_cache: ResponseCache | None = None
    # What a request without an output cap is expected to produce (tokens): spend
    # ceilings and cost_score count with it, and it is the output charged when a reply's
    # usage cannot be read (billing.py, docs/quotas.md).
    output_budget_tokens: Annotated[PositiveInt, bounded(1, 10_000_000)] = 1024
    # Let callers of one API reach targets of another through a bridge (docs/dialects.md).
    # Off by default: a bridge translates, and some fields cannot cross (then the target is
    # ineligible for that request).
    bridges: bool = False
    # A candidate policy decided beside every live decision, never acted on (shadow.py).
    shadow: ShadowPolicy | None = None
    # Hedged first tokens (docs/hedging.md); unset: off.
    hedge: HedgePolicy | None = None
    # A guarded canary of a candidate configuration (rollout.py, docs/rollout.md).
    rollout: Rollout | None = None

    # That `strategy: script` has its `script` block (and `external` its `external`) and that
    # the rules name targets of the group are cross-references (references.py): checked
    # rule by rule, also when another part of the group is invalid.

    @model_validator(mode="after")
    def _bridges_need_no_native_filter(self) -> ModelGroup:
        if (self.bridges and self.strategy == "dynamic_score"
                and self.dynamic_score.hard_filters.require_requested_api_skin):
            raise ValueError("bridges: true needs routing_policy.dynamic_score.hard_filters."
                             "require_requested_api_skin: false (that filter keeps every "
                             "request on targets of its own API)")
        return self

    @model_validator(mode="after")
    def _hedging_needs_two_attempts(self) -> ModelGroup:
        if self.hedge is not None and (len(self.targets) < 2
                                       or self.fallback.max_attempts < 2):
            raise ValueError("hedge needs at least two targets and fallback.max_attempts "
                             "of 2 or more (the hedge is the decision's second attempt)")
        return self

    @model_validator(mode="after")
    def _shadow_weights_name_targets(self) -> ModelGroup:
        if self.shadow is not None:
            labels = {f"{t.provider}/{t.model_ref}" for t in self.targets}
            unknown = sorted(set(self.shadow.weights) - labels)
            if unknown:
                raise ValueError(f"shadow.weights names no target of this group: "
                                 f"{', '.join(unknown)} (targets: {', '.join(sorted(labels))})")
        return self

    @model_validator(mode="after")
    def _shadow_traffic_names_a_priced_target(self) -> ModelGroup:
        mirror = self.rollout.shadow_traffic if self.rollout is not None else None
        if mirror is None:
            return self
        found = [t for t in self.targets if f"{t.provider}/{t.model_ref}" == mirror.target]
        if not found:
            labels = sorted(f"{t.provider}/{t.model_ref}" for t in self.targets)
            raise ValueError(f"rollout.shadow_traffic.target names no target of this group: "
                             f"{mirror.target} (targets: {', '.join(labels)})")
        if found[0].pricing is None:
            raise ValueError("rollout.shadow_traffic needs the candidate's pricing (its "
                             "max_daily_usd is counted at its prices)")
        if len(self.withheld) >= len(self.targets):
            raise ValueError("rollout leaves the live side no target (every target is "
                             "canary-only or shadow-only)")
        return self

    @model_validator(mode="after")
    def _canary_names_targets(self) -> ModelGroup:
        canary = self.rollout.canary if self.rollout is not None else None
        if canary is None:
            return self
        if self.strategy == "external":
            raise ValueError("rollout.canary is not available in a strategy: external group "
                             "(the routing service decides its targets)")
        labels = [f"{t.provider}/{t.model_ref}" for t in self.targets]
        unknown = sorted((set(canary.weights) | set(canary.targets)) - set(labels))
        if unknown:
            raise ValueError(f"rollout.canary names no target of this group: "
                             f"{', '.join(unknown)} (targets: {', '.join(sorted(labels))})")
        if set(labels) <= set(canary.targets):
            raise ValueError("rollout.canary.targets lists every target of the group: the "
                             "live side would have none")
        candidate = self.canary_group()
        assert candidate is not None
        if candidate.strategy != "failover" and not any(
                t.weight > 0 for index, t in enumerate(candidate.targets)
                if self.withheld.get(index) != SHADOW_ONLY):
            raise ValueError("rollout.canary leaves its candidate no target with a weight "
                             "above 0")
        if not canary.targets and candidate == self.model_copy(
                update={"rollout": None, "shadow": None}):
            raise ValueError("rollout.canary changes nothing: set a strategy, routing_policy, "
                             "weights or canary-only targets")
        return self

    @property
    def withheld(self) -> dict[int, str]:
        """Targets the live side leaves out, by index, with the exclusion's name: those only
        a canary routes to, and a shadow-only mirror's candidate (none without a rollout)."""
        rollout = self.rollout
        if rollout is None:
            return {}
        canary, mirror = rollout.canary, rollout.shadow_traffic
        withheld = {}
        for index, t in enumerate(self.targets):
            label = f"{t.provider}/{t.model_ref}"
            if mirror is not None and mirror.shadow_only and label == mirror.target:
                withheld[index] = SHADOW_ONLY
            elif canary is not None and label in canary.targets:
                withheld[index] = CANARY_ONLY
        return withheld

    def live_group(self) -> ModelGroup:
        """The group as its live side decides: without its canary, or the canary's own
        targets (its policy version is the one the group had before the canary)."""
        if self.rollout is None:
            return self
        withheld = self.withheld
        return self.model_copy(update={
            "rollout": None,
            "targets": [t for index, t in enumerate(self.targets) if index not in withheld]})

    def canary_group(self) -> ModelGroup | None:
        """The group as its canary's candidate has it, every target included (None without
        one). Target order is the group's: a decision's target indexes mean the same."""
        canary = self.rollout.canary if self.rollout is not None else None
        if canary is None:
            return None
        return self.model_copy(update={
            "strategy": canary.strategy or self.strategy,
            "targets": self._reweighted(canary.weights),
            "routing_policy": canary.routing_policy or self.routing_policy,
            "shadow": None, "rollout": None})

    def shadow_group(self) -> ModelGroup | None:
        """The group as its shadow policy would have it (None without one)."""
        shadow = self.shadow
        if shadow is None:
            return None
        live = self.live_group()  # a rollout's own targets are not the live policy's
        return live.model_copy(update={
            "strategy": shadow.strategy or live.strategy,
            "targets": live._reweighted(shadow.weights),
            "routing_policy": shadow.routing_policy or live.routing_policy, "shadow": None,
            "rollout": None})

    def _reweighted(self, weights: dict[str, int]) -> list[Target]:
        """The targets, in order, with the weights `weights` gives by label."""
        return [t.model_copy(update={"weight": weights[label]})
                if (label := f"{t.provider}/{t.model_ref}") in weights else t
                for t in self.targets]

    @property
    def caches_responses(self) -> bool:
        """Whether the group answers repeated requests from its response cache."""
        return self.response_cache is not None and self.response_cache.enabled

    @property
    def dynamic_score(self) -> DynamicScorePolicy:
        """The group's dynamic-score policy, defaults filled in when the block is absent
        (one shared frozen instance: building a policy per request would cost ~100 µs)."""
        return self.routing_policy.dynamic_score or _DEFAULT_DYNAMIC_SCORE


class Caller(StrictModel):
    """A caller identity. Tokens are never stored in the configuration in clear: give the
    SHA-256 hex digest, or name an environment variable or file that holds the token."""

    name: NonBlank
    token_sha256: Sha256Hex | None = None
    token_env: EnvName | None = None
    token_file: Path | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])
    spend_ceiling_usd: PositiveFloat | None = None
    quotas: CallerQuotas | None = None

    @model_validator(mode="after")
    def _one_token_source(self) -> Caller:
        sources = [self.token_sha256, self.token_env, self.token_file]
        if sum(source is not None for source in sources) != 1:
            raise ValueError("set exactly one of 'token_sha256', 'token_env' or 'token_file'")
        return self

    def may_use(self, group: str) -> bool:
        return "*" in self.models or group in self.models


_GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]*")


def is_group_name(name: str) -> bool:
    return _GROUP_NAME.fullmatch(name) is not None


def _group_name(name: str) -> str:
    if not is_group_name(name):
        raise ValueError("a group name must start with a letter or digit and use only "
                         "letters, digits and . _ : / @ -")
    return name


# A key type, so a bad name is reported at its own path and hides no problem of any group.
GroupName = Annotated[str, AfterValidator(_group_name)]


def merge_catalog(data: Any) -> Any:
    """`data` with its `providers:` entries layered over the built-in catalog, key by key.
    A new `base_url` also drops the catalog's `dialect_base_urls`, which belong to the
    catalog's host. Anything but a mapping (with a mapping or nothing under `providers`) is
    returned as it is, for validation to report."""
    if not isinstance(data, dict):
        return data
    declared = data.get("providers") or {}
    if not isinstance(declared, dict):
        return data
    merged: dict[str, Any] = {name: dict(entry) for name, entry in BUILTIN_PROVIDERS.items()}
    for name, entry in declared.items():
        if isinstance(entry, dict) and name in merged:
            base = merged[name]
            if "base_url" in entry:
                base.pop("dialect_base_urls", None)
            merged[name] = {**base, **entry}
        else:
            merged[name] = entry
    return {**data, "providers": merged}


class SidecarConfig(StrictModel):
    providers: dict[str, Provider] = Field(default_factory=dict)
    models: dict[GroupName, ModelGroup] = Field(min_length=1)
    callers: list[Caller] = Field(default_factory=list)
    limits: Limits = Limits()
    observations: Observations = Observations()
    telemetry: Telemetry = Telemetry()
    sessions: Sessions = Sessions()
    quotas: QuotaSettings = QuotaSettings()
    fleet: FleetSettings = FleetSettings()

    @model_validator(mode="before")
    @classmethod
    def _merge_catalog(cls, data: Any) -> Any:
        return merge_catalog(data)

    @model_validator(mode="after")
    def _fleet_caches_need_a_fleet(self) -> SidecarConfig:
        if self.fleet_redis is None:
            for name, group in self.models.items():
                if group.response_cache is not None and group.response_cache.fleet:
                    raise ValueError(f"models.{name}.response_cache.fleet needs a fleet "
                                     "Redis: set fleet.redis_url or quotas.redis_url")
        return self

    @model_validator(mode="after")
    def _hedging_needs_observations(self) -> SidecarConfig:
        if not self.observations.enabled:
            hedging = [name for name, group in self.models.items() if group.hedge is not None]
            if hedging:
                raise ValueError(f"models.{hedging[0]}.hedge needs observations (its deadline "
                                 "and the budget's returned tokens come from the access "
                                 "log): remove `observations.enabled: false`")
            guarded = [name for name, group in self.models.items()
                       if group.rollout is not None and group.rollout.canary is not None]
            if guarded:
                raise ValueError(f"models.{guarded[0]}.rollout.canary needs observations (its "
                                 "guards judge the access log's records of its requests): "
                                 "remove `observations.enabled: false`")
        return self

    @property
    def fleet_redis(self) -> SecretSource | None:
        """Where replicas share their state: `fleet.redis_url`, else the quotas' Redis."""
        if not self.fleet.enabled:
            return None
        return self.fleet.redis_url or self.quotas.redis_url

    @property
    def observation_retention_seconds(self) -> int:
        """The longest `observation_window_seconds` of any dynamic-score group (600 if none)."""
        windows = [g.dynamic_score.observation_window_seconds for g in self.models.values()
                   if g.strategy == "dynamic_score"]
        return max(windows, default=600)

    @cached_property
    def route_classes(self) -> dict[RouteClass, str]:
        """Each route class the groups need, by the name its route matches on; the default
        class is the catch-all route and has the name "" (docs/fallback-and-streaming.md)."""
        needed = sorted({group.fallback.route_class for group in self.models.values()}
                        - {DEFAULT_ROUTE_CLASS})
        return {DEFAULT_ROUTE_CLASS: "", **{c: f"c{n}" for n, c in enumerate(needed, 1)}}

    def route_class_name(self, group: str) -> str:
        return self.route_classes[self.models[group].fallback.route_class]

    @cached_property
    def lone_route_classes(self) -> dict[RouteClass, str]:
        """Each route class by the name of its route for decisions of one target (the
        class's name and `s`): the second attempt at the lone target follows a 5xx, a
        reset or no connection only, never a 429 (Fallback.retries_lone_target)."""
        return {route_class: name + "s" for route_class, name in self.route_classes.items()}

    @cached_property
    def hedge_route_classes(self) -> dict[RouteClass, str]:
        """The route classes of hedging groups, by the name of their hedging route (the
        class's name and `h`): a hedge policy is a route setting, and only the requests a
        decision hedges take that route (docs/hedging.md)."""
        return {group.fallback.route_class: self.route_classes[group.fallback.route_class] + "h"
                for group in self.models.values() if group.hedge is not None}

    def deadline_seconds(self, group: ModelGroup) -> float:
        """How long all of a request's attempts together may take in `group`."""
        return group.fallback.deadline_seconds or self.limits.request_timeout_seconds

    @property
    def target_prices(self) -> dict[str, Rates]:
        """Each priced target's prices, resolved, by its label (`provider/model_ref`): what
        telemetry and quotas cost a finished request with (sidecar/billing.py)."""
        return {f"{t.provider}/{t.model_ref}": t.pricing.rates
                for group in self.models.values() for t in group.targets if t.pricing}

    def target_dialects(self, target: Target) -> list[Dialect]:
        """Dialects `target` serves natively: its `api` if pinned, else all its provider's."""
        return [target.api] if target.api else list(self.providers[target.provider].dialects)
