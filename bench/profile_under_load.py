"""Where the sidecar's CPU goes under load (issue #32): the stack of `envoy_pieces.py`'s
`full` row (the SPEC group with provider keys, telemetry off) under wrk at concurrency 32,
while py-spy samples the sidecar process; Envoy's and the sidecar's user/kernel CPU split
from /proc over the same window.

py-spy is not a project dependency: install it anywhere (`pip install py-spy` into any
venv) and pass its path with `--py-spy` (default: `py-spy` on PATH). Without it the script
still reports the CPU split.

Output: the share of samples by function (self time, top N) and by area of the code
(inclusive: the first frame of the stack that falls in each area), Markdown.

Usage:  .venv/bin/python bench/profile_under_load.py [--seconds 10] [--py-spy PATH]
        [--strategy dynamic_score] [--output F]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from bench_processes import TOKEN, fast_provider, sidecar_stack, wait_http
from envoy_pieces import KEY_ENV, config_with_keys
from mode_runner import publish
from wrk_load import run_wrk

from sidecar.devstack.harness import ProviderThread
from sidecar.devstack.providers import FakeProvider

CHAT_PATH = "/v1/chat/completions"

# Areas by module path; a sample counts for the innermost area of its stack (framing is
# at the root of every stack: it calls everything else).
AREAS = (
    ("access-log ingestion", ("sidecar/observe/",)),
    ("routing decision", ("sidecar/routing/",)),
    ("gateway (request summary, auth, quotas, cache)", ("sidecar/gateway/", "sidecar/dialects/",
                                                          "sidecar/quotas/", "sidecar/cache/")),
    ("ext_proc adapter (protobuf in/out)", ("sidecar/extproc/",)),
    ("HTTP/2 + gRPC framing", ("sidecar/grpcwire/",)),
    ("telemetry", ("sidecar/telemetry/",)),
)


def _ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])  # utime, stime (clock ticks)


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    return stack.split(";"), int(count)


def _area(frame: str) -> str | None:
    for name, parts in AREAS:
        if any(part in frame for part in parts):
            return name
    return None


def summarize(raw: str, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        frames, count = _frames(line)
        total += count
        own[re.sub(r":\d+\)$", ")", frames[-1])] += count  # per function, not line
        area = next((a for a in map(_area, reversed(frames)) if a is not None), None)
        leaf = frames[-1]
        if area is None:
            area = ("socket writes / reads (uvloop, kernel)" if "uvloop" in leaf or "send" in leaf
                    else "event loop and the rest")
        areas[area] += count
    lines = [f"Samples: {total}", "", "| area (innermost in the stack) | share |",
             "| --- | ---: |"]
    lines += [f"| {name} | {n / total:.1%} |" for name, n in areas.most_common()]
    lines += ["", f"| function (self, top {top}) | share |", "| --- | ---: |"]
    lines += [f"| `{name.replace('|', '/')}` | {n / total:.1%} |"
              for name, n in own.most_common(top)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--strategy", default="dynamic_score")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    os.environ.setdefault(KEY_ENV, "bench-provider-key")
    drip = FakeProvider("drip")
    with ProviderThread([drip]) as drip_server, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        provider, fast_port = fast_provider(workdir)
        wait_http(fast_port, CHAT_PATH)
        config = config_with_keys(fast_port, drip_server.base_url("drip"), TOKEN,
                                  args.strategy)
        stack, port = sidecar_stack(workdir, args.strategy, fast_port, "", "",
                                    config_text=config)
        try:
            run_wrk(port, CHAT_PATH, "adaptive-agent", TOKEN, 32, 3)  # warm-up
            pids = {name: stack.named[name].pid for name in ("envoy", "sidecar")}
            before = {name: _ticks(pid) for name, pid in pids.items()}
            result: dict[str, object] = {}
            load = threading.Thread(target=lambda: result.update(
                wrk=run_wrk(port, CHAT_PATH, "adaptive-agent", TOKEN, 32, args.seconds)))
            load.start()
            raw = ""
            if args.py_spy:
                out = workdir / "profile.txt"
                subprocess.run([args.py_spy, "record", "--nonblocking", "--format", "raw",
                                "--rate", "250", "--duration", str(max(1, int(args.seconds) - 1)),
                                "--pid", str(pids["sidecar"]), "--output", str(out)],
                               check=True, capture_output=True)
                raw = out.read_text()
            load.join()
            after = {name: _ticks(pid) for name, pid in pids.items()}
        finally:
            stack.stop()
            provider.stop()
    wrk = result["wrk"]
    hz = os.sysconf("SC_CLK_TCK")
    lines = [f"## Under load: {args.strategy}, wrk c32, {args.seconds:g} s", "",
             f"{wrk.requests_per_s:,.0f} routed req/s ({wrk.bad_responses} bad responses).", "",
             "| process | user µs/req | kernel µs/req |", "| --- | ---: | ---: |"]
    for name in pids:
        user = (after[name][0] - before[name][0]) / hz / wrk.requests * 1e6
        kernel = (after[name][1] - before[name][1]) / hz / wrk.requests * 1e6
        lines.append(f"| {name} | {user:.0f} | {kernel:.0f} |")
    lines.append("")
    if raw:
        lines.append(summarize(raw, args.top))
    publish("\n".join(lines) + "\n", args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
