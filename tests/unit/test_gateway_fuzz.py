"""Whatever JSON a caller sends, the gateway answers (a Reply or a Forward) and never raises."""

from __future__ import annotations

import hashlib
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config import load_config_text
from sidecar.dialects.apis import Dialect
from sidecar.gateway import Forward, Gateway, Pending, Reply, Runtime

TOKEN = "fuzz"
CONFIG = load_config_text(f"""
providers:
  p: {{base_url: "http://127.0.0.1:9/v1", dialects: [openai_chat, openai_responses,
       anthropic_messages]}}
callers: [{{name: f, token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]
models:
  dyn:
    strategy: dynamic_score
    targets:
      - {{provider: p, model_ref: a, tags: [tool_capable, vision, reasoning, validated]}}
      - {{provider: p, model_ref: b, pricing: {{input_per_mtok: 1, output_per_mtok: 2}}}}
    routing_policy:
      dynamic_score:
        score_terms:
          - {{name: t, when: {{complexity_gte: standard}}, require_tags: [validated],
             expression: "cost_score + max(latency_score, eval_quality_score) / 2"}}
  plain: {{targets: [{{provider: p, model_ref: c}}]}}
""")
KEYS = ["messages", "content", "type", "text", "tools", "tool_choice", "system", "input",
        "thinking", "reasoning", "reasoning_effort", "max_tokens", "max_completion_tokens",
        "image_url", "url", "role", "output", "instructions", "stream", "source",
        "previous_response_id", "tool_calls", "budget_tokens", "effort"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30) | st.sampled_from(["user", "system", "developer", "image_url",
                                              "text", "image", "enabled", "required"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                                 max_size=6),
    max_leaves=25)
PATHS = {Dialect.OPENAI_CHAT: "/v1/chat/completions", Dialect.ANTHROPIC_MESSAGES: "/v1/messages",
         Dialect.OPENAI_RESPONSES: "/v1/responses"}
GATEWAY = Gateway(Runtime(CONFIG, {}))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=8),
       st.sampled_from(["dyn", "plain", "nope", 7, None]), st.sampled_from(list(Dialect)))
def test_any_body_gets_an_answer(payload: dict, model, dialect: Dialect) -> None:
    if model is not None:
        payload = {**payload, "model": model}
    pending = GATEWAY.on_headers({":path": PATHS[dialect], ":method": "POST",
                                  "authorization": f"Bearer {TOKEN}"}, end_of_stream=False)
    assert isinstance(pending, Pending)
    outcome = GATEWAY.on_body(pending, json.dumps(payload).encode())
    assert isinstance(outcome, Reply | Forward)
    if isinstance(outcome, Reply):
        assert outcome.status in (400, 404)
        json.loads(outcome.body)
    else:
        assert json.loads(outcome.body)["model"] in {"a", "b", "c"}
