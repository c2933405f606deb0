"""Where Envoy listens and finds the sidecar; kept apart from the renderer so that commands
which only need addresses do not import the (slow) typed Envoy API classes."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class EnvoyAddresses:
    """host:port strings for the client listener, Envoy admin and the sidecar."""

    listen: str = "127.0.0.1:10000"
    admin: str = "127.0.0.1:9901"
    ext_proc: str = "127.0.0.1:50051"
    ca_bundle: str = DEFAULT_CA_BUNDLE


def split_host_port(address: str, default_port: int | None = None) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"address '{address}' needs a port (host:port)")
        return address, default_port
    return host.strip("[]"), int(port)
