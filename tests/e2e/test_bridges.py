"""Dialect bridges through real Envoy (issue #16, first slice): the official OpenAI SDK
reaches an Anthropic-only group and the Anthropic SDK an OpenAI-only group, unary and
streamed; the provider receives its own API, with its own key, and the caller gets its
own; a request a bridge cannot carry is refused by name; native traffic is unchanged."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack import provider_wire
from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "bridge-caller-token"
KEYS = {"claude": "key-claude", "gpt": "key-gpt", "resp": "key-resp"}
CONFIG = """\
providers:
  claude: {{base_url: '{claude}', credential: {{env: KEY_CLAUDE}},
            dialects: [anthropic_messages]}}
  gpt: {{base_url: '{gpt}', credential: {{env: KEY_GPT}}}}
  resp: {{base_url: '{resp}', credential: {{env: KEY_RESP}}, dialects: [openai_responses]}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}'}}
models:
  claude-only:
    bridges: true
    targets: [{{provider: claude, model_ref: claude-model}}]
  gpt-only:
    bridges: true
    targets: [{{provider: gpt, model_ref: gpt-model}}]
  claude-native:
    targets: [{{provider: claude, model_ref: claude-model}}]
  responses-native:
    targets: [{{provider: resp, model_ref: resp-model}}]
  responses-pair:
    strategy: failover
    targets:
      - {{provider: resp, model_ref: resp-plain}}
      - {{provider: resp, model_ref: resp-json, supports_structured_output: true}}
  claude-json:
    bridges: true
    targets:
      - {{provider: claude, model_ref: claude-model, supports_structured_output: true}}
  claude-first:
    strategy: failover
    bridges: true
    targets:
      - {{provider: claude, model_ref: claude-model}}
      - {{provider: gpt, model_ref: gpt-model}}
  gpt-first:
    strategy: failover
    bridges: true
    targets:
      - {{provider: gpt, model_ref: gpt-model}}
      - {{provider: claude, model_ref: claude-model}}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, ProviderThread]]:
    workdir: Path = tmp_path_factory.mktemp("bridges")
    fakes = [FakeProvider(name, api_key=key) for name, key in KEYS.items()]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            claude=providers.base_url("claude"), gpt=providers.base_url("gpt"),
            resp=providers.base_url("resp"), db=workdir / "telemetry.db",
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()), KEYS) as running:
        yield running


def test_the_openai_sdk_reaches_an_anthropic_only_group(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    reply = client.chat.completions.create(
        model="claude-only", max_tokens=40,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "hello over the bridge"}])
    assert reply.object == "chat.completion" and reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens > 0
    received = providers.provider("claude").received[-1]
    assert received.path.endswith("/messages")
    upstream = received.json()
    assert upstream["model"] == "claude-model" and upstream["system"] == "be brief"
    assert upstream["max_tokens"] == 40 and upstream["stream"] is False
    assert received.headers.get("x-api-key") == KEYS["claude"]
    assert "anthropic-version" in received.headers


def test_the_openai_sdk_streams_from_an_anthropic_only_group(stack) -> None:
    up, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    chunks = list(client.chat.completions.create(
        model="claude-only", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream over the bridge"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_anthropic_sdk_reaches_an_openai_only_group(stack) -> None:
    up, providers = stack
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
    message = client.messages.create(model="gpt-only", max_tokens=30,
                                     system="be brief",
                                     messages=[{"role": "user", "content": "hello"}])
    assert message.type == "message" and message.content[0].text
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0
    received = providers.provider("gpt").received[-1]
    assert received.path.endswith("/chat/completions")
    upstream = received.json()
    assert upstream["messages"][0] == {"role": "system", "content": "be brief"}
    assert received.headers.get("authorization") == f"Bearer {KEYS['gpt']}"
    with client.messages.stream(model="gpt-only", max_tokens=30,
                                messages=[{"role": "user", "content": "stream"}]) as stream:
        final = stream.get_final_message()
    assert final.content[0].text and final.usage.output_tokens > 0


def test_what_cannot_cross_is_refused_by_name_and_native_groups_stay_native(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    before = len(providers.provider("claude").received)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude-only", n=2,
                                       messages=[{"role": "user", "content": "x"}])
    assert "cannot be bridged" in refused.value.message and "n:" in refused.value.message
    with pytest.raises(openai.BadRequestError) as native:
        client.chat.completions.create(model="claude-native",
                                       messages=[{"role": "user", "content": "x"}])
    assert "none speaks the openai_chat API" in native.value.message
    assert len(providers.provider("claude").received) == before


@pytest.mark.parametrize(("group", "failing", "serving", "path"), [
    ("claude-first", "claude", "gpt", "/chat/completions"),   # bridged, then native
    ("gpt-first", "gpt", "claude", "/messages"),              # native, then bridged
])
def test_a_fallback_crosses_dialects_before_the_answer_starts(
        stack, group: str, failing: str, serving: str, path: str) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    providers.provider(failing).behaviour = Behaviour(status=503)
    try:
        before = len(providers.provider(serving).received)
        reply = client.chat.completions.create(
            model=group, messages=[{"role": "user", "content": "fall over"}])
    finally:
        providers.provider(failing).behaviour = Behaviour()
    assert reply.object == "chat.completion" and reply.choices[0].message.content
    received = list(providers.provider(serving).received)[before:]
    assert len(received) == 1 and received[0].path.endswith(path)
    assert received[0].json()["model"] == f"{serving}-model"
    key_header = "x-api-key" if serving == "claude" else "authorization"
    assert KEYS[serving] in received[0].headers[key_header]
    assert KEYS[failing] not in str(received[0].headers)


WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}
CLAUDE_WEATHER = {"name": "weather", "description": "Current weather",
                  "input_schema": WEATHER["function"]["parameters"]}


@pytest.fixture
def tools_on(stack) -> Iterator[None]:
    _, providers = stack
    for name in KEYS:
        providers.provider(name).behaviour = Behaviour(call_tools=True)
    yield
    for name in KEYS:
        providers.provider(name).behaviour = Behaviour()


def test_tool_calls_cross_the_bridge_and_their_results_come_back(stack, tools_on) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    ask = [{"role": "user", "content": "weather in Oslo?"}]
    reply = client.chat.completions.create(model="claude-only", messages=ask, tools=[WEATHER],
                                           tool_choice="required")
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "weather", {"city": "Oslo", "days": 2})
    upstream = providers.provider("claude").received[-1].json()
    assert upstream["tool_choice"] == {"type": "any"}
    assert upstream["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]
    follow_up = [*ask, reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "3 °C"}]
    answer = client.chat.completions.create(model="claude-only", messages=follow_up,
                                            tools=[WEATHER])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    turns = providers.provider("claude").received[-1].json()["messages"]
    assert turns[1]["content"][-1] == {"type": "tool_use", "id": call.id, "name": "weather",
                                       "input": {"city": "Oslo", "days": 2}}
    assert turns[2]["content"][0] == {"type": "tool_result", "tool_use_id": call.id,
                                      "content": "3 °C"}
    with client.chat.completions.stream(model="claude-only", messages=ask,
                                        tools=[WEATHER]) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "weather"


def test_the_anthropic_sdk_gets_tool_use_from_an_openai_target(stack, tools_on) -> None:
    up, providers = stack
    client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0)
    message = client.messages.create(model="gpt-only", max_tokens=50, tools=[CLAUDE_WEATHER],
                                     messages=[{"role": "user", "content": "weather?"}])
    tool = message.content[-1]
    assert message.stop_reason == "tool_use" and tool.type == "tool_use"
    assert (tool.name, tool.input) == ("weather", {"city": "Oslo", "days": 2})
    upstream = providers.provider("gpt").received[-1].json()
    assert upstream["tools"][0]["function"]["name"] == "weather"
    with client.messages.stream(model="gpt-only", max_tokens=50, tools=[CLAUDE_WEATHER],
                                messages=[{"role": "user", "content": "weather?"}]) as stream:
        final = stream.get_final_message()
    assert final.content[-1].input == {"city": "Oslo", "days": 2}


@pytest.mark.parametrize("dialect", ["openai_chat", "anthropic_messages"])
def test_native_tool_call_streams_pass_through_byte_for_byte(stack, tools_on, dialect) -> None:
    """The demo provider's own tool-call deltas reach the caller unchanged."""
    up, providers = stack
    if dialect == "openai_chat":
        group, name, path = "gpt-only", "gpt", "/v1/chat/completions"
        body = {"model": group, "stream": True, "messages": [{"role": "user", "content": "w"}],
                "tools": [WEATHER]}
        headers = {"authorization": f"Bearer {TOKEN}"}
    else:
        group, name, path = "claude-native", "claude", "/v1/messages"
        body = {"model": group, "stream": True, "max_tokens": 50, "tools": [CLAUDE_WEATHER],
                "messages": [{"role": "user", "content": "w"}]}
        headers = {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"}
    with httpx.Client(timeout=10) as http:
        got = http.post(up.base_url + path, json=body, headers=headers)
    assert got.status_code == 200
    received = providers.provider(name).received[-1]
    first = json.loads(got.text.split("data: ", 1)[1].split("\n", 1)[0])
    request_id = first["id"] if dialect == "openai_chat" else first["message"]["id"]
    completion = provider_wire.make_completion(request_id, name, received.json(),
                                               len(received.body), None, call_tools=True)
    events = (provider_wire.openai_events(completion, include_usage=False)
              if dialect == "openai_chat" else provider_wire.anthropic_events(completion))
    assert got.content == b"".join(events)


def test_a_json_schema_crosses_the_bridge_and_json_mode_is_refused(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    client.chat.completions.create(
        model="claude-json", messages=[{"role": "user", "content": "a city"}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    upstream = providers.provider("claude").received[-1].json()
    assert upstream["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="claude-json",
                                       messages=[{"role": "user", "content": "a city"}],
                                       response_format={"type": "json_object"})
    assert "JSON mode" in refused.value.message


@pytest.mark.parametrize(("group", "provider", "path"), [
    ("gpt-only", "gpt", "/chat/completions"), ("claude-only", "claude", "/messages")])
def test_responses_callers_reach_chat_and_messages_targets(stack, group, provider,
                                                           path) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    answer = client.responses.create(model=group, instructions="be brief",
                                     input="hello from the Responses API")
    assert answer.object == "response" and answer.output_text
    assert answer.usage.output_tokens > 0
    received = providers.provider(provider).received[-1]
    assert received.path.endswith(path) and received.json()["stream"] is False
    with client.responses.stream(model=group, input="stream it") as stream:
        final = stream.get_final_response()
    assert final.output_text and final.status == "completed"


def test_a_stateful_responses_request_cannot_cross_a_bridge(stack) -> None:
    up, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-only", input="again",
                                previous_response_id="resp_123")
    assert "previous_response_id" in refused.value.message


def test_responses_requests_go_upstream_unary_and_streams_are_synthesized(stack) -> None:
    """SPEC (Streaming): OpenAI Responses keep unary upstream behaviour; a caller's stream
    is synthesized from the answer, and stored-response ids travel unchanged."""
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    with client.responses.stream(model="responses-native", input="stream me") as stream:
        final = stream.get_final_response()
    assert final.output_text.startswith("Hello from resp serving resp-model")
    received = providers.provider("resp").received[-1]
    assert received.path.endswith("/v1/responses") and received.json()["stream"] is False
    assert received.headers.get("authorization") == f"Bearer {KEYS['resp']}"
    follow = client.responses.create(model="responses-native", input="and then?",
                                     previous_response_id=final.id)
    assert follow.output_text
    assert providers.provider("resp").received[-1].json()["previous_response_id"] == final.id


def test_a_three_turn_stateful_session_threads_previous_response_id(stack) -> None:
    """A Chat caller opts into a session with `x-session-id`; each turn goes to the same
    Responses target, carrying the previous turn's response id and only the new turns."""
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0,
                           default_headers={"x-session-id": "session-one"})
    history = [{"role": "system", "content": "be brief"}]
    seen: list[dict] = []
    for turn in ("first", "second", "third"):
        history.append({"role": "user", "content": f"{turn} turn"})
        stream = turn == "third"
        if stream:
            chunks = list(client.chat.completions.create(model="responses-native",
                                                         messages=history, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = client.chat.completions.create(model="responses-native", messages=history)
            assert reply.object == "chat.completion"
            text = reply.choices[0].message.content
        assert text.startswith("Hello from resp")
        history.append({"role": "assistant", "content": text})
        seen.append(providers.provider("resp").received[-1].json())
    first, second, third = seen
    assert "previous_response_id" not in first and first["instructions"] == "be brief"
    assert second["previous_response_id"].startswith("resp_")
    assert third["previous_response_id"].startswith("resp_")
    assert third["previous_response_id"] != second["previous_response_id"]
    assert second["input"] == [{"role": "user", "content": "second turn"}]  # only the new turn
    # Another caller's identical session id is another session; a bad id is refused.
    other = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0,
                          default_headers={"x-session-id": "session-two"})
    other.chat.completions.create(model="responses-native",
                                  messages=[{"role": "user", "content": "hi"}])
    assert "previous_response_id" not in providers.provider("resp").received[-1].json()
    bad = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0,
                        default_headers={"x-session-id": "x" * 500})
    with pytest.raises(openai.BadRequestError):
        bad.chat.completions.create(model="responses-native",
                                    messages=[{"role": "user", "content": "hi"}])


def test_a_session_whose_target_became_ineligible_fails_clearly(stack) -> None:
    up, providers = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0,
                           default_headers={"x-session-id": "session-gone"})
    history = [{"role": "user", "content": "hello"}]
    reply = client.chat.completions.create(model="responses-pair", messages=history)
    assert providers.provider("resp").received[-1].json()["model"] == "resp-plain"
    history += [{"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "now as JSON"}]
    before = len(providers.provider("resp").received)
    # The pinned target declares no structured output: for this turn only the other one is
    # eligible, and a session never moves.
    with pytest.raises(openai.ConflictError) as conflict:
        client.chat.completions.create(model="responses-pair", messages=history,
                                       response_format={"type": "json_object"})
    assert "start a new session" in conflict.value.message
    assert len(providers.provider("resp").received) == before


def test_bridged_requests_are_observed_and_joined_on_their_target(stack) -> None:
    """Telemetry and observations see a bridged request as its target's: the serving
    target, attempts and the usage the caller got (translated)."""
    import sqlite3
    import time

    up, _ = stack
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
    started = time.time()
    reply = client.chat.completions.create(model="claude-only",
                                           messages=[{"role": "user", "content": "count"}])
    db_path = next(Path(up.log_path).parent.glob("telemetry.db"))
    deadline = time.monotonic() + 30
    rows: list = []
    while time.monotonic() < deadline and not rows:
        with sqlite3.connect(db_path) as db:
            rows = db.execute(
                "SELECT serving_target, attempts, output_tokens, status FROM request_rows "
                "WHERE group_name = 'claude-only' AND started_at >= ?", (started,)).fetchall()
        time.sleep(0.05)
    assert rows == [("claude/claude-model", 1, reply.usage.completion_tokens, 200)]
    observed = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/observations").json()
    assert observed["targets"]["claude/claude-model"]["count"] >= 1
