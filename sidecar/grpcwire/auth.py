"""Who may call the sidecar's gRPC port: only the Envoy it was started for.

Envoy sends a per-deployment secret as gRPC initial metadata on every call it makes to the
sidecar (the `initial_metadata` of its `GrpcService`, rendered by `sidecar render-envoy`);
the server compares it in constant time before a call reaches any handler. Health checks
stay open, because probes (Kubernetes, load balancers) cannot send metadata and the health
service reveals nothing but "serving". Envoy's own health checks of the sidecar carry the
token too (envoy_config/channel.py), so they never spend what a peer without it may.

The token is a shared secret between two processes the operator runs side by side, not a
user credential: it is generated per start by `sidecar up`, or read from a file (a
Kubernetes or compose secret) by `sidecar serve --grpc-token-file`.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

# The metadata key Envoy sends the token in (lower case: HTTP/2 header names are).
CHANNEL_TOKEN_HEADER = "x-sidecar-channel-token"
# Methods any peer may call without the token.
OPEN_METHODS = frozenset({
    b"/grpc.health.v1.Health/Check",
    b"/grpc.health.v1.Health/Watch",
})
# Shorter tokens are refused at start-up: the token is the port's only credential.
MIN_TOKEN_CHARS = 32


class ChannelTokenError(Exception):
    """The channel token cannot be used (missing, unreadable, too short, not printable)."""


class ChannelAuth:
    """Decides whether a call's initial metadata carries the channel token."""

    __slots__ = ("_token",)

    def __init__(self, token: str) -> None:
        check_token(token)
        self._token = token.encode("ascii")

    def allows(self, method: bytes, presented: bytes | None) -> bool:
        return method in OPEN_METHODS or self.carries_token(presented)

    def carries_token(self, presented: bytes | None) -> bool:
        """The right token, whatever the method: a health call that carries it is Envoy's."""
        return presented is not None and hmac.compare_digest(presented, self._token)


def check_token(token: str, what: str = "gRPC channel token") -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise ChannelTokenError(f"the {what} must have at least {MIN_TOKEN_CHARS} characters")
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ChannelTokenError(f"the {what} must be printable ASCII without spaces (it "
                                "travels as an HTTP header value)")


def new_channel_token() -> str:
    """A fresh random token (256 bits, URL-safe), as `sidecar up` makes one per start."""
    return secrets.token_urlsafe(32)


def read_channel_token(path: Path, what: str = "gRPC channel token") -> str:
    """The token from a secret file (surrounding whitespace ignored). Errors name the file,
    never its content. Also reads the admin endpoint's token (`what` names it)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ChannelTokenError(f"cannot read the {what} file {path}: {reason}") from None
    try:
        check_token(token, what)
    except ChannelTokenError as exc:
        raise ChannelTokenError(f"{path}: {exc}") from None
    return token


def ensure_channel_token(path: Path) -> str:
    """The token in `path`; if there is no such file, a new token written there with
    owner-only permissions (how a deployment makes its token once)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(new_channel_token() + "\n")
    return read_channel_token(path)
