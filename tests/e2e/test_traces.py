"""OpenTelemetry spans through the real stack (issue #15): a request sent with a W3C
traceparent through real Envoy yields one span in that trace, exported over OTLP/HTTP to a
collector (the test's own, reading OTLP's JSON encoding), with the GenAI attributes of the
decision and its outcome, and without any prompt text."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "traces-caller-token"
PROMPT = f"CANARY-TRACE-PROMPT-{uuid.uuid4().hex}"
TRACE = uuid.uuid4().hex
CONFIG = """\
providers:
  good: {{base_url: '{good}', credential: {{env: KEY_GOOD}}}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry:
  sqlite_path: '{db}'
  traces: {{otlp_endpoint: 'http://127.0.0.1:{collector}/v1/traces', service_name: e2e}}
models:
  chat:
    targets:
      - {{provider: good, model_ref: good-model}}
"""


class Collector(ThreadingHTTPServer):
    """Receives OTLP/HTTP JSON exports on loopback and keeps the raw bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if (self.path == "/v1/traces"
                        and self.headers["content-type"] == "application/json"):
                    collector.bodies.append(body)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def spans(self) -> list:
        found = []
        for body in self.bodies:
            for resource in json.loads(body)["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    found.extend((resource["resource"], span) for span in scope["spans"])
        return found


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_span_in_the_callers_trace_with_genai_attributes(
        tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
    fakes = [FakeProvider("good", api_key="key-good")]
    with keyed_stack(tmp_path, fakes, lambda providers: CONFIG.format(
            db=tmp_path / "t.db", collector=collector.server_address[1],
            digest=hashlib.sha256(TOKEN.encode()).hexdigest(), good=providers.base_url("good")),
            {"good": "key-good"}) as (up, _):
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": PROMPT}],
            extra_headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
        deadline = time.monotonic() + 30
        while not collector.spans() and time.monotonic() < deadline:
            time.sleep(0.05)
    (resource, span), = collector.spans()
    assert span["traceId"] == TRACE and span["parentSpanId"] == "00f067aa0ba902b7"
    assert span["kind"] == 3  # CLIENT
    attributes = {a["key"]: a["value"] for a in span["attributes"]}
    assert attributes["gen_ai.request.model"] == {"stringValue": "chat"}
    assert attributes["gen_ai.response.model"] == {"stringValue": "good-model"}
    assert attributes["gen_ai.provider.name"] == {"stringValue": "good"}
    assert attributes["gen_ai.usage.input_tokens"] == {"intValue": str(reply.usage.prompt_tokens)}
    assert attributes["gen_ai.usage.output_tokens"] == {
        "intValue": str(reply.usage.completion_tokens)}
    assert attributes["http.response.status_code"] == {"intValue": "200"}
    assert {a["key"]: a["value"]["stringValue"] for a in resource["attributes"]
            if "stringValue" in a["value"]}["service.name"] == "e2e"
    assert int(span["endTimeUnixNano"]) > int(span["startTimeUnixNano"])
    for body in collector.bodies:
        assert PROMPT.encode() not in body and TOKEN.encode() not in body
