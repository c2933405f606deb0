"""`strategy: script` (docs/strategies.md): the condition language, each action and their
order, refusals by rule, time of day from an injected clock, and rule errors at load with
their YAML path."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError
from sidecar.routing.conditions import ConditionError, compile_condition
from sidecar.routing.decision import NoEligibleTarget
from sidecar.routing.request import Reasoning
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, excluded, request

FEATURES = {"dialect": "openai_chat", "stream": True, "tools": "forced", "images": False,
            "complexity": "complex", "features": frozenset({"stack_trace"}),
            "caller": "batch", "hour_utc": 23.0, "weekday": "sat", "prompt_chars": 900.0}


@pytest.mark.parametrize(("text", "expected"), [
    ("stream", True), ("not images", True), ("tools == 'forced'", True),
    ("complexity in ['complex', 'reasoning'] and stream", True),
    ("'stack_trace' in features", True), ("'code' in features", False),
    ("hour_utc >= 22 or hour_utc < 6", True), ('caller != "batch"', False),
    ("(images or stream) and not (weekday == 'sun')", True), ("prompt_chars > 1000", False),
])
def test_conditions(text: str, expected: bool) -> None:
    assert compile_condition(text)(FEATURES) is expected


@pytest.mark.parametrize(("text", "words"), [
    ("", "is empty"), ("tokens > 3", "unknown name 'tokens'"), ("complexity", "comparison"),
    ("caller > 'a'", "compares numbers"), ("stream == 'yes'", "cannot compare"),
    ("x = 1", "unexpected character"), ("images and", "expected a value"),
    ("'a' in caller", "set feature"), ("__import__('os')", "unknown name"),
])
def test_condition_errors_say_what_and_where(text: str, words: str) -> None:
    with pytest.raises(ConditionError, match=words):
        compile_condition(text)


GROUP = """
  g:
    strategy: script
    targets:
      - {provider: p, model_ref: cheap, weight: 3, tags: [cheap]}
      - {provider: p, model_ref: mid, weight: 1}
      - {provider: q, model_ref: premium, weight: 1, tags: [premium],
         supports_reasoning: true}
    script:
      base: failover
      rules:
        - when: "complexity == 'complex' or reasoning"
          prefer: {tags: [premium]}
        - when: "caller == 'batch'"
          require: {tags: [cheap]}
        - when: "tools == 'forced'"
          exclude: {targets: [p/cheap]}
        - when: "hour_utc >= 22"
          order: [p/mid, q/premium]
"""


def labels(outcome) -> list[str]:
    return [c.label for c in outcome.ordered]


def test_each_action_and_their_order() -> None:
    router = Router(config(GROUP), wall_clock=lambda: 1_767_225_600.0 + 12 * 3600)  # noon
    assert labels(router.decide(request())) == ["p/cheap", "p/mid", "q/premium"]
    hard = router.decide(request(reasoning=Reasoning(effort="high")))
    assert labels(hard)[0] == "q/premium" and "rules 0 applied" in hard.trace.order
    batch = router.decide(request(caller="batch"))
    assert labels(batch) == ["p/cheap"]
    assert excluded(batch) == {"p/mid": "script.rules[1].require",
                               "q/premium": "script.rules[1].require"}
    forced = router.decide(request(has_tools=True, tool_forced=True))
    assert labels(forced) == ["p/mid", "q/premium"]
    refused = router.decide(request(caller="batch", has_tools=True, tool_forced=True))
    assert isinstance(refused, NoEligibleTarget)
    assert "the group's routing rules exclude the rest" in refused.reason
    night = Router(config(GROUP), wall_clock=lambda: 1_767_225_600.0 + 23 * 3600)
    assert labels(night.decide(request())) == ["p/mid", "q/premium", "p/cheap"]


def test_a_weighted_base_keeps_its_rotation_under_the_rules() -> None:
    cfg = config(GROUP.replace("base: failover", "base: weighted"))
    router = Router(cfg, wall_clock=lambda: 1_767_225_600.0)
    firsts = [labels(router.decide(request()))[0] for _ in range(5)]
    assert firsts.count("p/cheap") == 3 and firsts.count("p/mid") == 1


def test_rule_errors_name_their_yaml_path() -> None:
    broken = GROUP.replace("caller == 'batch'", "caller >")
    with pytest.raises(ConfigError) as raised:
        config(broken)
    assert "models.g.script.rules[1].when: condition" in str(raised.value)
    with pytest.raises(ConfigError, match="no target 'p/nope'"):
        config(GROUP.replace("order: [p/mid, q/premium]", "order: [p/nope]"))
    with pytest.raises(ConfigError, match="needs an action"):
        config(GROUP.replace("          order: [p/mid, q/premium]\n", ""))
    with pytest.raises(ConfigError, match="needs a 'script' block"):
        config("  g:\n    strategy: script\n    targets: [{provider: p, model_ref: m}]\n")
