"""Connections a peer opens and then neglects: the handshake timeout, the idle timeout, and
the connection limit. Durations are tiny here; every wait has a generous upper bound, and
no assertion depends on the machine being fast."""

from __future__ import annotations

import contextlib
import socket
import time

from sidecar.grpcwire import frames as f
from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import RawClient, ends_stream, goaway_code, grpc_message
from tests.conformance.conftest import HOLD, MiB, ServerThread


def _limits(**values) -> ServerLimits:
    return ServerLimits(max_message_bytes=4 * MiB, **values)


def test_a_connection_that_never_completes_the_handshake_is_closed() -> None:
    running = ServerThread(_limits(handshake_timeout=0.3, idle_timeout=600))
    try:
        with RawClient(running.port, handshake=False) as silent, \
                RawClient(running.port, handshake=False) as preface_only:
            preface_only.send(f.PREFACE)  # the preface, but never the SETTINGS frame
            silent.read_until_closed(timeout=20)
            preface_only.read_until_closed(timeout=20)
        counters = running.wait_for(lambda c: c["connections_open"] == 0)
        assert counters["handshake_timeouts"] == 2
        assert counters["connections_open"] == 0
    finally:
        running.close()


def test_a_completed_handshake_is_not_timed_out() -> None:
    running = ServerThread(_limits(handshake_timeout=0.5, idle_timeout=600))
    try:
        with RawClient(running.port) as client:
            assert client.ping()
            time.sleep(2.0)  # four handshake timeouts
            assert client.ping()
        assert running.counters()["handshake_timeouts"] == 0
    finally:
        running.close()


def test_an_idle_connection_gets_goaway_then_is_closed() -> None:
    running = ServerThread(_limits(handshake_timeout=5, idle_timeout=0.3))
    try:
        with RawClient(running.port) as client:
            client.send(client.headers(1, HOLD, end_stream=True))  # one call, then nothing
            frames = client.read_until_closed(timeout=20)
        assert goaway_code(frames) == f.NO_ERROR
        goaway = [p for kind, _, _, p in frames if kind == f.GOAWAY][-1]
        assert int.from_bytes(goaway[:4], "big") == 1  # the last call we took
        counters = running.wait_for(lambda c: c["connections_open"] == 0)
        assert counters["idle_closed"] == 1
    finally:
        running.close()


def test_a_connection_with_an_open_call_is_never_idle() -> None:
    running = ServerThread(_limits(handshake_timeout=5, idle_timeout=0.2))
    try:
        with RawClient(running.port, handshake=False) as client:
            # the handshake and the call in one write: the call is open from the start
            client.send(f.PREFACE + f.settings({}) + client.headers(1, HOLD)
                        + f.frame(f.DATA, 0, 1, grpc_message(b"x")))
            time.sleep(1.0)  # five idle timeouts, with the call open throughout
            assert client.ping()
            client.send(f.frame(f.DATA, f.END_STREAM, 1, b""))
            frames = client.read(ends_stream(1))
            assert client.trailers(frames, 1)["grpc-status"] == "0"
            client.read_until_closed(timeout=20)  # idle from now on
        assert running.wait_for(lambda c: c["idle_closed"] == 1)["idle_closed"] == 1
    finally:
        running.close()


def test_connections_beyond_the_limit_are_closed_at_once_and_counted() -> None:
    running = ServerThread(_limits(max_connections=3))
    try:
        clients = [RawClient(running.port) for _ in range(3)]
        for client in clients:
            assert client.ping()
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as extra:
            extra.settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # (or reset)
                assert extra.recv(100) == b""  # closed without a byte
        counters = running.counters()
        assert counters["connections_refused"] == 1
        assert counters["connections_open"] == 3
        clients.pop().sock.close()
        running.wait_for(lambda c: c["connections_open"] == 2)
        with RawClient(running.port) as again:  # room again
            assert again.ping()
        for client in clients:
            client.sock.close()
    finally:
        running.close()
