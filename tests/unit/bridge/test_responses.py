"""OpenAI Responses callers (docs/dialects.md §11): requests to Chat (and through Chat to
Messages), answers back as Responses objects, and synthesized Responses streams that the
official SDK's own parser reads, function calls included."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from sidecar.bridge import Untranslatable
from sidecar.bridge.registry import translator_for
from sidecar.bridge.responses_to_chat import output_text, request, response
from sidecar.bridge.streams import responses_sse
from sidecar.dialects.apis import Dialect

AGENT = {
    "model": "agent-group",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "Weather in Oslo?"},
            {"type": "input_image", "image_url": "https://example.com/map.png"}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "3 °C"},
        {"role": "user", "content": "And tomorrow?"},
    ],
    "tools": [{"type": "function", "name": "weather", "description": "Now",
               "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "weather"},
    "max_output_tokens": 200,
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"},
                        "strict": True}},
    "store": False,
    "stream": True,
}
CHAT_ANSWER = {
    "id": "chatcmpl-9", "object": "chat.completion", "model": "gpt-x",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Checking.",
        "tool_calls": [{"id": "call_2", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Oslo", "day": 2}'}}]}}],
    "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57,
              "prompt_tokens_details": {"cached_tokens": 10}}}


def test_a_responses_request_becomes_a_chat_request() -> None:
    out = request(AGENT)
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "tool",
                                                    "user"]
    assert out["messages"][1]["content"][1] == {
        "type": "image_url", "image_url": {"url": "https://example.com/map.png"}}
    assert out["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "3 °C"}
    assert out["tools"][0]["function"]["name"] == "weather"
    assert out["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert out["max_tokens"] == 200 and out["reasoning_effort"] == "low"
    assert out["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "w", "schema": {"type": "object"}, "strict": True}}
    assert out["stream"] is False and "store" not in out


def test_through_chat_a_responses_request_reaches_messages() -> None:
    bridge = translator_for(Dialect.OPENAI_RESPONSES, Dialect.ANTHROPIC_MESSAGES)
    assert bridge is not None
    out = bridge.request({**AGENT, "text": None, "reasoning": None, "tool_choice": "auto"})
    assert out["system"] == "Be brief." and out["max_tokens"] == 200
    assert out["messages"][-1]["content"][-1] == {"type": "text", "text": "And tomorrow?"}
    answer = bridge.response({"id": "msg_1", "content": [{"type": "text", "text": "Hi"}],
                              "stop_reason": "end_turn",
                              "usage": {"input_tokens": 3, "output_tokens": 1}},
                             "agent-group", lambda: 1.0)
    assert answer["object"] == "response" and output_text(answer) == "Hi"


@pytest.mark.parametrize(("change", "field"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"background": True}, "background"),
])
def test_what_chat_cannot_hold_is_named(change: dict, field: str) -> None:
    with pytest.raises(Untranslatable) as raised:
        request({"model": "g", "input": "hi"} | change)
    assert raised.value.field == field


def test_a_chat_answer_becomes_a_responses_object() -> None:
    out = response(CHAT_ANSWER, "agent-group", lambda: 1_767_225_600.0)
    assert out["object"] == "response" and out["status"] == "completed"
    message, call = out["output"]
    assert message["content"][0]["text"] == "Checking."
    assert (call["type"], call["call_id"], call["name"]) == ("function_call", "call_2",
                                                             "weather")
    assert out["usage"]["input_tokens_details"] == {"cached_tokens": 10}
    cut = response({**CHAT_ANSWER, "choices": [{**CHAT_ANSWER["choices"][0],
                                                "finish_reason": "length"}]}, "g", lambda: 0)
    assert cut["status"] == "incomplete"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    body = responses_sse(response(CHAT_ANSWER, "agent-group", lambda: 5.0))
    unary = __import__("json").dumps(response(CHAT_ANSWER, "agent-group", lambda: 5.0)).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sent = self.rfile.read(int(self.headers["content-length"]))
            streaming = b'"stream":true' in sent.replace(b" ", b"")
            payload = body if streaming else unary
            self.send_response(200)
            self.send_header("content-type",
                             "text/event-stream" if streaming else "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_the_openai_sdk_reads_the_answer_and_the_synthesized_stream(server: str) -> None:
    client = openai.OpenAI(base_url=server, api_key="x", max_retries=0)
    unary = client.responses.create(model="agent-group", input="hi")
    assert unary.output_text == "Checking." and unary.output[1].name == "weather"
    events = list(client.responses.create(model="agent-group", input="hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "Checking."
    with client.responses.stream(model="agent-group", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Checking."
    call = final.output[1]
    assert (call.name, call.arguments) == ("weather", '{"city": "Oslo", "day": 2}')
