"""Whatever a provider answers through a bridge — nested to death, garbage, HTML, the wrong
shape, as a 200 or an error — the caller gets an answer or an error in *its* dialect, and
the sidecar never raises (issue #28, observation 2)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.bridge.registry import UNARY_NATIVE, processed_routes
from sidecar.dialects.apis import Dialect
from sidecar.gateway.bridging import BridgeAttempt, response_body, response_headers
from sidecar.gateway.runtime import BridgeRoute, TargetRoute

NESTED = b"[" * 5000 + b"]" * 5000
DEEP_OBJECT = b'{"a":' * 5000 + b"1" + b"}" * 5000
HOSTILE = [NESTED, DEEP_OBJECT, b"<html><body>502 Bad Gateway</body></html>", b"",
           b"not json", b'{"foo": 1}', b"[1, 2, 3]", b'"a string"', b'{"choices": 7}',
           b'{"content": "x", "type": "message"}', b'{"choices": [{"message": 5}]}',
           b'{"output": [{"content": null}]}', b'{"error": ' * 2000 + b"1" + b"}" * 2000]
# Well-shaped answers with a hostile part (tool arguments nested to death): translated, or
# refused, but never a crash.
ODD = [b'{"choices": [{"message": {"tool_calls": [{"id": "c", "type": "function", '
       b'"function": {"name": "f", "arguments": "' + b"[" * 3000 + b'"}}]}}]}',
       b'{"type": "message", "content": [{"type": "tool_use", "id": "t", "name": "f", '
       b'"input": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}]}"]


def bridges() -> list[BridgeRoute]:
    """Every translating bridge (a Responses caller of a Responses target is passed its
    provider's answer as it is, as a native caller would be: only `every_processed_route`
    adds it)."""
    routes = processed_routes([Dialect.OPENAI_CHAT], bridges=True) + processed_routes(
        [Dialect.ANTHROPIC_MESSAGES], bridges=True)
    return [BridgeRoute(TargetRoute("target__g__0__p", "/v1/x", "m"), r.translator, "g")
            for r in routes if r.kind == "bridge"]


def every_processed_route() -> list[BridgeRoute]:
    return [*bridges(), BridgeRoute(TargetRoute("target__g__0__p", "/v1/x", "m"),
                                    UNARY_NATIVE[Dialect.OPENAI_RESPONSES], "g")]


def caller_shaped(body: bytes, caller: Dialect) -> dict:
    document = json.loads(body)
    if caller.is_anthropic:
        assert document["type"] == "error" and set(document["error"]) == {"type", "message"}
    else:
        assert set(document) == {"error"}
    return document


@pytest.mark.parametrize("bridge", bridges(), ids=lambda b: f"{b.translator.caller}"
                                                            f"-from-{b.translator.target}")
@pytest.mark.parametrize("status", [200, 400, 429, 500])
@pytest.mark.parametrize("stream", [False, True])
def test_a_hostile_answer_becomes_an_error_in_the_callers_dialect(
        bridge: BridgeRoute, status: int, stream: bool) -> None:
    for body in HOSTILE:
        attempt = BridgeAttempt(bridge, stream=stream)
        response_headers(attempt, {":status": str(status), "content-type": "text/html"})
        rewrite = response_body(attempt, body, lambda: 1_767_225_600.0)
        headers = dict(rewrite.set_headers)
        if status == 200:
            assert headers.get(":status") == "502", body[:40]
        assert rewrite.body is not None
        caller_shaped(rewrite.body, bridge.translator.caller)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["choices", "message", "content", "type", "usage", "output",
                         "tool_calls", "function", "arguments", "id", "model"]),
        inner, max_size=4), max_leaves=20).map(lambda d: json.dumps(d).encode()))
def test_no_answer_makes_a_bridge_raise(body: bytes) -> None:
    answer_through_every_bridge(body)


@pytest.mark.parametrize("body", ODD)
def test_a_well_shaped_answer_with_a_hostile_part_does_not_crash(body: bytes) -> None:
    answer_through_every_bridge(body)


def answer_through_every_bridge(body: bytes) -> None:
    for bridge in every_processed_route():
        for status, stream in ((200, False), (200, True), (400, False)):
            attempt = BridgeAttempt(bridge, stream=stream)
            response_headers(attempt, {":status": str(status)})
            rewrite = response_body(attempt, body, lambda: 0.0)
            if rewrite.body is not None and dict(rewrite.set_headers).get(":status"):
                caller_shaped(rewrite.body, bridge.translator.caller)
