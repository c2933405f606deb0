"""Synthesized streams (docs/dialects.md §6), read by the official SDKs: each SDK's own
stream parser must rebuild the translated answer, tool calls and usage included. The bytes
are served by a loopback HTTP server of the test's own (no Envoy here: the end-to-end tests
come with the Envoy wiring)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest

from sidecar.bridge import chat_to_messages, messages_to_chat
from sidecar.bridge.streams import chat_sse, messages_sse

ANTHROPIC_ANSWER = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "text", "text": "Checking the weather."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather",
                 "input": {"city": "Oslo", "days": 2}}],
    "stop_reason": "tool_use",
    "usage": {"input_tokens": 40, "output_tokens": 12, "cache_read_input_tokens": 8}}
OPENAI_ANSWER = {
    "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-x", "created": 1,
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "On it.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Bergen"}'}}]}}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    bodies = {
        "/v1/chat/completions": chat_sse(
            chat_to_messages.response(ANTHROPIC_ANSWER, "agent-group", lambda: 7.0),
            include_usage=True),
        "/v1/messages": messages_sse(messages_to_chat.response(OPENAI_ANSWER, "agent-group")),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            body = bodies[self.path]
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_openai_sdk_reads_a_synthesized_chat_stream(server: str) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="agent-group", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Checking the weather."
    calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id == "toolu_1" and calls[0].function.name == "weather"
    assert "".join(d.function.arguments or "" for d in calls) == '{"city": "Oslo", "days": 2}'
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    assert chunks[-1].usage.prompt_tokens == 48 and chunks[-1].usage.completion_tokens == 12
    assert {c.model for c in chunks} == {"agent-group"}


def test_the_openai_sdk_stream_helper_rebuilds_the_tool_call(server: str) -> None:
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    with client.chat.completions.stream(
            model="agent-group", messages=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == (
        "weather", '{"city": "Oslo", "days": 2}')


def test_the_anthropic_sdk_reads_a_synthesized_messages_stream(server: str) -> None:
    client = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)
    with client.messages.stream(model="agent-group", max_tokens=50,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_message()
    text, tool = final.content
    assert text.text == "On it."
    assert (tool.type, tool.id, tool.name, tool.input) == (
        "tool_use", "call_1", "weather", {"city": "Bergen"})
    assert final.stop_reason == "tool_use" and final.model == "agent-group"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (30, 9)


def test_without_include_usage_there_is_no_usage_chunk_and_done_ends_it() -> None:
    completion = chat_to_messages.response(
        {"id": "m", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"},
        "g", lambda: 0.0)
    events = chat_sse(completion, include_usage=False).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all('"usage"' not in e for e in events)
    assert '"finish_reason":"stop"' in events[-3]
