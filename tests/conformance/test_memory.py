"""What a peer can make the server hold: memory for unfinished messages is reserved against a
per-connection and a server-wide cap; a message that does not fit ends its call with
RESOURCE_EXHAUSTED. Measured through `counters.buffered_bytes` and, for the full-size attack,
through the peak RSS of a server in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from sidecar.grpcwire.limits import ServerLimits
from tests.conformance.clients import H2Client, grpc_message
from tests.conformance.conftest import HOLD, MiB, ServerThread

ROOT = Path(__file__).resolve().parents[2]


def _attack(client: H2Client, streams: int, declared: int, send: int) -> list[int]:
    """`streams` calls, each declaring a `declared`-byte message and sending `send` bytes
    of it (never all), obeying flow control; returns the bytes each got out."""
    ids = [client.open(HOLD) for _ in range(streams)]
    sent = [client.send(stream_id, grpc_message(b"", declared=declared)) for stream_id in ids]
    chunk = b"\xab" * MiB
    for index, stream_id in enumerate(ids):
        while sent[index] < send:
            piece = chunk[:min(len(chunk), send - sent[index])]
            got = client.send(stream_id, piece, timeout=10)
            sent[index] += got
            if got < len(piece):
                break  # reset, or no more credit
    return sent


def test_unfinished_messages_are_capped_per_connection_and_in_total() -> None:
    limits = ServerLimits(max_message_bytes=MiB, connection_buffer_bytes=3 * MiB,
                          total_buffer_bytes=5 * MiB)
    running = ServerThread(limits)
    try:
        first, second = H2Client(running.port), H2Client(running.port)
        with first, second:
            _attack(first, 8, MiB, MiB - 100)
            counters = running.counters()
            # three framed 1 MiB messages are 15 bytes too many for 3 MiB: two fit
            assert counters["buffered_bytes"] == 2 * (MiB + 5)
            assert counters["calls_resource_exhausted"] == 6
            for stream_id in sorted(first.replies)[2:]:  # ended at once, trailers only
                assert first.wait(stream_id).headers["grpc-status"] == "8"
            _attack(second, 8, MiB, MiB - 100)
            counters = running.counters()
            assert counters["buffered_bytes"] == 4 * (MiB + 5) <= 5 * MiB
            assert counters["calls_resource_exhausted"] == 12
            with H2Client(running.port) as third:  # the total cap, now
                _attack(third, 2, MiB, MiB - 100)
                counters = running.counters()
                assert counters["buffered_bytes"] == 4 * (MiB + 5)
                assert counters["calls_resource_exhausted"] == 14
        counters = running.wait_for(lambda c: c["connections_open"] == 0)
        assert counters["buffered_bytes"] == 0
    finally:
        running.close()


def test_finished_and_reset_calls_give_their_reservation_back() -> None:
    running = ServerThread(ServerLimits(max_message_bytes=MiB, connection_buffer_bytes=3 * MiB))
    try:
        with H2Client(running.port) as client:
            _attack(client, 2, MiB, MiB // 2)
            assert running.counters()["buffered_bytes"] == 2 * (MiB + 5)
            first, second = sorted(client.replies)
            client.conn.reset_stream(first)
            client.send(second, b"\x00" * (MiB - MiB // 2), end_stream=True)
            client.wait(second)
            assert running.wait_for(lambda c: c["buffered_bytes"] == 0)["buffered_bytes"] == 0
            reply = client.unary(HOLD, b"y" * (MiB - 1000))  # and the room is there again
            assert reply.status == "0"
    finally:
        running.close()


def test_the_sixteen_by_32_mib_attack_holds_at_most_the_cap() -> None:
    """The reported attack, against a server in its own process configured as the sidecar
    configures it (messages up to the default request body limit + 1 MiB): one connection,
    16 calls, each declaring ~32 MiB and sending all but a little of it."""
    limits = ServerLimits.for_message_size(33 * MiB)
    cap = limits.connection_buffer_bytes
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.rss_server", json.dumps({
            "max_message_bytes": limits.max_message_bytes,
            "connection_buffer_bytes": limits.connection_buffer_bytes,
            "total_buffer_bytes": limits.total_buffer_bytes})],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None

    def stats() -> dict:
        process.stdin.write("stats\n")
        process.stdin.flush()
        return json.loads(process.stdout.readline())

    try:
        before = json.loads(process.stdout.readline())
        with H2Client(before["port"]) as client:
            sent = _attack(client, 16, 32 * MiB, 32 * MiB - 4096)
            during = stats()
        deadline = time.monotonic() + 20
        after = stats()
        while after["counters"]["connections_open"] and time.monotonic() < deadline:
            time.sleep(0.05)
            after = stats()
    finally:
        process.stdin.close()
        process.wait(30)
    growth = during["peak_rss"] - before["peak_rss"]
    # two of the calls got their room and sent everything; the other 14 ended at their
    # prefix (whatever the client sent on them before it read so was discarded)
    assert sent[:2] == [32 * MiB - 4096] * 2, sent
    assert during["counters"]["buffered_bytes"] == 2 * (5 + 32 * MiB) <= cap
    assert during["counters"]["calls_resource_exhausted"] == 14
    assert growth <= cap + 64 * MiB, (growth, sent)
    assert after["counters"]["buffered_bytes"] == 0
