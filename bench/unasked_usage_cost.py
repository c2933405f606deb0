"""Benchmark: the CPU the unasked-usage Lua filter spends on one long stream (issue #40).

The filter (sidecar/envoy_config/unasked_usage.lua) runs in Envoy's LuaJIT once per write of
every Chat stream whose caller did not ask for usage. Here the same script runs in LuaJIT
(lupa, through the Envoy Lua API stand-ins of tests/envoy_lua.py) over a stream of N content
chunks as a provider asked for usage sends it (OpenAI's `"usage": null` on each chunk, the
final chunk, the usage chunk, `[DONE]`), one event per write as token-by-token providers
flush them, written compact and spaced. The figure is process CPU per stream (median of
rounds), for this tree and, with `--against REV`, for the script of another revision (the
byte-pattern strip before issue #40 is 55b5205).

Usage:  .venv/bin/python bench/unasked_usage_cost.py [--chunks 2000] [--rounds 7]
            [--against 55b5205]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sidecar.envoy_config.unasked_usage import unasked_usage_script  # noqa: E402
from tests.envoy_lua import LuaFilter  # noqa: E402


def stream_writes(chunks: int, spaced: bool) -> list[bytes]:
    def data(value: dict) -> bytes:
        text = json.dumps(value) if spaced else json.dumps(value, separators=(",", ":"))
        return b"data: " + text.encode() + b"\n\n"
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
            "model": "bench-model"}
    writes = [data({**head, "choices": [{"index": 0, "delta": {"content": f"word{k} "},
                                         "finish_reason": None}], "usage": None})
              for k in range(chunks)]
    writes.append(data({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                        "usage": None}))
    writes.append(data({**head, "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": chunks + 12}}))
    writes.append(b"data: [DONE]\n\n")
    return writes


def script_at(revision: str) -> str:
    """The filter's Lua as rendered at `revision` (the inline `_SCRIPT` of the byte-pattern
    strip, or the .lua file(s) the module reads since)."""
    source = subprocess.run(["git", "show", f"{revision}:sidecar/envoy_config/unasked_usage.py"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    namespace: dict = {"__name__": "unasked_usage_at_revision"}
    if "_SCRIPT = " in source:
        exec(compile(source, "unasked_usage.py", "exec"), namespace)
        return namespace["_SCRIPT"] % namespace["MAX_CARRY_BYTES"]
    raise SystemExit(f"{revision}: reads .lua files; check it out and run this bench there")


def cpu_per_stream(lua: LuaFilter, writes: list[bytes], rounds: int) -> float:
    lua.respond(writes)  # warm up (LuaJIT traces)
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        lua.respond(writes)
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", default=None)
    args = parser.parse_args()
    scripts = {"this tree": unasked_usage_script()}
    if args.against:
        scripts[args.against] = script_at(args.against)
    # The harness's own cost (a script that edits nothing), subtracted from each figure.
    floor_script = "function envoy_on_response(handle)\n" \
        "  for chunk in handle:bodyChunks() do chunk:getBytes(0, chunk:length()) end\nend\n"
    for spaced in (False, True):
        writes = stream_writes(args.chunks, spaced)
        size = sum(map(len, writes))
        floor = cpu_per_stream(LuaFilter(floor_script), writes, args.rounds)
        for name, source in scripts.items():
            cost = cpu_per_stream(LuaFilter(source), writes, args.rounds) - floor
            print(f"{name:>10}  {'spaced ' if spaced else 'compact'}  {len(writes)} writes, "
                  f"{size} bytes: {cost * 1e3:.2f} ms CPU per stream "
                  f"({cost * 1e6 / len(writes):.2f} µs per write)")


if __name__ == "__main__":
    main()
