"""Where Envoy listens and finds the sidecar; kept apart from the renderer so that commands
which only need addresses do not import the (slow) typed Envoy API classes."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

DEFAULT_ADMIN_HTTP = "127.0.0.1:50052"  # the sidecar's own admin endpoint
DEFAULT_SECRETS_DIR = "/etc/envoy/secrets"

# Where common distributions keep the system CA bundle (Debian/Ubuntu, RHEL/Fedora, Alpine,
# macOS, SUSE); OpenSSL's own default is tried first.
_CA_CANDIDATES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
)


@dataclass(frozen=True)
class EnvoyAddresses:
    """host:port strings for the client listener, Envoy admin and the sidecar; the CA file
    for https providers (None: the system bundle, found by `find_ca_bundle`); the folder
    where Envoy finds the providers' SDS secret files (envoy_config/credentials.py)."""

    listen: str = "127.0.0.1:10000"
    admin: str = "127.0.0.1:9901"
    ext_proc: str = "127.0.0.1:50051"
    ca_bundle: str | None = None
    secrets_dir: str = DEFAULT_SECRETS_DIR
    # Envoy's loopback listener for shadow traffic (envoy_config/shadow_listener.py); None:
    # none, and groups' `rollout.shadow_traffic` send nothing.
    shadow: str | None = None


def find_ca_bundle() -> str:
    """The system CA bundle Envoy should trust for https providers."""
    default = ssl.get_default_verify_paths().cafile
    for path in (default, *_CA_CANDIDATES):
        if path and os.path.isfile(path):
            return path
    raise FileNotFoundError(
        "no system CA bundle found for https providers; pass --ca-bundle FILE")


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``host:port``; raise ValueError with a readable message otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"'{address}' is not host:port (for example 127.0.0.1:10000)")
    return host.strip("[]"), int(port)
