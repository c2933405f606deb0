"""RFC 9113 violations, sent as raw frames: each is answered with a GOAWAY carrying the
right error code, the connection closes, it is counted, and the server keeps serving."""

from __future__ import annotations

import hpack
import pytest

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import RawClient, ends_stream, goaway_code, grpc_message, open_frame
from tests.conformance.conftest import COLLECT, ECHO, HOLD, LINGER, MiB, ServerThread

MAX_WINDOW = 2**31 - 1


def _violation(server: ServerThread, frames: bytes, expected: int,
               settings: dict[int, int] | None = None) -> None:
    before = server.counters()["protocol_errors"]
    with RawClient(server.port, settings=settings) as client:
        client.send(frames)
        got = client.read_until_closed()
    assert goaway_code(got) == expected
    assert server.counters()["protocol_errors"] == before + 1
    with RawClient(server.port) as other:  # the server itself is fine
        assert other.ping()


def test_a_connection_window_pushed_past_the_maximum_is_a_flow_control_error(
        server: ServerThread) -> None:
    # our send window starts at 65,535: this increment makes it 2^31
    _violation(server, f.window_update(0, MAX_WINDOW - 65_535 + 1), f.FLOW_CONTROL_ERROR)


def test_a_stream_window_pushed_past_the_maximum_is_a_flow_control_error(
        server: ServerThread) -> None:
    opening = open_frame(1, HOLD)
    _violation(server, opening + f.window_update(1, MAX_WINDOW), f.FLOW_CONTROL_ERROR)


def test_a_settings_change_that_overflows_a_stream_window_is_a_flow_control_error(
        server: ServerThread) -> None:
    """RFC 9113 §6.9.2: a stream window pushed past the maximum by a new initial size."""
    opening = open_frame(1, HOLD)
    _violation(server, opening + f.window_update(1, MAX_WINDOW - 65_535)
               + f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 65_536}), f.FLOW_CONTROL_ERROR)


def test_a_zero_connection_window_increment_is_a_protocol_error(server: ServerThread) -> None:
    _violation(server, f.window_update(0, 0), f.PROTOCOL_ERROR)


def test_a_zero_stream_window_increment_is_a_protocol_error(server: ServerThread) -> None:
    opening = open_frame(1, HOLD)
    _violation(server, opening + f.window_update(1, 0), f.PROTOCOL_ERROR)


def test_data_beyond_the_window_we_granted_is_a_flow_control_error() -> None:
    running = ServerThread(ServerLimits(max_message_bytes=4 * MiB, stream_window=65_535,
                                        connection_window=65_535))
    try:
        opening = open_frame(1, HOLD)
        # one 70,000-byte frame (our frames may be that large) against a 65,535 window
        _violation(running, opening + f.frame(f.DATA, 0, 1, b"\x00" * 70_000),
                   f.FLOW_CONTROL_ERROR)
    finally:
        running.close()


@pytest.mark.parametrize(("name", "frames", "code"), [
    ("DATA on stream 0", f.frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR),
    ("DATA on an idle stream", f.frame(f.DATA, 0, 7, b"x"), f.PROTOCOL_ERROR),
    ("HEADERS on stream 0", f.frame(f.HEADERS, f.END_HEADERS, 0, b"\x82"), f.PROTOCOL_ERROR),
    ("RST_STREAM on an idle stream", f.rst_stream(9, f.CANCEL), f.PROTOCOL_ERROR),
    ("RST_STREAM on stream 0", f.rst_stream(0, f.CANCEL), f.PROTOCOL_ERROR),
    ("RST_STREAM of 3 bytes", f.frame(f.RST_STREAM, 0, 1, b"\x00\x00\x08"), f.FRAME_SIZE_ERROR),
    ("WINDOW_UPDATE on an idle stream", f.window_update(11, 10), f.PROTOCOL_ERROR),
    ("WINDOW_UPDATE of 3 bytes", f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"),
     f.FRAME_SIZE_ERROR),
    ("SETTINGS on a stream", f.frame(f.SETTINGS, 0, 1, b""), f.PROTOCOL_ERROR),
    ("SETTINGS ACK with a payload", f.frame(f.SETTINGS, f.ACK, 0, b"\x00" * 6),
     f.FRAME_SIZE_ERROR),
    ("SETTINGS of 5 bytes", f.frame(f.SETTINGS, 0, 0, b"\x00" * 5), f.FRAME_SIZE_ERROR),
    ("ENABLE_PUSH of 2", f.settings({f.SETTINGS_ENABLE_PUSH: 2}), f.PROTOCOL_ERROR),
    ("initial window of 2^31", f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 2**31}),
     f.FLOW_CONTROL_ERROR),
    ("PING of 7 bytes", f.frame(f.PING, 0, 0, b"1234567"), f.FRAME_SIZE_ERROR),
    ("PING on a stream", f.frame(f.PING, 0, 1, b"12345678"), f.PROTOCOL_ERROR),
    ("GOAWAY on a stream", f.frame(f.GOAWAY, 0, 1, b"\x00" * 8), f.PROTOCOL_ERROR),
    ("PRIORITY of 4 bytes", f.frame(f.PRIORITY, 0, 1, b"\x00" * 4), f.FRAME_SIZE_ERROR),
    ("PRIORITY on stream 0", f.frame(f.PRIORITY, 0, 0, b"\x00" * 5), f.PROTOCOL_ERROR),
    ("a stream depending on itself", f.frame(f.PRIORITY, 0, 3, b"\x00\x00\x00\x03\x10"),
     f.PROTOCOL_ERROR),
    ("PUSH_PROMISE from a client", f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00" * 4),
     f.PROTOCOL_ERROR),
    ("CONTINUATION out of the blue", f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x82"),
     f.PROTOCOL_ERROR),
    ("a frame over our maximum size", f.header(f.DATA, 0, 1, 300_000), f.FRAME_SIZE_ERROR),
    ("an even stream id", f.frame(f.HEADERS, f.END_HEADERS, 2, b"\x82"), f.PROTOCOL_ERROR),
    ("a bad HPACK block", f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff"),
     f.COMPRESSION_ERROR),
])
def test_frame_level_violations(server: ServerThread, name: str, frames: bytes,
                                code: int) -> None:
    _violation(server, frames, code)


def test_the_first_frame_must_be_settings(server: ServerThread) -> None:
    before = server.counters()["protocol_errors"]
    with RawClient(server.port, handshake=False) as client:
        client.send(f.PREFACE + f.frame(f.PING, 0, 0, b"12345678"))
        assert goaway_code(client.read_until_closed()) == f.PROTOCOL_ERROR
    assert server.counters()["protocol_errors"] == before + 1


def test_data_after_the_client_half_closed_is_stream_closed(server: ServerThread) -> None:
    """(Linger keeps the call open after the client's half-close.)"""
    with RawClient(server.port) as client:
        client.send(client.headers(1, HOLD, end_stream=True))
        client.read(ends_stream(1))
        client.send(client.headers(3, LINGER) + f.frame(f.DATA, f.END_STREAM, 3, b"")
                    + f.frame(f.DATA, 0, 3, grpc_message(b"late")))
        got = client.read_until_closed()
    assert goaway_code(got) == f.STREAM_CLOSED


def test_new_stream_ids_must_increase(server: ServerThread) -> None:
    with RawClient(server.port) as client:
        client.send(client.headers(5, HOLD) + client.headers(3, HOLD))
        assert goaway_code(client.read_until_closed()) == f.PROTOCOL_ERROR


@pytest.mark.parametrize(("name", "fields"), [
    ("an upper-case name", [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                            ("Content-Type", "application/grpc")]),
    ("no :path", [(":method", "POST"), (":scheme", "http")]),
    ("a pseudo-header after a regular one", [(":method", "POST"), (":scheme", "http"),
                                             ("te", "trailers"), (":path", ECHO)]),
    ("a response pseudo-header", [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                  (":status", "200")]),
    ("a repeated pseudo-header", [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                  (":path", ECHO)]),
    ("a connection-specific field", [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                     ("connection", "keep-alive")]),
    ("te other than trailers", [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                ("te", "gzip")]),
    ("a newline in a value", [(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                              ("x-a", "1\n2")]),
])
def test_malformed_requests_are_protocol_errors(server: ServerThread, name: str,
                                                fields: list[tuple[str, str]]) -> None:
    block = hpack.Encoder().encode(fields)
    _violation(server, f.frame(f.HEADERS, f.END_HEADERS, 1, block), f.PROTOCOL_ERROR)


def test_a_message_cut_short_by_end_stream_is_an_error(server: ServerThread) -> None:
    """Declared 100 bytes, 3 sent, then END_STREAM: INTERNAL, and the handler hears of a
    cancel, never of a clean half-close."""
    with RawClient(server.port) as client:
        client.send(client.headers(1, COLLECT)
                    + f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"abc", declared=100)))
        trailers = client.trailers(client.read(ends_stream(1)), 1)
        assert client.ping()  # only the call ended
    assert trailers["grpc-status"] == str(13)
    assert trailers["grpc-message"] == "incomplete message"
    assert server.collected[-1].events == ["cancel"]
    assert server.counters()["buffered_bytes"] == 0


def test_a_message_cut_short_by_client_trailers_is_an_error(server: ServerThread) -> None:
    with RawClient(server.port) as client:
        trailers_block = client.encoder.encode([("x-trailer", "1")])
        client.send(client.headers(1, COLLECT)
                    + f.frame(f.DATA, 0, 1, grpc_message(b"abc", declared=100))
                    + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, trailers_block))
        trailers = client.trailers(client.read(ends_stream(1)), 1)
    assert trailers["grpc-status"] == str(13)
    assert server.collected[-1].events == ["cancel"]


def test_every_violation_leaves_nothing_held(server: ServerThread) -> None:
    with RawClient(server.port) as client:
        client.send(client.headers(1, COLLECT)
                    + f.frame(f.DATA, 0, 1, grpc_message(b"abc" * 1000, declared=1 << 20))
                    + f.window_update(0, 0))
        client.read_until_closed()
    counters = server.wait_for(lambda c: c["connections_open"] == 0)
    assert counters["buffered_bytes"] == 0 and counters["connections_open"] == 0
