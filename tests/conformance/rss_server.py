"""A GrpcServer in a process of its own, for memory measurements (test_memory.py).

Prints one JSON line with its port and peak RSS, then answers each `stats` line on stdin
with another (peak and current RSS, the server's counters); stops when stdin closes."""

from __future__ import annotations

import asyncio
import json
import sys
import threading

from sidecar.grpcwire import Call, GrpcServer
from sidecar.grpcwire.limits import ServerLimits


class Hold:
    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        pass

    def on_half_close(self, call: Call) -> None:
        call.finish()

    def on_cancel(self) -> None:
        pass


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _stats(server: GrpcServer) -> str:
    return json.dumps({"port": server.port, "peak_rss": _status_kib("VmHWM") * 1024,
                       "rss": _status_kib("VmRSS") * 1024,
                       "counters": server.counters.as_dict()})


async def main(limits: dict) -> None:
    server = GrpcServer(ServerLimits(**limits))
    server.add_method("test.Conformance", "Hold", Hold)
    await server.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def answer() -> None:
        print(_stats(server), flush=True)

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip() == "stats":
                loop.call_soon_threadsafe(answer)
        loop.call_soon_threadsafe(done.set)

    print(_stats(server), flush=True)
    threading.Thread(target=read_commands, daemon=True).start()
    await done.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
