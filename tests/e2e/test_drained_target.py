"""Issue 41 through real Envoy, one replica: a drained target stays out while it is still
sick (its share of attempts bounded, probes, retries and fallbacks counted), and a
conversation whose first turn a probe served stays with that target once it is back (the
pin records the probe, the initially selected primary)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import Behaviour, FakeProvider
from sidecar.routing.ejection import PROBE_SHARE
from tests.e2e.drained import GROUP_YAML, HEALTHY, probing_rounds, sick_share_after_drain

pytestmark = pytest.mark.e2e
TOKEN = "drained-target-token"
CONFIG = """\
providers:
{providers}
callers: [{{name: team, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 50}}
models:
{drained}
  pinned:
    strategy: dynamic_score
    targets:
      - {{provider: first, model_ref: first-m, weight: 50}}
      - {{provider: second, model_ref: second-m, weight: 50}}
    routing_policy:
      dynamic_score:
        min_observations: 5
        observation_window_seconds: 30
        affinity: {{ttl_seconds: 600}}
        thresholds: {{max_error_rate: 0.2}}
"""
NAMES = ("cheap", "dear", "first", "second")


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[UpProcess, dict[str, FakeProvider]]]:
    tmp = tmp_path_factory.mktemp("drained")
    fakes = {name: FakeProvider(name, behaviour=HEALTHY, seed=41) for name in NAMES}
    with ProviderThread(list(fakes.values())) as providers:
        lines = "\n".join(f"  {name}: {{base_url: '{providers.base_url(name)}', "
                          "credential: null}" for name in NAMES)
        config = tmp / "config.yaml"
        config.write_text(CONFIG.format(
            providers=lines, digest=hashlib.sha256(TOKEN.encode()).hexdigest(),
            drained=GROUP_YAML.format(cheap="cheap", dear="dear")))
        up = UpProcess(["--config", str(config), "--log-decisions"], log_path=tmp / "up.log")
        with up.running():
            yield up, fakes


def ejected(up: UpProcess, group: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics", timeout=5).text
    found = re.search(rf'^sidecar_ejected_targets{{group="{group}"}} (\S+)$', text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def chat(up: UpProcess, messages: list[dict]) -> httpx.Response:
    return httpx.post(f"{up.base_url}/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {TOKEN}"},
                      json={"model": "pinned", "messages": messages})


def test_a_drained_target_gets_its_probe_share_and_no_more(stack) -> None:
    """At 30 requests a second, 40 s of them after the drain. Before issue 41 a probing
    round came every 5-10 s whatever the traffic, some thirty probes each: 10.6 % of the
    attempts here (the issue found 13 %); now a round starts only once the probes so far
    are within PROBE_SHARE of the group's decisions since the target left."""
    up, fakes = stack
    share = sick_share_after_drain(fakes["cheap"], fakes["dear"], [up.listen_port], TOKEN,
                                   lambda: ejected(up, "drained") == 1.0, 1_200, 30.0)
    rounds, probes, decisions = probing_rounds(up.log_path, "drained", "cheap/cheap-m")
    print(f"one replica: {share} ({100 * share.share:.2f} %); rounds {rounds}; "
          f"{probes} probes in {decisions} decisions")
    assert share.failed == 0  # its failed probes fell back to the healthy target
    assert rounds, "it was never probed"
    for spent, since in rounds:
        assert spent <= PROBE_SHARE * since + 1, rounds


def test_a_first_turn_a_probe_served_keeps_its_target_on_the_next_turn(stack) -> None:
    up, fakes = stack
    second = fakes["second"]
    second.behaviour = Behaviour(status=503)
    sent = 0
    while ejected(up, "pinned") != 1.0:
        chat(up, [{"role": "user", "content": f"warm-up {sent}"}])
        sent += 1
        assert sent < 200, "the failing target was never ejected"
    second.behaviour = HEALTHY  # it recovers while out: its probes will answer well
    probed = None
    deadline = time.monotonic() + 60
    for index in range(5_000):
        assert time.monotonic() < deadline, "no probe ever served a first turn"
        before, out = len(second.received), ejected(up, "pinned") == 1.0
        question = f"conversation {index}"
        assert chat(up, [{"role": "user", "content": question}]).status_code == 200
        if probed is None and out and len(second.received) > before:
            probed = question  # the target out served it: a probe led the decision
        if probed is not None and ejected(up, "pinned") == 0.0:
            break  # and it is back
        time.sleep(0.01)  # the ejection lasts seconds: spread the probes over it
    assert probed is not None and ejected(up, "pinned") == 0.0
    before = len(second.received)
    follow_up = [{"role": "user", "content": probed},
                 {"role": "assistant", "content": "an answer"},
                 {"role": "user", "content": "and then?"}]
    assert chat(up, follow_up).status_code == 200
    # The pin named the probe, not the rotation's pick: the turn stays where it began.
    assert len(second.received) == before + 1
