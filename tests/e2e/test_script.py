"""`strategy: script` through real Envoy (issue #17): each action decides where requests
from the official SDK land, and a request the rules leave nowhere is refused clearly."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, keyed_stack
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e

TOKENS = {"team": "script-team-token", "batch": "script-batch-token"}
NAMES = ("cheap", "mid", "premium")
CONFIG = """\
providers:
{providers}
callers:
  - {{name: team, token_sha256: {team}}}
  - {{name: batch, token_sha256: {batch}}}
models:
  routed:
    strategy: script
    targets:
      - {{provider: cheap, model_ref: cheap-model, tags: [cheap], supports_tools: true}}
      - {{provider: mid, model_ref: mid-model, supports_tools: true}}
      - {{provider: premium, model_ref: premium-model, tags: [premium], supports_tools: true,
         supports_reasoning: true}}
    script:
      base: failover
      rules:
        - when: "reasoning"
          prefer: {{tags: [premium]}}
        - when: "caller == 'batch'"
          require: {{tags: [cheap]}}
        - when: "tools == 'forced'"
          exclude: {{targets: [cheap/cheap-model]}}
        - when: "'stack_trace' in features"
          order: [mid/mid-model, premium/premium-model]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, ProviderThread]]:
    workdir: Path = tmp_path_factory.mktemp("script")
    fakes = [FakeProvider(name, api_key=f"key-{name}") for name in NAMES]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            providers="\n".join(f"  {n}: {{base_url: '{providers.base_url(n)}', "
                                f"credential: {{env: KEY_{n.upper()}}}}}" for n in NAMES),
            **{who: hashlib.sha256(token.encode()).hexdigest()
               for who, token in TOKENS.items()}),
            {name: f"key-{name}" for name in NAMES}) as running:
        yield running


def served(providers: ProviderThread, before: dict[str, int]) -> list[str]:
    return [name for name in NAMES
            for _ in range(len(providers.provider(name).received) - before[name])]


def ask(up: UpProcess, who: str = "team", **extra) -> None:
    client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKENS[who], max_retries=0)
    client.chat.completions.create(model="routed", **{
        "messages": [{"role": "user", "content": "hello"}], **extra})


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("who", "extra", "expected"), [
    ("team", {}, ["cheap"]),                                     # base order: failover
    ("team", {"reasoning_effort": "high"}, ["premium"]),         # prefer
    ("batch", {}, ["cheap"]),                                    # require
    ("team", {"tools": [TOOL], "tool_choice": "required"}, ["mid"]),  # exclude
    ("team", {"messages": [{"role": "user", "content":
              "Traceback (most recent call last):\n  File \"app.py\", line 3"}]},
     ["mid"]),                                                   # order
])
def test_each_action_decides_the_target(stack, who, extra, expected) -> None:
    up, providers = stack
    before = {name: len(providers.provider(name).received) for name in NAMES}
    ask(up, who, **extra)
    assert served(providers, before) == expected


def test_rules_that_leave_nothing_refuse_clearly(stack) -> None:
    up, providers = stack
    before = {name: len(providers.provider(name).received) for name in NAMES}
    with pytest.raises(openai.BadRequestError) as refused:
        ask(up, "batch", tools=[TOOL], tool_choice="required")
    assert "routing rules exclude the rest" in refused.value.message
    assert served(providers, before) == []
