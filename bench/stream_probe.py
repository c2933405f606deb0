"""Streaming figures at concurrency 1: time to the first SSE event and the gaps between
events, read from the raw socket (no SDK in between)."""

from __future__ import annotations

import itertools
import json
import socket
import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamFigures:
    ttfb_p50_ms: float
    ttfb_p99_ms: float
    mean_gap_ms: float
    events: int  # per stream
    ttfbs_ms: tuple[float, ...] = ()  # every stream's, for pooling over batches


def _one(port: int, path: str, model: str, token: str) -> tuple[float, list[float]]:
    body = json.dumps({"model": model, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "stream please"}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {token}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.perf_counter()
        sock.sendall(head + body)
        arrivals: list[float] = []
        buffer = b""
        status_checked = False
        done = False
        while not done:
            data = sock.recv(65536)
            if not data:
                break
            now = time.perf_counter()
            buffer += data
            if not status_checked and b"\r\n" in buffer:
                status = buffer.split(b"\r\n", 1)[0]
                if b" 200 " not in status:
                    raise RuntimeError(f"stream request failed: {buffer[:300]!r}")
                status_checked = True
            # Each SSE event ends with a blank line; count the ones that arrived now.
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if b"data:" in event:
                    arrivals.append(now)
                done = done or b"data: [DONE]" in event
    if not arrivals:
        raise RuntimeError("no SSE event arrived")
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
    return (arrivals[0] - started) * 1000, gaps


def probe_streams(port: int, path: str, model: str, token: str, count: int) -> StreamFigures:
    ttfbs, gaps, events = [], [], []
    for _ in range(count):
        ttfb, stream_gaps = _one(port, path, model, token)
        ttfbs.append(ttfb)
        gaps.extend(stream_gaps)
        events.append(len(stream_gaps) + 1)
    ttfbs.sort()
    return StreamFigures(statistics.median(ttfbs), ttfbs[max(0, int(len(ttfbs) * .99) - 1)],
                         statistics.fmean(gaps) if gaps else 0.0, min(events), tuple(ttfbs))
