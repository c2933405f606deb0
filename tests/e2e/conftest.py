"""One real stack for the end-to-end tests: fake providers in this process, and
`sidecar up --config` (the real sidecar and the real Envoy binary) as a child process."""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import Behaviour, FakeProvider

TOKEN_A = "caller-token-alpha-7f3a"
TOKEN_B = "caller-token-bravo-19c2"
PROVIDER_KEYS = {
    "baseten": "key-baseten-111",
    "minimax": "key-minimax-222",
    "openai": "key-openai-333",
    "anthropic": "key-anthropic-444",
    "p60": "key-p60",
    "p25": "key-p25",
    "p5": "key-p5",
    "drip": "key-drip",
}
SPEC_SAMPLE = (Path(__file__).parent.parent / "fixtures" / "spec_sample.yaml").read_text()


@dataclass
class Stack:
    up: UpProcess
    providers: ProviderThread

    @property
    def base_url(self) -> str:
        return self.up.base_url

    def log_size(self) -> int:
        assert self.up.log_path is not None
        return self.up.log_path.stat().st_size

    def decisions_since(self, offset: int) -> list[dict]:
        """Decision records the sidecar logged after byte `offset` of its log."""
        assert self.up.log_path is not None
        with open(self.up.log_path, "rb") as log:
            log.seek(offset)
            lines = log.read().decode().splitlines()
        return [json.loads(line.split(" sidecar.decision ", 1)[1])
                for line in lines if " sidecar.decision " in line]


def _config(providers: ProviderThread, anthropic_key_file: Path, closed_port: int) -> str:
    def provider(name: str, extra: str = "") -> str:
        return (f"  {name}:\n    base_url: {providers.base_url(name)}\n"
                f"    credential: {{ env: TEST_KEY_{name.upper()} }}\n{extra}")

    spec_group = SPEC_SAMPLE[len("models:\n"):]
    return (
        "providers:\n"
        + provider("baseten") + provider("minimax") + provider("openai")
        + f"  anthropic:\n    base_url: {providers.base_url('anthropic')}\n"
        f"    credential: {{ file: {anthropic_key_file} }}\n"
        + provider("p60") + provider("p25") + provider("p5") + provider("drip")
        + f"  dead:\n    base_url: http://127.0.0.1:{closed_port}/v1\n"
        "    dialects: [openai_chat, anthropic_messages]\n"
        + textwrap.dedent(f"""\
        callers:
          - name: team-a
            token_sha256: {hashlib.sha256(TOKEN_A.encode()).hexdigest()}
            models: [adaptive-agent, weighted-trio, claude-agent, drip-group, dead-group,
                     adaptive-agent-meta, affinity-agent]
          - name: team-b
            token_env: TEST_TOKEN_B
            models: [private-group, affinity-agent]
        models:
        """)
        + spec_group
        + textwrap.indent(textwrap.dedent("""\
        weighted-trio:
          strategy: weighted
          targets:
            - {provider: p60, model_ref: model-60, weight: 60}
            - {provider: p25, model_ref: model-25, weight: 25}
            - {provider: p5, model_ref: model-5, weight: 5}
        claude-agent:
          strategy: failover
          targets:
            - {provider: anthropic, model_ref: claude-test-1}
        drip-group:
          targets:
            - {provider: drip, model_ref: drip-model}
        private-group:
          targets:
            - {provider: p5, model_ref: private-model}
        dead-group:
          targets:
            - {provider: dead, model_ref: unreachable}
        affinity-agent:
          strategy: dynamic_score
          targets:
            - {provider: p60, model_ref: equal-a, weight: 1}
            - {provider: p25, model_ref: equal-b, weight: 1}
            - {provider: p5, model_ref: equal-c, weight: 1}
          routing_policy:
            dynamic_score:
              affinity: {ttl_seconds: 2, max_entries: 100}
        adaptive-agent-meta:
          strategy: dynamic_score
          description: the SPEC group plus capability metadata
          targets:
            - provider: baseten
              model_ref: gpt-oss-120b
              weight: 60
              tags: [validated, coding, tool_capable]
              input_modalities: [text, image]
              supports_reasoning: true
            - provider: minimax
              model_ref: m3
              weight: 25
              tags: [validated, low_cost, tool_capable]
              honors_max_tokens: false
            - provider: openai
              model_ref: gpt-5.4-nano
              weight: 5
              tags: [fallback]
              input_modalities: [text]
        """), "  ")
    )


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stack")
    fakes = [FakeProvider(name, api_key=key) for name, key in PROVIDER_KEYS.items()]
    fakes[-1].behaviour = Behaviour(inter_event_delay_s=0.25)
    with ProviderThread(fakes) as providers:
        key_file = workdir / "anthropic.key"
        key_file.write_text(PROVIDER_KEYS["anthropic"] + "\n")
        config_file = workdir / "config.yaml"
        config_file.write_text(_config(providers, key_file, free_port()))
        env = {f"TEST_KEY_{name.upper()}": key for name, key in PROVIDER_KEYS.items()
               if name != "anthropic"}
        env["TEST_TOKEN_B"] = TOKEN_B
        up = UpProcess(["--config", str(config_file), "--log-decisions"], env=env,
                       log_path=workdir / "up.log")
        with up.running():
            yield Stack(up, providers)


@pytest.fixture
def providers(stack: Stack) -> ProviderThread:
    stack.providers.clear()
    return stack.providers
