"""Builders for routing-core tests: configs from YAML snippets and request summaries."""

from __future__ import annotations

from dataclasses import replace

from sidecar.config import SidecarConfig, load_config_text
from sidecar.dialects.apis import Dialect
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.observations import ObservationSnapshot, TargetObservations
from sidecar.routing.request import RequestSummary
from sidecar.routing.router import Router

PROVIDERS = """
providers:
  p: {base_url: "http://127.0.0.1:9/v1", dialects: [openai_chat, anthropic_messages]}
  q: {base_url: "http://127.0.0.1:9/v1"}
  anth-only: {base_url: "http://127.0.0.1:9/v1", dialects: [anthropic_messages]}
"""


def config(models_yaml: str) -> SidecarConfig:
    return load_config_text(PROVIDERS + "models:\n" + models_yaml)


def request(group: str = "g", dialect: Dialect = Dialect.OPENAI_CHAT, **fields) -> RequestSummary:
    return replace(RequestSummary(group=group, caller="c", dialect=dialect), **fields)


def warm(count: int = 100, **figures) -> TargetObservations:
    return TargetObservations(count=count, **figures)


def snapshot(**by_label: TargetObservations) -> ObservationSnapshot:
    """Keys use `__` for `/`: snapshot(p__a=warm()) is target p/a."""
    return ObservationSnapshot({k.replace("__", "/"): v for k, v in by_label.items()})


def decide(cfg: SidecarConfig, req: RequestSummary, obs=None) -> Decision:
    outcome = Router(cfg).decide(req, obs) if obs is not None else Router(cfg).decide(req)
    assert isinstance(outcome, Decision), outcome
    return outcome


def refuse(cfg: SidecarConfig, req: RequestSummary) -> NoEligibleTarget:
    outcome = Router(cfg).decide(req)
    assert isinstance(outcome, NoEligibleTarget), outcome
    return outcome


def excluded(decision: Decision | NoEligibleTarget) -> dict[str, str]:
    return dict(decision.trace.exclusions)
