"""Benchmark: the CPU the unasked-usage Lua filter spends on one long stream (issue #40).

The filter (sidecar/envoy_config/unasked_usage.lua) runs in Envoy's LuaJIT once per write of
every Chat stream whose caller did not ask for usage. Here the same script runs in LuaJIT
(lupa, through the Envoy Lua API stand-ins of tests/envoy_lua.py) over a stream of N content
chunks as a provider asked for usage sends it (OpenAI's `"usage": null` on each chunk, the
final chunk, the usage chunk, `[DONE]`), one event per write as token-by-token providers
flush them, written compact and spaced. The figure is process CPU per stream (median of
rounds), for this tree and, with `--against REV`, for the script of another revision (the
byte-pattern strip before issue #40 is 55b5205).

With `--envoy`, the same in real Envoy: `sidecar serve` and Envoy as rendered for one
group (bench/mode_runner.py), a fake provider streaming `--chunks` words, `--streams`
streams a round; Envoy's CPU per stream for a caller that does not ask for usage (the Lua
runs) and for one that asks (no Lua), and with `--against`, a caller that does not ask with
that revision's script in the bootstrap; interleaved rounds. The difference to `asked` is
the filter's cost in Envoy (its LuaJIT, the chunks' copies in and out).

Usage:  .venv/bin/python bench/unasked_usage_cost.py [--chunks 2000] [--rounds 7]
            [--against 55b5205] [--envoy --streams 40]
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


def envoy_rows(words: int, streams: int, rounds: int, against: str | None) -> None:
    import asyncio
    import tempfile

    import httpx
    from mode_runner import compare, run_mode
    from reply_gate_cost import load

    from sidecar.devstack.harness import ProviderThread
    from sidecar.devstack.providers import Behaviour, FakeProvider
    from sidecar.envoy_config.unasked_usage import unasked_usage_script

    def when_ready(streamed: bool | str):  # a loaded machine starts the sidecar slowly
        inner = load(streamed)

        async def run(port: int, count: int) -> list[float]:
            async with httpx.AsyncClient(timeout=5) as client:
                for _ in range(300):
                    if (await client.get(f"http://127.0.0.1:{port}/ready")).status_code == 200:
                        break
                    await asyncio.sleep(0.2)
            return await inner(port, count)
        return run

    def swap_script(source: str):  # the bootstrap with another revision's script in it
        def replace(node: object) -> object:
            if isinstance(node, dict):
                return {key: replace(value) for key, value in node.items()}
            if isinstance(node, list):
                return [replace(value) for value in node]
            return source if node == unasked_usage_script() else node

        def extend(document: dict, _port: int) -> None:
            document.update(replace(document))
        return extend

    modes = {"unasked": None, "asked": None}
    if against:
        modes[f"unasked@{against}"] = swap_script(script_at(against))
    provider = FakeProvider("bench", behaviour=Behaviour(text=" ".join(["word"] * words)))
    with ProviderThread([provider]) as providers, tempfile.TemporaryDirectory() as workdir:
        def one(mode: str) -> dict[str, float]:
            return run_mode(mode.replace("@", "-"), providers.base_url("bench"), Path(workdir),
                            streams, when_ready("asked" if mode == "asked" else True),
                            observations=True, settle_s=0.5, extend=modes[mode])
        medians = compare(tuple(modes), rounds, one)
    asked = medians["asked"]["envoy_cpu_per_1k"]
    for mode, figures in medians.items():
        cpu = figures["envoy_cpu_per_1k"]
        lua = "" if mode == "asked" else (
            f"; the filter {cpu - asked:.2f} ms ({(cpu - asked) * 1e3 / words:.2f} µs a chunk)")
        print(f"Envoy {mode:>18}: {cpu:.2f} ms CPU per stream of {words} chunks{lua}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", default=None)
    parser.add_argument("--envoy", action="store_true")
    parser.add_argument("--streams", type=int, default=40)
    args = parser.parse_args()
    if args.envoy:
        envoy_rows(args.chunks, args.streams, args.rounds, args.against)
        return
    from sidecar.envoy_config.unasked_usage import unasked_usage_script
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
