"""The soak driver (issue 40, "long runs as a test"): the running stack (soak_stack.py) under
mixed traffic (soak_traffic.py) for a while, with a quiet phase in the middle longer than
the gRPC server's idle timeout, `/ready` polled throughout, and the processes sampled: what
a platform team checks before it leaves a gateway running for months. An operator console
stays open throughout, refreshing every page every second.

One driver, two users: tests/e2e/test_soak.py (minutes, the gRPC port's timers and Envoy's
health checks scaled 10x faster by grpcwire/time_scale.py) and bench/soak.py (30 minutes at
production speed; its figures are in docs/operations.md).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.devstack.soak_stack import SoakStack, rss_mb, soak_stack
from sidecar.devstack.soak_traffic import (
    ConsolePoller,
    ReadyPoller,
    Tally,
    describe,
    run_callers,
)
from sidecar.grpcwire.limits import ServerLimits
from sidecar.grpcwire.time_scale import scaled_limits

# Log lines at WARNING or above that the soak's own traffic makes by design, each with why.
# Anything else at that level is "unexplained" and fails the test.
EXPLAINED_WARNINGS: tuple[tuple[str, str], ...] = ()
# The gRPC counters that say the sidecar closed or refused something of a peer's: for
# Envoy, the only peer here, every one of them stays 0.
LIMIT_COUNTERS = ("flood_closed", "connections_evicted", "calls_resource_exhausted",
                  "connections_refused", "handshake_timeouts", "protocol_errors",
                  "unauthenticated_calls", "invalid_messages", "incomplete_messages",
                  "handler_errors", "internal_errors", "log_lines_suppressed")
_ENVOY_LINE = re.compile(rb"^\[[^\]]*\]\[\d+\]\[(\w+)\]")


@dataclass(frozen=True)
class SoakPlan:
    seconds: float  # traffic, both phases together
    time_scale: float = 1.0
    workers: int = 4
    pause_s: float = 0.05  # between two requests of one caller
    sample_every_s: float = 10.0
    ready_every_s: float = 0.2
    console_every_s: float = 1.0  # an open console's refresh (all its pages)

    @property
    def limits(self) -> ServerLimits:
        """The gRPC server's limits in this run (the sidecar's message size aside)."""
        return scaled_limits(ServerLimits(), self.time_scale)

    @property
    def quiet_s(self) -> float:
        """The quiet phase: the server's idle timeout and a fifth more."""
        return self.limits.idle_timeout * 1.2


@dataclass
class Sample:
    at_s: float
    sidecar_rss_mb: float
    envoy_rss_mb: float


@dataclass
class LogFinding:
    source: str  # "sidecar", "envoy" or "other"
    level: str
    text: str
    reason: str = ""  # why it is expected; empty: unexplained


@dataclass
class SoakReport:
    plan: SoakPlan
    wall_s: float = 0.0
    tally: Tally = field(default_factory=Tally)
    ready_polls: int = 0
    ready_failures: Counter[str] = field(default_factory=Counter)
    ready_first_failures: list[tuple[float, str]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    grpc_start: dict[str, float] = field(default_factory=dict)
    grpc_end: dict[str, float] = field(default_factory=dict)
    envoy_start: dict[str, int] = field(default_factory=dict)
    envoy_end: dict[str, int] = field(default_factory=dict)
    findings: list[LogFinding] = field(default_factory=list)
    health_checks: int = 0
    console_pages: int = 0
    console_failures: Counter[str] = field(default_factory=Counter)

    @property
    def unexplained(self) -> list[LogFinding]:
        return [finding for finding in self.findings if not finding.reason]

    def grew(self, name: str) -> float:
        return self.grpc_end.get(name, 0.0) - self.grpc_start.get(name, 0.0)

    def envoy_grew(self, name: str) -> int:
        return self.envoy_end.get(name, 0) - self.envoy_start.get(name, 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.__dict__, "wall_s": round(self.wall_s, 1),
            "requests": self.tally.total(), "traffic": describe(self.tally),
            "ready": {"polls": self.ready_polls, "not_200": dict(self.ready_failures),
                      "first_failures": self.ready_first_failures},
            "health_checks": self.health_checks,
            "console": {"pages": self.console_pages, "not_200": dict(self.console_failures)},
            "rss_mb": [(round(s.at_s), round(s.sidecar_rss_mb, 1), round(s.envoy_rss_mb, 1))
                       for s in self.samples],
            "grpc_counters_end": self.grpc_end,
            "grpc_counters_grew": {name: self.grew(name) for name in self.grpc_end},
            "envoy_sidecar_stats_grew": {name: self.envoy_grew(name)
                                         for name in self.envoy_end},
            "log_findings": [finding.__dict__ for finding in self.findings],
        }


def scan_log(path: Path, explained: tuple[tuple[str, str], ...] = EXPLAINED_WARNINGS
             ) -> list[LogFinding]:
    """Every line at WARNING or above in the stack's log (the sidecar's JSON lines, Envoy's
    `[time][pid][level]` lines), and every line that is neither (a traceback, a crash)."""
    patterns = [(re.compile(pattern), reason) for pattern, reason in explained]
    findings = []
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        envoy = _ENVOY_LINE.match(raw)
        text = raw.decode(errors="replace")
        if envoy is not None:
            level = envoy.group(1).decode()
            if level in ("info", "debug", "trace"):
                continue
            source = "envoy"
        elif raw.startswith(b"{"):
            try:
                line = json.loads(raw)
            except ValueError:
                line = {"level": "?"}
            level = str(line.get("level", "?"))
            if level in ("DEBUG", "INFO"):
                continue
            source = "sidecar"
        else:
            source, level = "other", "?"
        reason = next((why for pattern, why in patterns if pattern.search(text)), "")
        findings.append(LogFinding(source, level, text[:400], reason))
    return findings


def _sampler(stack: SoakStack, report: SoakReport, started: float, every_s: float,
             done: threading.Event) -> None:
    while True:
        report.samples.append(Sample(time.monotonic() - started, rss_mb(stack.sidecar_pid),
                                     rss_mb(stack.envoy_pid)))
        if done.wait(every_s):
            return


def run_soak(workdir: Path, plan: SoakPlan) -> SoakReport:
    """Start the stack, run the plan (traffic, quiet, traffic), stop the stack, report."""
    report = SoakReport(plan)
    with soak_stack(workdir, plan.time_scale) as stack:
        started = time.monotonic()
        report.grpc_start = stack.grpc_counters()
        report.envoy_start = stack.envoy_sidecar_stats()
        done = threading.Event()
        sampler = threading.Thread(target=_sampler, name="soak-sampler", daemon=True,
                                   args=(stack, report, started, plan.sample_every_s, done))
        sampler.start()
        with ReadyPoller(stack.up.listen_port, plan.ready_every_s) as poller, \
                ConsolePoller(stack.up.admin_http_port, plan.console_every_s) as console:
            half = plan.seconds / 2
            run_callers(stack.up.base_url, report.tally, half, plan.workers, plan.pause_s)
            time.sleep(plan.quiet_s)  # nothing but /ready and Envoy's health checks
            run_callers(stack.up.base_url, report.tally, half, plan.workers, plan.pause_s)
            time.sleep(1.0)  # the last access-log entries and health checks land
        done.set()
        sampler.join(10)
        report.samples.append(Sample(time.monotonic() - started, rss_mb(stack.sidecar_pid),
                                     rss_mb(stack.envoy_pid)))
        report.grpc_end = stack.grpc_counters()
        report.envoy_end = stack.envoy_sidecar_stats()
        report.wall_s = time.monotonic() - started
        report.ready_polls = poller.polls
        report.console_pages = console.pages
        report.console_failures = console.failures
        report.ready_failures = poller.not_ready
        report.ready_first_failures = poller.first_failures
        report.health_checks = report.envoy_grew("health_check.attempt")
    report.findings = scan_log(stack.log_path)
    return report
