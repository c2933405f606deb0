"""Smoke test of the escape hatch: `sidecar up --grpc-server grpcio` (real Envoy, the
sidecar's handlers served by grpcio) routes both SDKs' requests, falls back after a 503,
learns observations from Envoy's access log, and still refuses callers without the channel
token."""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from collections.abc import Iterator

import anthropic
import grpc
import httpx
import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "escape-hatch-caller-token"
KEYS = {"first": "key-first-9a8b", "second": "key-second-7c6d", "claude": "key-claude-5e4f"}
CONFIG = """\
providers:
  first: {{base_url: '{first}', credential: {{env: KEY_FIRST}}}}
  second: {{base_url: '{second}', credential: {{env: KEY_SECOND}}}}
  claude: {{base_url: '{claude}', credential: {{env: KEY_CLAUDE}},
           dialects: [anthropic_messages]}}
callers: [{{name: team, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
models:
  pair:
    strategy: failover
    targets:
      - {{provider: first, model_ref: first-model}}
      - {{provider: second, model_ref: second-model}}
  claude-group:
    targets:
      - {{provider: claude, model_ref: claude-test-1}}
"""
# gRPC core announces this setting (GRPC_ALLOW_TRUE_BINARY_METADATA) in its first SETTINGS
# frame; the sidecar's own server does not: proof of which server holds the port.
GRPC_CORE_SETTING = 0xFE03


class Stack:
    def __init__(self, up: UpProcess, providers: ProviderThread) -> None:
        self.up = up
        self.providers = providers

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.up.base_url + "/v1", api_key=TOKEN, max_retries=0)

    def admin(self, path: str) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.up.admin_http_port}{path}", timeout=5).json()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    fakes = [FakeProvider(name, api_key=key) for name, key in KEYS.items()]
    with keyed_stack(tmp_path_factory.mktemp("grpcio"), fakes, lambda providers: CONFIG.format(
            first=providers.base_url("first"), second=providers.base_url("second"),
            claude=providers.base_url("claude"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()),
            KEYS, "--grpc-server", "grpcio") as (up, providers):
        yield Stack(up, providers)


@pytest.fixture
def fresh(stack: Stack) -> Stack:
    stack.providers.reset()
    return stack


def _server_settings(port: int) -> dict[int, int]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(9)[:3] + b"\x04" + bytes(5))
        head = b""
        while len(head) < 9:
            head += sock.recv(9 - len(head))
        length, kind = int.from_bytes(head[:3], "big"), head[3]
        assert kind == 4  # SETTINGS first
        payload = b""
        while len(payload) < length:
            payload += sock.recv(length - len(payload))
    return {key: value for key, value in
            (struct.unpack_from(">HI", payload, offset) for offset in range(0, length, 6))}


def test_the_port_is_served_by_grpcio(stack: Stack) -> None:
    assert GRPC_CORE_SETTING in _server_settings(stack.up.ext_proc_port)


def test_openai_sdk_chat_completion(fresh: Stack) -> None:
    reply = fresh.openai().chat.completions.create(
        model="pair", messages=[{"role": "user", "content": "Say hello"}])
    assert reply.model == "first-model"
    assert reply.choices[0].message.content
    (request,) = fresh.providers.provider("first").received
    assert request.json()["model"] == "first-model"
    assert request.headers["authorization"] == f"Bearer {KEYS['first']}"
    assert TOKEN not in repr(request.headers)


def test_openai_sdk_streamed_chat_completion(fresh: Stack) -> None:
    stream = fresh.openai().chat.completions.create(
        model="pair", messages=[{"role": "user", "content": "Say hello"}], stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert all(chunk.model == "first-model" for chunk in chunks)


def test_anthropic_sdk_message(fresh: Stack) -> None:
    client = anthropic.Anthropic(base_url=fresh.up.base_url, api_key=TOKEN, max_retries=0)
    message = client.messages.create(model="claude-group", max_tokens=64,
                                     messages=[{"role": "user", "content": "Hi"}])
    assert message.model == "claude-test-1"
    assert message.content[0].text
    (request,) = fresh.providers.provider("claude").received
    assert request.headers["x-api-key"] == KEYS["claude"]


def test_a_503_falls_back_to_the_next_target(fresh: Stack) -> None:
    fresh.providers.provider("first").behaviour = Behaviour(status=503)
    reply = fresh.openai().chat.completions.create(
        model="pair", messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "second-model"
    # a 5xx earns the same target one more try first (retry_same_target 1, issue 40)
    assert len(fresh.providers.provider("first").received) == 2
    (retried,) = fresh.providers.provider("second").received
    # The retry was rewritten by the per-attempt ext_proc stream for its own target.
    assert retried.json()["model"] == "second-model"
    assert retried.headers["authorization"] == f"Bearer {KEYS['second']}"


def test_observations_arrive_at_the_admin_endpoint(fresh: Stack) -> None:
    fresh.openai().chat.completions.create(
        model="pair", messages=[{"role": "user", "content": "observe me"}])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        targets = fresh.admin("/observations")["targets"]
        if targets.get("first/first-model", {}).get("outcomes", {}).get("ok"):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"no observation for first/first-model: {targets}")
    # Every ext_proc stream of these requests has ended (none leaked by the adapter).
    while fresh.admin("/status")["ext_proc_streams"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fresh.admin("/status")["ext_proc_streams"] == 0


def test_a_peer_without_the_channel_token_is_refused(fresh: Stack) -> None:
    before = fresh.admin("/status")["grpc"]["unauthenticated_calls"]
    with grpc.insecure_channel(f"127.0.0.1:{fresh.up.ext_proc_port}") as channel:
        process = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process")
        with pytest.raises(grpc.RpcError) as refused:
            list(process(iter([b""]), timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert fresh.admin("/status")["grpc"]["unauthenticated_calls"] == before + 1
