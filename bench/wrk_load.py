"""Drive load with wrk (Debian's `wrk` package): a C load generator, so the client is not
what limits the figures (the provider-direct row of side_by_side.py shows its ceiling).

Each request is a POST of a chat body whose prompt carries a per-request counter, so a
routing sidecar with conversation affinity sees distinct conversations, as in production.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
local counter = 0
local base = 0
setup = function(thread)
  thread:set("base", math.random(1, 1000000000))
end
request = function()
  counter = counter + 1
  local conversation = base + counter
  if {conversations} > 0 then
    conversation = counter % {conversations}
  end
  return wrk.format(nil, "{path}", nil,
    '{{"model":"{model}","messages":[{{"role":"user","content":"conversation ' ..
    conversation .. ' {padding}"}}]}}')
end
"""
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass(frozen=True)
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    bad_responses: int  # non-2xx/3xx responses + socket errors (connect, read, write, timeout)
    cpu_s: float  # wrk's own CPU time
    failure_detail: str = ""  # "non-2xx N, timeouts N, …" when anything failed


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk is not installed: `apt-get install -y wrk` (Debian) first")
    return path


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)([a-z]+)", text).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def run_wrk(port: int, path: str, model: str, token: str, connections: int,
            duration_s: float, body_bytes: int = 1024, conversations: int = 0) -> WrkResult:
    """`conversations` > 0 cycles through that many conversations (per wrk thread);
    otherwise every request starts a new one."""
    padding = "x" * max(0, body_bytes - 110)
    with tempfile.TemporaryDirectory() as workdir:
        script = Path(workdir) / "post.lua"
        script.write_text(_SCRIPT.format(token=token, path=path, model=model, padding=padding,
                                         conversations=conversations))
        threads = min(2, connections)
        process = subprocess.Popen(
            [wrk_path(), "--latency", "-t", str(threads), "-c", str(connections),
             "-d", f"{max(1, round(duration_s))}s", "-s", str(script), f"http://127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        output = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed:\n{output}")
    percentiles = dict(re.findall(r"^\s+(\d+)%\s+([\d.]+[a-z]+)\s*$", output, re.M))
    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    total = re.search(r"(\d+) requests in", output)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       output)
    if rate is None or total is None or "50" not in percentiles:
        raise RuntimeError(f"unexpected wrk output:\n{output}")
    counts = {"non-2xx": int(bad.group(1)) if bad else 0}
    if errors:
        counts.update(zip(("connect errors", "read errors", "write errors", "timeouts"),
                          map(int, errors.groups()), strict=True))
    detail = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    return WrkResult(float(rate.group(1)), _ms(percentiles["50"]), _ms(percentiles["99"]),
                     int(total.group(1)), sum(counts.values()),
                     usage.ru_utime + usage.ru_stime, detail)
