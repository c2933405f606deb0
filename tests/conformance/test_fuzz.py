"""The frame parser against random and mutated frame sequences (hypothesis): whatever
arrives after a valid preface, `data_received` never raises, never takes its internal-error
path, and the connection either keeps serving or ends with a GOAWAY; when it is gone it
holds nothing; and a well-formed call on a fresh connection still works."""

from __future__ import annotations

import itertools
import struct

import hpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire import frames as f
from sidecar.grpcwire.health import add_health
from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import (
    fake_connection,
    grpc_message,
    open_frame,
    request_headers,
    status_of,
)
from tests.conformance.conftest import (
    COLLECT,
    ECHO,
    HOLD,
    LINGER,
    SERVICE,
    Collect,
    Echo,
    Hold,
    Linger,
)

_SERVER = GrpcServer(ServerLimits(max_message_bytes=64 * 1024, connection_buffer_bytes=256 * 1024,
                                  total_buffer_bytes=512 * 1024, stream_window=65_535,
                                  connection_window=65_535, max_concurrent_calls=8))
_SERVER.add_method(SERVICE, "Echo", Echo)
_SERVER.add_method(SERVICE, "Hold", Hold)
_SERVER.add_method(SERVICE, "Collect", Collect)
_SERVER.add_method(SERVICE, "Linger", Linger)
add_health(_SERVER, [SERVICE])


def _valid_call() -> list[bytes]:
    encoder = hpack.Encoder()
    message = grpc_message(b"m" * 300)
    echo = encoder.encode(request_headers(ECHO))
    collect = encoder.encode(request_headers(COLLECT))
    return [
        f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 1000, f.SETTINGS_MAX_FRAME_SIZE: 20_000}),
        f.frame(f.HEADERS, f.END_HEADERS, 1, echo),
        f.frame(f.DATA, 0, 1, message[:100]),
        f.frame(f.PING, 0, 0, b"12345678"),
        f.frame(f.DATA, 0, 1, message[100:] + grpc_message(b"", declared=5000)[:3]),
        f.frame(f.HEADERS, 0, 3, collect[:8]),
        f.frame(f.CONTINUATION, f.END_HEADERS, 3, collect[8:]),
        f.frame(f.DATA, f.PADDED, 3, bytes([4]) + grpc_message(b"x" * 40, 2000) + b"\0" * 4),
        f.window_update(0, 5000),
        f.window_update(1, 3000),
        f.rst_stream(1, f.CANCEL),
        f.frame(f.DATA, f.END_STREAM, 3, b"y" * 50),
        f.frame(f.PRIORITY, 0, 5, b"\x00\x00\x00\x01\x10"),
        f.frame(f.HEADERS, f.END_HEADERS, 5, encoder.encode(request_headers(LINGER))),
        f.frame(f.DATA, f.END_STREAM, 5, grpc_message(b"last")),
        f.frame(f.GOAWAY, 0, 0, struct.pack(">II", 3, 0)),
    ]


_streams = st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1])
_frame = st.one_of(
    st.builds(lambda kind, flags, stream, payload: f.frame(kind, flags, stream, payload),
              st.sampled_from([*range(10), 0x0F, 0xFF]),
              st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x29, 0xFF]), _streams,
              st.binary(max_size=64)),
    # frames that make sense, so that calls open and carry messages
    st.builds(open_frame, _streams, st.sampled_from([ECHO, COLLECT, LINGER, HOLD, "/x/y"]),
              st.booleans()),
    st.builds(lambda stream, size, declared, end: f.frame(
        f.DATA, f.END_STREAM if end else 0, stream,
        grpc_message(b"d" * size, declared)), _streams, st.integers(0, 300),
        st.one_of(st.none(), st.integers(0, 70_000)), st.booleans()),
    st.builds(f.window_update, _streams, st.integers(0, 2**31 - 1)),
    st.builds(f.rst_stream, _streams, st.integers(0, 13)),
)


@st.composite
def _mutated(draw: st.DrawFn) -> list[bytes]:
    frames = _valid_call()
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 5))
        index = draw(st.integers(0, len(frames) - 1))
        if choice == 0 and frames[index]:  # flip a byte
            data = bytearray(frames[index])
            position = draw(st.integers(0, len(data) - 1))
            data[position] ^= draw(st.integers(1, 255))
            frames[index] = bytes(data)
        elif choice == 1:  # cut a frame short
            frames[index] = frames[index][:draw(st.integers(0, len(frames[index])))]
        elif choice == 2:
            frames.insert(index, frames[index])
        elif choice == 3 and len(frames) > 1:
            del frames[index]
        elif choice == 4:
            other = draw(st.integers(0, len(frames) - 1))
            frames[index], frames[other] = frames[other], frames[index]
        else:
            frames.insert(index, draw(_frame))
    return frames


def _check(frames: list[bytes], cuts: list[int]) -> None:
    before = _SERVER.counters.as_dict()
    connection, transport = fake_connection(_SERVER)
    wire = b"".join(frames)
    points = sorted({0, len(wire), *(cut % (len(wire) + 1) for cut in cuts)})
    for start, end in itertools.pairwise(points):
        connection.data_received(wire[start:end])  # must never raise
        if transport.closed:
            break
    written = transport.frames()
    assert _SERVER.counters.internal_errors == before["internal_errors"]
    if transport.closed:
        assert written and written[-1][0] == f.GOAWAY
    connection.connection_lost(None)
    after = _SERVER.counters.as_dict()
    assert after["buffered_bytes"] == 0
    assert after["connections_open"] == before["connections_open"]
    # and a fresh connection serves a well-formed call
    fresh, fresh_transport = fake_connection(_SERVER)
    fresh.data_received(
        f.frame(f.HEADERS, f.END_HEADERS, 1, hpack.Encoder().encode(request_headers(ECHO)))
        + f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"ok")))
    assert status_of(fresh_transport.frames(), 1) == "0"
    fresh.connection_lost(None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_frame, max_size=12), st.lists(st.integers(0, 10_000), max_size=4))
def test_random_frames_after_the_preface(frames: list[bytes], cuts: list[int]) -> None:
    _check(frames, cuts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated(), st.lists(st.integers(0, 10_000), max_size=4))
def test_mutated_calls(frames: list[bytes], cuts: list[int]) -> None:
    _check(frames, cuts)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_after_the_preface(garbage: bytes) -> None:
    _check([garbage], [])


def test_the_valid_sequence_itself_is_served() -> None:
    """The seed of the mutations is a sequence the server takes without complaint."""
    connection, transport = fake_connection(_SERVER)
    connection.data_received(b"".join(_valid_call()))
    frames = transport.frames()
    assert not transport.closed
    assert (f.PING, f.ACK, 0, b"12345678") in frames
    assert status_of(frames, 1) != "0"  # reset by the client: no trailers
    connection.connection_lost(None)
