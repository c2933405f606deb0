"""Per-group policies of the strategies beside dynamic_score (`script`, `external`) and of
the exact-match response cache: the YAML blocks `script:`, `external:` and
`response_cache:` of a model group (docs/strategies.md, docs/external.md, docs/cache.md)."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sidecar.config.fields import PositiveInt, StrictModel, bounded


class TargetSelector(StrictModel):
    """Targets of the group by tag or by label (`provider/model_ref`); any match counts."""

    tags: list[str] = Field(default_factory=list)
    targets: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _something(self) -> TargetSelector:
        if not self.tags and not self.targets:
            raise ValueError("name at least one tag or target")
        return self


class ScriptRule(StrictModel):
    """`when` the condition holds (docs/strategies.md), apply the actions in this order:
    require, exclude, prefer, order."""

    when: str = "true"
    require: TargetSelector | None = None
    exclude: TargetSelector | None = None
    prefer: TargetSelector | None = None
    order: list[str] | None = None

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str) -> str:
        from sidecar.routing.conditions import ConditionError, compile_condition

        try:
            compile_condition(value)
        except ConditionError as exc:
            raise ValueError(f"condition {exc}") from None
        return value

    @model_validator(mode="after")
    def _acts(self) -> ScriptRule:
        if not (self.require or self.exclude or self.prefer or self.order):
            raise ValueError("a rule needs an action: require, exclude, prefer or order")
        return self


class ScriptPolicy(StrictModel):
    """The `script` strategy's rules, applied in order to the base order's result."""

    base: Literal["weighted", "failover"] = "weighted"
    rules: list[ScriptRule] = Field(min_length=1)


class ExternalPolicy(StrictModel):
    """`strategy: external`: an operator-run routing service ranks the eligible targets
    (proto/sidecar/external/v1/router.proto). Anything but a usable answer within
    `timeout_ms` — a timeout, an error, too many calls waiting, an empty list or a label
    that is not an eligible candidate — hands the decision to `fallback_strategy`."""

    # grpc://host:port (the ExternalRouter service) or http(s)://host:port/path (JSON).
    url: str
    timeout_ms: Annotated[PositiveInt, bounded(1, 30_000)] = 50
    fallback_strategy: Literal["weighted", "failover"] = "weighted"
    # Send up to max_scan_bytes of prompt text with each call; off, the service sees only
    # buckets, features, counts and the candidates.
    send_prompt_text: bool = False
    # Calls of this group waiting at once; beyond it a request is not held, it falls back.
    max_concurrent_calls: Annotated[PositiveInt, bounded(1, 100_000)] = 256

    @field_validator("url")
    @classmethod
    def _service_address(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("grpc", "http", "https") or not parts.hostname:
            raise ValueError("url must be grpc://host:port or http(s)://host[:port]/path")
        if parts.scheme == "grpc" and (parts.port is None or parts.path not in ("", "/")):
            raise ValueError("a grpc:// url is host:port only (grpc://10.0.0.5:9000)")
        if parts.username or parts.password:
            raise ValueError("url must not carry credentials")
        return value

    @property
    def is_grpc(self) -> bool:
        return self.url.startswith("grpc://")


class ResponseCache(StrictModel):
    """The exact-match response cache of a group (docs/cache.md): identical non-streaming
    requests answered from the sidecar's memory, without an upstream call."""

    enabled: bool = True
    ttl_seconds: Annotated[PositiveInt, bounded(1, 7 * 86_400)] = 300
    max_entries: Annotated[PositiveInt, bounded(1, 10_000_000)] = 10_000
    # All entries of the group together, and one answer (larger answers are not stored).
    max_bytes: Annotated[PositiveInt, bounded(1024, 16 * 1024**3)] = 64 * 1024 * 1024
    max_entry_bytes: Annotated[PositiveInt, bounded(1, 64 * 1024 * 1024)] = 1024 * 1024
    # Share entries across callers; off, a caller only ever gets its own cached answers.
    shared: bool = False
    # Share entries across replicas through the fleet channel (docs/fleet.md §3a); needs a
    # fleet Redis, and is off by default (answers travel through Redis).
    fleet: bool = False

    @model_validator(mode="after")
    def _entry_fits(self) -> ResponseCache:
        if self.max_entry_bytes > self.max_bytes:
            raise ValueError("max_entry_bytes must not exceed max_bytes")
        return self
