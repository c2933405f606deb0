"""What a peer WITHOUT the channel token can cost the server (the security review of the
open methods and control frames): open-method (health) calls get their own small budget
(a few per connection, one request message each, a deadline, a server-wide reservation
budget apart from the authenticated calls' caps), queued output is capped per call and per
connection, control-frame floods end the connection with GOAWAY ENHANCE_YOUR_CALM, and
unauthenticated connections have their own, smaller share of the connection slots.

Most tests run a connection on a fake transport with an injectable clock and a fake loop:
no sleeps, no timing assertions."""

from __future__ import annotations

import hpack

from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire import frames as f
from sidecar.grpcwire.auth import CHANNEL_TOKEN_HEADER, ChannelAuth
from sidecar.grpcwire.connection import Connection
from sidecar.grpcwire.health import add_health
from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import (
    AbortableTransport,
    Clock,
    FakeLoop,
    H2Client,
    RawClient,
    goaway_code,
    grpc_message,
    request_headers,
    status_of,
)
from tests.conformance.conftest import COLLECT, HEALTH, SERVICE, Collect, Linger, MiB, ServerThread

TOKEN = "k" * 40
GOOD = ((CHANNEL_TOKEN_HEADER, TOKEN),)
WATCH = "/grpc.health.v1.Health/Watch"
LINGER = f"/{SERVICE}/Linger"


def make_server(**limits) -> tuple[GrpcServer, Clock]:
    clock = Clock()
    base = ServerLimits(max_message_bytes=MiB, connection_buffer_bytes=4 * MiB,
                        total_buffer_bytes=8 * MiB)
    server = GrpcServer(base.with_changes(**limits) if limits else base,
                        auth=ChannelAuth(TOKEN), clock=clock)
    server.add_method(SERVICE, "Collect", Collect)
    server.add_method(SERVICE, "Linger", Linger)
    add_health(server, [SERVICE])
    return server, clock


class Peer:
    """A connection on a fake transport and fake loop, and an HPACK encoder for it."""

    def __init__(self, server: GrpcServer, clock: Clock, handshake: bool = True,
                 settings: dict[int, int] | None = None) -> None:
        self.loop = FakeLoop(clock)
        self.connection = Connection(server, self.loop)  # type: ignore[arg-type]
        self.transport = AbortableTransport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.frames: list = []
        if handshake:
            self.send(f.PREFACE + f.settings(settings or {}))

    def send(self, *chunks: bytes) -> None:
        self.connection.data_received(b"".join(chunks))
        self.frames += self.transport.frames()

    def open(self, stream_id: int, path: str, token: bool = False,
             end_stream: bool = False) -> bytes:
        block = self.encoder.encode(request_headers(path, GOOD if token else ()))
        flags = f.END_HEADERS | (f.END_STREAM if end_stream else 0)
        return f.frame(f.HEADERS, flags, stream_id, block)

    def status(self, stream_id: int) -> str:
        return status_of(self.frames, stream_id, hpack.Decoder())

    @property
    def goaway(self) -> int | None:
        self.frames += self.transport.frames()  # (also what was sent outside a read)
        return goaway_code(self.frames)

    @property
    def closed(self) -> bool:
        return self.transport.closed


def check_request(service: str = "") -> bytes:
    from grpc_health.v1 import health_pb2
    return health_pb2.HealthCheckRequest(service=service).SerializeToString()


# --- item 1: open-method calls get their own tiny budget --------------------------------------

def test_open_method_calls_per_connection_are_capped() -> None:
    server, clock = make_server()
    peer = Peer(server, clock)
    limit = server.limits.max_open_method_calls
    assert limit == 4
    for n in range(limit + 2):  # each sends only a prefix declaring 4,096 bytes
        stream_id = 1 + 2 * n
        peer.send(peer.open(stream_id, HEALTH),
                  f.frame(f.DATA, 0, stream_id, grpc_message(b"", declared=4096)))
    assert [peer.status(1 + 2 * n) for n in range(limit + 2)] == [""] * limit + ["8", "8"]
    assert server.counters.buffered_bytes == 0  # never the authenticated calls' caps
    assert server.counters.open_method_buffered_bytes == limit * 4101
    assert server.counters.calls_resource_exhausted == 2


def test_open_method_reservations_have_a_small_server_wide_budget() -> None:
    server, clock = make_server(open_method_buffer_bytes=3 * 4101)
    peers = [Peer(server, clock) for _ in range(2)]
    for peer in peers:
        for stream_id in (1, 3):
            peer.send(peer.open(stream_id, HEALTH),
                      f.frame(f.DATA, 0, stream_id, grpc_message(b"", declared=4096)))
    assert server.counters.open_method_buffered_bytes == 3 * 4101
    assert [peers[1].status(1), peers[1].status(3)] == ["", "8"]
    assert server.counters.buffered_bytes == 0


def test_an_incomplete_open_method_message_ends_at_its_deadline() -> None:
    server, clock = make_server()
    peer = Peer(server, clock)
    peer.send(peer.open(1, HEALTH), f.frame(f.DATA, 0, 1, grpc_message(b"", declared=4096)))
    peer.send(peer.open(3, HEALTH))  # a call that never sends its message at all
    assert server.counters.open_method_buffered_bytes == 4101
    timeout = server.limits.open_method_timeout
    peer.loop.advance_to(timeout * 0.9)
    assert peer.status(1) == "" and peer.status(3) == ""
    peer.loop.advance_to(timeout + 0.01)
    peer.frames += peer.transport.frames()
    assert peer.status(1) == "8" and peer.status(3) == "8"
    assert server.counters.open_method_buffered_bytes == 0
    assert peer.connection.open_calls == 0


def test_a_health_call_takes_exactly_one_request_message() -> None:
    server, clock = make_server()
    peer = Peer(server, clock)
    request = grpc_message(check_request())
    peer.send(peer.open(1, WATCH), f.frame(f.DATA, 0, 1, request))
    answers = [p for kind, _, s, p in peer.frames if kind == f.DATA and s == 1]
    assert len(answers) == 1 and peer.status(1) == ""
    peer.send(f.frame(f.DATA, 0, 1, request * 5))  # a second message ends the call
    answers = [p for kind, _, s, p in peer.frames if kind == f.DATA and s == 1]
    assert len(answers) == 1
    assert peer.status(1) not in ("", "0")
    # a second message cut short (only its prefix) ends the call at once too
    peer.send(peer.open(3, WATCH), f.frame(f.DATA, 0, 3, request))
    peer.send(f.frame(f.DATA, 0, 3, grpc_message(b"", declared=4000)))
    assert peer.status(3) not in ("", "0")
    assert server.counters.open_method_buffered_bytes == 0


def test_open_method_floods_leave_authenticated_bodies_their_room() -> None:
    """The reported attack, scaled down: peers without the token open health calls that
    each send a prefix declaring 4,096 bytes; an authenticated call with a large body cut
    across frames still gets its reservation."""
    server, clock = make_server(total_buffer_bytes=4 * MiB)
    for _ in range(7):
        peer = Peer(server, clock)
        for n in range(40):
            stream_id = 1 + 2 * n
            peer.send(peer.open(stream_id, HEALTH),
                      f.frame(f.DATA, 0, stream_id, grpc_message(b"", declared=4096)))
    assert server.counters.buffered_bytes == 0
    envoy = Peer(server, clock)
    body = grpc_message(b"x" * (MiB - 10))
    envoy.send(envoy.open(1, COLLECT, token=True), f.frame(f.DATA, 0, 1, body[:1000]))
    assert server.counters.buffered_bytes == len(body)
    for start in range(1000, len(body), 200_000):
        envoy.send(f.frame(f.DATA, 0, 1, body[start:start + 200_000]))
    envoy.send(f.frame(f.DATA, f.END_STREAM, 1, b""))
    assert envoy.status(1) == "0"


# --- item 2: queued output is bounded ----------------------------------------------------------

def test_watch_with_a_closed_window_queues_nothing_without_bound() -> None:
    server, clock = make_server()
    peer = Peer(server, clock, settings={f.SETTINGS_INITIAL_WINDOW_SIZE: 0})
    request = grpc_message(b"")
    peer.send(peer.open(1, WATCH), f.frame(f.DATA, 0, 1, request))
    for _ in range(200):
        if peer.closed:
            break
        peer.send(f.frame(f.DATA, 0, 1, request * 100))
    queued = sum(len(c.pending_data) for c in peer.connection._calls.values())
    assert queued < 64


class Flood:
    """An authenticated handler that answers each message with `size` bytes."""

    size = 100_000

    def on_message(self, call, payload) -> None:
        call.send(b"z" * Flood.size)

    def on_half_close(self, call) -> None:
        call.finish()

    def on_cancel(self) -> None:
        pass


def test_queued_output_is_capped_per_call_and_per_connection() -> None:
    Flood.size = 100_000
    server, clock = make_server(connection_output_bytes=3 * MiB)
    server.add_method(SERVICE, "Flood", Flood)
    peer = Peer(server, clock, settings={f.SETTINGS_INITIAL_WINDOW_SIZE: 0})
    path = f"/{SERVICE}/Flood"
    peer.send(peer.open(1, path, token=True))
    for _ in range(30):  # 3 MB of answers against a per-call cap of 2 x (1 MiB + 5)
        peer.send(f.frame(f.DATA, 0, 1, grpc_message(b"go")))
        if peer.status(1):
            break
    assert peer.status(1) == "8"
    assert not peer.closed
    limit = 2 * (MiB + 5)
    assert all(len(c.pending_data) <= limit for c in peer.connection._calls.values())
    # many calls, each under its cap: the connection's cap ends the connection
    Flood.size = MiB
    for n in range(1, 6):
        stream_id = 1 + 2 * n
        peer.send(peer.open(stream_id, path, token=True),
                  f.frame(f.DATA, 0, stream_id, grpc_message(b"go")))
        if peer.closed:
            break
    assert peer.closed and peer.goaway == f.ENHANCE_YOUR_CALM
    assert server.counters.flood_closed == 1


# --- item 3: control-frame floods --------------------------------------------------------------

def _flood(frame_for, server_limits=None) -> tuple[Peer, GrpcServer, Clock]:
    server, clock = make_server(**(server_limits or {}))
    peer = Peer(server, clock)
    for n in range(1000):
        peer.send(frame_for(peer, n))
        if peer.closed:
            break
    return peer, server, clock


def _ping(peer: Peer, n: int) -> bytes:
    return f.frame(f.PING, 0, 0, b"12345678")


def _settings(peer: Peer, n: int) -> bytes:
    return f.settings({})


def _open_and_reset(peer: Peer, n: int) -> bytes:
    return peer.open(1 + 2 * n, HEALTH) + f.rst_stream(1 + 2 * n, f.CANCEL)


def _refused(peer: Peer, n: int) -> bytes:
    return peer.open(1 + 2 * n, COLLECT, end_stream=True)


def _empty_data(peer: Peer, n: int) -> bytes:
    head = peer.open(1, LINGER, token=True) if n == 0 else b""
    return head + f.frame(f.DATA, 0, 1, b"")


def _empty_continuation(peer: Peer, n: int) -> bytes:
    if n == 0:
        block = peer.encoder.encode(request_headers(LINGER, GOOD))
        return f.frame(f.HEADERS, 0, 1, block)
    return f.frame(f.CONTINUATION, 0, 1, b"")


def test_control_frame_floods_end_the_connection_with_enhance_your_calm() -> None:
    for frame_for in (_ping, _settings, _open_and_reset, _refused, _empty_data,
                      _empty_continuation):
        peer, server, _ = _flood(frame_for)
        assert peer.closed, frame_for.__name__
        assert peer.goaway == f.ENHANCE_YOUR_CALM, frame_for.__name__
        assert server.counters.flood_closed == 1, frame_for.__name__


def test_control_frames_within_their_rate_are_fine() -> None:
    server, clock = make_server()
    peer = Peer(server, clock)
    step = 1.0 / server.limits.flood_rate
    for _ in range(3 * server.limits.flood_burst):
        clock.now += step
        peer.send(f.frame(f.PING, 0, 0, b"12345678"), f.settings({}))
    assert not peer.closed and server.counters.flood_closed == 0


def test_a_connection_is_closed_after_too_many_unauthenticated_calls() -> None:
    server, clock = make_server(flood_burst=10_000)
    peer = Peer(server, clock)
    limit = server.limits.max_unauthenticated_calls
    assert limit == 100
    for n in range(limit + 1):
        clock.now += 10  # slow enough for every rate limit
        peer.send(peer.open(1 + 2 * n, HEALTH), f.frame(f.DATA, f.END_STREAM, 1 + 2 * n,
                                                        grpc_message(check_request())))
        if peer.closed:
            break
    assert peer.closed and peer.goaway == f.ENHANCE_YOUR_CALM
    assert n == limit
    # an authenticated connection makes as many calls as it likes
    envoy = Peer(server, clock)
    for n in range(limit + 50):
        envoy.send(envoy.open(1 + 2 * n, COLLECT, token=True, end_stream=True))
    assert not envoy.closed


def test_health_calls_with_the_token_are_envoys_and_never_spend_the_unauthenticated_budget(
        ) -> None:
    """Issue 40, observation 1: Envoy health-checks the sidecar once a second over one
    connection; with the token those calls authenticate it, so the budget for calls without
    the token never closes it (it did after 100 checks, and /ready flapped)."""
    server, clock = make_server(flood_burst=10_000)
    envoy = Peer(server, clock)
    limit = server.limits.max_unauthenticated_calls
    for n in range(3 * limit):
        clock.now += 1  # Envoy's cadence
        envoy.send(envoy.open(1 + 2 * n, HEALTH, token=True),
                   f.frame(f.DATA, f.END_STREAM, 1 + 2 * n, grpc_message(check_request())))
    assert not envoy.closed and server.counters.flood_closed == 0
    assert envoy.status(1 + 2 * (3 * limit - 1)) == "0"
    # a wrong token is no token: that peer keeps the small budget
    server.auth = ChannelAuth("w" * 40)
    stranger = Peer(server, clock)
    for n in range(limit + 1):
        clock.now += 10
        stranger.send(stranger.open(1 + 2 * n, HEALTH, token=True),
                      f.frame(f.DATA, f.END_STREAM, 1 + 2 * n, grpc_message(check_request())))
    assert stranger.closed and stranger.goaway == f.ENHANCE_YOUR_CALM


# --- item 5: connection slots ------------------------------------------------------------------

def test_unauthenticated_connections_have_their_own_smaller_share_of_slots() -> None:
    server, clock = make_server(max_unauthenticated_connections=3)
    envoy = Peer(server, clock)
    envoy.send(envoy.open(1, LINGER, token=True))  # authenticated: never evicted
    idle = [Peer(server, clock) for _ in range(3)]
    for peer in idle:
        peer.send(peer.open(1, WATCH), f.frame(f.DATA, 0, 1, grpc_message(b"")))
    assert not any(peer.closed for peer in idle)
    newcomer = Peer(server, clock)  # the oldest unauthenticated connection makes room
    assert idle[0].closed and not any(p.closed for p in idle[1:]) and not newcomer.closed
    assert idle[0].goaway == f.ENHANCE_YOUR_CALM
    assert not envoy.closed
    assert server.counters.connections_evicted == 1


# --- item 4 (own server's half): a repeated token header ------------------------------------

def test_a_call_carrying_the_token_header_twice_is_refused() -> None:
    server, clock = make_server()
    peer = Peer(server, clock)
    block = peer.encoder.encode(request_headers(COLLECT, [*GOOD, (CHANNEL_TOKEN_HEADER, "x")]))
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block))
    block = peer.encoder.encode(request_headers(COLLECT, [(CHANNEL_TOKEN_HEADER, "x"), *GOOD]))
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, block))
    assert peer.status(1) == "16" and peer.status(3) == "16"
    assert server.counters.unauthenticated_calls == 2


# --- over real sockets ---------------------------------------------------------------------------

def test_health_floods_without_the_token_do_not_starve_authenticated_calls() -> None:
    running = ServerThread(ServerLimits(max_message_bytes=MiB, connection_buffer_bytes=4 * MiB,
                                        total_buffer_bytes=4 * MiB), auth=ChannelAuth(TOKEN))
    try:
        attackers = [RawClient(running.port) for _ in range(3)]
        for client in attackers:
            for n in range(30):
                client.send(client.headers(1 + 2 * n, HEALTH),
                            f.frame(f.DATA, 0, 1 + 2 * n, grpc_message(b"", declared=4096)))
        running.wait_for(lambda c: c["calls_resource_exhausted"] >= 3 * 26 or
                         c["flood_closed"] >= 3, timeout=20)
        assert running.counters()["buffered_bytes"] == 0
        with H2Client(running.port) as envoy:
            reply = envoy.unary(COLLECT, b"b" * (MiB - 100), metadata=GOOD)
            assert reply.status == "0" and reply.messages() == [str(MiB - 100).encode()]
        for client in attackers:
            client.sock.close()
    finally:
        running.close()


def test_envoys_resets_of_finished_calls_are_never_charged() -> None:
    """Envoy resets each finished ext_proc stream; at thousands of requests a second those
    resets (of calls the server has already forgotten) must not spend a flood budget on an
    authenticated connection (found by bench/hostile.py: 503s through Envoy)."""
    server, clock = make_server()
    peer = Peer(server, clock)
    message = grpc_message(b"x")
    for n in range(10 * server.limits.flood_burst):
        stream_id = 1 + 2 * n
        peer.send(peer.open(stream_id, COLLECT, token=True),
                  f.frame(f.DATA, f.END_STREAM, stream_id, message))
        peer.send(f.rst_stream(stream_id, f.CANCEL))  # after the call has ended
    assert not peer.closed and server.counters.flood_closed == 0
