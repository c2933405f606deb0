"""Graceful drain through real Envoy (issue #18): SIGTERM during a stream turns the gRPC
health to NOT_SERVING first, the stream still completes, and the stack stops once Envoy
has no request left — well within the drain period."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.devstack.harness import keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "drain-caller-token"
CONFIG = """\
providers:
  slow: {{base_url: '{slow}', credential: {{env: KEY_SLOW}}}}
callers: [{{name: team, token_sha256: {digest}}}]
models:
  chat:
    targets: [{{provider: slow, model_ref: slow-model}}]
"""


def health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2)
    return answer.status


def test_sigterm_during_a_stream_drains_it(tmp_path) -> None:
    words = " ".join(f"w{n}" for n in range(12))
    slow = FakeProvider("slow", api_key="key-slow",
                        behaviour=Behaviour(inter_event_delay_s=0.15, text=words))
    with keyed_stack(tmp_path, [slow], lambda providers: CONFIG.format(
            slow=providers.base_url("slow"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()),
            {"slow": "key-slow"}, "--drain-seconds", "20") as (up, _providers):
        assert up.process is not None
        assert health(up.ext_proc_port) == health_pb2.HealthCheckResponse.SERVING
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        received: list[str] = []
        first = threading.Event()
        failure: list[BaseException] = []

        def stream() -> None:
            try:
                for chunk in client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "hi"}],
                        stream=True):
                    if chunk.choices and chunk.choices[0].delta.content:
                        received.append(chunk.choices[0].delta.content)
                        first.set()
            except BaseException as exc:
                failure.append(exc)
                first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(10)
        signalled = time.monotonic()
        os.kill(up.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while health(up.ext_proc_port) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health never turned NOT_SERVING"
            time.sleep(0.02)
        assert reader.is_alive(), "the stream should still be running while health flips"
        reader.join(20)
        assert failure == []
        assert "".join(received).split() == words.split()
        code = up.process.wait(20)
        assert code == 0
        # It stopped once Envoy had nothing left: long before the 20 s drain period.
        assert time.monotonic() - signalled < 15
