"""`sidecar explain`: run one routing decision offline and show why each target won or lost.

The same code path as live traffic (`request_shape` → `RequestSummary` → `Router.decide`),
with observations from a snapshot file instead of the live store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.commands.text_table import format_table
from sidecar.config.models import SidecarConfig
from sidecar.dialects.apis import Dialect
from sidecar.dialects.body import BodyError, parse_body
from sidecar.dialects.shape import request_shape
from sidecar.gateway.handler import affinity_key
from sidecar.gateway.scan import scan_limit
from sidecar.routing.capabilities import eval_quality
from sidecar.routing.decision import Decision, NoEligibleTarget
from sidecar.routing.observations import EMPTY_SNAPSHOT, ObservationSnapshot, snapshot_from_dict
from sidecar.routing.router import Router

# The caller a request is keyed for without --caller (pins are per caller, so the same
# opening gives another key for another caller).
EXPLAIN_CALLER = "explain"


class ExplainError(Exception):
    """The request or observation file cannot be used."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExplainError(f"cannot read {what} {path}: {exc.strerror}") from None
    except (ValueError, RecursionError):
        raise ExplainError(f"{what} {path} is not valid JSON") from None


def explain(config: SidecarConfig, request_file: Path, dialect: Dialect,
            observations_file: Path | None = None, caller: str | None = None
            ) -> Decision | NoEligibleTarget:
    try:
        payload = parse_body(request_file.read_bytes()).payload
    except OSError as exc:
        raise ExplainError(f"cannot read request {request_file}: {exc.strerror}") from None
    except BodyError as exc:
        raise ExplainError(f"request {request_file}: {exc}") from None
    if not isinstance(payload.get("model"), str):
        raise ExplainError("the request must be a JSON object with a 'model' (group name)")
    group_name = payload["model"]
    if group_name not in config.models:
        raise ExplainError(f"unknown model group '{group_name}' "
                           f"(configured: {', '.join(config.models)})")
    snapshot: ObservationSnapshot = EMPTY_SNAPSHOT
    if observations_file is not None:
        try:
            snapshot = snapshot_from_dict(_read_json(observations_file, "observations"))
        except ValueError as exc:
            raise ExplainError(f"observations {observations_file}: {exc}") from None
    return decide(config, payload, dialect, snapshot, caller)


def decide(config: SidecarConfig, payload: dict[str, Any], dialect: Dialect,
           snapshot: ObservationSnapshot = EMPTY_SNAPSHOT, caller: str | None = None
           ) -> Decision | NoEligibleTarget:
    """One request body's decision, as live traffic would get it (`sidecar explain`, and
    what `sidecar rollout check` expects of the live gateway)."""
    group_name = payload["model"]
    ceiling = None
    if caller is not None:
        match = [c for c in config.callers if c.name == caller]
        if not match:
            raise ExplainError(f"unknown caller '{caller}'")
        ceiling = match[0].spend_ceiling_usd
    group = config.models[group_name]
    shape = request_shape(dialect, payload, scan_limit(group))
    caller_name = caller or EXPLAIN_CALLER
    # As live traffic keys it, with no pin yet: a first turn's outcome (`miss_created`: the
    # conversation would be pinned to the primary).
    key = affinity_key(caller_name, group_name, group, dialect, payload)
    summary = shape.summary(group_name, caller_name, dialect, ceiling, key)
    return Router(config).decide(summary, snapshot)


def evaluation_provenance(config: SidecarConfig, group: str) -> dict[str, dict[str, Any]]:
    """Per target, the configured evaluation and validation metadata `eval_quality_score`
    is computed from, with where it came from (`validation.suite`, `validated_at`): the
    score alone does not say which evaluation an operator is trusting (issue 42)."""
    found: dict[str, dict[str, Any]] = {}
    for target in config.models[group].targets:
        quality = eval_quality(target)
        entry: dict[str, Any] = {"eval_quality_score": 0.5 if quality is None else quality}
        if target.evaluation is not None:
            entry["evaluation"] = target.evaluation.model_dump(exclude_none=True)
        if target.validation is not None:
            entry["validation"] = target.validation.model_dump(exclude_none=True)
        found[f"{target.provider}/{target.model_ref}"] = entry
    return found


def _provenance_lines(provenance: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["", "evaluation metadata (eval_quality_score's inputs, from the configuration):"]
    for label, entry in provenance.items():
        parts = [f"{part}: " + ", ".join(f"{key} {value}" for key, value in fields.items())
                 for part, fields in entry.items() if part != "eval_quality_score" and fields]
        score = f"eval_quality_score {entry['eval_quality_score']:.3f}"
        lines.append(f"  {label}: {score} from " + ("; ".join(parts) if parts else
                                                    "nothing configured (neutral)"))
    return lines


def as_json(outcome: Decision | NoEligibleTarget,
            provenance: dict[str, dict[str, Any]] | None = None) -> str:
    document: dict[str, Any] = {"group": outcome.group}
    if isinstance(outcome, Decision):
        document["primary"] = outcome.primary.label
        document["fallbacks"] = [c.label for c in outcome.fallbacks]
    else:
        document["refused"] = outcome.reason
    document["trace"] = outcome.trace.to_dict()
    if provenance is not None:
        document["evaluation_metadata"] = provenance
    return json.dumps(document, indent=2)


def _affinity(outcome: Decision | NoEligibleTarget) -> str:
    words = {"miss_created": "a new conversation: pinned to {primary} from this turn on",
             "not_applicable": "not applicable: only dynamic_score groups pin, and only a "
                               "request with a conversation opening outside a stateful "
                               "session",
             "disabled": "off for this group"}
    outcome_name = outcome.trace.affinity
    primary = outcome.primary.label if isinstance(outcome, Decision) else "-"
    text = words.get(outcome_name, "").format(primary=primary)
    return f"{outcome_name} ({text})" if text else outcome_name


def as_table(outcome: Decision | NoEligibleTarget,
             provenance: dict[str, dict[str, Any]] | None = None) -> str:
    trace = outcome.trace
    lines = [f"group: {outcome.group}   strategy: {trace.strategy}   "
             f"targets: {trace.target_count}   candidates: {trace.candidate_count}"]
    if isinstance(outcome, Decision):
        lines.append(f"primary: {outcome.primary.label}")
        lines.append("fallbacks: " + (", ".join(c.label for c in outcome.fallbacks) or "none"))
    else:
        lines.append(f"refused: {outcome.reason}")
    details = {
        "order": trace.order, "complexity": trace.complexity, "cold_start": trace.cold_start,
        "score_terms": ", ".join(trace.score_terms) or None,
        "prompt_features": ", ".join(trace.prompt_features) or None,
        "request_shape": " ".join(f"{k}={v}" for k, v in trace.request_shape.items()) or None,
        "thresholds_relaxed": trace.thresholds_relaxed or None,
        "require_tags_relaxed": trace.require_tags_relaxed or None,
        "reasoning": trace.reasoning,
        "affinity": _affinity(outcome),
        "chosen with": (f"probability {trace.selection[0]:.3f} ({trace.selection[1]})"
                        if trace.selection else None),
        "odds": "  ".join(f"{t} {p:.3f}" for t, p in trace.odds) or None,
        "policy_version": trace.policy_version or None,
        "canary": (f"{trace.canary} (the candidate decides this conversation)"
                   if trace.canary == "canary" else trace.canary),
    }
    lines += [f"{key}: {value}" for key, value in details.items() if value]
    if trace.blend:
        a, k = trace.blend["adjustment"], trace.blend["sharpness"]
        lines.append(f"blend: final = {1 - a:.2f} × weight share + {a:.2f} × warm weight × "
                     f"softmax({k:g} × term) over the warm targets (cold: weight share)")
    for target, stage in trace.exclusions:
        lines.append(f"excluded: {target}  by {stage}")
    for target, threshold in trace.unproven:
        lines.append(f"not applied: {threshold} to {target}  (over its limit on too little "
                     "evidence: see thresholds.min_observations, thresholds.confidence)")
    if trace.candidates:
        names = ["cost", "latency", "throughput", "reliability", "complexity", "eval_quality"]
        header = ["target", "warm", "obs", *names, "term", "weight", "final"]
        rows = [header]
        for c in trace.candidates:
            rows.append([c.target, "yes" if c.warm else "no", str(c.observations),
                         *(f"{c.scores[n + '_score']:.3f}" if c.scores else "-" for n in names),
                         "-" if c.term_value is None else f"{c.term_value:.3f}",
                         f"{c.weight_share:.3f}", f"{c.final_share:.3f}"])
        lines += ["", format_table(rows)]
    if provenance is not None:
        lines += _provenance_lines(provenance)
    return "\n".join(lines)
