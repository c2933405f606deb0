"""Benchmark: what the reply gate (docs/reply-gate.md) and the failover defaults of issue 40
cost on the happy path, side by side, in one interleaved run.

  stream_before        a streaming request in a group with the defaults before issue 40
                       (`commit_at_first_event: false`, `retry_same_target: 0`): the gate's
                       matcher skips it; the caller does not ask for usage, so the gateway
                       asks and Envoy's Lua takes it back out (envoy_config/unasked_usage.py)
  stream_asked         the same, the caller asking for usage itself: no Lua
  stream_commit        the same with the first-event commit only (`retry_same_target: 0`):
                       the sidecar holds the headers until the first event, then steps out
  stream_retry         the same with the same-target retry and its wait only
                       (`commit_at_first_event: false`): a longer attempt order, a route
                       with a rate-limited back-off
  stream_defaults      the same with today's defaults (both)
  json_before          a JSON reply with a content-length (held by Lua, read by Envoy),
                       the defaults before issue 40
  json_defaults        the same with today's defaults
  json_chunked         the same reply chunked: the gate reads it in the sidecar

For streams the latency is the time to the first event (`--requests` streams of 8 events),
for JSON the whole reply. CPU is per 1,000 requests, observations on, concurrency 1.

Usage:  .venv/bin/python bench/reply_gate_cost.py [--requests 1000] [--rounds 5] [--output F]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
from mode_runner import TOKEN, compare, publish, run_mode, table

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import Behaviour, FakeProvider

BEFORE = "fallback: {commit_at_first_event: false, retry_same_target: 0}"
TEXT = Behaviour(text="one two three four five six")
MODES = {  # mode → (group keys, provider behaviour, streamed)
    "stream_before": (BEFORE, TEXT, True),
    "stream_asked": (BEFORE, TEXT, "asked"),
    "stream_commit": ("fallback: {retry_same_target: 0}", TEXT, True),
    "stream_retry": ("fallback: {commit_at_first_event: false}", TEXT, True),
    "stream_defaults": ("", TEXT, True),
    "json_before": (BEFORE, Behaviour(), False),
    "json_defaults": ("", Behaviour(), False),
    "json_chunked": ("", Behaviour(chunked_json=True), False),
}


def load(streamed: bool | str):
    async def run(port: int, count: int) -> list[float]:
        body = {"model": "g", "messages": [{"role": "user", "content": "x" * 900}],
                "stream": bool(streamed)}
        if streamed == "asked":
            body["stream_options"] = {"include_usage": True}
        results = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10,
                                     headers={"authorization": f"Bearer {TOKEN}"}) as client:
            for _ in range(count):
                started = time.perf_counter()
                async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                    assert reply.status_code == 200
                    first = None
                    async for _ in reply.aiter_raw():
                        first = first or time.perf_counter()
                results.append(((first if streamed else time.perf_counter()) - started)
                               * 1000)
        return results
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    provider = FakeProvider("bench")
    with ProviderThread([provider]) as providers, tempfile.TemporaryDirectory() as workdir:
        def one(mode: str) -> dict[str, float]:
            group, behaviour, streamed = MODES[mode]
            provider.behaviour = behaviour
            return run_mode(mode, providers.base_url("bench"), Path(workdir), args.requests,
                            load(streamed), observations=True, settle_s=0.5, group=group)
        medians = compare(tuple(MODES), args.rounds, one)
    title = (f"The reply gate and the failover defaults: {args.rounds} interleaved rounds "
             f"of {args.requests} requests, "
             "concurrency 1, medians (streams: time to first event)")
    publish(table(title, medians), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
