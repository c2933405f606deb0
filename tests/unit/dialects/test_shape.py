"""Reading the request shape from each dialect's body; odd bodies never raise."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.dialects.apis import Dialect
from sidecar.dialects.shape import request_shape
from sidecar.routing.request import Reasoning

CHAT, MESSAGES = Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES
RESPONSES = Dialect.OPENAI_RESPONSES
IMAGE_URL = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def shape(dialect: Dialect, payload: dict, limit: int = 16384):
    return request_shape(dialect, payload, limit)


def test_openai_chat_shape() -> None:
    s = shape(CHAT, {
        "model": "g", "stream": True, "max_completion_tokens": 1, "reasoning_effort": "High",
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                  IMAGE_URL]}]})
    assert (s.stream, s.has_tools, s.tool_forced, s.has_images) == (True, True, True, True)
    assert s.max_tokens_cap == 1
    assert s.reasoning == Reasoning(effort="high")
    assert s.prompt_chars == len("Be brief.") + len("What is this?")
    assert s.prompt_sample == "What is this?\nBe brief."  # newest first


def test_openai_chat_legacy_max_tokens_and_functions() -> None:
    s = shape(CHAT, {"max_tokens": 50, "functions": [{"name": "f"}],
                     "function_call": {"name": "f"}, "messages": []})
    assert (s.max_tokens_cap, s.has_tools, s.tool_forced) == (50, True, True)


@pytest.mark.parametrize("cap", [0, -1, True, "5", 2.5, None])
def test_only_explicit_positive_integer_caps_count(cap) -> None:
    assert shape(CHAT, {"max_completion_tokens": cap, "messages": []}).max_tokens_cap is None


def test_anthropic_shape() -> None:
    s = shape(MESSAGES, {
        "model": "g", "max_tokens": 1024, "system": [{"type": "text", "text": "sys"}],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "tools": [{"name": "t", "input_schema": {}}], "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "1"}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1",
                      "content": [{"type": "image", "source": {}}, {"type": "text",
                                                                   "text": "result"}]}]}]})
    assert (s.has_tools, s.tool_forced, s.has_images, s.max_tokens_cap) == (True, True, True, 1024)
    assert s.reasoning == Reasoning(budget_tokens=2048)
    assert s.prompt_sample == "result\nhi\nsys"


def test_anthropic_thinking_disabled_and_auto_tool_choice() -> None:
    s = shape(MESSAGES, {"thinking": {"type": "disabled"}, "tools": [{"name": "t"}],
                         "tool_choice": {"type": "auto"}, "messages": []})
    assert (s.reasoning, s.tool_forced) == (None, False)


def test_responses_shape() -> None:
    s = shape(RESPONSES, {"instructions": "inst", "max_output_tokens": 9,
                          "reasoning": {"effort": "low"},
                          "input": [{"role": "user", "content": [
                              {"type": "input_text", "text": "look"},
                              {"type": "input_image", "image_url": "x"}]},
                              {"type": "function_call_output", "output": "42"}]})
    assert (s.has_images, s.max_tokens_cap, s.reasoning) == (True, 9, Reasoning(effort="low"))
    assert s.prompt_sample == "42\nlook\ninst"
    assert shape(RESPONSES, {"input": "just text"}).prompt_chars == len("just text")


def test_scan_is_bounded_in_utf8_bytes_and_size_counts_everything() -> None:
    long = "é" * 50_000
    s = shape(CHAT, {"messages": [{"role": "user", "content": long}]}, limit=1000)
    assert s.prompt_chars == 50_000
    assert len(s.prompt_sample.encode()) <= 1000
    assert shape(CHAT, {"messages": [{"role": "user", "content": long}]}, 0).prompt_sample == ""


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["messages", "content", "type", "text", "tools", "tool_choice", "system",
                         "input", "thinking", "reasoning", "max_tokens", "image_url", "role",
                         "output", "instructions", "functions", "function_call"]), inner,
        max_size=5),
    max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["messages", "system", "input", "tools", "tool_choice",
                                        "thinking", "reasoning", "reasoning_effort",
                                        "max_tokens", "max_completion_tokens", "stream",
                                        "instructions", "functions", "function_call"]),
                       JSON, max_size=8),
       st.sampled_from(list(Dialect)))
def test_any_json_object_is_read_without_raising(payload: dict, dialect: Dialect) -> None:
    s = request_shape(dialect, payload, 256)
    assert s.prompt_chars >= 0 and len(s.prompt_sample.encode()) <= 256


@pytest.mark.parametrize(("dialect", "payload", "expected"), [
    (Dialect.OPENAI_CHAT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}}}}, "json_schema"),
    (Dialect.OPENAI_CHAT, {"response_format": {"type": "json_object"}}, "json_object"),
    (Dialect.OPENAI_CHAT, {"response_format": {"type": "text"}}, None),
    (Dialect.OPENAI_CHAT, {"response_format": "json"}, None),
    (Dialect.OPENAI_RESPONSES, {"text": {"format": {"type": "json_schema", "name": "x",
                                                    "schema": {}}}}, "json_schema"),
    (Dialect.ANTHROPIC_MESSAGES, {"output_config": {"format": {"type": "json_schema",
                                                               "schema": {}}}}, "json_schema"),
    (Dialect.ANTHROPIC_MESSAGES, {"output_format": {"type": "json_schema", "schema": {}}},
     "json_schema"),
    (Dialect.ANTHROPIC_MESSAGES, {"output_config": {"effort": "high"}}, None),
])
def test_structured_output_is_read_from_each_dialects_field(dialect, payload, expected) -> None:
    shape = request_shape(dialect, {"model": "g", "messages": [], **payload}, 1024)
    assert shape.structured_output == expected
    assert shape.summary("g", "c", dialect).structured_output == expected
