"""Issue #30: one replica against three, with the same total traffic, through a real
balancer — what sharing through Redis (`fleet:`) buys and what it costs.

Three set-ups, one after the other in one run: one `sidecar up` (no Redis), three replicas
with only their quotas shared (`fleet.enabled: false`, how the issue found them), and three
replicas with the fleet channel on. Each stands behind Debian's HAProxy (round-robin, TCP,
`GET /ready` checked every 200 ms) and shares one real Redis (Debian's redis-server). The
figures:

- **sick target**: two targets, one turns slow and fails 10 % of its requests; the share of
  requests it still gets in the second half of the sick phase (after its drain);
- **stickiness**: conversations of three turns through round-robin, turns 0.6 s apart; the
  share of follow-ups served by the first turn's target;
- **quota**: a caller limited to 200 requests a minute sends 300 as fast as 8 clients can;
  how many were admitted (over-admission in per cent of the limit);
- **drain**: four keep-alive clients without pause while each replica in turn is SIGTERMed
  and started again; failed requests (three-replica set-ups only);
- **cost**: the sidecars' own CPU (their main processes, not Envoy) per request over a
  steady phase, fleet on beside fleet off.

Run from the repository root: `.venv/bin/python bench/fleet.py --output
bench/results/fleet.md` (about five minutes; `--quick` halves the phases).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import Behaviour, FakeProvider
from tests.e2e.test_rolling_restart import HAPROXY, HAPROXY_BIN
from tests.redis_server import redis_server

TOKEN, LIMITED = "bench-fleet-token", "bench-fleet-limited"
QUOTA = 200
HEALTHY = Behaviour(latency_s=0.02)
# Under the latency threshold, 10 % 503s: only its error rate can drain it (issue #30.1).
SICK = Behaviour(latency_s=0.05, error_rate=0.1, error_status=503)
CONFIG = """\
providers:
{providers}
callers:
  - {{name: bench, token_sha256: {token}}}
  - {{name: limited, token_sha256: {limited}, quotas: {{requests_per_minute: {quota}}}}}
observations: {{flush_interval_ms: 50, refresh_ms: 100, slice_seconds: 5}}
{shared}
models:
  sick:
    strategy: dynamic_score
    targets:
      - {{provider: good, model_ref: good-m, weight: 50}}
      - {{provider: ill, model_ref: ill-m, weight: 50}}
    routing_policy:
      dynamic_score:
        min_observations: 10
        observation_window_seconds: 30
        affinity: {{enabled: false}}
        thresholds: {{max_error_rate: 0.03, max_p95_latency_ms: 150}}
  pinned:
    strategy: dynamic_score
    targets:
      - {{provider: gamma, model_ref: gamma-m, weight: 50}}
      - {{provider: delta, model_ref: delta-m, weight: 50}}
  plain:
    targets: [{{provider: plain, model_ref: plain-m}}]
"""
PROVIDERS = ("good", "ill", "gamma", "delta", "plain")


@dataclass
class Setup:
    name: str
    replicas: int
    shared: str  # the config's Redis block ("" for none)


SETUPS = (
    Setup("1 replica", 1, ""),
    Setup("3 replicas, fleet off", 3, "quotas: {redis_url: {env: FLEET_REDIS}}\n"
                                      "fleet: {enabled: false}"),
    Setup("3 replicas, fleet on", 3, "quotas: {redis_url: {env: FLEET_REDIS}}\n"
                                     "fleet: {publish_ms: 200}"),
)


@dataclass
class Figures:
    sick_share: float = 0.0
    sick_requests: int = 0
    sick_early_share: float = 0.0
    stickiness: float = 0.0
    follow_ups: int = 0
    quota_admitted: int = 0
    quota_refusals: Counter[str] = field(default_factory=Counter)
    steady_admitted: int = 0
    steady_refusals: Counter[str] = field(default_factory=Counter)
    drain_failed: int | None = None
    drain_requests: int = 0
    cpu_ms_per_request: float = 0.0
    cpu_percent_per_replica: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Stack:
    def __init__(self, setup: Setup, workdir: Path, providers: ProviderThread,
                 redis_url: str) -> None:
        self.setup = setup
        lines = [f"  {name}: {{base_url: '{providers.base_url(name)}', credential: null}}"
                 for name in PROVIDERS]
        self.config = workdir / "config.yaml"
        self.config.write_text(CONFIG.format(
            providers="\n".join(lines), token=hashlib.sha256(TOKEN.encode()).hexdigest(),
            limited=hashlib.sha256(LIMITED.encode()).hexdigest(), quota=QUOTA,
            shared=setup.shared))
        self.workdir = workdir
        self.env = {"FLEET_REDIS": redis_url}
        self.replicas = [self._replica(i) for i in range(setup.replicas)]
        self.port = free_port()

    def _replica(self, index: int, like: UpProcess | None = None) -> UpProcess:
        up = UpProcess(["--config", str(self.config), "--replica", f"r{index}",
                        "--drain-seconds", "10", "--drain-grace-seconds", "2"],
                       env=self.env, log_path=self.workdir / f"r{index}-{time.time():.0f}.log")
        if like is not None:
            up.args, up.listen_port, up.admin_http_port = (like.args, like.listen_port,
                                                           like.admin_http_port)
        return up

    @contextlib.contextmanager
    def running(self):
        with contextlib.ExitStack() as stack:
            for up in self.replicas:
                stack.enter_context(up.running())
            servers = "\n".join(f"  server r{i} 127.0.0.1:{up.listen_port} check"
                                for i, up in enumerate(self.replicas))
            (self.workdir / "haproxy.cfg").write_text(HAPROXY.format(port=self.port,
                                                                     servers=servers))
            log = stack.enter_context((self.workdir / "haproxy.log").open("w"))
            balancer = subprocess.Popen([str(HAPROXY_BIN), "-f",
                                         str(self.workdir / "haproxy.cfg"), "-db"],
                                        stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 30
                while self.chat("plain", "ready?") != 200:
                    assert time.monotonic() < deadline, "the balancer never served"
                    time.sleep(0.2)
                time.sleep(1.0)  # every server up in HAProxy's eyes (rise 2 × 200 ms)
                yield self
            finally:
                balancer.terminate()
                balancer.wait(10)
                for up in self.replicas:  # restarted ones are not in the exit stack
                    with contextlib.suppress(Exception):
                        if up.process is not None and up.process.poll() is None:
                            up.interrupt()

    def chat(self, group: str, text: str, http: httpx.Client | None = None,
             token: str = TOKEN, history: list[dict] | None = None,
             refusals: Counter[str] | None = None) -> int | str:
        messages = [*(history or []), {"role": "user", "content": text}]
        try:
            answer = (http or httpx).post(
                f"http://127.0.0.1:{self.port}/v1/chat/completions", timeout=10,
                headers={"authorization": f"Bearer {token}"},
                json={"model": group, "messages": messages})
            if refusals is not None and answer.status_code == 429:
                refusals["under the limit (lease pending)" if "under its limit"
                         in answer.text else "over the limit"] += 1
            return answer.status_code
        except httpx.TransportError as exc:
            return type(exc).__name__


def _paced(stack: Stack, group: str, rate: float, seconds: float, figures: Figures,
           clients: int = 6) -> int:
    """`rate` requests a second in total for `seconds`, from `clients` keep-alive
    clients; returns how many were sent."""
    sent = Counter[str]()
    end = time.monotonic() + seconds

    def client(index: int) -> None:
        interval = clients / rate
        next_at = time.monotonic() + index * interval / clients
        with httpx.Client() as http:
            while next_at < end:
                time.sleep(max(0.0, next_at - time.monotonic()))
                outcome = stack.chat(group, f"{group} {index} {next_at}", http)
                sent[str(outcome)] += 1
                next_at += interval

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for outcome, n in sent.items():
        if outcome != "200":
            figures.errors[f"{group}:{outcome}"] += n
    return sum(sent.values())


def sick_phase(stack: Stack, fakes: dict[str, FakeProvider], seconds: float,
               figures: Figures) -> None:
    fakes["ill"].behaviour = SICK
    start = time.monotonic()
    _paced(stack, "sick", 30.0, seconds, figures)
    middle = start + seconds / 2

    def share(begin: float, end: float) -> tuple[float, int]:
        ill = sum(1 for r in fakes["ill"].received if begin <= r.at < end)
        good = sum(1 for r in fakes["good"].received if begin <= r.at < end)
        return ill / max(1, ill + good), ill

    figures.sick_share, figures.sick_requests = share(middle, float("inf"))
    figures.sick_early_share, _ = share(start, start + 10)
    fakes["ill"].behaviour = HEALTHY


def stickiness_phase(stack: Stack, fakes: dict[str, FakeProvider], figures: Figures,
                     conversations: int) -> None:
    openings = [f"conversation {i} {time.monotonic()}" for i in range(conversations)]
    for text in openings:
        stack.chat("pinned", text)
    kept = total = 0
    for turn in range(2):
        time.sleep(0.6)
        for text in openings:
            stack.chat("pinned", f"follow-up {turn}",
                       history=[{"role": "user", "content": text},
                                {"role": "assistant", "content": "an answer"}])
    for text in openings:
        marker = f'"{text}"'.encode()
        turns = {name: sum(1 for r in fakes[name].received if marker in r.body)
                 for name in ("gamma", "delta")}
        first = max(turns, key=turns.get)  # the target with the most turns
        kept += turns[first] - 1
        total += sum(turns.values()) - 1
    figures.stickiness = kept / max(1, total)
    figures.follow_ups = total


def _one_window(seconds: float) -> None:
    """Wait until `seconds` fit before the next UTC minute (one quota window)."""
    while time.gmtime().tm_sec > 58 - seconds:
        time.sleep(0.5)


def quota_phase(stack: Stack, figures: Figures, steady_s: float) -> None:
    """A burst: 300 requests as fast as 8 clients can, then (next window) a steady caller
    at 1.25 × its limit's rate, as in the issue (faster than L per second)."""
    _one_window(15)
    outcomes = Counter[str]()
    remaining = iter(range(300))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client() as http:
            while True:
                with lock:
                    if next(remaining, None) is None:
                        return
                outcomes[str(stack.chat("plain", "quota", http, token=LIMITED,
                                        refusals=figures.quota_refusals))] += 1

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures.quota_admitted = outcomes["200"]
    burst_window = int(time.time() // 60)
    while int(time.time() // 60) == burst_window:  # the next window for the steady caller
        time.sleep(0.2)
    steady = Counter[str]()
    rate = 1.25 * QUOTA / 60  # requests a second: faster than the limit allows for long
    end, next_at = time.monotonic() + steady_s, time.monotonic()
    with httpx.Client() as http:
        while next_at < end:
            time.sleep(max(0.0, next_at - time.monotonic()))
            steady[str(stack.chat("plain", "steady", http, token=LIMITED,
                                  refusals=figures.steady_refusals))] += 1
            next_at += 1 / rate
    figures.steady_admitted = steady["200"]


def drain_phase(stack: Stack, figures: Figures) -> None:
    outcomes = Counter[str]()
    stopping = threading.Event()

    def client() -> None:
        with httpx.Client() as http:
            while not stopping.is_set():
                outcomes[str(stack.chat("plain", "drain", http))] += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for index, up in enumerate(list(stack.replicas)):
            time.sleep(1.0)
            assert up.process is not None
            os.kill(up.process.pid, signal.SIGTERM)
            up.process.wait(30)
            stack.replicas[index] = stack._replica(index, like=up)
            stack.replicas[index].start()
            time.sleep(1.0)
    finally:
        stopping.set()
        for thread in threads:
            thread.join(20)
    figures.drain_requests = sum(outcomes.values())
    figures.drain_failed = figures.drain_requests - outcomes["200"]


def cost_phase(stack: Stack, seconds: float, figures: Figures) -> None:
    pids = [up.process.pid for up in stack.replicas if up.process is not None]
    before, began = sum(_cpu_seconds(pid) for pid in pids), time.monotonic()
    sent = _paced(stack, "plain", 60.0, seconds, figures)
    used = sum(_cpu_seconds(pid) for pid in pids) - before
    figures.cpu_ms_per_request = used * 1000 / max(1, sent)
    figures.cpu_percent_per_replica = used * 100 / (time.monotonic() - began) / len(pids)


def run(setup: Setup, redis_url: str, quick: bool) -> Figures:
    figures = Figures()
    fakes = {name: FakeProvider(name, behaviour=HEALTHY) for name in PROVIDERS}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, \
            ProviderThread(list(fakes.values())) as providers:
        stack = Stack(setup, Path(tmp), providers, redis_url)
        with stack.running():
            cost_phase(stack, 5.0 if quick else 10.0, figures)
            sick_phase(stack, fakes, 20.0 if quick else 40.0, figures)
            stickiness_phase(stack, fakes, figures, 31 if quick else 61)
            quota_phase(stack, figures, 20.0 if quick else 40.0)
            if setup.replicas > 1:
                drain_phase(stack, figures)
    return figures


def report(results: list[tuple[Setup, Figures]]) -> str:
    lines = ["# Fleet benchmark (issue #30)", "",
             f"`bench/fleet.py`, {time.strftime('%Y-%m-%d', time.gmtime())}; same total "
             "traffic for every set-up, through HAProxy round-robin.", "",
             "| set-up | sick target's share: first 10 s | after its drain | stickiness "
             "through round-robin | quota, burst of 300: admitted of 200 | quota, steady at "
             "1.25 × the limit's rate: admitted | failed requests in a rolling "
             "restart | sidecar CPU per request | sidecar CPU per replica (60 req/s in all) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for setup, f in results:
        drain = ("n/a (one replica)" if f.drain_failed is None
                 else f"{f.drain_failed} of {f.drain_requests}")
        lines.append(f"| {setup.name} | {f.sick_early_share:.1%} | "
                     f"{f.sick_share:.1%} ({f.sick_requests} requests) | "
                     f"{f.stickiness:.1%} of {f.follow_ups} | {f.quota_admitted} "
                     f"({(f.quota_admitted - QUOTA) / QUOTA:+.1%}) | {f.steady_admitted} "
                     f"of {f.steady_admitted + sum(f.steady_refusals.values())} | {drain} | "
                     f"{f.cpu_ms_per_request:.3f} ms | {f.cpu_percent_per_replica:.1f} % |")
    lines.append("")
    for setup, f in results:
        lines.append(f"- {setup.name}, quota refusals in the burst: "
                     + ", ".join(f"{k} × {v}" for k, v in sorted(f.quota_refusals.items()))
                     + "; steady: " + (", ".join(f"{k} × {v}" for k, v in
                                                 sorted(f.steady_refusals.items())) or "none"))
    for setup, f in results:
        if f.errors:
            lines.append(f"- {setup.name}, client-visible non-200s outside the quota phase: "
                         + ", ".join(f"{k} × {v}" for k, v in sorted(f.errors.items())))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if HAPROXY_BIN is None:
        sys.exit("HAProxy is not installed (.ci/services installs Debian's)")
    results = []
    with redis_server() as redis:
        for setup in SETUPS:
            print(f"{setup.name} …", flush=True)
            results.append((setup, run(setup, redis.url, args.quick)))
    text = report(results)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
