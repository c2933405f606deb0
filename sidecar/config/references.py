"""Cross-references of a configuration: what a value names must exist, and agree.

A target's provider (and the dialect it pins), a strategy's block, the targets a script
rule names, an external service's timeout against the sidecar's, group names Envoy can
tell apart, the groups a caller and its quotas name, unique caller names.

The checks read a `ConfigView`: the parts of the configuration that validated. For a
valid configuration that is all of it (`config_view`). For an invalid one,
`salvaged_view` validates each part on its own — each provider, group, target, script
rule and caller, and the sections a check reads — so a problem in one place hides no
problem elsewhere. A check is skipped only where a part it reads did not validate; that
part's own problem is validation's to report.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from sidecar.config.fields import NonBlank
from sidecar.config.models import (
    Caller,
    ModelGroup,
    Provider,
    SidecarConfig,
    Strategy,
    Target,
    is_group_name,
    merge_catalog,
)
from sidecar.config.problems import ConfigProblem
from sidecar.config.quotas import CallerQuotas
from sidecar.config.service_settings import Limits, Observations
from sidecar.config.strategy_policies import ExternalPolicy, ScriptRule
from sidecar.envoy_contract import target_cluster_name


@dataclass(frozen=True)
class GroupView:
    """One model group as far as it validated: None (or an empty tuple) where a part did
    not, and the checks that read that part are skipped."""

    strategy: str | None
    targets: tuple[Target | None, ...]
    # `provider/model_ref` of each target (also of one invalid otherwise); None when a
    # target's label cannot be read, so no name can be said to be missing.
    labels: frozenset[str] | None
    has_script: bool
    rules: tuple[ScriptRule | None, ...]
    has_external: bool
    external: ExternalPolicy | None

    @classmethod
    def of(cls, group: ModelGroup) -> GroupView:
        return cls(group.strategy, tuple(group.targets),
                   frozenset(f"{t.provider}/{t.model_ref}" for t in group.targets),
                   group.script is not None, tuple(group.script.rules if group.script else ()),
                   group.external is not None, group.external)

    @classmethod
    def salvaged(cls, raw: Any) -> GroupView:
        group = _valid(ModelGroup, raw)
        if group is not None:
            return cls.of(group)
        if not isinstance(raw, dict):
            return cls(None, (), None, False, (), False, None)
        targets = raw.get("targets")
        targets = targets if isinstance(targets, list) else []
        script = raw.get("script")
        rules = script.get("rules") if isinstance(script, dict) else None
        return cls(_valid(_STRATEGY, raw.get("strategy", "weighted")),
                   tuple(_valid(Target, target) for target in targets), _labels(targets),
                   script is not None,
                   tuple(_valid(ScriptRule, rule) for rule in rules)
                   if isinstance(rules, list) else (),
                   raw.get("external") is not None, _valid(ExternalPolicy, raw.get("external")))


@dataclass(frozen=True)
class CallerView:
    """One caller as far as it validated; `caller` only when the whole entry did (the
    secrets check reads its token source)."""

    caller: Caller | None
    name: str | None
    models: tuple[str, ...]
    quotas: CallerQuotas | None

    @classmethod
    def of(cls, caller: Caller) -> CallerView:
        return cls(caller, caller.name, tuple(caller.models), caller.quotas)

    @classmethod
    def salvaged(cls, raw: Any) -> CallerView:
        caller = _valid(Caller, raw)
        if caller is not None:
            return cls.of(caller)
        if not isinstance(raw, dict):
            return cls(None, None, (), None)
        return cls(None, _valid(_NAME, raw.get("name")),
                   tuple(_valid(_NAMES, raw.get("models", ["*"])) or ()),
                   _valid(CallerQuotas, raw.get("quotas")))


@dataclass(frozen=True)
class ConfigView:
    """What the cross-reference and secrets checks read of a configuration."""

    # None: the block itself is unusable (not a mapping), so no name can be called unknown.
    providers: Mapping[str, Provider | None] | None
    groups: Mapping[str, GroupView] | None
    callers: tuple[CallerView, ...]
    message_timeout_ms: int | None        # limits.sidecar_message_timeout_ms
    observations_enabled: bool | None


def config_view(config: SidecarConfig) -> ConfigView:
    return ConfigView(dict(config.providers),
                      {name: GroupView.of(group) for name, group in config.models.items()},
                      tuple(CallerView.of(caller) for caller in config.callers),
                      config.limits.sidecar_message_timeout_ms, config.observations.enabled)


def salvaged_view(data: dict[str, Any]) -> ConfigView:
    """The view of a configuration mapping that did not validate as a whole."""
    providers = merge_catalog(data).get("providers")
    groups = data.get("models")
    callers = data.get("callers", [])
    limits = _valid(Limits, data.get("limits", {}))
    observations = _valid(Observations, data.get("observations", {}))
    return ConfigView(
        {name: _valid(Provider, entry) for name, entry in providers.items()
         if isinstance(name, str)} if isinstance(providers, dict) else None,
        {name: GroupView.salvaged(entry) for name, entry in groups.items()
         if isinstance(name, str)} if isinstance(groups, dict) else None,
        tuple(CallerView.salvaged(entry) for entry in callers)
        if isinstance(callers, list) else (),
        limits.sidecar_message_timeout_ms if limits else None,
        observations.enabled if observations else None)


def reference_problems(view: ConfigView) -> list[ConfigProblem]:
    """Every dangling or contradictory reference the view lets us see, each at its path."""
    problems: list[ConfigProblem] = []
    for name, group in (view.groups or {}).items():
        path = f"models.{name}"
        problems += targets_name_declared_providers(path, group, view.providers)
        problems += some_target_has_weight(path, group)
        problems += strategy_has_its_block(path, group)
        problems += script_rules_name_group_targets(path, group)
        problems += external_answers_before_envoy_gives_up(path, group,
                                                           view.message_timeout_ms)
    problems += group_names_stay_apart_in_envoy(view.groups or {})
    for index, caller in enumerate(view.callers):
        problems += caller_names_declared_groups(f"callers[{index}]", caller, view.groups)
        problems += quotas_name_groups_and_have_their_counts(
            f"callers[{index}].quotas", caller.quotas, view.groups, view.observations_enabled)
    problems += caller_names_are_unique(view.callers)
    return problems


def targets_name_declared_providers(path: str, group: GroupView,
                                    providers: Mapping[str, Provider | None] | None,
                                    ) -> Iterator[ConfigProblem]:
    if providers is None:
        return
    for index, target in enumerate(group.targets):
        if target is None:
            continue
        where = f"{path}.targets[{index}]"
        if target.provider not in providers:
            yield ConfigProblem(f"{where}.provider",
                                f"unknown provider '{target.provider}' (declare it under "
                                f"providers:; known: {', '.join(sorted(providers))})")
            continue
        provider = providers[target.provider]
        if provider is not None and target.api is not None and (
                target.api not in provider.dialects):
            yield ConfigProblem(f"{where}.api",
                                f"provider '{target.provider}' does not speak '{target.api}' "
                                f"(it speaks: {', '.join(provider.dialects)})")


def some_target_has_weight(path: str, group: GroupView) -> Iterator[ConfigProblem]:
    targets = group.targets
    if (not targets or None in targets or group.strategy in (None, "failover")
            or sum(target.weight for target in targets if target is not None)):
        return
    yield ConfigProblem(f"{path}.targets", "at least one target needs a weight above 0")


def strategy_has_its_block(path: str, group: GroupView) -> Iterator[ConfigProblem]:
    if group.strategy == "script" and not group.has_script:
        yield ConfigProblem(f"{path}.script", "strategy: script needs a 'script' block with "
                                              "rules")
    if group.strategy == "external" and not group.has_external:
        yield ConfigProblem(f"{path}.external", "strategy: external needs an 'external' "
                                                "block with the url")


def script_rules_name_group_targets(path: str, group: GroupView) -> Iterator[ConfigProblem]:
    """Each place of each rule that names a target label the group does not have."""
    if group.labels is None:
        return
    known = ", ".join(sorted(group.labels))
    for index, rule in enumerate(group.rules):
        if rule is None:
            continue
        named = [("order", rule.order or [])]
        for action in ("require", "exclude", "prefer"):
            selector = getattr(rule, action)
            named.append((f"{action}.targets", selector.targets if selector else []))
        for where, labels in named:
            unknown = [f"'{label}'" for label in dict.fromkeys(labels)
                       if label not in group.labels]
            if unknown:
                yield ConfigProblem(f"{path}.script.rules[{index}].{where}",
                                    f"no target {', '.join(unknown)} in this group "
                                    f"(targets: {known})")


def external_answers_before_envoy_gives_up(path: str, group: GroupView,
                                           message_timeout_ms: int | None,
                                           ) -> Iterator[ConfigProblem]:
    if group.external is None or message_timeout_ms is None:
        return
    if group.external.timeout_ms + 100 > message_timeout_ms:
        yield ConfigProblem(f"{path}.external.timeout_ms",
                            f"must be at least 100 ms below limits.sidecar_message_timeout_ms "
                            f"({message_timeout_ms}): Envoy would give up on the sidecar first")


def group_names_stay_apart_in_envoy(groups: Collection[str]) -> Iterator[ConfigProblem]:
    clusters: dict[str, str] = {}
    for name in groups:
        if not is_group_name(name):
            continue  # validation says what is wrong with it
        cluster = target_cluster_name(name, 0, "x")
        if cluster in clusters:
            yield ConfigProblem(f"models.{name}",
                                f"group names '{clusters[cluster]}' and '{name}' differ only in "
                                "characters Envoy cluster names cannot hold (. : / @); rename "
                                "one")
        clusters.setdefault(cluster, name)


def caller_names_declared_groups(path: str, caller: CallerView,
                                 groups: Collection[str] | None) -> Iterator[ConfigProblem]:
    if groups is None:
        return
    for name in caller.models:
        if name != "*" and name not in groups:
            yield ConfigProblem(f"{path}.models", f"unknown model group '{name}'")


def quotas_name_groups_and_have_their_counts(path: str, quotas: CallerQuotas | None,
                                             groups: Collection[str] | None,
                                             observations_enabled: bool | None,
                                             ) -> Iterator[ConfigProblem]:
    """Unknown groups in `per_group`; token and spend limits without the access log that
    counts them (docs/quotas.md)."""
    if quotas is None:
        return
    for name in quotas.per_group:
        if groups is not None and name not in groups:
            yield ConfigProblem(f"{path}.per_group", f"unknown model group '{name}'")
    counted = [quotas, *quotas.per_group.values()]
    if observations_enabled is False and any(
            q.tokens_per_day is not None or q.spend_per_day_usd is not None for q in counted):
        yield ConfigProblem(path, "tokens_per_day and spend_per_day_usd are counted from "
                                  "Envoy's access log: they need observations.enabled: true")


def caller_names_are_unique(callers: tuple[CallerView, ...]) -> Iterator[ConfigProblem]:
    seen: dict[str, int] = {}
    for index, caller in enumerate(callers):
        if caller.name is None:
            continue
        if caller.name in seen:
            yield ConfigProblem(f"callers[{index}].name",
                                f"duplicate caller name '{caller.name}' "
                                f"(also callers[{seen[caller.name]}])")
        seen.setdefault(caller.name, index)


_STRATEGY: TypeAdapter[Any] = TypeAdapter(Strategy)
_NAME: TypeAdapter[Any] = TypeAdapter(NonBlank)
_NAMES: TypeAdapter[Any] = TypeAdapter(list[str])


def _valid(kind: type[BaseModel] | TypeAdapter[Any], value: Any) -> Any:
    """`value` validated as `kind`, or None when it is not valid (or absent)."""
    if value is None:
        return None
    try:
        if isinstance(kind, TypeAdapter):
            return kind.validate_python(value)
        return kind.model_validate(value)
    except ValidationError:
        return None


def _labels(targets: list[Any]) -> frozenset[str] | None:
    labels = set()
    for target in targets:
        provider = target.get("provider") if isinstance(target, dict) else None
        model_ref = target.get("model_ref") if isinstance(target, dict) else None
        if not (isinstance(provider, str) and isinstance(model_ref, str)):
            return None
        labels.add(f"{provider}/{model_ref}")
    return frozenset(labels)
