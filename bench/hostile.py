"""Hostile run (issue 13): drive the real stack the way an attacker and a broken peer would,
and report what it cost: inputs tried, crashes, the most memory the sidecar held, the
connections it refused or reaped, log volume. The figures go into docs/security.md.

The stack is `sidecar up --config` (real sidecar, real Envoy) with fake providers. Phases:
1. gRPC port, no token: forged ext_proc and access-log calls (refused), the memory attack
   of the issue (16 streams each declaring a 32 MiB message and sending most of it).
2. gRPC port, with the token (an insider: a compromised Envoy): the same memory attack.
3. gRPC port: 2,000 connections, half never sending the preface.
4. gRPC port: random and protocol-breaking frame sequences, each on a fresh connection.
5. Client listener: malformed HTTP and hostile JSON bodies through Envoy.
After every phase the stack must still serve a real request.
6. The surfaces of the second pass (issue 28, bench/hostile_surfaces.py), on a second stack
   at `--log-level debug`: quotas streamed around, hostile answers through bridges, duplicate
   `model` members, emoji bodies, hostile configuration files, secrets in the debug log.

Usage:  .venv/bin/python bench/hostile.py [--output bench/results/hostile.md] [--seed N]
Loopback only; it stops every process it starts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import socket
import struct
import tempfile
import time
from collections import Counter
from pathlib import Path

import hostile_surfaces
import httpx
from hostile_surfaces import channel_token, rss_mb, serves

from sidecar.devstack.harness import ProviderThread, UpProcess, pid_alive
from sidecar.devstack.providers import FakeProvider
from sidecar.grpcwire import frames as f

TOKEN = "hostile-run-caller-token"
EXT_PROC = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"
ACCESS_LOG = b"/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
MiB = 1024 * 1024


class Peak:
    """Samples a process's RSS between calls; `.mb` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.mb = rss_mb(pid)

    def sample(self) -> None:
        self.mb = max(self.mb, rss_mb(self.pid))


def request_headers(path: bytes, token: str | None = None) -> bytes:
    block = (f.literal(b":method", b"POST") + f.literal(b":scheme", b"http")
             + f.literal(b":path", path) + f.literal(b":authority", b"sidecar")
             + f.literal(b"content-type", b"application/grpc") + f.literal(b"te", b"trailers"))
    if token is not None:
        block += f.literal(b"x-sidecar-channel-token", token.encode())
    return block


def connect(port: int, preface: bool = True) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if preface:
        sock.sendall(f.PREFACE + f.settings({}))
    return sock


def drain(sock: socket.socket, seconds: float) -> bytes:
    """Read what the server sends for `seconds` (or until it closes)."""
    sock.settimeout(0.05)
    data = bytearray()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def frame_types(data: bytes) -> list[int]:
    kinds, position = [], 0
    while len(data) - position >= 9:
        length = int.from_bytes(data[position:position + 3], "big")
        kinds.append(data[position + 3])
        position += 9 + length
    return kinds


def memory_attack(port: int, peak: Peak, token: str | None) -> dict[str, object]:
    """16 streams, each a 32 MiB message prefix and then most of the message, as fast as
    the server's windows allow; the connection is held open until the server stops
    granting credit or ends the calls."""
    sock = connect(port)
    sock.settimeout(0.02)
    streams = [1 + 2 * i for i in range(16)]
    chunk = b"\0" * 16384
    for stream_id in streams:
        sock.sendall(f.frame(f.HEADERS, f.END_HEADERS, stream_id,
                             request_headers(EXT_PROC, token)))
        sock.sendall(f.frame(f.DATA, 0, stream_id, f.MESSAGE_PREFIX.pack(0, 32 * MiB)))
    sent, refused = 0, 0
    deadline = time.monotonic() + 20
    stalled_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - stalled_since < 3:
        progressed = False
        for stream_id in streams:
            try:
                sock.send(f.frame(f.DATA, 0, stream_id, chunk))
                sent += len(chunk)
                progressed = True
            except (BlockingIOError, TimeoutError):
                pass
            except OSError:
                refused += 1
                break
        try:
            answer = sock.recv(65536)
            if not answer:
                break
        except (BlockingIOError, TimeoutError):
            pass
        except OSError:
            break
        if progressed:
            stalled_since = time.monotonic()
        peak.sample()
    sock.close()
    return {"bytes_sent": sent}


def connection_flood(port: int, count: int = 2000) -> dict[str, object]:
    sockets = []
    for index in range(count):
        try:
            sockets.append(connect(port, preface=index % 2 == 0))
        except OSError:
            break
    opened = len(sockets)
    time.sleep(7)  # past the handshake timeout
    closed = 0
    for sock in sockets:  # closed by the server: EOF, or a GOAWAY waiting to be read
        answer = drain(sock, 0.002)
        closed += f.GOAWAY in frame_types(answer) or _at_eof(sock)
    for sock in sockets:
        sock.close()
    return {"opened": opened, "closed_by_server_within_7s": closed}


def _at_eof(sock: socket.socket) -> bool:
    sock.settimeout(0.001)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def protocol_fuzz(port: int, rng: random.Random, rounds: int, peak: Peak) -> dict[str, object]:
    """Random frame sequences after a valid preface: each round a fresh connection."""
    outcomes: Counter[str] = Counter()
    frames_sent = 0
    for index in range(rounds):
        try:
            sock = connect(port)
        except OSError:
            outcomes["connect refused"] += 1
            continue
        wire = bytearray()
        for _ in range(rng.randint(1, 12)):
            wire += hostile_frame(rng, index)
            frames_sent += 1
        try:
            sock.sendall(wire)
            answer = drain(sock, 0.05)
        except OSError:
            answer = b""
        kinds = frame_types(answer)
        outcomes["GOAWAY" if f.GOAWAY in kinds else "kept open"] += 1
        sock.close()
        if index % 100 == 0:
            peak.sample()
    return {"connections": rounds, "frames": frames_sent, **outcomes}


def hostile_frame(rng: random.Random, index: int) -> bytes:
    stream_id = rng.choice([0, 1, 2, 3, 5, 2**31 - 1])
    choice = rng.randrange(9)
    if choice == 0:  # window overflow or zero increment
        return f.window_update(stream_id, rng.choice([0, 2**31 - 1]))
    if choice == 1:
        return f.frame(f.HEADERS, rng.choice([0, f.END_HEADERS, f.END_HEADERS | f.END_STREAM]),
                       stream_id or 1, request_headers(EXT_PROC))
    if choice == 2:  # truncated or oversized gRPC message
        return f.frame(f.DATA, rng.choice([0, f.END_STREAM]), stream_id,
                       f.MESSAGE_PREFIX.pack(rng.choice([0, 1]), rng.choice([100, 2**31])) + b"x")
    if choice == 3:
        return f.settings({rng.randrange(1, 7): rng.choice([0, 1, 2**31, 2**32 - 1])})
    if choice == 4:
        return f.frame(f.CONTINUATION, rng.choice([0, f.END_HEADERS]), stream_id,
                       rng.randbytes(rng.randrange(0, 64)))
    if choice == 5:
        return f.frame(rng.randrange(0, 12), rng.randrange(256), stream_id,
                       rng.randbytes(rng.randrange(0, 128)))
    if choice == 6:  # a length that lies about the payload
        return struct.pack(">I", rng.randrange(2**24))[1:] + bytes([f.DATA, 0]) + struct.pack(
            ">I", stream_id) + rng.randbytes(16)
    if choice == 7:
        return f.frame(f.HEADERS, f.END_HEADERS, stream_id or 1, rng.randbytes(40))
    return f.frame(f.PING, 0, 0, rng.randbytes(rng.choice([8, 7, 9])))


HTTP_CASES = [
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models#frag HTTP/1.1\r\nHost: x\r\nanthropic-version: 1\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"get /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"FOO /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"x-h: y\r\n" * 200 + b"\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
    b"GARBAGE\r\n\r\n",
]


def http_hostile(base_port: int, rng: random.Random, count: int) -> dict[str, object]:
    statuses: Counter[str] = Counter()
    not_json = 0
    for raw in HTTP_CASES:
        statuses[raw_status(base_port, raw)] += 1
    url = f"http://127.0.0.1:{base_port}"
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    with httpx.Client(timeout=10) as client:
        for _ in range(count):
            path = rng.choice(["/v1/chat/completions", "/v1/messages", "/v1/responses"])
            response = client.post(url + path, headers=headers, content=hostile_body(rng))
            statuses[str(response.status_code)] += 1
            if response.content:
                try:
                    json.loads(response.content)
                except ValueError:
                    not_json += 1
    return {"requests": count + len(HTTP_CASES), "statuses": dict(sorted(statuses.items())),
            "non_json_bodies": not_json}


def raw_status(port: int, raw: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        answer = drain(sock, 0.5)
    match = re.match(rb"HTTP/1\.1 (\d{3})", answer)
    return match.group(1).decode() if match else "closed"


def hostile_body(rng: random.Random) -> bytes:
    choice = rng.randrange(10)
    if choice == 0:
        return b"[" * rng.randrange(1, 100_000)
    if choice == 1:
        return rng.randbytes(rng.randrange(0, 4096))
    if choice == 2:
        return json.dumps({"model": rng.choice([None, 1, [], {}, "", "x" * 5000])}).encode()
    if choice == 3:
        return b'{"model":"g","messages":[{"role":"user","content":"\\ud800"}]}'
    if choice == 4:
        return json.dumps({"model": "g", "messages": "not-a-list", "tools": 7}).encode()
    if choice == 5:
        return b'{"model":"g","model":"h","messages":[]}'
    if choice == 6:
        return json.dumps({"model": "g", "max_tokens": -1, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": 5}]}]}).encode()
    if choice == 7:
        return b'{"model":"g","messages":[' + b'{"role":"user","content":"hi"},' * 5000 + b"{}]}"
    if choice == 8:
        return json.dumps({"model": "g", "stream": "yes", "messages": [
            {"role": "system", "content": "x" * rng.randrange(100_000)}]}).encode()
    return b'{"model": "g", "messages": [], "x": 1e999999}'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--fuzz-connections", type=int, default=3000)
    parser.add_argument("--http-requests", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows: list[tuple[str, str, str]] = []
    with ProviderThread([FakeProvider("p")]) as providers, \
            tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        workdir = Path(tmp)
        config = workdir / "config.yaml"
        config.write_text(
            f"providers: {{p: {{base_url: '{providers.base_url('p')}'}}}}\n"
            f"callers: [{{name: c, token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]\n"
            "models: {g: {targets: [{provider: p, model_ref: m}]}}\n")
        up = UpProcess(["--config", str(config)], log_path=workdir / "up.log")
        with up.running():
            pid = int(up.banner_value(r"sidecar pid (\d+)"))
            start_mb = rss_mb(pid)
            peak = Peak(pid)
            grpc_port = up.ext_proc_port

            def after(phase: str, detail: object) -> None:
                peak.sample()
                ok = pid_alive(pid) and serves(up, TOKEN)
                rows.append((phase, json.dumps(detail), "yes" if ok else "NO"))
                print(f"{phase}: {detail}; still serving: {ok}", flush=True)

            memory_attack(grpc_port, peak, None)
            after("16 x 32 MiB messages, no token", {"peak_rss_mb": round(peak.mb, 1)})
            token = channel_token(up)
            insider = Peak(pid)
            memory_attack(grpc_port, insider, token)
            peak.mb = max(peak.mb, insider.mb)
            after("16 x 32 MiB messages, with the token",
                  {"peak_rss_mb": round(insider.mb, 1),
                   "held_over_start_mb": round(insider.mb - start_mb, 1)})
            after("2,000 connections, half without preface", connection_flood(grpc_port))
            after("random frame sequences", protocol_fuzz(grpc_port, rng,
                                                          args.fuzz_connections, peak))
            after("hostile HTTP through Envoy", http_hostile(up.listen_port, rng,
                                                             args.http_requests))
            status = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/status").json()
            end_mb = rss_mb(pid)
        log_bytes = (workdir / "up.log").stat().st_size
    surfaces, _ = hostile_surfaces.run(args.seed)
    lines = ["# Hostile run (bench/hostile.py)", "",
             "| phase | figures | stack still serving |", "| --- | --- | --- |",
             *(f"| {phase} | `{detail}` | {ok} |" for phase, detail, ok in rows), "",
             f"- sidecar RSS: {start_mb:.1f} MB at start, {peak.mb:.1f} MB at most, "
             f"{end_mb:.1f} MB at the end",
             f"- gRPC port counters: `{json.dumps(status.get('grpc', {}))}`",
             f"- log written during the run (sidecar and Envoy): {log_bytes / 1024:.0f} KiB",
             f"- crashes: {'none' if all(ok == 'yes' for _, _, ok in rows) else 'SEE ABOVE'}",
             "", "## Second pass (issue 28): a stack at `--log-level debug`", "",
             "| attack | figures | as wanted, stack still serving |", "| --- | --- | --- |",
             *(f"| {name} | `{json.dumps(figures)}` | {'yes' if ok else 'NO'} |"
               for name, figures, ok in surfaces)]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        args.output.write_text(report)
    passed = all(ok == "yes" for _, _, ok in rows) and all(ok for _, _, ok in surfaces)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
