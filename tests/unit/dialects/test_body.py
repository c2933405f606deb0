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


def test_nested_model_keys_are_left_alone_and_the_last_top_level_one_wins() -> None:
    raw = b'{"model":"a","metadata":{"model":"g"},"tools":[{"model":"g"}],"model":"g"}'
    out = json.loads(rewrite(raw, "m"))
    assert out == {"model": "m", "metadata": {"model": "g"}, "tools": [{"model": "g"}]}
    assert parse_body(raw).payload["model"] == "g"


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
