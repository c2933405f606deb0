"""Envoy's half of the gRPC channel authentication (sidecar/grpcwire/auth.py): every gRPC
service in the bootstrap that calls the sidecar (both ext_proc filters, both access logs)
sends the channel token as initial metadata, and so do Envoy's health checks of the
sidecar's cluster (envoy_config/readiness.py). Without it each health check (one a second)
was a call without the token, and the sidecar's budget for those (100 per connection) closed
Envoy's health-check connection every ~100 s: `/ready` answered 503 for a second each time.

Applied to the rendered document as data, so a gRPC service added anywhere later is covered
without each builder having to remember the token.
"""

from __future__ import annotations

from typing import Any

from sidecar.envoy_contract import EXT_PROC_CLUSTER, SHADOW_TOKEN_HEADER
from sidecar.grpcwire.auth import CHANNEL_TOKEN_HEADER

# What the committed compose bootstrap carries instead of a real token; the compose stack
# renders its own file with a fresh token at start (docker-compose.yaml).
CHANNEL_TOKEN_PLACEHOLDER = "replace-with-the-sidecar-channel-token-file-content"


def add_channel_token(document: dict, token: str) -> dict:
    """Add the token to every `grpc_service` that targets the sidecar's cluster."""
    _walk(document, token)
    return document


def _walk(node: Any, token: str) -> None:
    if isinstance(node, dict):
        if node.get("name") == SHADOW_TOKEN_HEADER and "string_match" in node:
            node["string_match"] = {"exact": token}  # the shadow listener's route
        service = node.get("grpc_service")
        if isinstance(service, dict) and _targets_sidecar(service):
            service["initial_metadata"] = [{"key": CHANNEL_TOKEN_HEADER, "value": token}]
        if node.get("name") == EXT_PROC_CLUSTER:
            for check in node.get("health_checks", ()):
                grpc_check = check.get("grpc_health_check")
                if isinstance(grpc_check, dict):
                    grpc_check["initial_metadata"] = [
                        {"header": {"key": CHANNEL_TOKEN_HEADER, "value": token}}]
        for value in node.values():
            _walk(value, token)
    elif isinstance(node, list):
        for value in node:
            _walk(value, token)


def _targets_sidecar(service: dict) -> bool:
    return service.get("envoy_grpc", {}).get("cluster_name") == EXT_PROC_CLUSTER
