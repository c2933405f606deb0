"""The soak's stack (issue 40, "long runs as a test"): fake providers with the faults real
ones have, a configuration whose groups rescue some of them and pass others to the caller,
and `sidecar up` (the real sidecar and the real Envoy) in front, as the end-to-end harness
starts it. Also what the soak reads from the running processes: resident memory from
/proc, the gRPC server's counters from the sidecar's `/metrics`, Envoy's counters of its
connections to the sidecar from Envoy's admin `/stats`.

Used by tests/e2e/test_soak.py (a short run, timers scaled) and bench/soak.py (30 minutes at
production speed) through devstack/soak.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import Behaviour, FakeProvider
from sidecar.grpcwire.time_scale import TIME_SCALE_ENV

CALLER_TOKEN = "soak-caller-token-5d1e"
# Seconds a 429's `retry-after` asks for (the rate-limited providers), and what the groups
# are willing to wait for one.
RETRY_AFTER_S = 1
# A stream's first event from the slow provider, and how long the group waits for one.
SLOW_FIRST_EVENT_S = 3.0
FIRST_TOKEN_TIMEOUT_S = 0.5
# The dripping providers' stream: this many words, this far apart (callers hang up early).
DRIP_WORDS = 40
DRIP_DELAY_S = 0.05


def soak_providers() -> list[FakeProvider]:
    """Each with one behaviour (a fake's behaviour is per provider): the healthy ones, and
    one per fault (providers/provider_behaviours.py name the documents they follow)."""
    drip_text = " ".join(f"w{n}" for n in range(DRIP_WORDS))
    rate_limited = (("retry-after", str(RETRY_AFTER_S)),)
    return [
        FakeProvider("healthy", api_key="key-healthy"),
        # a one-in-two 500 (platform.openai.com/docs/guides/error-codes: 500, retry)
        FakeProvider("flaky", api_key="key-flaky",
                     behaviour=Behaviour(error_rate=0.5, error_status=500)),
        # every request a 429 with retry-after (Azure OpenAI, and OpenAI behind it)
        FakeProvider("limited", api_key="key-limited",
                     behaviour=Behaviour(status=429, headers=rate_limited)),
        # the connection dropped before any reply
        FakeProvider("resetter", api_key="key-resetter",
                     behaviour=Behaviour(reset_connection=True)),
        # 200 and headers at once, the first event seconds later (a provider under load)
        FakeProvider("slow", api_key="key-slow",
                     behaviour=Behaviour(first_event_delay_s=SLOW_FIRST_EVENT_S)),
        # every request a 500: nothing to fall back to, the caller gets the error
        FakeProvider("broken", api_key="key-broken", behaviour=Behaviour(status=500)),
        FakeProvider("drip", api_key="key-drip", behaviour=Behaviour(
            text=drip_text, inter_event_delay_s=DRIP_DELAY_S)),
        FakeProvider("claude", api_key="key-claude"),
        # one in two overloaded (docs.anthropic.com/en/api/errors: 529 overloaded_error)
        FakeProvider("claude-overloaded", api_key="key-claude-overloaded",
                     behaviour=Behaviour(error_rate=0.5, error_status=529)),
        # every request a 429 with retry-after (docs.anthropic.com/en/api/rate-limits)
        FakeProvider("claude-limited", api_key="key-claude-limited",
                     behaviour=Behaviour(status=429, headers=rate_limited)),
        FakeProvider("claude-broken", api_key="key-claude-broken",
                     behaviour=Behaviour(status=500)),
        FakeProvider("claude-drip", api_key="key-claude-drip", behaviour=Behaviour(
            text=drip_text, inter_event_delay_s=DRIP_DELAY_S)),
    ]


def _key_env(name: str) -> str:
    return "KEY_" + name.upper().replace("-", "_")


def soak_config(providers: ProviderThread, telemetry_db: Path) -> str:
    """Every provider, one caller, and a group per kind of traffic: `*-rescued` groups fall
    back from a faulty target to a healthy one (the caller sees a 200), `*-broken` groups
    have nothing to fall back to (the caller sees the error, in its dialect)."""
    lines = ["providers:"]
    for name, fake in providers.server.providers.items():
        dialects = "[anthropic_messages]" if name.startswith("claude") else "[openai_chat]"
        lines.append(f"  {name}: {{base_url: '{providers.base_url(name)}', "
                     f"credential: {{env: {_key_env(fake.name)}}}, dialects: {dialects}}}")
    digest = hashlib.sha256(CALLER_TOKEN.encode()).hexdigest()
    fallback = (f"{{retry_same_target: 1, wait_for_retry_after_seconds: {RETRY_AFTER_S + 1}, "
                f"commit_at_first_event: true, "
                f"first_token_timeout_seconds: {FIRST_TOKEN_TIMEOUT_S}}}")

    def group(name: str, *targets: str, bridges: bool = False) -> list[str]:
        body = [f"  {name}:", "    strategy: failover", f"    fallback: {fallback}"]
        if bridges:
            body.append("    bridges: true")
        body.append("    targets:")
        body += [f"      - {{provider: {t}, model_ref: {t}-model}}" for t in targets]
        return body

    lines += [f"callers: [{{name: soak, token_sha256: {digest}}}]",
              f"telemetry: {{sqlite_path: '{telemetry_db}'}}", "models:"]
    lines += group("chat-flaky", "flaky", "healthy")
    lines += group("chat-limited", "limited", "healthy")
    lines += group("chat-reset", "resetter", "healthy")
    lines += group("chat-slow", "slow", "healthy")
    lines += group("chat-broken", "broken")
    lines += group("chat-drip", "drip")
    lines += group("claude-flaky", "claude-overloaded", "claude")
    lines += group("claude-limited", "claude-limited", "claude")
    lines += group("claude-broken", "claude-broken")
    lines += group("claude-drip", "claude-drip")
    # an Anthropic SDK caller answered by an OpenAI-only target (through the sidecar)
    lines += group("claude-bridged", "flaky", "healthy", bridges=True)
    return "\n".join(lines) + "\n"


@dataclass
class SoakStack:
    up: UpProcess
    providers: ProviderThread
    log_path: Path

    @property
    def sidecar_pid(self) -> int:
        assert self.up.process is not None
        return self.up.process.pid  # `sidecar up` runs the sidecar in its own process

    @property
    def envoy_pid(self) -> int:
        return self.up.envoy_pid

    def grpc_counters(self) -> dict[str, float]:
        """The gRPC server's counters (ServerCounters) from the sidecar's `/metrics`."""
        text = _get(f"http://127.0.0.1:{self.up.admin_http_port}/metrics")
        found = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            marker = name.find("grpc_")
            if marker >= 0 and "{" not in name:
                found[name[marker + len("grpc_"):]] = float(value)
        return found

    def envoy_sidecar_stats(self) -> dict[str, int]:
        """Envoy's counters of its connections to the sidecar (flow control included) and of
        its health checks."""
        text = _get(f"http://127.0.0.1:{self.up.admin_port}/stats?filter="
                    r"^cluster\.sidecar_ext_proc\.(upstream_cx_|upstream_flow_control_"
                    r"|health_check\.)")
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                found[name.removeprefix("cluster.sidecar_ext_proc.")] = int(value)
        return found


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback only
        return response.read().decode()


def rss_mb(pid: int) -> float:
    """Resident memory (VmRSS) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def soak_stack(workdir: Path, time_scale: float = 1.0) -> Iterator[SoakStack]:
    """The providers on a thread of this process and `sidecar up` as a child process (its
    log, the sidecar's JSON lines and Envoy's, in `workdir/up.log`); `time_scale` > 1 runs
    the gRPC port's timers and Envoy's health checks that much faster
    (grpcwire/time_scale.py)."""
    fakes = soak_providers()
    with ProviderThread(fakes) as providers:
        config = workdir / "soak.yaml"
        config.write_text(soak_config(providers, workdir / "telemetry.sqlite"))
        env = {_key_env(fake.name): fake.api_key or "" for fake in fakes}
        if time_scale != 1.0:
            env[TIME_SCALE_ENV] = f"{time_scale:g}"
        log_path = workdir / "up.log"
        up = UpProcess(["--config", str(config), "--log-format", "json"], env=env,
                       log_path=log_path)
        with up.running():
            yield SoakStack(up, providers, log_path)
