"""Well-formed calls from an independent HTTP/2 implementation (`h2`): an ext_proc exchange
with the real processor, a health Check, a message far larger than every window, and the
channel-token check (grpcwire/auth.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from grpc_health.v1 import health_pb2

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire.auth import CHANNEL_TOKEN_HEADER, ChannelAuth
from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import H2Client, grpc_message
from tests.conformance.conftest import COLLECT, ECHO, HEALTH, Echo, MiB, ServerThread

TOKEN = "t" * 40
EXT_PROC = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def _with_ext_proc(server: GrpcServer) -> None:
    from sidecar.config import load_config_text
    from sidecar.extproc.processor import METHOD, SERVICE, ExternalProcessor
    from sidecar.gateway import Gateway, Runtime

    config = load_config_text("""
providers:
  p: {base_url: "http://127.0.0.1:9/v1", credential: {env: K}}
callers: [{name: c, token_sha256: "%s"}]
models:
  g: {targets: [{provider: p, model_ref: m}]}
""" % ("0" * 64))
    server.add_method(SERVICE, METHOD, ExternalProcessor(Gateway(Runtime(config, {"K": "k"})))
                      .stream)


@pytest.fixture()
def extproc_server() -> Iterator[ServerThread]:
    running = ServerThread(extra=_with_ext_proc)
    yield running
    running.close()


def test_an_ext_proc_exchange_over_h2(extproc_server: ServerThread) -> None:
    """Request headers without a caller credential: the processor answers at once (an
    immediate response) and ends the stream, as Envoy sees it."""
    headers = HeaderMap(headers=[
        HeaderValue(key=":method", raw_value=b"POST"),
        HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
        HeaderValue(key=":authority", raw_value=b"gateway"),
        HeaderValue(key="content-type", raw_value=b"application/json")])
    request = ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=headers))
    with H2Client(extproc_server.port) as client:
        stream_id = client.open(EXT_PROC)
        client.send(stream_id, grpc_message(request.SerializeToString()))
        reply = client.wait(stream_id)
    assert reply.headers[":status"] == "200"
    assert reply.status == "0"
    [answer] = reply.messages()
    assert ext.ProcessingResponse.FromString(answer).HasField("immediate_response")


def test_a_health_check_over_h2(server: ServerThread) -> None:
    with H2Client(server.port) as client:
        reply = client.unary(HEALTH, health_pb2.HealthCheckRequest(service="").SerializeToString())
    assert reply.status == "0"
    [answer] = reply.messages()
    assert (health_pb2.HealthCheckResponse.FromString(answer).status
            == health_pb2.HealthCheckResponse.SERVING)


def test_a_message_far_larger_than_every_window_still_arrives() -> None:
    """Windows of 64 KiB and a 3 MiB message: credit for the rest of a message is granted
    once its buffer is reserved, so it flows without the window ever being as large."""
    limits = ServerLimits(max_message_bytes=4 * MiB, stream_window=65_535,
                          connection_window=65_535)
    running = ServerThread(limits)
    try:
        with H2Client(running.port) as client:
            big = bytes(range(256)) * (3 * 4096)
            reply = client.unary(COLLECT, big)
        assert reply.status == "0" and reply.messages() == [str(len(big)).encode()]
        assert running.counters()["buffered_bytes"] == 0
    finally:
        running.close()


@pytest.fixture()
def guarded() -> Iterator[ServerThread]:
    running = ServerThread(auth=ChannelAuth(TOKEN))
    yield running
    running.close()


@pytest.mark.parametrize("metadata", [(), ((CHANNEL_TOKEN_HEADER, "w" * 40),)],
                         ids=["missing", "wrong"])
def test_a_call_without_the_channel_token_is_refused_before_any_handler(
        guarded: ServerThread, metadata, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar.grpcwire")
    started = Echo.started
    with H2Client(guarded.port) as client:
        stream_id = client.open(ECHO, metadata)
        reply = client.wait(stream_id)  # answered at once, before any message is sent
    assert reply.ended and reply.trailers == {}  # a trailers-only response
    assert reply.headers["grpc-status"] == "16"
    assert reply.headers["grpc-message"] == "missing or wrong channel token"
    assert Echo.started == started
    assert guarded.counters()["unauthenticated_calls"] == 1
    assert caplog.records == []


def test_the_channel_token_opens_every_method(guarded: ServerThread) -> None:
    with H2Client(guarded.port) as client:
        reply = client.unary(ECHO, b"hello", [(CHANNEL_TOKEN_HEADER, TOKEN)])
    assert reply.status == "0" and reply.messages() == [b"hello"]
    assert guarded.counters()["unauthenticated_calls"] == 0


def test_only_connections_with_token_calls_count_as_envoys(guarded: ServerThread) -> None:
    """What a drain without an Envoy admin waits for (operations/drain.py): connections that
    carried a call with the channel token. Health probes and refused calls do not count."""
    async def peers() -> tuple[int, int]:
        return guarded.server.peers_seen, guarded.server.peers_open

    with H2Client(guarded.port) as client:
        health = health_pb2.HealthCheckRequest(service="").SerializeToString()
        assert client.unary(HEALTH, health).status == "0"
        assert client.unary(ECHO, b"x", [(CHANNEL_TOKEN_HEADER, "w" * 40)]).status == "16"
        assert guarded.call(peers()) == (0, 0)
        assert client.unary(ECHO, b"x", [(CHANNEL_TOKEN_HEADER, TOKEN)]).status == "0"
        assert guarded.call(peers()) == (1, 1)
    deadline = time.monotonic() + 5
    while guarded.call(peers()) != (1, 0):  # the client has closed its connection
        assert time.monotonic() < deadline, guarded.call(peers())
        time.sleep(0.02)


def test_health_stays_open_without_the_token(guarded: ServerThread) -> None:
    with H2Client(guarded.port) as client:
        reply = client.unary(HEALTH, health_pb2.HealthCheckRequest(service="").SerializeToString())
    assert reply.status == "0"
    assert guarded.counters()["unauthenticated_calls"] == 0
