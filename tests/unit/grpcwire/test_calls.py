"""The sidecar's own gRPC server, exercised by the official grpcio client: streaming in
both directions, flow control with messages far larger than any window, errors, cancellation
and graceful stop."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.grpcwire import frames as f
from tests.unit.grpcwire.servers import (
    SERVICE,
    Echo,
    Running,
    bidi,
    identity,
)


def test_health_check_serving_and_unknown(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "test.Echo"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_the_status(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        stream.cancel()


def test_a_drain_turns_health_not_serving_for_checks_and_watchers(running: Running) -> None:
    """operations/drain.py: the first step of a drain, announced on open Watch calls."""
    with grpc.insecure_channel(running.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING

        async def drain() -> None:
            running.health.stop_serving()

        running.call(drain())
        assert next(stream).status == health_pb2.HealthCheckResponse.NOT_SERVING
        stream.cancel()
        reply = stub.Check(health_pb2.HealthCheckRequest(service="test.Echo"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_bidi_stream_echoes_in_order_and_finishes_on_half_close(running: Running) -> None:
    messages = [f"message {n}".encode() for n in range(50)]
    with grpc.insecure_channel(running.address) as channel:
        assert list(bidi(channel)(iter(messages), timeout=5)) == messages


def test_handler_may_finish_before_the_client_is_done(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        replies = list(bidi(channel)(iter([b"a", b"stop"]), timeout=5))
    assert replies == [b"a", b"stop"]


def test_messages_larger_than_every_window_flow_both_ways(running: Running) -> None:
    """20 MiB each way: beyond our 16 MiB stream window and grpcio's own windows, so both
    sides' flow control (and our queued sending) must work."""
    big = bytes(range(256)) * (20 * 1024 * 4)
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
               ("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(running.address, options=options) as channel:
        replies = list(bidi(channel)(iter([big, b"small", big]), timeout=30))
    assert [len(r) for r in replies] == [len(big), 5, len(big)]
    assert replies[0] == big and replies[2] == big


def test_client_streaming_gets_one_answer_at_the_end(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        collect = channel.stream_unary(f"/{SERVICE}/Collect", request_serializer=identity,
                                       response_deserializer=identity)
        assert collect(iter([b"x" * 1000] * 300), timeout=5) == b"300000"


def test_many_concurrent_calls(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        echo = bidi(channel)
        futures = []
        results: list[list[bytes]] = []

        def one(n: int) -> None:
            results.append(list(echo(iter([str(n).encode()] * 3), timeout=10)))

        futures = [threading.Thread(target=one, args=(n,)) for n in range(64)]
        for thread in futures:
            thread.start()
        for thread in futures:
            thread.join()
    assert sorted(r[0] for r in results) == sorted(str(n).encode() for n in range(64))
    assert all(len(set(r)) == 1 and len(r) == 3 for r in results)


def test_unknown_method_is_unimplemented(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel, \
            pytest.raises(grpc.RpcError) as error:
        list(bidi(channel, "Nope")(iter([b"x"]), timeout=5))
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_handler_exception_ends_only_that_call_with_internal(running: Running) -> None:
    with grpc.insecure_channel(running.address) as channel:
        with pytest.raises(grpc.RpcError) as error:
            list(bidi(channel)(iter([b"boom"]), timeout=5))
        assert error.value.code() == grpc.StatusCode.INTERNAL
        assert list(bidi(channel)(iter([b"still here"]), timeout=5)) == [b"still here"]


def test_message_over_the_limit_is_resource_exhausted() -> None:
    server = Running(max_message=1024)
    try:
        with grpc.insecure_channel(server.address) as channel, \
                pytest.raises(grpc.RpcError) as error:
            list(bidi(channel)(iter([b"x" * 2048]), timeout=5))
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.close()


def test_client_cancel_reaches_the_handler(running: Running) -> None:
    before = Echo.cancelled
    release = threading.Event()

    def requests():
        yield b"first"
        release.wait(10)  # keep the call open (no half-close) until cancelled

    with grpc.insecure_channel(running.address) as channel:
        call = bidi(channel)(requests(), timeout=10)
        assert next(call) == b"first"
        call.cancel()
        deadline = time.monotonic() + 5
        while Echo.cancelled == before and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
    assert Echo.cancelled == before + 1
    assert all(c.open_calls == 0 for c in running.server.connections)


def test_stop_refuses_new_connections(running: Running) -> None:
    running.call(running.server.stop(0.1))
    with socket.socket() as sock, pytest.raises(OSError):
        sock.settimeout(1)
        sock.connect(("127.0.0.1", running.server.port))
        sock.sendall(f.PREFACE)
        if not sock.recv(1):
            raise OSError("closed")
