"""deploy/grafana/sidecar-dashboard.json stays importable and charts only metrics that exist:
every `sidecar_` name in its PromQL is one the sidecar's code exposes on `/metrics`, every
`envoy_` name one in ENVOY_METRICS, which tests/e2e/test_grafana_envoy_stats.py checks
against the real Envoy binary."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from sidecar.envoy_contract import target_cluster_name

REPO = Path(__file__).parent.parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "sidecar-dashboard.json"
ROWS = ["Traffic & decisions", "Fallbacks & affinity", "Target observations", "Envoy clusters",
        "Sidecar health", "Guards & reloads"]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Names seen in Envoy 1.40's /stats/prometheus in front of the sidecar, after a routed request
# and a fallback (labelled counters such as *_xx appear only once they count something);
# tests/e2e/test_grafana_envoy_stats.py checks each against the real binary.
ENVOY_METRICS = frozenset({
    "envoy_cluster_upstream_rq_total",
    "envoy_cluster_upstream_rq_xx",
    "envoy_cluster_retry_upstream_rq_xx",
    "envoy_cluster_upstream_rq_time_bucket",
    "envoy_cluster_upstream_rq_retry",
    "envoy_cluster_upstream_rq_timeout",
    "envoy_cluster_upstream_cx_connect_fail",
    "envoy_cluster_upstream_cx_active",
    "envoy_cluster_ext_proc_streams_failed",
    "envoy_cluster_ext_proc_message_timeouts",
    "envoy_http_downstream_rq_total",
    "envoy_http_downstream_rq_xx",
    "envoy_http_ext_proc_streams_failed",
    "envoy_http_ext_proc_message_timeouts",
})
# Families the sidecar exposes that the dashboard leaves out on purpose.
NOT_CHARTED = frozenset({
    "sidecar_grpc_idle_closed",  # GOAWAY after the idle timeout: normal churn
    "sidecar_hedge_decisions_total",  # hedged + no budget, both charted
    "sidecar_access_log_entries_total",  # a diagnostic: the entries each log carries
    "sidecar_access_log_attempts_waiting",  # a diagnostic: bounded, pairs by itself
})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"\b(?:sidecar|envoy)_[A-Za-z0-9_:]*")
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*\w+\)$", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """The `sidecar_`/`envoy_` metric names a PromQL expression selects. Label names appear
    only in matchers `{...}`, grouping clauses `by (...)` and strings, so those go first;
    every such identifier left is a metric name (a histogram's keeps its _bucket suffix)."""
    bare = _STRING.sub('""', expr)
    bare = _MATCHERS.sub("{}", bare)
    bare = _GROUPING.sub("", bare)
    return set(_NAME.findall(bare))


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included, and the panels of collapsed rows."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def chart_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(dashboard) if p["type"] != "row"]


def variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return query["query"] if isinstance(query, dict) else query


def exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and the selectors of query variables."""
    found = [t["expr"] for p in chart_panels(dashboard) for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable_query(variable))
            assert match, variable["name"]
            found.append(match.group(1))
    return found


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    return set().union(*(metric_names(e) for e in exprs(dashboard)))


def family_samples(name: str, kind: str) -> set[str]:
    """The sample names of a metric family in the text format."""
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count"}
    return {name}


def families(exposition: str) -> dict[str, str]:
    """`# TYPE` lines of a Prometheus text exposition: family name → type."""
    return {parts[2]: parts[3] for line in exposition.splitlines()
            if (parts := line.split())[:2] == ["#", "TYPE"]}


@pytest.fixture(scope="module")
def sidecar_families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The families the real sidecar serves on /metrics (start_sidecar, telemetry on, so
    every counter and gauge is there), on ephemeral loopback ports."""
    # Here, not at the top: the e2e test imports this module's helpers.
    from sidecar.config import load_config_text
    from sidecar.devstack.harness import free_port
    from sidecar.gateway import Runtime
    from sidecar.operations.assembly import start_sidecar
    from sidecar.operations.reload import enable_reload

    workdir = tmp_path_factory.mktemp("grafana")
    db = workdir / "telemetry.db"
    # A group with a response cache, quotas shared through a Redis that is not there (its
    # rounds fail: the figures exist) and a configuration file that can be reloaded.
    url_file = workdir / "redis-url"
    url_file.write_text(f"redis://127.0.0.1:{free_port()}/0")
    path = workdir / "config.yaml"
    path.write_text(f"""
providers:
  p: {{base_url: "http://127.0.0.1:9/v1"}}
models:
  g: {{targets: [{{provider: p, model_ref: m}}], response_cache: {{}}}}
telemetry: {{sqlite_path: '{db}'}}
quotas: {{redis_url: {{file: '{url_file}'}}}}
fleet: {{publish_ms: 50}}
""")
    config = load_config_text(path.read_text())

    async def scrape() -> str:
        sidecar = await start_sidecar(config, Runtime(config, {}), "127.0.0.1:0",
                                      "127.0.0.1:0")
        enable_reload(sidecar, path, watch_interval_s=None)
        try:
            url = f"http://127.0.0.1:{sidecar.admin.port}/metrics"

            def get() -> str:
                with urllib.request.urlopen(url, timeout=5) as response:
                    return response.read().decode()

            return await asyncio.to_thread(get)
        finally:
            await sidecar.stop(grace=0)

    return families(asyncio.run(scrape()))


def test_metric_names_leave_out_labels_functions_and_strings() -> None:
    expr = ('histogram_quantile(0.95, sum by (envoy_cluster_name, le) (rate('
            'envoy_cluster_upstream_rq_time_bucket{envoy_cluster_name=~"target__envoy_x"}'
            '[$__rate_interval]))) / on (group) sidecar_affinity_pins + sidecar_ext_proc_streams')
    assert metric_names(expr) == {"envoy_cluster_upstream_rq_time_bucket",
                                  "sidecar_affinity_pins", "sidecar_ext_proc_streams"}


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = load()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["id"] is None and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variable_query(variables["group"]) == "label_values(sidecar_decisions_total, group)"
    for name in ("group", "target", "cluster"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == DATASOURCE
    titles = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert titles == ROWS


def test_every_panel_queries_prometheus_with_a_target() -> None:
    for panel in chart_panels(load()):
        assert panel["type"] in {"timeseries", "stat"}, panel["title"]
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]
            expr = target["expr"]
            assert expr.strip() and metric_names(expr), panel["title"]
            bare = _STRING.sub('""', expr)
            for opening, closing in ("()", "{}", "[]"):
                assert bare.count(opening) == bare.count(closing), (panel["title"], expr)


def test_panel_ids_are_unique() -> None:
    ids = [p["id"] for p in panels(load())]
    assert len(ids) == len(set(ids))


def test_grid_positions_fit_the_24_columns_and_do_not_overlap() -> None:
    every = panels(load())
    for panel in every:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["y"] >= 0 and pos["w"] >= 1 and pos["h"] >= 1, pos
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            assert (pos["x"], pos["w"], pos["h"]) == (0, 24, 1), panel["title"]

    def overlap(a: dict[str, int], b: dict[str, int]) -> bool:
        return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
                and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])

    for a, b in combinations(every, 2):
        assert not overlap(a["gridPos"], b["gridPos"]), (a["title"], b["title"])


def test_every_variable_used_is_defined() -> None:
    dashboard = load()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for expr in exprs(dashboard):
        for braced, plain in _VARIABLE.findall(expr):
            name = braced or plain
            assert name in defined or name.startswith("__"), (name, expr)


def test_the_cluster_variable_matches_the_sidecars_cluster_names() -> None:
    """`cluster` selects `target__${group}__.*`: the shape envoy_contract gives them."""
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert 'envoy_cluster_name=~"target__${group}__.*"' in variable_query(variables["cluster"])
    assert re.fullmatch("target__(chain|other)__.*", target_cluster_name("chain", 1, "good"))
    assert re.fullmatch(variables["cluster"]["allValue"], target_cluster_name("g-1", 0, "p"))


def test_every_sidecar_metric_is_one_the_code_exposes(sidecar_families) -> None:
    allowed = set().union(*(family_samples(name, kind) for name, kind in
                            sidecar_families.items()))
    used = {n for n in dashboard_metric_names(load()) if n.startswith("sidecar_")}
    assert used - allowed == set()


def test_every_envoy_metric_was_seen_in_real_envoy_output() -> None:
    used = {n for n in dashboard_metric_names(load()) if n.startswith("envoy_")}
    assert used - ENVOY_METRICS == set()
    assert ENVOY_METRICS - used == set(), "names no panel uses: drop them from the list"


def test_every_sidecar_family_is_charted_or_left_out_on_purpose(sidecar_families) -> None:
    """A new metric gets a panel (or a NOT_CHARTED entry saying why not)."""
    used = dashboard_metric_names(load())
    uncharted = {name for name, kind in sidecar_families.items()
                 if not family_samples(name, kind) & used}
    assert uncharted == NOT_CHARTED
