"""Benchmark: a configuration of real size — 1,000 model groups × 5 targets (dynamic_score)
and 10,000 callers — against the SPEC's one group, side by side in one run.

Reported: load + validate, routing runtime, Envoy render (YAML and JSON bootstrap, and the
xDS files a reload writes), a whole reload (load, check, runtime, xDS files, swap), the
sidecar process's RSS and start time to SERVING (`sidecar serve`), and the in-process CPU
cost of one routed request (both ext_proc messages, real upb messages) for a caller and a
group picked from the middle of the big configuration.

Usage:  .venv/bin/python bench/large_config.py [--groups 1000] [--targets 5]
        [--callers 10000] [--rounds 3000] [--output FILE]
Loopback only; every process it starts it also stops.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from in_process import chat_wire, one_request
from mode_runner import publish

from sidecar.config import load_config_text
from sidecar.devstack.harness import free_port
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import bootstrap_yaml, rendered_document
from sidecar.envoy_config.xds_files import XdsFiles
from sidecar.extproc.processor import ExternalProcessor
from sidecar.gateway import Gateway, Runtime
from sidecar.operations.process import keep_large_buffers_in_heap

SPEC = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "spec_sample.yaml"


def token(n: int) -> str:
    return f"bench-caller-token-{n}"


def large_text(groups: int, targets: int, callers: int) -> str:
    lines = ["providers:"]
    lines += [f"  p{p}: {{base_url: 'http://127.0.0.1:9/v1'}}" for p in range(targets)]
    lines.append("callers:")
    lines += [f"  - {{name: caller-{c}, token_sha256: "
              f"{hashlib.sha256(token(c).encode()).hexdigest()}}}" for c in range(callers)]
    lines.append("models:")
    for g in range(groups):
        lines.append(f"  group-{g}:\n    strategy: dynamic_score\n    targets:")
        lines += [f"      - {{provider: p{t}, model_ref: m{g}-{t}, weight: {t + 1}}}"
                  for t in range(targets)]
    return "\n".join(lines) + "\n"


def spec_text() -> str:
    """The SPEC's sample, verbatim, with one caller (it declares none)."""
    digest = hashlib.sha256(token(0).encode()).hexdigest()
    return SPEC.read_text() + f"\ncallers: [{{name: caller-0, token_sha256: {digest}}}]\n"


def timed(work) -> tuple[float, object]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def request_cost(config, group: str, caller: int, rounds: int) -> float:
    """Microseconds of sidecar CPU per routed request."""
    keep_large_buffers_in_heap()
    processor = ExternalProcessor(Gateway(Runtime(config, {})))
    body = json.dumps({"model": group, "messages": [{"role": "user", "content": "hi " * 40}],
                       "max_tokens": 64}).encode()
    wire = chat_wire(body, token(caller))

    def one() -> None:
        one_request(processor, wire)

    for _ in range(200):
        one()
    started = time.process_time()
    for _ in range(rounds):
        one()
    return (time.process_time() - started) / rounds * 1e6


def serve_figures(config_path: Path, workdir: Path) -> tuple[float, float]:
    """(seconds to SERVING, RSS MB once serving) of `sidecar serve` with this config."""
    port = free_port()
    grpc_token = workdir / "grpc-token"
    grpc_token.write_text("t" * 40)
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--config", str(config_path), "--listen",
         f"127.0.0.1:{port}", "--admin-http", f"127.0.0.1:{free_port()}",
         "--grpc-token-file", str(grpc_token), "--drain-seconds", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    if time.perf_counter() - started > 300:
                        raise RuntimeError("serve did not come up") from None
                    time.sleep(0.05)
        ready = time.perf_counter() - started
        rss = next(int(line.split()[1]) for line in
                   Path(f"/proc/{process.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:")) / 1024
        return ready, rss
    finally:
        process.terminate()
        process.wait(30)


def reload_time(config_text: str, workdir: Path) -> float:
    """A whole reload as `operations/reload.py` runs it, xDS files included."""
    from sidecar.operations.reload import Reloader, apply

    path = workdir / "reload.yaml"
    path.write_text(config_text)
    config = load_config_text(config_text)
    gateway = Gateway(Runtime(config, {}))

    class Running:  # what `apply` touches of a running sidecar
        def __init__(self) -> None:
            self.gateway = gateway
            self.receiver = None
            self.telemetry = None
            self.max_request_s = 600.0

        def retire(self, external) -> None:
            pass

    xds = XdsFiles(workdir / "xds")
    reloader = Reloader(path, Running(), environ=_AnyKey())  # type: ignore[arg-type]
    started = time.perf_counter()
    prepared = reloader._prepare()
    assert not isinstance(prepared, list), prepared
    new_config, runtime = prepared
    xds.publish(rendered_document(new_config, EnvoyAddresses()))
    apply(reloader.sidecar, new_config, runtime)  # type: ignore[arg-type]
    return time.perf_counter() - started


class _AnyKey(dict):
    """Every provider key variable is set (to a dummy): a reload checks they can be read."""

    def get(self, key, default=None):
        return "bench-provider-key"


def measure(name: str, text: str, group: str, caller: int, rounds: int,
            workdir: Path) -> dict[str, float]:
    load_s, config = timed(lambda: load_config_text(text))
    runtime_s, _ = timed(lambda: Runtime(config, {}))
    document_s, document = timed(lambda: rendered_document(config, EnvoyAddresses()))
    yaml_s, _ = timed(lambda: bootstrap_yaml(document))
    json_s, _ = timed(lambda: json.dumps(document))
    xds_s, _ = timed(lambda: XdsFiles(workdir / f"xds-{name}").publish(document))
    path = workdir / f"{name}.yaml"
    path.write_text(text)
    start_s, rss = serve_figures(path, workdir)
    costs = [request_cost(config, group, caller, rounds) for _ in range(3)]
    return {"load + validate s": load_s, "runtime s": runtime_s,
            "render YAML s": document_s + yaml_s, "render JSON s": document_s + json_s,
            "xDS files s": document_s + xds_s, "reload s": reload_time(text, workdir),
            "serve start s": start_s, "serve RSS MB": rss,
            "µs/request": statistics.median(costs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--targets", type=int, default=5)
    parser.add_argument("--callers", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-large-") as temp:
        workdir = Path(temp)
        rows = {
            "SPEC sample (1 group)": measure(
                "spec", spec_text(), "adaptive-agent", 0, args.rounds, workdir),
            f"{args.groups} groups × {args.targets} targets, {args.callers} callers": measure(
                "large", large_text(args.groups, args.targets, args.callers),
                f"group-{args.groups // 2}", args.callers // 2, args.rounds, workdir),
        }
    names = list(next(iter(rows.values())))
    lines = [f"## Configurations of real size ({time.strftime('%Y-%m-%d')})", "",
             "| configuration | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for label, figures in rows.items():
        lines.append(f"| {label} | " + " | ".join(f"{figures[n]:,.2f}" for n in names) + " |")
    small, large = rows.values()
    lines += ["", f"Decision cost, large / SPEC in the same run: "
                  f"{large['µs/request'] / small['µs/request']:.2f}×"]
    publish("\n".join(lines), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
