"""How much of a request's prompt the routing core may scan, per group (resolved at load:
gateway/runtime.py)."""

from __future__ import annotations

from sidecar.config.models import ModelGroup


def scan_limit(group: ModelGroup) -> int:
    """How much prompt text the routing core may scan: only dynamic_score, script and
    external groups (whose rules or service may read prompt features and complexity) with
    the prompt_features signal on look at text at all — or an external group that sends
    prompt text to its service; and whatever the group's shadow policy would scan."""
    shadow = group.shadow_group()
    own = _own_scan_limit(group)
    return own if shadow is None else max(own, _own_scan_limit(shadow))


def _own_scan_limit(group: ModelGroup) -> int:
    if group.strategy not in ("dynamic_score", "script", "external"):
        return 0
    features = group.dynamic_score.signals.prompt_features
    sends_text = group.external is not None and group.external.send_prompt_text
    return features.max_scan_bytes if features.enabled or sends_text else 0
