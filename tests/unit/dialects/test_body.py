"""Parsing a body once and splicing the new `model` in, byte for byte."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.dialects.body import BodyError, parse_body


def rewrite(raw: bytes, model: str = "real-model") -> bytes:
    return parse_body(raw).with_model(model)


def test_only_the_model_value_changes() -> None:
    raw = (b'{ "messages" : [ {"role":"user","content":"hi \\u00e9 \\ud83d"} ],\n'
           b'  "model" : "g" , "n": 1.50 }')
    assert rewrite(raw) == raw.replace(b'"g"', b'"real-model"')


def test_nested_model_keys_are_left_alone() -> None:
    raw = b'{"metadata":{"model":"g"},"tools":[{"model":"g"}],"model":"g"}'
    out = json.loads(rewrite(raw, "m"))
    assert out == {"model": "m", "metadata": {"model": "g"}, "tools": [{"model": "g"}]}
    assert parse_body(raw).payload["model"] == "g"


@pytest.mark.parametrize("raw", [
    b'{"model":"a","model":"g"}',
    b'{"model":"a","metadata":{"model":"g"},"mod\\u0065l":"g"}',
    b'{"model":"a","x":"' + b"y" * 9000 + b'","model":"g"}',  # the fast path's size
])
def test_two_top_level_model_members_are_refused(raw: bytes) -> None:
    """Issue #28: parsers disagree on which duplicate counts, so a provider keeping the
    first would serve a model the router did not choose."""
    with pytest.raises(BodyError, match="more than one top-level 'model'"):
        parse_body(raw)


@pytest.mark.parametrize(("raw", "name"), [
    (b'{"model":"g","stream":false,"max_tokens":5,"stream":true}', "stream"),
    (b'{"model":"g","max_tok\\u0065ns":5,"x":"' + b"y" * 9000 + b'","max_tokens":9}',
     "max_tokens"),
    (b'{"model":"g","messages":[],"messages":[{"role":"user","content":"hi"}]}', "messages"),
])
def test_any_top_level_member_given_twice_is_refused(raw: bytes, name: str) -> None:
    """A provider keeping the first `stream` would stream where the router decided on JSON
    (and asked for no usage); so for every member the router reads."""
    with pytest.raises(BodyError, match=f"more than one top-level '{name}'"):
        parse_body(raw)


def test_a_refused_duplicate_name_is_shown_shortened() -> None:
    name = "k" * 500
    with pytest.raises(BodyError) as refused:
        parse_body(f'{{"model":"g","{name}":1,"{name}":2}}'.encode())
    assert len(str(refused.value)) < 150


def test_nested_duplicates_are_left_to_the_provider() -> None:
    assert parse_body(b'{"model":"g","metadata":{"a":1,"a":2}}').payload["metadata"] == {"a": 2}


def test_escaped_key_spelling_and_special_characters_in_the_new_value() -> None:
    raw = b'{"mod\\u0065l": "g"}'
    assert json.loads(rewrite(raw, 'we"ird\\/model')) == {"model": 'we"ird\\/model'}


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"model": "g",', "not valid JSON"),
    (b'{"model": NaN}', "not valid JSON"),
    (b'{"model": "g", "t": Infinity}', "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"),
    (b"", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b'{"model": "g"} trailing', "not valid JSON"),
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"a" 1}', "not valid JSON"),
])
def test_bad_bodies_raise_a_caller_safe_error(raw: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message):
        parse_body(raw)


def test_non_string_model_is_kept_in_the_payload_for_the_gateway_to_reject() -> None:
    assert parse_body(b'{"model": 7}').payload == {"model": 7}
    assert parse_body(b"{ }").payload == {}


@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3), max_leaves=10),
    max_size=5), st.text(max_size=20), st.booleans())
def test_same_result_as_json_loads_then_set_model(payload, model, pretty) -> None:
    payload = {**payload, "model": "group"}
    raw = json.dumps(payload, indent=2 if pretty else None, ensure_ascii=False).encode()
    parsed = parse_body(raw)
    assert parsed.payload == payload
    assert json.loads(parsed.with_model(model)) == {**payload, "model": model}


# --- the fast path and the exact path agree ---------------------------------------------

from sidecar.dialects import body as body_module  # noqa: E402

_KEYS = st.sampled_from(["model", "messages", "mod\\u0065l", "x", "é", "\"", "\\", ""])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["model", '"model":', "\\\"model\\\":"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "content", "a"]) | st.text(max_size=4), inner, max_size=3),
    max_leaves=12)


def _members(draw_pairs: list[tuple[str, object]], pretty: bool, ascii_only: bool) -> bytes:
    """A JSON object written member by member, so keys may repeat and use escapes."""
    parts = []
    for key, value in draw_pairs:
        name = f'"{key}"' if "\\u" in key else json.dumps(key, ensure_ascii=ascii_only)
        parts.append(f"{name}{' : ' if pretty else ':'}"
                     f"{json.dumps(value, ensure_ascii=ascii_only, indent=1 if pretty else None)}")
    return ("{" + (",\n " if pretty else ",").join(parts) + "}").encode()


_MODEL_MEMBER = st.tuples(st.sampled_from(["model", "mod\\u0065l"]), st.text(max_size=12))


@given(st.lists(st.tuples(_KEYS, _VALUES) | _MODEL_MEMBER, max_size=6), st.booleans(),
       st.booleans(), st.text(max_size=10))
def test_the_fast_path_gives_what_the_exact_path_gives(pairs, pretty, ascii_only, model) -> None:
    raw = _members(pairs, pretty, ascii_only)
    try:
        exact = body_module._parse_exact(raw)
    except BodyError as refused:  # two members of one name: both paths refuse alike
        with pytest.raises(BodyError) as fast_refusal:
            body_module._parse_fast(raw, budget=10**6)
        assert str(fast_refusal.value) == str(refused)
        return
    fast = body_module._parse_fast(raw, budget=10**6)
    assert fast is not None
    assert fast.payload == exact.payload
    assert fast.model_span == exact.model_span
    assert fast.with_model(model) == exact.with_model(model)


def test_a_large_image_body_takes_the_fast_path() -> None:
    image = "iVBORw0KGgo" * 100_000
    raw = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": 'say "model": hi \\ there'},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]}],
        "model": "group", "stream": True}).encode()
    fast = body_module._parse_fast(raw)
    assert fast is not None
    assert fast.with_model("m-a") == raw.replace(b'"model": "group"', b'"model": "m-a"')
    assert fast.payload == json.loads(raw)


def test_bodies_of_many_small_tokens_take_the_exact_path_with_the_same_result() -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": str(n)} for n in range(200)],
                      "model": "group"}).encode()
    assert body_module._parse_fast(raw) is None  # 200 messages: over a 4 KB body's budget
    assert rewrite(raw, "m") == raw.replace(b'"model": "group"', b'"model": "m"')


def test_lone_surrogate_escapes_are_accepted_as_the_standard_library_accepts_them() -> None:
    raw = b'{"model": "g", "messages": [{"content": "\\ud800"}]}'
    assert parse_body(raw).payload["messages"][0]["content"] == "\ud800"
    assert rewrite(raw, "m") == raw.replace(b'"g"', b'"m"')


@pytest.mark.parametrize("content", [
    '\\"' * 200_000,  # escaped quotes: each one costs the walk a token
    "\\" * 300_000,  # one long run of backslashes before the closing quote
])
def test_escape_heavy_bodies_leave_the_walk_early_and_parse_exactly(content: str) -> None:
    raw = json.dumps({"messages": [{"content": content}], "model": "g"}).encode()
    assert body_module._parse_fast(raw) is None
    assert rewrite(raw, "m") == raw.replace(b'"model": "g"', b'"model": "m"')
