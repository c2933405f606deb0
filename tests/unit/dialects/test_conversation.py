"""The conversation key: equivalent encodings agree, different content and contexts differ."""

from __future__ import annotations

import pytest

from sidecar.dialects.apis import Dialect
from sidecar.dialects.conversation import conversation_key

CHAT, MESSAGES, RESPONSES = (Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES,
                             Dialect.OPENAI_RESPONSES)


def key(payload: dict, dialect: Dialect = CHAT, caller: str = "a", group: str = "g") -> bytes:
    result = conversation_key(caller, group, dialect, payload)
    assert result is not None and len(result) == 32
    return result


FIRST = {"role": "user", "content": "Fix my bug"}


@pytest.mark.parametrize(("left", "right"), [
    # string content ≡ a single text part
    ({"messages": [FIRST]},
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "Fix my bug"}]}]}),
    # later turns do not matter: the opening does
    ({"messages": [FIRST]},
     {"messages": [FIRST, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "more"}]}),
    # key order and extra part fields do not matter
    ({"messages": [{"content": "Fix my bug", "role": "user"}]}, {"messages": [FIRST]}),
    ({"messages": [{"role": "user", "content": [{"text": "Fix my bug", "type": "text",
                                                 "cache_control": {"type": "ephemeral"}}]}]},
     {"messages": [FIRST]}),
    # other request fields do not matter
    ({"messages": [FIRST], "temperature": 0.2, "stream": True}, {"messages": [FIRST]}),
    # image parts compare by source
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:x", "detail": "high"}}]}]},
     {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:x"}}]}]}),
])
def test_equivalent_encodings_give_the_same_key(left: dict, right: dict) -> None:
    assert key(left) == key(right)


def test_openai_system_message_normalizes_like_anthropic_system() -> None:
    openai_like = {"messages": [{"role": "system", "content": "Be terse."}, FIRST]}
    anthropic_like = {"system": "Be terse.", "messages": [FIRST]}
    # Same normalized opening, but the dialect stays in the key: different pins.
    from sidecar.dialects.conversation import _opening

    assert _opening(CHAT, openai_like) == _opening(MESSAGES, anthropic_like)
    assert key(openai_like, CHAT) != key(anthropic_like, MESSAGES)


@pytest.mark.parametrize("changed", [
    {"messages": [{"role": "user", "content": "Fix my bug!"}]},                 # content
    {"messages": [{"role": "assistant", "content": "Fix my bug"}]},             # role
    {"messages": [{"role": "system", "content": "x"}, FIRST]},                  # system context
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Fix my bug"},
                                               {"type": "text", "text": "!"}]}]},  # parts
])
def test_different_openings_give_different_keys(changed: dict) -> None:
    assert key(changed) != key({"messages": [FIRST]})


def test_caller_group_and_dialect_are_part_of_the_key() -> None:
    payload = {"messages": [FIRST]}
    assert key(payload, caller="a") != key(payload, caller="b")
    assert key(payload, group="g") != key(payload, group="h")
    assert key(payload, CHAT) != key(payload, MESSAGES)


def test_sending_only_the_new_turn_is_a_different_conversation() -> None:
    assert key({"messages": [{"role": "user", "content": "and now?"}]}) != key(
        {"messages": [FIRST, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "and now?"}]})


def test_responses_system_items_are_system_context_not_the_first_message() -> None:
    shared = {"role": "developer", "content": "You are a coding agent."}
    one = key({"input": [shared, {"role": "user", "content": "task 1"}]}, RESPONSES)
    two = key({"input": [shared, {"role": "user", "content": "task 2"}]}, RESPONSES)
    assert one != two
    assert one == key({"instructions": "You are a coding agent.",
                       "input": [{"role": "user", "content": "task 1"}]}, RESPONSES)


def test_non_message_openings_do_not_collide() -> None:
    outputs = [key({"input": [{"type": "function_call_output", "call_id": c, "output": "x"}]},
                   RESPONSES) for c in ("a", "b")]
    assert outputs[0] != outputs[1]
    calls = [key({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})
        for c in ("a", "b")]
    assert calls[0] != calls[1]


def test_cache_markers_and_empty_text_do_not_change_the_key() -> None:
    doc = {"type": "document", "source": {"type": "text", "data": "d"}}
    marked = {**doc, "cache_control": {"type": "ephemeral"}}
    assert key({"messages": [{"role": "user", "content": [doc]}]}, MESSAGES) == key(
        {"messages": [{"role": "user", "content": [marked]}]}, MESSAGES)
    assert key({"system": "", "messages": [FIRST]}, MESSAGES) == key({"messages": [FIRST]},
                                                                      MESSAGES)


def test_long_strings_enter_by_digest_and_differ_when_they_differ() -> None:
    image = "data:image/png;base64," + "A" * 3_000_000
    same = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image}}]}]}
    other = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image[:-1] + "B"}}]}]}
    assert key(same) == key(same) != key(other)


def test_the_key_covers_the_whole_first_message_however_long() -> None:
    """Issue #29.11: over 64 KiB only the length and both 32 KiB ends were hashed, so two
    different 70,000-character openings shared a pin."""
    opening = "a" * 35_000 + "{}" + "z" * 34_998
    middle_changed = "a" * 35_000 + "[]" + "z" * 34_998
    assert len(opening) == len(middle_changed) == 70_000
    assert key({"messages": [{"role": "user", "content": opening}]}) != key(
        {"messages": [{"role": "user", "content": middle_changed}]})
    # Slicing the hash changes no byte: lone surrogates (JSON escapes) across slice edges.
    odd = "x" * (64 * 1024 - 1) + "\ud800" + "y" * 70_000
    assert key({"messages": [{"role": "user", "content": odd}]}) == key(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": odd}]}]})


def test_absurdly_deep_content_gives_no_key_instead_of_failing() -> None:
    deep: object = "x"
    for _ in range(5_000):
        deep = [deep]
    assert conversation_key("a", "g", CHAT, {"messages": [{"role": "user",
                                                           "content": [deep]}]}) is None


def test_responses_input_without_messages() -> None:
    assert key({"input": "Fix my bug"}, RESPONSES) == key(
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Fix my bug"}]}]},
        RESPONSES)
    assert key({"input": "Fix my bug", "instructions": "x"}, RESPONSES) != key(
        {"input": "Fix my bug"}, RESPONSES)


@pytest.mark.parametrize("payload", [{}, {"messages": []}, {"messages": "x"},
                                     {"messages": [{"role": "system", "content": "only"}]},
                                     {"messages": [7]}])
def test_no_conversation_no_key(payload: dict) -> None:
    assert conversation_key("a", "g", CHAT, payload) is None


def image_message(data: str) -> dict:
    return {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]}


def test_large_images_are_keyed_by_every_character() -> None:
    """The SPEC's key is over the complete first message: a 4 MB image differing in one
    middle character is another conversation."""
    middle = "A" * 4_000_000
    base = key(image_message("head" + middle + "tail"))
    assert key(image_message("head" + middle + "tail")) == base
    assert key(image_message("HEAD" + middle + "tail")) != base
    assert key(image_message("head" + middle + "TAIL")) != base
    assert key(image_message("head" + middle + "tail!")) != base
    assert key(image_message("head" + "A" * 1_999_999 + "B" + "A" * 2_000_000 + "tail")) != base
