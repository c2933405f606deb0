"""The Istio EnvoyFilter (sidecar/envoy_config/istio.py, docs/deploy.md §4): rendered from
the same bootstrap as every deployment, valid as a Kubernetes object, and — applied to a
gateway-like Envoy configuration the way Istio applies it — accepted by the real Envoy
binary, routing by the sidecar's decision."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sidecar.config import load_config_file, load_config_text
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.istio import apply_patches, envoy_filter
from sidecar.envoy_contract import EXT_PROC_CLUSTER, target_cluster_name
from tests.unit.test_envoy_config import FIXTURES, envoy_validate

HOST = "models.example.com:80"


def gateway_bootstrap() -> dict:
    """What an Istio ingress gateway's Envoy holds for one VirtualService host, reduced
    to the parts the patches touch."""
    return {"static_resources": {
        "listeners": [{"name": "0.0.0.0_8080", "address": {"socket_address": {
            "address": "127.0.0.1", "port_value": 18080}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network."
                             "http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "outbound_0.0.0.0_8080",
                    "route_config": {"name": "http.8080", "virtual_hosts": [{
                        "name": HOST, "domains": ["models.example.com"],
                        "routes": [{"match": {"prefix": "/"}, "route": {
                            "cluster": "outbound|80||model-group-gateway.svc",
                            "timeout": "0s"}}]}]},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http."
                                 "router.v3.Router"}}]}}]}]}],
        "clusters": [{"name": "outbound|80||model-group-gateway.svc", "type": "STATIC",
                      "connect_timeout": "1s", "load_assignment": {
                          "cluster_name": "outbound|80||model-group-gateway.svc",
                          "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                              "socket_address": {"address": "127.0.0.1",
                                                 "port_value": 18081}}}}]}]}}]},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        # Istio's gateway bootstrap raises Envoy's RE2 program-size bound to this in its
        # static runtime layer (the response-header allowlist's regex needs more than 100).
        "layered_runtime": {"layers": [{"name": "global config", "static_layer": {
            "re2.max_program_size.error_level": 32768}}]},
        "node": {"id": "gateway", "cluster": "gateway"}}


def test_the_patched_gateway_validates_and_routes_by_the_sidecar(tmp_path: Path) -> None:
    config = load_config_file(FIXTURES / "spec_sample.yaml")
    write_sds_files(config, tmp_path / "secrets")
    addresses = EnvoyAddresses(ext_proc="127.0.0.1:50051", secrets_dir=str(tmp_path / "secrets"))
    resource = envoy_filter(config, addresses, HOST, {"istio": "ingressgateway"})
    assert resource["kind"] == "EnvoyFilter"
    patched = apply_patches(gateway_bootstrap(), resource)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(patched, sort_keys=False))
    envoy_validate(path)
    manager = patched["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = [f["name"] for f in manager["typed_config"]["http_filters"]]
    assert filters[0] == "envoy.filters.http.ext_proc" and filters[-1].endswith(".router")
    route = manager["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert "cluster" not in route  # the sidecar's attempt order decides
    assert route["inline_cluster_specifier_plugin"]["extension"]["name"].endswith(
        "priority_group")
    names = {c["name"] for c in patched["static_resources"]["clusters"]}
    assert {EXT_PROC_CLUSTER, target_cluster_name("adaptive-agent", 0, "baseten")} <= names


def test_render_istio_refuses_hedging_it_cannot_patch_in() -> None:
    """Hedging needs internal listeners and pair clusters the EnvoyFilter does not add."""
    config = load_config_text(
        "models:\n  h:\n    targets: [{provider: openai, model_ref: a},"
        " {provider: openai, model_ref: b}]\n    hedge: {}\n")
    with pytest.raises(ValueError, match="hedge is not available in an Istio gateway"):
        envoy_filter(config, EnvoyAddresses(), "api.example", {"istio": "ingressgateway"})
