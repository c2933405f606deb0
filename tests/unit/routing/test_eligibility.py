"""Request eligibility (every strategy) and the dynamic-score `hard_filters`, one test per
rule, named after its config key."""

from __future__ import annotations

import pytest

from sidecar.dialects.apis import Dialect
from sidecar.routing.request import Reasoning
from tests.unit.routing.helpers import config, decide, excluded, refuse, request

TARGETS = """
    targets:
      - {provider: p, model_ref: declared, weight: 1, supports_tools: true,
         input_modalities: [text, image], supports_reasoning: true,
         supports_structured_output: true}
      - {provider: p, model_ref: unknown, weight: 1}
      - {provider: p, model_ref: denied, weight: 1, supports_tools: false,
         input_modalities: [text], supports_reasoning: false, honors_max_tokens: false,
         supports_structured_output: false}
      - {provider: anth-only, model_ref: other-api, weight: 1}
"""
WEIGHTED = config("  g:\n    strategy: weighted" + TARGETS)


def dynamic(**filters: bool):
    block = ", ".join(f"{k}: {str(v).lower()}" for k, v in filters.items())
    return config("  g:\n    strategy: dynamic_score" + TARGETS
                  + f"    routing_policy: {{dynamic_score: {{hard_filters: {{{block}}}}}}}\n")


def served(cfg, **shape) -> set[str]:
    return {c.target.model_ref for c in decide(cfg, request(**shape)).ordered}


def test_tool_passthrough_baseline_excludes_only_declared_no_support() -> None:
    decision = decide(WEIGHTED, request(has_tools=True))
    assert {c.target.model_ref for c in decision.ordered} == {"declared", "unknown"}
    assert excluded(decision)["p/denied"] == "eligibility.tool_passthrough"


def test_require_tool_support_when_tools_present_also_excludes_unknown() -> None:
    decision = decide(dynamic(require_tool_support_when_tools_present=True),
                      request(has_tools=True))
    assert {c.target.model_ref for c in decision.ordered} == {"declared"}
    stage = "hard_filters.require_tool_support_when_tools_present"
    assert excluded(decision)["p/unknown"] == excluded(decision)["p/denied"] == stage
    # Turned off, the baseline still applies: only the declared refusal is excluded.
    off = decide(dynamic(require_tool_support_when_tools_present=False), request(has_tools=True))
    assert excluded(off)["p/denied"] == "eligibility.tool_passthrough"
    assert "p/unknown" not in excluded(off)


def test_require_tool_support_tag_shorthand() -> None:
    cfg = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: tagged, tags: [tool_capable]}
      - {provider: p, model_ref: untagged}
""")
    assert served(cfg, has_tools=True) == {"tagged"}
    assert served(cfg, has_tools=False) == {"tagged", "untagged"}


@pytest.mark.parametrize(("shape", "baseline", "hard"), [
    ({"has_images": True}, "eligibility.image_modality", "require_input_modalities"),
    ({"reasoning": Reasoning(effort="high")}, "eligibility.reasoning_metadata",
     "require_reasoning_support_when_requested"),
    ({"structured_output": "json_schema"}, "eligibility.structured_output",
     "require_structured_output_support_when_requested"),
    ({"structured_output": "json_object"}, "eligibility.structured_output",
     "require_structured_output_support_when_requested"),
])
def test_declared_metadata_is_needed_in_every_strategy(shape, baseline, hard):
    for cfg, stage in ((WEIGHTED, baseline), (dynamic(**{hard: False}), baseline),
                       (dynamic(**{hard: True}), f"hard_filters.{hard}")):
        decision = decide(cfg, request(**shape))
        assert {c.target.model_ref for c in decision.ordered} == {"declared"}
        assert excluded(decision)["p/unknown"] == excluded(decision)["p/denied"] == stage


def test_require_input_modalities_vision_tag() -> None:
    cfg = config("""
  g:
    targets:
      - {provider: p, model_ref: seeing, tags: [vision]}
      - {provider: p, model_ref: blind}
""")
    assert served(cfg, has_images=True) == {"seeing"}


@pytest.mark.parametrize("cap", [1, 64])
def test_require_honors_max_tokens_when_caller_capped(cap: int) -> None:
    for cfg, stage in ((WEIGHTED, "eligibility.honors_max_tokens"),
                       (dynamic(require_honors_max_tokens_when_caller_capped=True),
                        "hard_filters.require_honors_max_tokens_when_caller_capped")):
        decision = decide(cfg, request(max_tokens_cap=cap))
        assert "denied" not in {c.target.model_ref for c in decision.ordered}
        assert excluded(decision)["p/denied"] == stage
    assert "denied" in served(WEIGHTED, max_tokens_cap=None)


def test_require_requested_api_skin() -> None:
    decision = decide(dynamic(require_requested_api_skin=True), request())
    assert excluded(decision)["anth-only/other-api"] == "hard_filters.require_requested_api_skin"
    decision = decide(dynamic(require_requested_api_skin=False), request())
    assert excluded(decision)["anth-only/other-api"] == "eligibility.api_skin"
    assert served(WEIGHTED, dialect=Dialect.ANTHROPIC_MESSAGES) == {
        "declared", "unknown", "denied", "other-api"}


def test_refusal_explains_every_reason_in_caller_words() -> None:
    cfg = config("""
  g:
    targets:
      - {provider: p, model_ref: x, supports_tools: false, input_modalities: [text, image]}
      - {provider: p, model_ref: y, input_modalities: [text]}
""")
    outcome = refuse(cfg, request(has_tools=True, has_images=True))
    assert outcome.reason == (
        "No target of model group 'g' can serve this request: tool use needs a target with "
        "tool support; image input needs a target that accepts images.")


def test_a_contract_refusal_is_not_mistaken_for_an_image_one() -> None:
    cfg = config("""
  g:
    contract: {require_input_modalities: [image]}
    targets: [{provider: p, model_ref: x, input_modalities: [text]}]
""")
    assert refuse(cfg, request()).reason.endswith("the group's contract excludes the rest.")


def test_structured_output_tag_shorthand_and_caller_words() -> None:
    cfg = config("""
  g:
    targets:
      - {provider: p, model_ref: tagged, tags: [structured_output]}
      - {provider: p, model_ref: untagged}
""")
    assert served(cfg, structured_output="json_schema") == {"tagged"}
    assert served(cfg) == {"tagged", "untagged"}
    plain = config("""
  g:
    targets: [{provider: p, model_ref: untagged}]
""")
    assert "structured output (JSON mode or a JSON schema) needs a target that declares" in (
        refuse(plain, request(structured_output="json_object")).reason)
