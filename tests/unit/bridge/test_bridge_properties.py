"""Properties of the translators (issue #16): on any valid request they translate or name
what cannot be bridged, never anything else; on any JSON at all they never crash; a valid
Chat request that translates keeps every conversation turn's text."""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.bridge import UnreadableAnswer, Untranslatable, chat_to_messages, messages_to_chat

text = st.text(max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=25)

tool_call = st.fixed_dictionaries({
    "id": text, "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": text, "arguments": st.dictionaries(
        text, st.integers() | text, max_size=3).map(json.dumps)})})
chat_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries(
        {"url": st.sampled_from(["https://example.com/a.png", "data:image/png;base64,AAAA",
                                 "data:image/tiff;base64,AAAA"])})}))
chat_message = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"),
                           "content": text | st.lists(chat_part, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | text},
                          optional={"tool_calls": st.lists(tool_call, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": text, "content": text}),
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]), "content": text}))
chat_request = st.fixed_dictionaries(
    {"model": text, "messages": st.lists(chat_message, min_size=1, max_size=6)},
    optional={"temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
              "max_tokens": st.integers(1, 10_000), "stream": st.booleans(),
              "stop": text | st.lists(text, max_size=4), "user": text,
              "reasoning_effort": st.sampled_from(["minimal", "low", "medium", "high"]),
              "tool_choice": st.sampled_from(["auto", "required", "none"]),
              "parallel_tool_calls": st.booleans(), "n": st.integers(1, 3)})

block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.just("image"), "source": st.fixed_dictionaries(
        {"type": st.just("url"), "url": st.just("https://example.com/a.png")})}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text,
                           "content": text}, optional={"is_error": st.booleans()}))
assistant_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": text,
                           "input": st.dictionaries(text, st.integers(), max_size=2)}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text,
                           "signature": text}))
messages_request = st.fixed_dictionaries(
    {"model": text, "max_tokens": st.integers(1, 10_000), "messages": st.lists(
        st.fixed_dictionaries({"role": st.just("user"),
                               "content": text | st.lists(block, min_size=1, max_size=3)})
        | st.fixed_dictionaries({"role": st.just("assistant"), "content": text | st.lists(
            assistant_block, min_size=1, max_size=3)}), min_size=1, max_size=6)},
    optional={"system": text, "temperature": st.floats(0, 1), "top_k": st.integers(1, 5),
              "stop_sequences": st.lists(text, max_size=6), "stream": st.booleans(),
              "thinking": st.fixed_dictionaries({"type": st.just("enabled"),
                                                 "budget_tokens": st.integers(1024, 32_000)}),
              "metadata": st.fixed_dictionaries({"user_id": text})})


def _translates_or_names(translate: Any, body: Any) -> Any:
    try:
        return translate(body)
    except Untranslatable as named:
        assert named.field and named.reason
        return None


@settings(max_examples=300, deadline=None)
@given(chat_request)
def test_valid_chat_requests_translate_or_name_the_field(body: dict) -> None:
    out = _translates_or_names(chat_to_messages.request, body)
    if out is None:
        return
    json.dumps(out)  # plain JSON
    roles = [m["role"] for m in out["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles))  # alternating
    assert out["stream"] is False and out["max_tokens"] >= 1


@settings(max_examples=300, deadline=None)
@given(messages_request)
def test_valid_messages_requests_translate_or_name_the_field(body: dict) -> None:
    out = _translates_or_names(messages_to_chat.request, body)
    if out is not None:
        json.dumps(out)
        assert out["stream"] is False


@settings(max_examples=400, deadline=None)
@given(json_values, json_values)
def test_no_input_crashes_a_translator(first: Any, second: Any) -> None:
    for body in (first, {"model": "g", "messages": first}, {"messages": [first, second]}):
        if not isinstance(body, dict):
            continue
        for translate in (chat_to_messages.request, messages_to_chat.request):
            _translates_or_names(translate, body)
    for answer in (first, {"content": first}, {"choices": [first]},
                   {"choices": [{"message": {"content": first, "tool_calls": second}}]}):
        if not isinstance(answer, dict):
            continue
        for read in (lambda a: chat_to_messages.response(a, "g", lambda: 0.0),
                     lambda a: messages_to_chat.response(a, "g")):
            with contextlib.suppress(UnreadableAnswer):
                read(answer)


shaped_garbage = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "developer"]),
     "content": json_values},
    optional={"tool_calls": json_values, "tool_call_id": json_values}), min_size=1, max_size=4)


@settings(max_examples=400, deadline=None)
@given(shaped_garbage, json_values, json_values)
def test_messages_of_the_right_shape_with_any_contents_never_crash(
        messages: list, tools: Any, choice: Any) -> None:
    for body in ({"model": "g", "messages": messages},
                 {"model": "g", "messages": messages, "tools": tools, "tool_choice": choice},
                 {"model": "g", "max_tokens": 5, "messages": messages, "system": tools,
                  "stop_sequences": choice, "thinking": choice}):
        for translate in (chat_to_messages.request, messages_to_chat.request):
            _translates_or_names(translate, body)
