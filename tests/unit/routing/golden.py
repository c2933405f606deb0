"""Golden decisions (issue #17): a fixed scenario of groups of every strategy, requests of
every shape and observation snapshots, decided in sequence by one Router (so rotations,
affinity pins and ejections carry over), rendered as plain data. The strategy interface
must reproduce them exactly; `python -m tests.unit.routing.golden` rewrites the file after
a deliberate change of behaviour."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sidecar.routing.decision import Decision
from sidecar.routing.request import Reasoning
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request, snapshot, warm

GOLDEN = Path(__file__).parents[2] / "fixtures" / "golden_decisions.json"

GROUPS = config("""
  weighted:
    targets:
      - {provider: p, model_ref: a, weight: 5, supports_tools: true}
      - {provider: p, model_ref: b, weight: 3, input_modalities: [text, image]}
      - {provider: q, model_ref: c, weight: 1}
  failover:
    strategy: failover
    targets:
      - {provider: q, model_ref: first}
      - {provider: p, model_ref: second, supports_reasoning: true}
      - {provider: p, model_ref: third, weight: 0}
  dynamic:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: cheap, weight: 2, pricing: {input_per_mtok: 0.1,
         output_per_mtok: 0.4}, supports_tools: true}
      - {provider: p, model_ref: mid, weight: 1, pricing: {input_per_mtok: 1,
         output_per_mtok: 4}, supports_tools: true, input_modalities: [text, image]}
      - {provider: q, model_ref: premium, weight: 1, pricing: {input_per_mtok: 5,
         output_per_mtok: 15}, supports_tools: true, supports_reasoning: true,
         evaluation: {quality_score: 0.9}}
    routing_policy:
      dynamic_score:
        min_observations: 5
        thresholds: {max_error_rate: 0.3}
""")

SNAPSHOTS = [
    None,
    snapshot(p__cheap=warm(50, p95_latency_ms=300, error_rate=0.0),
             p__mid=warm(50, p95_latency_ms=900, error_rate=0.01),
             q__premium=warm(50, p95_latency_ms=1500, error_rate=0.0)),
    snapshot(p__cheap=warm(50, p95_latency_ms=300, error_rate=0.6),
             p__mid=warm(3, p95_latency_ms=200),
             q__premium=warm(50, p95_latency_ms=800, error_rate=0.0)),
]
SHAPES: list[dict[str, Any]] = [
    {},
    {"has_tools": True},
    {"has_tools": True, "tool_forced": True},
    {"has_images": True},
    {"reasoning": Reasoning(effort="high")},
    {"max_tokens_cap": 64, "prompt_chars": 40_000},
    {"prompt_sample": "Debug this stack trace: Traceback (most recent call last)",
     "prompt_chars": 2_000},
    {"conversation_key": b"k" * 32},
    {"conversation_key": b"k" * 32},
    {"spend_ceiling_usd": 0.00001, "prompt_chars": 100_000},
]


def scenario() -> list[dict[str, Any]]:
    router = Router(GROUPS, clock=lambda: 1000.0)
    out = []
    for round_ in range(3):
        for group in ("weighted", "failover", "dynamic"):
            for s, observations in enumerate(SNAPSHOTS):
                for n, shape in enumerate(SHAPES):
                    req = request(group=group, **shape)
                    outcome = (router.decide(req, observations) if observations is not None
                               else router.decide(req))
                    entry: dict[str, Any] = {"round": round_, "group": group, "snapshot": s,
                                             "shape": n}
                    if isinstance(outcome, Decision):
                        entry["ordered"] = [c.label for c in outcome.ordered]
                    else:
                        entry["refused"] = outcome.reason
                    entry["trace"] = outcome.trace.to_dict()
                    out.append(entry)
    return out


def rendered() -> str:
    return json.dumps(scenario(), indent=1, sort_keys=True, default=str) + "\n"


if __name__ == "__main__":
    GOLDEN.write_text(rendered())
    print(f"wrote {GOLDEN}")
