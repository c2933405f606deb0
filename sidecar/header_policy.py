"""Which headers cross the gateway: by allowlist, in both directions.

A caller's request reaches a provider with only the headers a provider needs to serve it
(framing, content negotiation, the dialect's version and beta headers, a user agent, the
request id) plus the names a provider's `pass_request_headers` adds. Cookies, custom
tokens, tracing and anything else a caller sends stay at the gateway. The caller's own
credentials are dropped too; Envoy injects the provider's key per attempt
(envoy_config/credentials.py).

A provider's response reaches the caller with only the headers a client needs (framing,
content type, the provider's request id, `retry-after`) plus every provider's
`pass_response_headers`: account and rate-limit headers describe the gateway's provider
account, not the caller's.

Pseudo-headers (`:path`, ...) are Envoy's and never filtered here.
"""

from __future__ import annotations

from sidecar.config.models import Credential, SidecarConfig
from sidecar.dialects.apis import Dialect
from sidecar.envoy_contract import ROUTE_CLASS_HEADER

# Headers that carry a caller's own credentials; never sent to a provider.
CALLER_CREDENTIAL_HEADERS = ("authorization", "x-api-key", "proxy-authorization")

REQUEST_ALLOWLIST = frozenset({
    "content-type",
    "content-length",
    "transfer-encoding",
    "accept",
    "user-agent",
    "x-request-id",
    # The dialects' version and feature headers.
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
})

# Kept past the sidecar because Envoy's route lookup needs it (a request without it matches
# no route), and removed by each target cluster's upstream filters instead.
# The route class is removed by the listener's route configuration already; an Istio
# gateway's routes are its own, so the target clusters remove it too.
ROUTING_ONLY_HEADERS = ("x-forwarded-proto", ROUTE_CLASS_HEADER)

RESPONSE_ALLOWLIST = frozenset({
    "content-type",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "cache-control",
    "date",
    "retry-after",
    "x-request-id",
    "request-id",  # Anthropic's
    # The gateway's response-cache marker (docs/cache.md); a provider's own is removed by
    # every target cluster (envoy_config/fallback.py, strip_filter).
    "x-sidecar-cache",
    # Set by Envoy on the way out; listed so the filter never has to know it.
    "server",
})


def forwarded_request_headers(config: SidecarConfig) -> frozenset[str]:
    """What may leave the router-level exchange: the allowlist and every provider's extra
    names (a target cluster removes the extras that are not its own provider's)."""
    extras = {name for provider in config.providers.values()
              for name in provider.pass_request_headers}
    return REQUEST_ALLOWLIST | extras | frozenset(ROUTING_ONLY_HEADERS)


# Forwarded headers that cannot change what a provider answers (framing, negotiation, ids).
_NEUTRAL_REQUEST_HEADERS = frozenset({"content-type", "content-length", "transfer-encoding",
                                      "accept", "user-agent", "x-request-id",
                                      *ROUTING_ONLY_HEADERS})


def answer_varying_headers(config: SidecarConfig) -> tuple[str, ...]:
    """The caller headers that reach a provider and may change its answer (the dialects'
    version and beta headers, every provider's `pass_request_headers`): part of the
    response cache's key, so a cached answer is never served to a request that would have
    been answered differently."""
    return tuple(sorted(forwarded_request_headers(config) - _NEUTRAL_REQUEST_HEADERS))


def cluster_stripped_headers(config: SidecarConfig, provider: str) -> tuple[str, ...]:
    """What `provider`'s cluster removes beyond credentials: the routing-only headers, and
    extra names other providers pass that `provider` must not receive."""
    own = set(config.providers[provider].pass_request_headers)
    others = {name for name_, other in config.providers.items() if name_ != provider
              for name in other.pass_request_headers}
    return (*ROUTING_ONLY_HEADERS, *sorted(others - own - REQUEST_ALLOWLIST))


def returned_response_headers(config: SidecarConfig) -> frozenset[str]:
    extras = {name for provider in config.providers.values()
              for name in provider.pass_response_headers}
    return RESPONSE_ALLOWLIST | extras


def credential_header(credential: Credential, dialect: Dialect) -> tuple[str, str]:
    """(header, value prefix) that carries the key. Header default: `x-api-key` for
    Anthropic, `authorization` otherwise; prefix default: `Bearer ` on `authorization`."""
    header = (credential.header or ("x-api-key" if dialect.is_anthropic
                                    else "authorization")).lower()
    prefix = credential.prefix
    if prefix is None:
        prefix = "Bearer " if header == "authorization" else ""
    return header, prefix


def credential_headers(config: SidecarConfig) -> tuple[str, ...]:
    """Every header name that carries some provider's key, plus the callers' credential
    headers: what each attempt clears before its own key is injected."""
    names = set(CALLER_CREDENTIAL_HEADERS)
    for group in config.models.values():
        for target in group.targets:
            credential = config.providers[target.provider].credential
            if credential is not None:
                names.update(credential_header(credential, dialect)[0]
                             for dialect in config.target_dialects(target))
    return tuple(sorted(names))
