"""Envoy's shadow listener as rendered (envoy_config/shadow_listener.py): only when a group
mirrors and an address is given; it answers only the channel token and target clusters,
removes both headers before the provider, has no ext_proc and no retries, and logs under
its own name."""

from __future__ import annotations

from sidecar.config import load_config_text
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import rendered_document
from sidecar.envoy_contract import (
    SHADOW_CLUSTER_HEADER,
    SHADOW_LISTENER,
    SHADOW_LOG_NAME,
    SHADOW_REFUSED_HEADER,
    SHADOW_TOKEN_HEADER,
    target_cluster_name,
)

CONFIG = """
providers:
  p: {base_url: "http://127.0.0.1:9/v1"}
  q: {base_url: "http://127.0.0.1:9/v1"}
models:
  g:
    targets:
      - {provider: p, model_ref: a}
      - {provider: q, model_ref: b, pricing: {input_per_mtok: 1, output_per_mtok: 2}}
%s
"""
MIRROR = "    rollout: {shadow_traffic: {target: q/b, shadow_only: true}}"
ADDRESSES = EnvoyAddresses(shadow="127.0.0.1:10001", ca_bundle="/dev/null")


def listeners(config_text: str, addresses: EnvoyAddresses = ADDRESSES) -> dict[str, dict]:
    document = rendered_document(load_config_text(config_text), addresses, "the-token")
    return {listener["name"]: listener for listener in
            document["static_resources"]["listeners"]}


def test_never_rendered_without_a_real_channel_token() -> None:
    """The committed placeholder would be a public password Envoy checks."""
    document = rendered_document(load_config_text(CONFIG % MIRROR), ADDRESSES, None)
    assert SHADOW_LISTENER not in {listener["name"] for listener in
                                   document["static_resources"]["listeners"]}


def test_rendered_only_for_a_mirroring_group_with_an_address() -> None:
    assert SHADOW_LISTENER in listeners(CONFIG % MIRROR)
    assert SHADOW_LISTENER not in listeners(CONFIG % "")
    assert SHADOW_LISTENER not in listeners(CONFIG % MIRROR, EnvoyAddresses(
        ca_bundle="/dev/null"))


def test_it_routes_only_the_token_and_target_clusters_and_does_nothing_else() -> None:
    listener = listeners(CONFIG % MIRROR)[SHADOW_LISTENER]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1",
                                                     "port_value": 10001}
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    config = manager["route_config"]
    mirrored, refused = config["virtual_hosts"][0]["routes"]
    headers = {h["name"]: h["string_match"] for h in mirrored["match"]["headers"]}
    assert headers[SHADOW_TOKEN_HEADER] == {"exact": "the-token"}
    # Only the candidate's own target cluster, by its exact name.
    candidate = target_cluster_name("g", 1, "q")
    assert headers[SHADOW_CLUSTER_HEADER] == {"exact": candidate}
    assert mirrored["route"]["cluster"] == candidate
    assert "retry_policy" not in mirrored["route"]
    assert refused["direct_response"]["status"] == 403
    assert refused["response_headers_to_add"][0]["header"]["key"] == SHADOW_REFUSED_HEADER
    # A first try, always: the target cluster's retry hook (which calls the sidecar) only
    # runs when Envoy's attempt count says a retry.
    assert config["virtual_hosts"][0]["include_request_attempt_count"] is True
    assert set(config["request_headers_to_remove"]) == {SHADOW_TOKEN_HEADER,
                                                         SHADOW_CLUSTER_HEADER}
    filters = [f["name"] for f in manager["http_filters"]]
    assert "envoy.filters.http.ext_proc" not in filters and filters[-1].endswith("router")
    [log] = manager["access_log"]
    assert log["typed_config"]["common_config"]["log_name"] == SHADOW_LOG_NAME
