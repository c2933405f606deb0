"""The Grafana dashboard's Envoy statistics are real: after a routed request and a fallback,
every `envoy_` name deploy/grafana/sidecar-dashboard.json queries (and the unit test's
ENVOY_METRICS) appears in the real Envoy's `/stats/prometheus`, with the labels the panels
select on; every `sidecar_` name in the sidecar's `/metrics`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import httpx
import pytest

from sidecar.devstack.harness import UpProcess, free_port, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider
from tests.unit.test_grafana_dashboard import (
    ENVOY_METRICS,
    dashboard_metric_names,
    families,
    family_samples,
    load,
)

pytestmark = pytest.mark.e2e

TOKEN = "grafana-caller-token"
KEYS = {"good": "key-good", "flaky": "key-flaky"}
CONFIG = """\
providers:
  good: {{base_url: '{good}', credential: {{env: KEY_GOOD}}}}
  flaky: {{base_url: '{flaky}', credential: {{env: KEY_FLAKY}}}}
callers: [{{name: team-a, token_sha256: {digest}}}]
observations: {{flush_interval_ms: 50, refresh_ms: 10}}
telemetry: {{sqlite_path: '{db}', replica: e2e}}
# A Redis that is not there: the quota store's figures exist (and say so).
quotas: {{redis_url: {{env: QUOTA_REDIS}}}}
models:
  cached:
    targets: [{{provider: good, model_ref: good-model}}]
    response_cache: {{}}
  chain:
    strategy: failover
    targets:
      - {{provider: flaky, model_ref: flaky-model}}
      - {{provider: good, model_ref: good-model}}
"""
# Labels the panels select on, by name prefix (model_groups: the listener's stat_prefix).
LABELS = {"envoy_cluster_": 'envoy_cluster_name="target__',
          "envoy_http_": 'envoy_http_conn_manager_prefix="model_groups"'}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """The stack after two routed requests, the first of which fell back to `good`."""
    workdir = tmp_path_factory.mktemp("grafana")
    fakes = [FakeProvider("good", api_key=KEYS["good"]),
             FakeProvider("flaky", api_key=KEYS["flaky"])]
    with keyed_stack(workdir, fakes, lambda providers: CONFIG.format(
            good=providers.base_url("good"), flaky=providers.base_url("flaky"),
            db=workdir / "telemetry.db", digest=hashlib.sha256(TOKEN.encode()).hexdigest()),
            KEYS, env={"QUOTA_REDIS": f"redis://127.0.0.1:{free_port()}/0"}
            ) as (up, providers):
        url = up.base_url + "/v1/chat/completions"
        headers = {"authorization": f"Bearer {TOKEN}"}
        body = {"model": "chain", "messages": [{"role": "user", "content": "dashboard"}]}
        with httpx.Client(timeout=10) as client:
            providers.provider("flaky").behaviour = Behaviour(status=503)
            assert client.post(url, json=body, headers=headers).status_code == 200
            providers.provider("flaky").behaviour = Behaviour()
            assert client.post(url, json=body, headers=headers).status_code == 200
        yield up


def sample_lines(exposition: str) -> dict[str, list[str]]:
    """Sample lines of a Prometheus text exposition by sample name."""
    found: dict[str, list[str]] = {}
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            found.setdefault(line.split("{", 1)[0].split(" ", 1)[0], []).append(line)
    return found


def test_every_envoy_name_the_dashboard_uses_is_in_envoys_stats(up: UpProcess) -> None:
    wanted = {n for n in dashboard_metric_names(load()) if n.startswith("envoy_")}
    wanted |= ENVOY_METRICS
    url = f"http://127.0.0.1:{up.admin_port}/stats/prometheus"
    deadline = time.monotonic() + 5
    while True:  # counters are live, but give a slow machine a moment
        samples = sample_lines(httpx.get(url, timeout=5).text)
        missing = wanted - samples.keys()
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert missing == set()
    for name in sorted(wanted):
        label = next(text for prefix, text in LABELS.items() if name.startswith(prefix))
        assert any(label in line for line in samples[name]), (name, samples[name][:3])


def test_every_sidecar_name_the_dashboard_uses_is_in_its_metrics(up: UpProcess) -> None:
    exposed = families(httpx.get(f"http://127.0.0.1:{up.admin_http_port}/metrics",
                                 timeout=5).text)
    allowed = set().union(*(family_samples(name, kind) for name, kind in
                            exposed.items()))
    used = {n for n in dashboard_metric_names(load()) if n.startswith("sidecar_")}
    assert used - allowed == set()
