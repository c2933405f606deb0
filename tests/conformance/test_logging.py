"""What a peer can make the server log: undecodable messages end their call with
INVALID_ARGUMENT and one WARNING line without traceback; protocol errors and handler
failures are rate-limited per kind (grpcwire/ratelimit.py), with one "suppressed" line."""

from __future__ import annotations

import logging

import hpack
import pytest

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire import frames as f
from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import (
    RawClient,
    fake_connection,
    grpc_message,
    request_headers,
    status_of,
)
from tests.conformance.conftest import ECHO, Echo, MiB, ServerThread

EXT_PROC = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
ACCESS_LOG = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Boom(Echo):
    def on_message(self, call, payload) -> None:
        raise RuntimeError("a bug in a handler")


def _server(clock: Clock) -> tuple[GrpcServer, object]:
    from sidecar.config import load_config_text
    from sidecar.extproc.processor import METHOD, SERVICE, ExternalProcessor
    from sidecar.gateway import Gateway, Runtime
    from sidecar.observe.access_log import AccessLogReceiver
    from sidecar.observe.store import ObservationStore

    config = load_config_text("""
providers:
  p: {base_url: "http://127.0.0.1:9/v1", credential: {env: K}}
callers: [{name: c, token_sha256: "%s"}]
models:
  g: {targets: [{provider: p, model_ref: m}]}
""" % ("0" * 64))
    processor = ExternalProcessor(Gateway(Runtime(config, {"K": "k"})))
    server = GrpcServer(ServerLimits(max_message_bytes=MiB, log_burst=3, log_interval=60),
                        clock=clock)
    server.add_method(SERVICE, METHOD, processor.stream)
    receiver = AccessLogReceiver(ObservationStore(retention_seconds=60), {}, {})
    server.add_method(AccessLogReceiver.SERVICE, AccessLogReceiver.METHOD, receiver.stream)
    server.add_method("test.Conformance", "Boom", Boom)
    return server, processor


def _calls(connection, transport, path: str, count: int, payload: bytes,
           first: int = 1) -> list[str]:
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    statuses = []
    for index in range(count):
        stream_id = first + 2 * index
        connection.data_received(
            f.frame(f.HEADERS, f.END_HEADERS, stream_id, encoder.encode(request_headers(path)))
            + f.frame(f.DATA, 0, stream_id, grpc_message(payload)))
        statuses.append(status_of(transport.frames(), stream_id, decoder))
    return statuses


def _ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("sidecar.grpcwire")]


@pytest.mark.parametrize("path", [EXT_PROC, ACCESS_LOG])
def test_undecodable_messages_are_invalid_argument_with_a_few_one_line_warnings(
        path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar")
    clock = Clock()
    server, processor = _server(clock)
    connection, transport = fake_connection(server)
    statuses = _calls(connection, transport, path, 20, b"\xff\xff\xff")
    assert statuses == ["3"] * 20  # INVALID_ARGUMENT
    assert processor.active_streams == 0  # type: ignore[attr-defined]
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 3
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in records)
    assert all("\n" not in r.getMessage() for r in records)
    assert server.counters.log_lines_suppressed == 17
    clock.now += 60
    caplog.clear()
    connection, transport = fake_connection(server)
    assert _calls(connection, transport, path, 1, b"\xff\xff\xff") == ["3"]
    messages = [r.getMessage() for r in _ours(caplog)]
    assert any("suppressed 17 similar messages" in m for m in messages), messages


def test_protocol_error_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar")
    clock = Clock()
    server, _ = _server(clock)
    for _ in range(30):
        connection, transport = fake_connection(server, handshake=False)
        connection.data_received(b"GET / HTTP/1.1\r\n\r\n")
        assert transport.closed and transport.frames()[-1][0] == f.GOAWAY
        connection.connection_lost(None)
    assert len(_ours(caplog)) == 3
    assert server.counters.protocol_errors == 30
    assert server.counters.log_lines_suppressed == 27


def test_handler_bugs_keep_their_traceback_but_are_rate_limited(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar")
    server, _ = _server(Clock())
    connection, transport = fake_connection(server)
    statuses = _calls(connection, transport, "/test.Conformance/Boom", 10, b"x")
    assert statuses == ["13"] * 10
    records = _ours(caplog)
    assert len(records) == 3 and all(r.exc_info for r in records)
    assert server.counters.log_lines_suppressed == 7


def test_a_real_flood_over_the_socket_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar")
    running = ServerThread(ServerLimits(max_message_bytes=MiB, log_burst=2, log_interval=600))
    try:
        for _ in range(12):
            with RawClient(running.port) as client:
                client.send(f.window_update(0, 0))
                client.read_until_closed()
        with RawClient(running.port) as client:
            client.send(client.headers(1, ECHO, end_stream=True))
            assert client.read()
        assert running.counters()["protocol_errors"] == 12
    finally:
        running.close()
    assert len([r for r in _ours(caplog) if r.levelno >= logging.WARNING]) <= 3
