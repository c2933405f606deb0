"""The escape hatch (`--grpc-server grpcio`): the sidecar's own handlers served by grpc.aio,
driven by the official grpcio client. ext_proc and access-log streams with real protobuf
messages, health, the channel token, message limits, handler failures, cancellation, stop."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.config import load_config_text
from sidecar.envoy_contract import ACCESS_LOG_NAME
from sidecar.extproc.grpcio_server import (
    OPEN_METHOD_READ_TIMEOUT,
    OPEN_METHOD_READS,
    GrpcioServer,
)
from sidecar.extproc.processor import METHOD, SERVICE, ExternalProcessor
from sidecar.extproc.server import start_server
from sidecar.gateway import Gateway, Runtime
from sidecar.grpcwire.auth import CHANNEL_TOKEN_HEADER, ChannelAuth
from sidecar.grpcwire.call import Call
from sidecar.grpcwire.counters import ServerCounters
from sidecar.grpcwire.health import add_health
from sidecar.observe.access_log import AccessLogReceiver
from sidecar.observe.store import ObservationStore

CALLER = "caller-token"
CHANNEL_TOKEN = "channel-token-0123456789abcdef0123456789"
GOOD = ((CHANNEL_TOKEN_HEADER, CHANNEL_TOKEN),)
EXT_PROC = f"/{SERVICE}/{METHOD}"
ACCESS_LOGS = f"/{AccessLogReceiver.SERVICE}/{AccessLogReceiver.METHOD}"
CONFIG = load_config_text(f"""
providers:
  local: {{base_url: "http://127.0.0.1:9/v1", credential: {{env: K}}}}
callers: [{{name: a, token_sha256: {hashlib.sha256(CALLER.encode()).hexdigest()}}}]
limits: {{max_request_body_bytes: 65536}}
models:
  g:
    targets: [{{provider: local, model_ref: real}}]
""")


class Loop:
    """An event loop on a thread, as `sidecar serve` runs one; the client is grpcio's
    synchronous one on the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Sidecar:
    """The sidecar's gRPC port as `sidecar serve --grpc-server grpcio` assembles it."""

    def __init__(self) -> None:
        self.loop = Loop()
        self.store = ObservationStore(retention_seconds=600, slice_seconds=10,
                                      refresh_seconds=0)
        runtime = Runtime(CONFIG, {"K": "provider-key"})
        self.processor = ExternalProcessor(Gateway(runtime, observations=self.store))
        receiver = AccessLogReceiver(self.store, runtime.cluster_targets,
                                     runtime.cluster_groups)

        async def start() -> GrpcioServer:
            server = await start_server(self.processor, "127.0.0.1:0", receiver,
                                        ChannelAuth(CHANNEL_TOKEN), grpc_server="grpcio")
            assert isinstance(server, GrpcioServer)
            return server

        self.server: GrpcioServer = self.loop.run(start())
        self.address = f"127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.loop.run(self.server.stop(0))
        self.loop.close()


@pytest.fixture()
def sidecar() -> Iterator[Sidecar]:
    running = Sidecar()
    yield running
    running.close()


def raw(x: bytes) -> bytes:
    return x


def headers_message(path: str = "/v1/chat/completions") -> ext.ProcessingRequest:
    values = {":path": path, ":method": "POST", "authorization": f"Bearer {CALLER}",
              "content-type": "application/json"}
    return ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=HeaderMap(
        headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()])))


def body_message(body: bytes) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=body, end_of_stream=True))


def ext_proc(channel: grpc.Channel):
    return channel.stream_stream(EXT_PROC,
                                 request_serializer=ext.ProcessingRequest.SerializeToString,
                                 response_deserializer=ext.ProcessingResponse.FromString)


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_an_ext_proc_stream_routes_a_request(sidecar: Sidecar) -> None:
    body = b'{"model":"g","messages":[{"role":"user","content":"hi"}]}'
    with grpc.insecure_channel(sidecar.address) as channel:
        first, second = ext_proc(channel)(iter([headers_message(), body_message(body)]),
                                          metadata=GOOD, timeout=10)
    assert "authorization" in first.request_headers.response.header_mutation.remove_headers
    common = second.request_body.response
    assert common.clear_route_cache is True
    assert common.body_mutation.body == body.replace(b'"g"', b'"real"')
    order = json_format.MessageToDict(second.dynamic_metadata)["sidecar.route"]
    assert order["priority_groups"][0]["clusters"][0]["cluster_name"] == "target__g__0__local"
    wait_until(lambda: sidecar.processor.active_streams == 0)


def test_an_error_is_an_immediate_response_and_the_stream_ends(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        (reply,) = ext_proc(channel)(iter([headers_message("/v1/nowhere")]), metadata=GOOD,
                                     timeout=10)
    assert reply.immediate_response.status.code == 404
    wait_until(lambda: sidecar.processor.active_streams == 0)


def test_many_streams_at_once_each_get_their_own_answers(sidecar: Sidecar) -> None:
    def one(index: int) -> bytes:
        body = b'{"model":"g","messages":[{"role":"user","content":"%d"}]}' % index
        with grpc.insecure_channel(sidecar.address) as channel:
            replies = list(ext_proc(channel)(iter([headers_message(), body_message(body)]),
                                             metadata=GOOD, timeout=20))
        return replies[1].request_body.response.body_mutation.body

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(one, range(48)))
    assert bodies == [b'{"model":"real","messages":[{"role":"user","content":"%d"}]}' % i
                      for i in range(48)]
    wait_until(lambda: sidecar.processor.active_streams == 0)


def test_access_log_entries_become_observations(sidecar: Sidecar) -> None:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.common_properties.upstream_cluster = "target__g__0__local"
    entry.common_properties.time_to_last_downstream_tx_byte.nanos = 40_000_000
    entry.response.response_code.value = 200
    message = als_pb2.StreamAccessLogsMessage()
    message.identifier.log_name = ACCESS_LOG_NAME
    message.http_logs.log_entry.append(entry)
    with grpc.insecure_channel(sidecar.address) as channel:
        send = channel.stream_unary(ACCESS_LOGS, request_serializer=raw,
                                    response_deserializer=als_pb2.StreamAccessLogsResponse.FromString)
        reply = send(iter([message.SerializeToString()] * 3), metadata=GOOD, timeout=10)
    assert reply == als_pb2.StreamAccessLogsResponse()
    summary = sidecar.store.summary("local/real", 600)
    assert summary.outcomes == {"ok": 3}


def test_health_is_open_without_the_token(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    assert sidecar.server.counters.unauthenticated_calls == 0


@pytest.mark.parametrize("metadata", [(), ((CHANNEL_TOKEN_HEADER, "x" * 40),),
                                      (("x-other", CHANNEL_TOKEN),)])
def test_calls_without_the_token_are_refused_before_any_handler(sidecar: Sidecar,
                                                                metadata) -> None:
    body = b'{"model":"g","messages":[]}'
    with grpc.insecure_channel(sidecar.address) as channel:
        with pytest.raises(grpc.RpcError) as error:
            list(ext_proc(channel)(iter([headers_message(), body_message(body)]),
                                   metadata=metadata, timeout=5))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error.value.code().value[0] == 16
        send = channel.stream_unary(ACCESS_LOGS, request_serializer=raw,
                                    response_deserializer=raw)
        with pytest.raises(grpc.RpcError) as error:
            send(iter([b""]), metadata=metadata, timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert sidecar.server.counters.unauthenticated_calls == 2
    assert sidecar.processor.active_streams == 0  # no ProcessStream was ever made


def test_open_methods_read_only_a_few_messages_at_once(sidecar: Sidecar) -> None:
    """gRPC core takes in a whole message (up to the port's limit) before the adapter sees
    it, and health needs no token: so only OPEN_METHOD_READS such reads may wait at once.
    A further one makes room by ending the oldest waiting read (RESOURCE_EXHAUSTED), so
    calls that never send their message cannot block later probes."""
    release = threading.Event()

    def held():
        release.wait(10)
        yield health_pb2.HealthCheckRequest(service="").SerializeToString()

    with grpc.insecure_channel(sidecar.address) as channel:
        check = channel.stream_stream("/grpc.health.v1.Health/Check", request_serializer=raw,
                                      response_deserializer=raw)
        waiting = [check(held(), timeout=10) for _ in range(OPEN_METHOD_READS)]
        wait_until(lambda: sidecar.server.open_method_reads == OPEN_METHOD_READS)
        (reply,) = list(check(iter([b""]), timeout=5))  # a probe gets in at once
        assert health_pb2.HealthCheckResponse.FromString(reply).status == (
            health_pb2.HealthCheckResponse.SERVING)
        with pytest.raises(grpc.RpcError) as error:
            list(waiting[0])  # the oldest waiting read made room
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sidecar.server.counters.calls_resource_exhausted >= 1
        release.set()
        for call in waiting[1:]:
            try:
                list(call)
            except grpc.RpcError as ended:  # or ended by the read timeout meanwhile
                assert ended.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        wait_until(lambda: sidecar.server.open_method_reads == 0)


def test_an_open_method_read_that_never_completes_times_out(sidecar: Sidecar) -> None:
    release = threading.Event()

    def held():
        release.wait(20)
        yield b""

    with grpc.insecure_channel(sidecar.address) as channel:
        check = channel.stream_stream("/grpc.health.v1.Health/Check", request_serializer=raw,
                                      response_deserializer=raw)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as error:
            list(check(held(), timeout=15))
        release.set()
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - started < 4 * OPEN_METHOD_READ_TIMEOUT + 2
        assert sidecar.server.open_method_reads == 0


def test_unknown_methods_need_the_token_too(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        probe = channel.unary_unary("/no.Such/Method", request_serializer=raw,
                                    response_deserializer=raw)
        with pytest.raises(grpc.RpcError) as error:
            probe(b"", timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as error:
            probe(b"", metadata=GOOD, timeout=5)
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_repeated_token_header_is_refused(sidecar: Sidecar) -> None:
    body = b'{"model":"g","messages":[]}'
    for metadata in ((*GOOD, (CHANNEL_TOKEN_HEADER, "x" * 40)),
                     ((CHANNEL_TOKEN_HEADER, "x" * 40), *GOOD), GOOD + GOOD):
        with grpc.insecure_channel(sidecar.address) as channel:
            with pytest.raises(grpc.RpcError) as error:
                list(ext_proc(channel)(iter([headers_message(), body_message(body)]),
                                       metadata=metadata, timeout=5))
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert sidecar.processor.active_streams == 0


def test_a_message_over_the_limit_is_refused(sidecar: Sidecar) -> None:
    limit = CONFIG.limits.max_request_body_bytes + 1024 * 1024
    assert sidecar.server.limits.max_message_bytes == limit
    with grpc.insecure_channel(sidecar.address,
                               options=[("grpc.max_send_message_length", -1)]) as channel:
        with pytest.raises(grpc.RpcError) as error:
            list(ext_proc(channel)(iter([headers_message(), body_message(b"x" * limit)]),
                                   metadata=GOOD, timeout=10))
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The connection and the server stay usable.
        (reply,) = ext_proc(channel)(iter([headers_message("/v1/nowhere")]), metadata=GOOD,
                                     timeout=10)
    assert reply.immediate_response.status.code == 404
    wait_until(lambda: sidecar.processor.active_streams == 0)


def test_an_undecodable_message_ends_only_its_call(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        call = channel.stream_stream(EXT_PROC, request_serializer=raw, response_deserializer=raw)
        with pytest.raises(grpc.RpcError) as error:
            list(call(iter([b"\xff\xff\xff"]), metadata=GOOD, timeout=5))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sidecar.server.counters.invalid_messages == 1
    wait_until(lambda: sidecar.processor.active_streams == 0)


def test_a_client_cancel_reaches_the_handler(sidecar: Sidecar) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        requests = iter([headers_message()])

        def forever():
            yield from requests
            time.sleep(30)

        call = ext_proc(channel)(forever(), metadata=GOOD, timeout=30)
        next(call)  # the header answer: the stream is open, waiting for the body
        assert sidecar.processor.active_streams == 1
        call.cancel()
        wait_until(lambda: sidecar.processor.active_streams == 0)


def test_stop_cancels_calls_still_open_after_the_grace() -> None:
    running = Sidecar()
    try:
        with grpc.insecure_channel(running.address) as channel:
            def forever():
                yield headers_message()
                time.sleep(30)

            call = ext_proc(channel)(forever(), metadata=GOOD, timeout=30)
            next(call)
            started = time.monotonic()
            running.loop.run(running.server.stop(0.2))
            assert time.monotonic() - started < 4 * 2  # the grace, with a wide margin
            assert running.processor.active_streams == 0
            with pytest.raises(grpc.RpcError):
                next(call)
    finally:
        running.loop.close()


def test_a_port_in_use_is_an_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        loop = Loop()
        try:
            server = GrpcioServer()
            with pytest.raises(OSError):
                loop.run(server.start("127.0.0.1", port))
        finally:
            loop.close()


def test_the_counters_have_the_own_servers_keys(sidecar: Sidecar) -> None:
    assert sidecar.server.counters.as_dict().keys() == ServerCounters().as_dict().keys()


class Echo:
    """A generic handler: echoes, `boom` raises, `stop` finishes early, `later` sends after
    the half-close from outside its turn (as a watch would)."""

    calls: list[Call] = []  # noqa: RUF012
    cancelled = 0

    def on_message(self, call: Call, payload: bytes) -> None:
        if payload == b"boom":
            raise RuntimeError("handler failure")
        call.send(payload)
        if payload == b"stop":
            call.finish()
        if payload == b"parts":
            call.send_parts([b"pa", memoryview(b"rts!")])

    def on_half_close(self, call: Call) -> None:
        Echo.calls.append(call)

    def on_cancel(self) -> None:
        Echo.cancelled += 1


@pytest.fixture()
def echo() -> Iterator[tuple[Loop, GrpcioServer]]:
    loop = Loop()
    server = GrpcioServer(max_message_bytes=1024, max_connections=2)
    server.add_method("test.Echo", "Echo", Echo)
    add_health(server, ["test.Echo"])
    loop.run(server.start("127.0.0.1", 0))
    Echo.calls.clear()
    Echo.cancelled = 0
    yield loop, server
    loop.run(server.stop(0))
    loop.close()


def test_generic_handlers_keep_their_semantics(echo: tuple[Loop, GrpcioServer]) -> None:
    loop, server = echo
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_stream("/test.Echo/Echo", request_serializer=raw,
                                     response_deserializer=raw)
        assert list(call(iter([b"a", b"stop", b"never"]), timeout=5)) == [b"a", b"stop"]
        assert list(call(iter([b"parts", b"stop"]), timeout=5)) == [
            b"parts", b"parts!", b"stop"]
        with pytest.raises(grpc.RpcError) as error:
            list(call(iter([b"boom"]), timeout=5))
        assert error.value.code() == grpc.StatusCode.INTERNAL
        assert server.counters.handler_errors == 1
        assert Echo.cancelled == 1  # a call the server ended is a cancel to its handler
        # Half-closed but not finished: the call stays open until the handler finishes it,
        # even from outside its turn.
        replies = call(iter([b"x"]), timeout=10)
        assert next(replies) == b"x"
        wait_until(lambda: len(Echo.calls) == 1)
        loop.loop.call_soon_threadsafe(Echo.calls[0].send, b"later")
        assert next(replies) == b"later"
        loop.loop.call_soon_threadsafe(Echo.calls[0].finish, 9, "done here")
        with pytest.raises(grpc.RpcError) as error:
            next(replies)
        assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error.value.details() == "done here"
        with pytest.raises(grpc.RpcError) as error:
            list(channel.stream_stream("/test.Nope/Nope")(iter([b"x"]), timeout=5))
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_connections_beyond_the_limit_are_refused(echo: tuple[Loop, GrpcioServer]) -> None:
    _, server = echo  # max_connections=2
    address = f"127.0.0.1:{server.port}"
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(3)]
    try:
        results = []
        for channel in channels[:2]:
            call = channel.stream_stream("/test.Echo/Echo", request_serializer=raw,
                                         response_deserializer=raw)
            results.append(list(call(iter([b"ok", b"stop"]), timeout=5)))
        assert results == [[b"ok", b"stop"]] * 2
        call = channels[2].stream_stream("/test.Echo/Echo", request_serializer=raw,
                                         response_deserializer=raw)
        with pytest.raises(grpc.RpcError) as error:
            list(call(iter([b"ok", b"stop"]), timeout=2))
        assert error.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        for channel in channels:
            channel.close()


def test_the_command_line_selects_the_server_and_defaults_to_the_own() -> None:
    from sidecar.commands.arguments import parser as _parser

    serve = ["serve", "--config", "x.yaml", "--grpc-token-file", "t"]
    assert _parser().parse_args(serve).grpc_server == "own"
    assert _parser().parse_args([*serve, "--grpc-server", "grpcio"]).grpc_server == "grpcio"
    assert _parser().parse_args(["up"]).grpc_server == "own"
    assert _parser().parse_args(["up", "--grpc-server", "grpcio"]).grpc_server == "grpcio"
    with pytest.raises(SystemExit):
        _parser().parse_args(["up", "--grpc-server", "grpclib"])
