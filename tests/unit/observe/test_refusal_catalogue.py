"""The refusal catalogue: every entry is recognised as itself by the Python reader, and the
hold's Lua (run here in a Lua interpreter, `lupa`) gives the same answer on every entry in
compact and spaced JSON, and on replies no entry knows."""

from __future__ import annotations

import json
import re

import pytest
from lupa import LuaRuntime

from sidecar.envoy_config.refusal_lua import refusal_chunk
from sidecar.observe.refusal_catalogue import CATALOGUE, Refusal, Verdict
from sidecar.observe.refusals import (
    is_context_refusal,
    refusal_of,
    unrecognised_mark,
)

PROVIDERS = {"openai", "anthropic", "vllm", "sglang", "tgi", "llama.cpp", "gemini", "bedrock",
             "mistral", "groq", "together", "deepseek", "ollama"}


@pytest.fixture(scope="module")
def lua() -> LuaRuntime:
    runtime = LuaRuntime(unpack_returned_tuples=True)
    runtime.execute(refusal_chunk())
    return runtime


def lua_verdict(lua: LuaRuntime, status: int, body: bytes) -> str | None:
    # The hold lower-cases what it reads (upstream_errors.py).
    return lua.globals().refusal_verdict(str(status), body.decode().lower())


def python_verdict(status: int, body: bytes) -> str | None:
    entry = refusal_of(status, body)
    return entry.verdict.value if entry is not None else None


def ids(entry: Refusal) -> str:
    return f"{entry.provider}-{entry.status}-{entry.verdict.value}"


def test_the_catalogue_covers_the_providers_named_and_every_entry_names_its_source() -> None:
    assert {entry.provider for entry in CATALOGUE
            if entry.verdict is Verdict.NEXT_TARGET} == PROVIDERS
    for entry in CATALOGUE:
        assert len(entry.source) > 20
        assert entry.error_type or entry.error_code or entry.phrase


def test_phrases_and_tokens_are_what_no_json_writer_escapes() -> None:
    for entry in CATALOGUE:
        for value in (entry.phrase or "", entry.error_type or "", entry.error_code or ""):
            assert value.isascii() and not set(value) & set("\"\\/<>&'")
        for value in (entry.error_type or "", entry.error_code or ""):
            assert re.fullmatch(r"[A-Za-z0-9_.-]*", value)


@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize("entry", CATALOGUE, ids=ids)
def test_every_entry_is_itself_to_python_and_to_the_lua(lua: LuaRuntime, entry: Refusal,
                                                        spaced: bool) -> None:
    body = entry.example_bytes(spaced)
    matched = refusal_of(entry.status, body)
    # Several providers send the same thing (Groq answers as OpenAI does): any entry that
    # names it gives the same verdict.
    assert matched is not None and matched.verdict is entry.verdict
    assert lua_verdict(lua, entry.status, body) == entry.verdict.value
    assert is_context_refusal(entry.status, body) == (entry.verdict is Verdict.NEXT_TARGET)


@pytest.mark.parametrize("entry", CATALOGUE, ids=ids)
def test_an_entry_under_another_status_is_no_refusal_to_either(lua: LuaRuntime,
                                                               entry: Refusal) -> None:
    for status in (200, 429, 500, 404):
        body = entry.example_bytes()
        assert python_verdict(status, body) is None
        assert lua_verdict(lua, status, body) is None


UNKNOWN = [
    (400, {"error": {"message": "Something new", "type": "brand_new_error", "code": "x1"}}),
    (400, {"object": "error", "message": "Some engine's new wording", "type": "Mystery",
           "code": 400}),
    (400, [{"error": {"code": 400, "message": "Unknown", "status": "FAILED_PRECONDITION"}}]),
    (422, {"error": "Input validation error: something else", "error_type": "weird"}),
    (400, {"detail": "not an error object at all"}),
]


@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize(("status", "payload"), UNKNOWN)
def test_replies_no_entry_knows_are_unrecognised_to_both_and_named_alike(
        lua: LuaRuntime, status: int, payload: object, spaced: bool) -> None:
    separators = (", ", ": ") if spaced else (",", ":")
    body = json.dumps(payload, separators=separators).encode()
    assert python_verdict(status, body) is None
    assert lua_verdict(lua, status, body) is None
    mark = unrecognised_mark(status, body)
    assert mark == lua.globals().unrecognised_mark(body.decode().lower())


def test_the_mark_names_type_and_code_never_the_message() -> None:
    body = json.dumps({"error": {"message": "secret prompt text", "type": "new_error",
                                 "code": "c 1\n<x>"}}).encode()
    assert unrecognised_mark(400, body) == "type=new_error;code=c1x"
    assert unrecognised_mark(400, b"<html>bad gateway</html>") == "type=;code="
    assert unrecognised_mark(200, body) is None
    assert unrecognised_mark(400, CATALOGUE[0].example_bytes()) is None


def test_llama_cpp_exceed_context_size_is_a_context_refusal() -> None:
    """Issue 40, observation 2: what a real llama-server sent."""
    body = (b'{"error":{"code":400,"type":"exceed_context_size_error","message":"request '
            b'(1222 tokens) exceeds the available context size (256 tokens), try increasing '
            b'it"}}')
    assert is_context_refusal(400, body)


def test_a_body_that_is_not_json_is_no_refusal_to_either(lua: LuaRuntime) -> None:
    body = b"maximum context length, said the HTML page"
    assert python_verdict(400, body) is None
    assert lua_verdict(lua, 400, body) is None


def test_ollamas_refusal_is_known_in_both_of_its_envelopes() -> None:
    """Issue 40: Ollama refuses a prompt over `num_ctx` only where it cannot shift its
    context; its OpenAI-compatible and native bodies are both context refusals (as JSON,
    compact and spaced), and a 200 it answers after truncating has nothing to match."""
    from sidecar.observe.refusals import is_context_refusal
    entries = [entry for entry in CATALOGUE if entry.provider == "ollama"]
    assert len(entries) == 2
    for entry in entries:
        for spaced in (False, True):
            assert is_context_refusal(400, entry.example_bytes(spaced))


def test_llama_servers_refusal_relayed_by_ollama_is_still_a_context_refusal() -> None:
    """With a caller's `truncate: false` Ollama relays llama-server's 400 body as the text
    of its own message (llm/llama_server.go, statusErrorMessage)."""
    from sidecar.observe.refusals import is_context_refusal
    inner = json.dumps({"error": {"code": 400, "type": "exceed_context_size_error",
                                  "message": "request (1222 tokens) exceeds the available "
                                             "context size (256 tokens), try increasing it"}})
    for body in ({"error": {"message": inner, "type": "invalid_request_error", "param": None,
                            "code": None}}, {"error": inner}):
        assert is_context_refusal(400, json.dumps(body).encode())
