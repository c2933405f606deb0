"""Every port `sidecar up` needs, checked before anything starts: a port another process
holds is an error that names it (exit 1), not an Envoy log line under a banner that says
the stack is up."""

from __future__ import annotations

import errno
import socket

from sidecar.envoy_config.addresses import split_host_port


class PortInUseError(OSError):
    """A port the stack needs is taken (or cannot be bound)."""


def check_free(ports: dict[str, str], flags: dict[str, str]) -> None:
    """`ports` maps a role ("client listener") to host:port; `flags` the role to the option
    that moves it. Port 0 (the kernel picks) is always free."""
    for role, address in ports.items():
        host, port = split_host_port(address)
        if port == 0:
            continue
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As Envoy and the sidecar bind: a port in TIME_WAIT is free to them.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                reason = ("in use by another process" if exc.errno == errno.EADDRINUSE
                          else exc.strerror or str(exc))
                move = f" ({flags[role]} picks another)" if role in flags else ""
                raise PortInUseError(f"the {role} port {address} is {reason}{move}") from None
