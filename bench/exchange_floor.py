"""The floor of a Python ext_proc exchange (issue #32): what the sidecar's own gRPC server
costs per request when the answers are as cheap as they can be, against the real sidecar.

Rows, alternating round by round as side_by_side.py runs them (wrk at c32 and c1, 1 KB
chat bodies, a distinct conversation each):

  Envoy alone      a plain proxy to the fast provider
  full             the SPEC group's stack as rendered (keys in, telemetry off)
  empty answers    the same bootstrap, its route naming the first target (no attempt
                   order to read), and in place of the sidecar a process of this script
                   serving the same port with the project's gRPC server (grpcwire, channel
                   token, health) whose ext_proc answers are empty (continue, no mutation;
                   encoded once) and whose access-log receiver drops every entry unread

The third row's sidecar CPU is what any decision written on this server pays before it
decides anything: HTTP/2, gRPC framing and the event loop for two messages each way and
an access-log entry. Provider keys are in Envoy as in `envoy_pieces.py`.

Usage:  .venv/bin/python bench/exchange_floor.py [--rounds 3] [--seconds 4]
            [--output bench/results/exchange_floor.md]
Loopback only; every process it starts it also stops. wrk from Debian's package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench_processes import TOKEN, Processes, sidecar_stack, start_envoy_direct
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy_pieces import KEY_ENV, config_with_keys, without_priority_group
from mode_runner import publish
from side_by_side import CHAT_PATH, Row, Started, alternate

from sidecar.devstack.harness import ProviderThread
from sidecar.extproc.processor import METHOD, SERVICE
from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire.auth import ChannelAuth, read_channel_token
from sidecar.grpcwire.call import Call
from sidecar.grpcwire.health import add_health
from sidecar.observe.access_log import AccessLogReceiver

_HEADERS = ext.ProcessingResponse(request_headers=ext.HeadersResponse()).SerializeToString()
_BODY = ext.ProcessingResponse(request_body=ext.BodyResponse()).SerializeToString()
_ALS_DONE = b""


class EmptyAnswers:
    """One ext_proc stream answered without reading more than the message's kind."""

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        kind = ext.ProcessingRequest.FromString(payload).WhichOneof("request")
        if kind == "request_headers":
            call.send(_HEADERS)
        else:
            call.send(_BODY)
            call.finish()

    def on_half_close(self, call: Call) -> None:
        call.finish()

    def on_cancel(self) -> None:
        pass


class DroppedLogs:
    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        pass

    def on_half_close(self, call: Call) -> None:
        call.send(_ALS_DONE)
        call.finish()

    def on_cancel(self) -> None:
        pass


async def serve(port: int, token_file: Path) -> None:
    server = GrpcServer(auth=ChannelAuth(read_channel_token(token_file)))
    server.add_method(SERVICE, METHOD, EmptyAnswers)
    server.add_method(AccessLogReceiver.SERVICE, AccessLogReceiver.METHOD, DroppedLogs)
    server.health = add_health(server, [SERVICE])
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


def rows(fast_port: int, drip: ProviderThread, _workdir: Path) -> list[Row]:
    drip_url = drip.base_url("drip")
    drip_path = "/drip" + CHAT_PATH

    def envoy(work: Path) -> Started:
        processes, port = start_envoy_direct(work, fast_port, drip.server.port)
        return Started(processes, port, "m", port, drip_path, "drip-model")

    def stack(empty: bool) -> Callable[[Path], Started]:
        def start(work: Path) -> Started:
            text = config_with_keys(fast_port, drip_url, TOKEN)
            running, port = sidecar_stack(work, "dynamic_score", fast_port, drip_url, "",
                                          config_text=text,
                                          edit=without_priority_group if empty else None)
            if empty:  # the same port, served by the empty answers instead; the route
                # names a JSON target, so the stream probe goes to the demo provider
                _swap_sidecar(running)
                return Started(running, port, "adaptive-agent", drip.server.port, drip_path,
                               "drip-model")
            return Started(running, port, "adaptive-agent", port, CHAT_PATH, "stream-group")
        return start

    return [Row("Envoy alone", envoy), Row("full", stack(False)),
            Row("empty answers", stack(True))]


def _swap_sidecar(running: Processes) -> None:
    """Stop the real sidecar (a process `sidecar_stack` started) and serve its port, read
    from its command line, with this script's empty answers; Envoy's next health check
    (every second) finds the port serving again."""
    real = running.named["sidecar"]
    arguments = real.args
    port = int(arguments[arguments.index("--listen") + 1].rsplit(":", 1)[1])
    token_file = Path(arguments[arguments.index("--grpc-token-file") + 1])
    real.kill()
    real.wait(10)
    running.named["sidecar"] = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--token-file", str(token_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            break
        time.sleep(0.1)
    time.sleep(2.5)  # Envoy's gRPC health check: every second, healthy after one answer


def report(table: list[Row], rounds: int, seconds: float) -> str:
    medians = {row.name: {key: statistics.median(r[key] for r in row.results)
                          for key in row.results[0]} for row in table if row.results}
    alone = medians["Envoy alone"]["cpu_envoy"] * 1000
    lines = [f"## The exchange's floor: {rounds} alternating rounds, {seconds:g} s per load "
             "phase; medians", "",
             "| row | req/s c32 | Envoy µs/req | sidecar µs/req | sidecar × Envoy alone | "
             "p50 / p99 ms c1 |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, m in medians.items():
        envoy_us = m["cpu_envoy"] * 1000
        sidecar_us = m.get("cpu_sidecar", 0.0) * 1000
        lines.append(f"| {name} | {m['rps_c32']:,.0f} | {envoy_us:.0f} | {sidecar_us:.0f} | "
                     f"{sidecar_us / alone:.2f} | {m['p50_c1']:.2f} / {m['p99_c1']:.2f} |")
    lines += ["", f"Envoy alone: {alone:.0f} µs of Envoy CPU per request. `empty answers`: "
              "the project's gRPC server answering every ext_proc message with an empty "
              "answer and dropping access-log entries unread — the floor of any decision "
              "served this way."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--streams", type=int, default=5)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--token-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.token_file))
        return 0
    os.environ.setdefault(KEY_ENV, "bench-provider-key")
    table, _ = alternate(rows, args.rounds, args.seconds, args.streams)
    publish(report(table, args.rounds, args.seconds), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
