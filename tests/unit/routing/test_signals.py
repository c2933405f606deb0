"""`signals`: request_shape buckets, prompt_features (bounded scan) and complexity."""

from __future__ import annotations

import pytest

from sidecar.config.policy import Complexity, PromptFeature, Signals
from sidecar.routing.request import Reasoning, RequestSummary
from sidecar.routing.signals import complexity, prompt_feature_detector, request_shape_buckets
from tests.fixtures.complexity_prompts import LABELLED
from tests.unit.routing.helpers import request

ALL = Signals()

SAMPLES = {
    PromptFeature.CODE: "Why does this fail?\n```python\ndef f(x):\n    return x\n```",
    PromptFeature.DIFF: "Review:\ndiff --git a/app.py b/app.py\n@@ -1,3 +1,4 @@\n-x\n+y",
    PromptFeature.STACK_TRACE: 'Traceback (most recent call last):\n  File "a.py", line 3, in f\n'
                               "ValueError: bad",
    PromptFeature.SUMMARIZE: "Please summarize the meeting notes below.",
    PromptFeature.EXTRACT: "Extract every invoice number and return JSON.",
    PromptFeature.SECURITY_REVIEW: "Do a security review of this login handler for SQL injection.",
    PromptFeature.TOOL_AGENT: "You are an autonomous agent. Use the search tool when unsure.",
}


@pytest.mark.parametrize(("feature", "text"), SAMPLES.items())
def test_prompt_features_each_detected(feature: PromptFeature, text: str) -> None:
    assert feature in features_of(request(prompt_sample=text), ALL)


def test_code_detected_from_indented_statements() -> None:
    sample = "It fails here:\n    order = orders[order_id]\n    process(order)\n"
    assert PromptFeature.CODE in features_of(request(prompt_sample=sample), ALL)


def test_prompt_features_plain_chat_has_none() -> None:
    assert features_of(request(prompt_sample="Hi! How are you today?"), ALL) == set()


def test_prompt_features_only_listed_and_only_when_enabled() -> None:
    only_code = Signals.model_validate({"prompt_features": {"features": ["code"]}})
    sample = SAMPLES[PromptFeature.DIFF] + "\n" + SAMPLES[PromptFeature.CODE]
    assert features_of(request(prompt_sample=sample), only_code) == {
        PromptFeature.CODE}
    off = Signals.model_validate({"prompt_features": {"enabled": False}})
    assert features_of(request(prompt_sample=sample), off) == set()


def test_tool_agent_from_tools_present() -> None:
    assert PromptFeature.TOOL_AGENT in features_of(request(has_tools=True), ALL)


def test_request_shape_buckets() -> None:
    buckets = request_shape_buckets(request(stream=True, has_tools=True, tool_forced=True,
                                            max_tokens_cap=1, prompt_chars=40_000,
                                            structured_output="json_schema"))
    assert buckets == {"dialect": "openai_chat", "stream": True, "tools": "forced",
                       "images": False, "reasoning": False, "structured_output": "json_schema",
                       "max_tokens_cap": "tiny", "input_size": "large"}


@pytest.mark.parametrize(("shape", "features", "bucket", "points"), [
    ({}, set(), Complexity.SIMPLE, 0),
    ({"has_tools": True}, set(), Complexity.STANDARD, 1),
    ({"prompt_chars": 8_000 * 4}, set(), Complexity.COMPLEX, 3),  # a long document
    ({"prompt_chars": 7_999 * 4}, set(), Complexity.STANDARD, 1),
    ({"has_images": True, "reasoning": Reasoning(effort="high")}, set(), Complexity.STANDARD, 2),
    ({"max_tokens_cap": 20_000}, set(), Complexity.STANDARD, 2),
    ({}, {PromptFeature.CODE, PromptFeature.DIFF, PromptFeature.STACK_TRACE},
     Complexity.COMPLEX, 4),  # three markers and one hard-task point
    ({}, {PromptFeature.CODE, PromptFeature.STACK_TRACE}, Complexity.COMPLEX, 3),
    ({}, {PromptFeature.DIFF, PromptFeature.STACK_TRACE}, Complexity.COMPLEX, 3),
    ({}, {PromptFeature.CODE, PromptFeature.DIFF}, Complexity.COMPLEX, 3),
    ({"prompt_chars": 2_000 * 4}, {PromptFeature.CODE}, Complexity.COMPLEX, 3),
    ({}, {PromptFeature.CODE}, Complexity.STANDARD, 1),
    ({}, {PromptFeature.STACK_TRACE}, Complexity.STANDARD, 1),
    ({}, {PromptFeature.SUMMARIZE}, Complexity.SIMPLE, 0),  # a short text
    ({"prompt_chars": 250 * 4}, {PromptFeature.SUMMARIZE}, Complexity.STANDARD, 1),  # a page
    ({}, {PromptFeature.EXTRACT}, Complexity.STANDARD, 1),
    ({}, {PromptFeature.SECURITY_REVIEW, PromptFeature.CODE}, Complexity.COMPLEX, 3),
    ({"max_tokens_cap": 4_096}, {PromptFeature.CODE}, Complexity.COMPLEX, 3),  # long code out
    ({"prompt_chars": 32_000 * 4}, set(), Complexity.COMPLEX, 4),
])
def test_complexity_buckets(shape, features, bucket, points) -> None:
    result = complexity(request(**shape), frozenset(features), ALL)
    assert (result.bucket, result.points) == (bucket, points)
    assert result.score == min(1.0, points / 6)


def test_complexity_without_request_shape_counts_features_only() -> None:
    no_shape = Signals.model_validate({"request_shape": {"enabled": False}})
    result = complexity(request(has_tools=True, prompt_chars=10**6), frozenset(), no_shape)
    assert result.bucket is Complexity.SIMPLE
    assert complexity(request(), frozenset(), Signals.model_validate(
        {"complexity": {"enabled": False}})) is None


REALISTIC = {
    "debugging": (Complexity.COMPLEX, """My Flask endpoint crashes on empty carts. Why?

```python
@app.post("/checkout")
def checkout():
    cart = session.get("cart")
    total = sum(item["price"] for item in cart)
    return {"total": total}
```

Traceback (most recent call last):
  File "/srv/app.py", line 42, in checkout
    total = sum(item["price"] for item in cart)
TypeError: 'NoneType' object is not iterable
"""),
    "java trace with code": (Complexity.COMPLEX, """This throws on startup:

    public Config load() {
        return mapper.readValue(file, Config.class);
    }

Exception in thread "main" java.io.FileNotFoundException: config.yml
\tat com.acme.Config.load(Config.java:18)
\tat com.acme.Main.main(Main.java:7)
"""),
    "code review of a diff": (Complexity.COMPLEX, """Please review this change:

diff --git a/billing.py b/billing.py
@@ -10,6 +10,8 @@ def charge(customer, amount):
-    if amount > 0:
+    if amount >= 0:
+        log.info("charging %s", customer.id)
         return gateway.charge(customer.token, amount)
"""),
    "long code file": (Complexity.COMPLEX, "Refactor this module for readability:\n\n```python\n"
                       + "def step(state):\n    state = transform(state)\n    return state\n\n"
                       * 300 + "```\n"),
    "short code question": (Complexity.STANDARD,
                            "How do I reverse a list in Python? I tried:\n```python\n"
                            "items.reverse\n```"),
    "plain question": (Complexity.SIMPLE, "What is the capital of Australia?"),
    "short summary": (Complexity.SIMPLE, "Summarize in one line: the meeting moved to Monday."),
}


@pytest.mark.parametrize("name", REALISTIC)
def test_complexity_of_realistic_prompts(name: str) -> None:
    """Debugging requests and long code land in `complex`; short code questions stay
    `standard`; plain chat is `simple` (issue 14, item 5)."""
    bucket, text = REALISTIC[name]
    summary = request(prompt_sample=text, prompt_chars=len(text))
    result = complexity(summary, features_of(summary, ALL), ALL)
    assert result.bucket is bucket, (name, result)


def features_of(summary: RequestSummary, signals: Signals) -> frozenset[PromptFeature]:
    return prompt_feature_detector(signals)(summary)


def bucket_of(text: str, tools: bool = False, cap: int | None = None) -> Complexity:
    summary = request(prompt_sample=text[:16_384], prompt_chars=len(text), has_tools=tools,
                      max_tokens_cap=cap)
    result = complexity(summary, features_of(summary, ALL), ALL)
    assert result is not None
    return result.bucket


def test_a_readers_labels_are_matched_and_never_across_the_complex_line() -> None:
    """Issue #31.3: 3 of 30 labelled prompts got another bucket than a reader's, standard
    prompts rated complex among them. Over thirty-one labelled prompts one differs (a prose
    explanation of a technical idea, rated simple), and none is on the wrong side of the
    line the SPEC's score terms draw (`complex` takes the quality floor)."""
    differ = {name: (label, bucket_of(text, tools, cap).value)
              for name, label, text, tools, cap in LABELLED
              if bucket_of(text, tools, cap).value != label}
    assert set(differ) <= {"dependency injection"}, differ
    assert all((label == "complex") == (got == "complex") for label, got in differ.values())


@pytest.mark.parametrize(("text", "tools", "was", "now"), [
    # tools + tool_agent from the tools + "return " read as code: 3 points
    ("Use the order tool to look up order 8812 and return its status.", True,
     Complexity.COMPLEX, Complexity.STANDARD),
    ("What is the main function of the liver?", False, Complexity.STANDARD, Complexity.SIMPLE),
    ("What is dependency injection, and why do frameworks use it?", False,
     Complexity.STANDARD, Complexity.SIMPLE),
])
def test_words_prose_uses_are_not_code_or_security_work(text, tools, was, now) -> None:
    assert was is not now
    assert bucket_of(text, tools) is now


def test_tools_and_the_tool_agent_feature_count_once() -> None:
    assert bucket_of("What's the weather in Paris?", tools=True) is Complexity.STANDARD
    agent = ("You are an autonomous agent. Use the available tools to fix the failing "
             "build.\n```\nmake: *** [test] Error 2\n```")
    assert bucket_of(agent, tools=True) is Complexity.COMPLEX  # an agent task over code
