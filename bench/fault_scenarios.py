"""Benchmark: what a caller gets when providers behave as real ones do (issue #27).

One stack — `sidecar up` with real Envoy and the real sidecar, fake providers showing the
named behaviours of sidecar/devstack/provider_behaviours.py, the official `openai` and
`anthropic` SDKs as callers — and one scenario per behaviour, each against a fresh pair of
targets (primary `p`, fallback `f`; Anthropic ones `ap`, `af`). For each it prints what the
caller got:

  primary    a complete answer from the primary
  fallback   a complete answer from the fallback
  error NNN  a clear error: status NNN, JSON in the caller's dialect
  the provider's in-band error   a 200 stream that carried the provider's error event
  broken     no complete answer (a connection error, or a stream that ended early)

with how many upstream attempts were made and how long the caller waited. Groups: `plain`
(failover p → f, the defaults), `first-event` (`commit_at_first_event`, 1 s to the first
token), `same` (`retry_same_target: 1`), `idle` (`stream_idle_timeout_seconds: 1`).

Usage:  .venv/bin/python bench/fault_scenarios.py [--output bench/results/fault_scenarios.md]
Loopback only; every process it starts it also stops. About a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.provider_behaviours import BEHAVIOURS, behaviour
from sidecar.devstack.providers import Behaviour, FakeProvider

TOKEN = "fault-bench-token"
OPENAI, ANTHROPIC = ("p", "f"), ("ap", "af")
GROUPS = {
    "plain": "{}",
    "first-event": "{commit_at_first_event: true, first_token_timeout_seconds: 1.0}",
    "same": "{retry_same_target: 1}",
    "idle": "{stream_idle_timeout_seconds: 1.0}",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    group: str
    primary: Callable[[], Behaviour]
    fallback: Callable[[], Behaviour] = Behaviour
    anthropic: bool = False
    stream: bool = False
    long_prompt: bool = False


def named(name: str) -> Callable[[], Behaviour]:
    return lambda: behaviour(name)


SCENARIOS = (
    Scenario("healthy", "plain", Behaviour),
    Scenario("healthy stream", "plain", Behaviour, stream=True),
    Scenario("chunked JSON reply", "plain", named("chunked_json")),
    Scenario("chunked reply, broken framing", "plain", named("invalid_chunked")),
    Scenario("content-length reply cut mid-body", "plain", lambda: Behaviour(reset_mid_body=True)),
    Scenario("connection refused", "plain", lambda: Behaviour(reset_connection=True)),
    Scenario("OpenAI 429 with reset headers", "plain", named("openai_rate_limited")),
    Scenario("429 with retry-after", "plain", named("openai_retry_after")),
    Scenario("Anthropic 429", "plain", named("anthropic_rate_limited"), anthropic=True),
    Scenario("Anthropic 529 overloaded", "plain", named("anthropic_overloaded"),
             anthropic=True),
    Scenario("one transient 500", "plain", named("transient_500")),
    Scenario("one transient 500, retry_same_target", "same", named("transient_500")),
    Scenario("slow first token (20 s), default", "plain", named("slow_first_token"),
             stream=True),
    Scenario("slow first token (20 s), first-event", "first-event", named("slow_first_token"),
             stream=True),
    Scenario("Anthropic overloaded in the stream, default", "plain",
             named("anthropic_overloaded_in_stream"), anthropic=True, stream=True),
    Scenario("Anthropic overloaded in the stream, first-event", "first-event",
             named("anthropic_overloaded_in_stream"), anthropic=True, stream=True),
    Scenario("OpenAI error chunk first, first-event", "first-event",
             named("openai_error_in_stream"), stream=True),
    Scenario("stream cut after 3 events", "first-event", named("cut_stream"), stream=True),
    Scenario("stream stalled after 3 events, idle 1 s", "idle", named("stalled_stream"),
             stream=True),
    Scenario("garbage event in a stream", "plain", named("garbage_event"), anthropic=True,
             stream=True),
    Scenario("OpenAI context length 400", "plain", named("openai_context_length"),
             long_prompt=True),
    Scenario("vLLM context length 400", "plain", named("vllm_context_length"),
             long_prompt=True),
    Scenario("Anthropic prompt too long", "plain", named("anthropic_context_length"),
             anthropic=True, long_prompt=True),
    Scenario("every target 429", "plain", named("anthropic_rate_limited"),
             named("anthropic_rate_limited"), anthropic=True),
    Scenario("every target 500", "plain", lambda: Behaviour(status=500),
             lambda: Behaviour(status=500)),
)


def config_text(providers: ProviderThread) -> str:
    lines = ["providers:"]
    for name in (*OPENAI, *ANTHROPIC):
        dialect = "anthropic_messages" if name.startswith("a") else "openai_chat"
        lines.append(f"  {name}: {{base_url: '{providers.base_url(name)}', credential: null, "
                     f"dialects: [{dialect}]}}")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    lines += [f"callers: [{{name: bench, token_sha256: {digest}}}]",
              "observations: {flush_interval_ms: 50, max_retry_after_seconds: 0}", "models:"]
    for group, fallback in GROUPS.items():
        for suffix, (primary, spare) in (("", OPENAI), ("-claude", ANTHROPIC)):
            lines += [f"  {group}{suffix}:", "    strategy: failover",
                      f"    fallback: {fallback}", "    targets:",
                      f"      - {{provider: {primary}, model_ref: {primary}-model}}",
                      f"      - {{provider: {spare}, model_ref: {spare}-model}}"]
    return "\n".join(lines) + "\n"


def call(scenario: Scenario, up: UpProcess) -> tuple[str, str | None]:
    """(what the caller got, the serving model's name or None)."""
    text = "word " * 200 if scenario.long_prompt else "hello"
    messages = [{"role": "user", "content": text}]
    group = scenario.group + ("-claude" if scenario.anthropic else "")
    try:
        if scenario.anthropic:
            client = anthropic.Anthropic(base_url=up.base_url, api_key=TOKEN, max_retries=0,
                                         timeout=60)
            if scenario.stream:
                with client.messages.stream(model=group, max_tokens=16,
                                            messages=messages) as events:
                    final = events.get_final_message()
                return _complete(final.stop_reason is not None, final.model)
            message = client.messages.create(model=group, max_tokens=16, messages=messages)
            return _complete(bool(message.content), message.model)
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0,
                               timeout=60)
        if scenario.stream:
            chunks = list(client.chat.completions.create(model=group, messages=messages,
                                                         max_tokens=16, stream=True))
            finished = any(c.choices and c.choices[0].finish_reason for c in chunks)
            return _complete(finished, chunks[0].model if chunks else None)
        reply = client.chat.completions.create(model=group, messages=messages, max_tokens=16)
        return _complete(reply.choices[0].finish_reason is not None, reply.model)
    except (openai.APIStatusError, anthropic.APIStatusError) as error:
        if error.status_code == 200:  # the SDK read an error event in a 200 stream
            return "the provider's in-band error", None
        return f"error {error.status_code}", None
    except (openai.APIError, anthropic.APIError, ValueError):
        return "broken", None


def _complete(finished: bool, model: str | None) -> tuple[str, str | None]:
    return ("complete" if finished else "broken"), model


def run(output: Path | None) -> str:
    fakes = [FakeProvider(name) for name in (*OPENAI, *ANTHROPIC)]
    rows = []
    with ProviderThread(fakes) as providers, tempfile.TemporaryDirectory() as workdir:
        config = Path(workdir) / "config.yaml"
        config.write_text(config_text(providers))
        up = UpProcess(["--config", str(config)], log_path=Path(workdir) / "up.log")
        with up.running():
            for scenario in SCENARIOS:
                primary, spare = ANTHROPIC if scenario.anthropic else OPENAI
                for provider in fakes:
                    provider.received.clear()
                    provider.served = 0
                    provider.behaviour = Behaviour()
                providers.provider(primary).behaviour = scenario.primary()
                providers.provider(spare).behaviour = scenario.fallback()
                started = time.monotonic()
                got, model = call(scenario, up)
                took = time.monotonic() - started
                if got == "complete":
                    got = "primary" if model == f"{primary}-model" else "fallback"
                attempts = sum(len(p.received) for p in fakes)
                rows.append(f"| {scenario.name} | `{scenario.group}` | {got} | {attempts} | "
                            f"{took:.2f} |")
                time.sleep(0.1)  # the access log's batch, before the next scenario
    report = "\n".join([
        "## Provider behaviours against the stack (bench/fault_scenarios.py)", "",
        "| scenario | group | the caller got | upstream attempts | seconds |",
        "| --- | --- | --- | --- | --- |", *rows, "",
        f"{len(SCENARIOS)} scenarios from {len(BEHAVIOURS)} named behaviours "
        "(sidecar/devstack/provider_behaviours.py); `primary`/`fallback`: a complete answer "
        "from that target; `error NNN`: a JSON error in the caller's dialect; `broken`: no "
        "complete answer. Waits a 429 asks for are off here "
        "(`max_retry_after_seconds: 0`), so each scenario starts with both targets "
        "admitted; tests/e2e/wire/test_rate_limits.py covers them.", ""])
    print(report)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(report)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    run(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
