"""docs/configuration.md names every configuration key the models accept, and every
default it states for top-level scalar keys matches the model."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from sidecar.config.models import SidecarConfig
from sidecar.config.policy import DynamicScorePolicy

DOC = (Path(__file__).parent.parent.parent / "docs" / "configuration.md").read_text()


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _models(arg)]


def _all_keys(model: type[BaseModel], seen: set[type]) -> set[str]:
    keys: set[str] = set()
    if model in seen:
        return keys
    seen.add(model)
    for name, field in model.model_fields.items():
        keys.add(name)
        for inner in _models(field.annotation):
            keys |= _all_keys(inner, seen)
    return keys


def test_every_key_is_documented() -> None:
    keys = _all_keys(SidecarConfig, set()) | _all_keys(DynamicScorePolicy, set())
    missing = sorted(key for key in keys if f"`{key}" not in DOC and f".{key}`" not in DOC)
    assert missing == []


def test_stated_policy_defaults_match_the_model() -> None:
    policy = DynamicScorePolicy()
    for key, value in [("min_observations", policy.min_observations),
                       ("observation_window_seconds", policy.observation_window_seconds),
                       ("max_score_adjustment_percent", int(policy.max_score_adjustment_percent)),
                       ("affinity.ttl_seconds", policy.affinity.ttl_seconds),
                       ("affinity.max_entries", policy.affinity.max_entries),
                       ("signals.prompt_features.max_scan_bytes",
                        policy.signals.prompt_features.max_scan_bytes)]:
        assert f"| `{key}` | `{value}` |" in DOC, key
