"""An EnvoyFilter that puts the routing inside an Istio ingress gateway (docs/deploy.md §4),
rendered from the same bootstrap as every other deployment: the gateway's own Envoy calls
the sidecar (a Service in the mesh) and routes each request by its decision.

The patches, applied in order to the gateway's listener for the model API's host:

1. the HTTP filters before the router — ext_proc, the response-header allowlist, the JSON
   error replies, the usage readers — each inserted before the router;
2. the router merged with the per-attempt access log (fallback observations);
3. the connection manager merged with the request access log and the local reply mapper;
4. the virtual host told to count attempts, and its routes' actions replaced by the
   attempt-order specifier, the retry policy and the timeouts;
5. every target cluster (with its per-attempt filters and key injection) and the sidecar's
   cluster added.

`apply_patches` applies them to an Envoy configuration the way Istio does for these
operations; tests/unit/test_istio.py validates the result with the real Envoy binary.
"""

from __future__ import annotations

import copy
from typing import Any

from sidecar.config.models import SidecarConfig
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.readiness import READINESS_FILTER
from sidecar.envoy_config.render import rendered_document

HCM = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"
# Route-action fields of Envoy's `cluster_specifier` oneof: setting one clears the others.
CLUSTER_SPECIFIERS = ("cluster", "cluster_header", "weighted_clusters",
                      "cluster_specifier_plugin", "inline_cluster_specifier_plugin")


def envoy_filter(config: SidecarConfig, addresses: EnvoyAddresses, host: str,
                 gateway_labels: dict[str, str], channel_token: str | None = None,
                 name: str = "model-group-routing", namespace: str = "istio-system"
                 ) -> dict[str, Any]:
    """The EnvoyFilter resource for the gateway pods with `gateway_labels`, routing the
    virtual host `host` (Istio names it `<host>:<port>`). `addresses.ext_proc` is where
    the gateway reaches the sidecar (its Service), `addresses.secrets_dir` where the
    gateway pods have the providers' SDS files."""
    hedging = sorted(name for name, group in config.models.items() if group.hedge is not None)
    if hedging:
        raise ValueError(f"hedge is not available in an Istio gateway (it needs internal "
                         f"listeners the patch does not add): models {', '.join(hedging)}")
    document = rendered_document(config, addresses, channel_token)
    manager = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    typed = manager["typed_config"]
    filters = typed["http_filters"]
    router = next(f for f in filters if f["name"] == ROUTER)
    virtual_host = typed["route_config"]["virtual_hosts"][0]
    # The catch-all route's action: the gateway's routes are its own, so every request
    # takes the default route class (its named classes and the route for decisions of one
    # target are not patched in; docs/deploy.md §4).
    route = virtual_host["routes"][-1]
    listener_match = {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
        "name": HCM, "subFilter": {"name": ROUTER}}}}}
    # Not the readiness path: an Istio gateway has its own health port (15021), and a /ready
    # of ours would answer for the whole gateway listener.
    patches: list[dict[str, Any]] = [
        {"applyTo": "HTTP_FILTER", "match": copy.deepcopy(listener_match),
         "patch": {"operation": "INSERT_BEFORE", "value": entry}}
        for entry in filters if entry["name"] not in (ROUTER, READINESS_FILTER)]
    patches.append({"applyTo": "HTTP_FILTER", "match": copy.deepcopy(listener_match),
                    "patch": {"operation": "MERGE", "value": router}})
    patches.append({"applyTo": "NETWORK_FILTER",
                    "match": {"context": "GATEWAY", "listener": {"filterChain": {
                        "filter": {"name": HCM}}}},
                    "patch": {"operation": "MERGE", "value": {"typed_config": {
                        "@type": typed["@type"], "access_log": typed.get("access_log", []),
                        "local_reply_config": typed["local_reply_config"]}}}})
    vhost_match = {"context": "GATEWAY", "routeConfiguration": {"vhost": {"name": host}}}
    patches.append({"applyTo": "VIRTUAL_HOST", "match": vhost_match,
                    "patch": {"operation": "MERGE", "value": {
                        "include_request_attempt_count": True}}})
    patches.append({"applyTo": "HTTP_ROUTE", "match": copy.deepcopy(vhost_match),
                    "patch": {"operation": "MERGE", "value": {
                        "route": route["route"],
                        "request_body_buffer_limit": route["request_body_buffer_limit"]}}})
    patches += [{"applyTo": "CLUSTER", "match": {"context": "GATEWAY"},
                 "patch": {"operation": "ADD", "value": cluster}}
                for cluster in document["static_resources"]["clusters"]]
    return {"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"workloadSelector": {"labels": gateway_labels},
                     "configPatches": patches}}


def apply_patches(bootstrap: dict[str, Any], resource: dict[str, Any]) -> dict[str, Any]:
    """The patched copy of a gateway-like static bootstrap (one listener, one connection
    manager, inline route configuration), as Istio applies these operations: inserts
    before the named filter, proto merges (maps merged, lists appended, a oneof member
    replacing its siblings), cluster additions."""
    patched = copy.deepcopy(bootstrap)
    static = patched["static_resources"]
    manager = next(f for f in static["listeners"][0]["filter_chains"][0]["filters"]
                   if f["name"] == HCM)
    typed = manager["typed_config"]
    for patch in resource["spec"]["configPatches"]:
        kind, value = patch["applyTo"], copy.deepcopy(patch["patch"]["value"])
        operation = patch["patch"]["operation"]
        if kind == "HTTP_FILTER":
            filters = typed["http_filters"]
            at = next(i for i, f in enumerate(filters) if f["name"] == ROUTER)
            if operation == "INSERT_BEFORE":
                filters.insert(at, value)
            else:
                _merge(filters[at], value)
        elif kind == "NETWORK_FILTER":
            _merge(manager, value)
        elif kind in ("VIRTUAL_HOST", "HTTP_ROUTE"):
            name = patch["match"]["routeConfiguration"]["vhost"]["name"]
            for host in typed["route_config"]["virtual_hosts"]:
                if host["name"] != name:
                    continue
                for target in ([host] if kind == "VIRTUAL_HOST" else host["routes"]):
                    _merge(target, value)
        elif kind == "CLUSTER":
            static["clusters"].append(value)
    return patched


def _merge(target: dict[str, Any], value: dict[str, Any]) -> None:
    for key, item in value.items():
        if key in CLUSTER_SPECIFIERS:
            for other in CLUSTER_SPECIFIERS:
                target.pop(other, None)
        current = target.get(key)
        if isinstance(item, dict) and isinstance(current, dict) and (
                item.get("@type") == current.get("@type")):  # same message: merge fields
            _merge(current, item)
        elif isinstance(item, list) and isinstance(target.get(key), list):
            target[key] = [*target[key], *item]
        else:
            target[key] = item
