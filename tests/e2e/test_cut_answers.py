"""Cut answers through real Envoy (issue 40), with the official anthropic SDK as the caller:

- A bridged tool call cut by `max_tokens` (a Chat engine answering `finish_reason:
  "length"` with its arguments cut mid-JSON) reaches the caller as a 200 with
  `stop_reason: "max_tokens"`, after exactly one generation, and counts no error against
  the target.
- An Anthropic stream cut before its final `message_delta` (the caller closes it, or the
  engine dies) is charged by estimate: `usage_source: estimated`, the output budget as
  its output, never 0 or NULL, as an OpenAI stream cut before its usage is.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.provider_behaviours import behaviour
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "cut-caller-token"
KEYS = {"engine": "key-engine", "claude": "key-claude"}
CONFIG = """\
providers:
  engine: {{base_url: '{engine}', credential: {{env: KEY_ENGINE}}}}
  claude: {{base_url: '{claude}', credential: {{env: KEY_CLAUDE}},
            dialects: [anthropic_messages]}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  chat-engine:
    bridges: true
    targets: [{{provider: engine, model_ref: engine-model}}]
  claude-bridged:
    bridges: true
    targets: [{{provider: claude, model_ref: claude-model}}]
  chat-native:
    targets:
      - provider: engine
        model_ref: engine-stream-model  # its own window: this one's resets are its own
        pricing: {{input_per_mtok: 1, output_per_mtok: 4}}
  claude-native:
    targets:
      - provider: claude
        model_ref: claude-model
        pricing: {{input_per_mtok: 2, output_per_mtok: 8}}
"""
WEATHER = {"name": "weather", "description": "Current weather",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "days": {"type": "integer"}}}}
CAP = 20  # a token a character of the call's arguments: cut after `{"city": "Oslo", `
BIG_CAP = 4096  # a cut stream is charged by what was relayed, far below this


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[UpProcess, ProviderThread, Path]]:
    workdir = tmp_path_factory.mktemp("cut")
    db = workdir / "telemetry.db"
    fakes = [FakeProvider(name, api_key=key) for name, key in KEYS.items()]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            engine=providers.base_url("engine"), claude=providers.base_url("claude"), db=db,
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS) as (up, providers):
        yield up, providers, db


def _client(up: UpProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)


def _observed(up: UpProcess, target: str, count: int) -> dict:
    deadline = time.monotonic() + 30
    while True:
        figures = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/observations",
                            timeout=5).json()["targets"].get(target, {})
        if figures.get("count", 0) >= count or time.monotonic() > deadline:
            return figures
        time.sleep(0.05)


def _row(db: Path, group: str, since: float) -> dict:
    deadline = time.monotonic() + 30
    while True:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            found = [dict(r) for r in conn.execute(
                "SELECT * FROM request_rows WHERE group_name = ? AND started_at >= ?",
                (group, since))]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.05)


def test_a_bridged_tool_call_cut_by_max_tokens_is_a_max_tokens_stop(stack) -> None:
    up, providers, _ = stack
    engine = providers.provider("engine")
    engine.behaviour = behaviour("openai_tool_call_cut_by_max_tokens")
    before = len(engine.received)
    try:
        client = _client(up)
        message = client.messages.create(
            model="chat-engine", max_tokens=CAP, tools=[WEATHER],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "weather in Oslo?"}])
        assert message.stop_reason == "max_tokens"
        text, tool = message.content
        assert text.type == "text" and tool.type == "tool_use"
        # The members complete before the cut (sidecar/bridge/cut_arguments.py).
        assert (tool.name, tool.input) == ("weather", {"city": "Oslo"})
        assert message.usage.output_tokens == CAP
        with client.messages.stream(
                model="chat-engine", max_tokens=CAP, tools=[WEATHER],
                tool_choice={"type": "any"},
                messages=[{"role": "user", "content": "weather in Oslo?"}]) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "max_tokens"
        assert final.content[-1].input == {"city": "Oslo"}
    finally:
        engine.behaviour = Behaviour()
    sent = list(engine.received)[before:]
    assert len(sent) == 2  # one generation each: no retry, no fallback
    assert all(r.json()["tool_choice"] == "required" and r.json()["max_tokens"] == CAP
               for r in sent)
    figures = _observed(up, "engine/engine-model", 2)
    assert figures["count"] >= 2 and figures["error_rate"] == 0, figures


CHAT_WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": WEATHER["input_schema"]}}
RESPONSES_WEATHER = {"type": "function", "name": "weather",
                     "parameters": WEATHER["input_schema"]}


def test_every_other_direction_carries_a_cut_tool_call_as_its_own_max_tokens_stop(
        stack) -> None:
    """Chat caller ← Messages target, Responses caller ← Chat target (Chat caller ←
    Responses target is a unit test: the fake Responses API is unary text only)."""
    up, providers, _ = stack
    engine, claude = providers.provider("engine"), providers.provider("claude")
    engine.behaviour = behaviour("openai_tool_call_cut_by_max_tokens")
    claude.behaviour = Behaviour(call_tools=True, cut_tool_calls=True)
    sent_before = len(engine.received) + len(claude.received)
    try:
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        chat = client.chat.completions.create(
            model="claude-bridged", max_tokens=CAP, tools=[CHAT_WEATHER],
            tool_choice="required", messages=[{"role": "user", "content": "weather?"}])
        assert chat.choices[0].finish_reason == "length"
        call = chat.choices[0].message.tool_calls[0]
        assert call.function.name == "weather"
        assert json.loads(call.function.arguments) == {"city": "Oslo"}
        answer = client.responses.create(model="chat-engine", max_output_tokens=CAP,
                                         tools=[RESPONSES_WEATHER], tool_choice="required",
                                         input="weather?")
        assert answer.status == "incomplete"
        assert answer.incomplete_details.reason == "max_output_tokens"
        item = answer.output[-1]
        assert (item.type, item.arguments, item.status) == (
            "function_call", '{"city": "Oslo", ', "incomplete")
        with client.responses.stream(model="chat-engine", max_output_tokens=CAP,
                                     tools=[RESPONSES_WEATHER], tool_choice="required",
                                     input="weather?") as stream:
            kinds = [event.type for event in stream]
        assert kinds[-1] == "response.incomplete"
    finally:
        engine.behaviour = claude.behaviour = Behaviour()
    assert len(engine.received) + len(claude.received) == sent_before + 3
    for target in ("engine/engine-model", "claude/claude-model"):
        assert _observed(up, target, 1)["error_rate"] == 0


@pytest.mark.parametrize("cut", ["caller_closes", "engine_dies"])
def test_an_anthropic_stream_cut_before_its_usage_is_charged_by_estimate(stack,
                                                                         cut: str) -> None:
    up, providers, db = stack
    claude = providers.provider("claude")
    # Events 200 ms apart: the caller has `message_start` and some text long before the
    # final `message_delta` (which, with the engine dying after 4 events, never comes).
    claude.behaviour = Behaviour(inter_event_delay_s=0.2,
                                 fail_after_events=4 if cut == "engine_dies" else None)
    started = time.time()
    try:
        with _client(up).messages.stream(
                model="claude-native", max_tokens=BIG_CAP,
                messages=[{"role": "user", "content": "a long story"}]) as stream:
            received = []
            try:
                for event in stream:
                    received.append(event.type)
                    if cut == "caller_closes" and event.type == "content_block_delta":
                        break  # leaving the block closes the response
            except (anthropic.APIError, httpx.HTTPError):
                assert cut == "engine_dies"
    finally:
        claude.behaviour = Behaviour()
    assert received[0] == "message_start" and "message_delta" not in received
    row = _row(db, "claude-native", started)
    assert row["status"] == 200 and row["serving_target"] == "claude/claude-model"
    assert row["usage_source"] == "estimated", row
    # The input as `message_start` reported it (the fake counts a token per 4 body bytes),
    # the output by what Envoy relayed (4 bytes a token), far below the caller's cap.
    reported_input = len(claude.received[-1].body) // 4
    assert row["input_tokens"] == reported_input
    assert 0 < row["output_tokens"] < BIG_CAP // 4, row
    assert row["cost_usd"] == pytest.approx((reported_input * 2 + row["output_tokens"] * 8) / 1e6)


@pytest.mark.parametrize("cut", ["caller_closes", "engine_dies"])
def test_an_openai_stream_cut_before_its_usage_is_charged_by_estimate_too(stack,
                                                                          cut: str) -> None:
    up, providers, db = stack
    engine = providers.provider("engine")
    engine.behaviour = Behaviour(inter_event_delay_s=0.2,
                                 fail_after_events=3 if cut == "engine_dies" else None)
    started = time.time()
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    try:
        with client.chat.completions.create(
                model="chat-native", max_tokens=BIG_CAP, stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "a long story"}]) as stream:
            try:
                for chunk in stream:
                    assert chunk.usage is None
                    if cut == "caller_closes" and chunk.choices and chunk.choices[0].delta.content:
                        break
            except (openai.APIError, httpx.HTTPError):
                assert cut == "engine_dies"
    finally:
        engine.behaviour = Behaviour()
    row = _row(db, "chat-native", started)
    assert row["status"] == 200 and row["usage_source"] == "estimated", row
    # Nothing was reported: the request's estimated input (12 characters), and the output by
    # what Envoy relayed (4 bytes a token), far below the caller's cap.
    assert row["input_tokens"] == 3 and 0 < row["output_tokens"] < BIG_CAP // 4, row
    assert row["cost_usd"] == pytest.approx((3 * 1 + row["output_tokens"] * 4) / 1e6)
