"""Bridge clusters (docs/dialects.md §7, §9): a target reached from callers of another API.

The same upstream as the target's own cluster, but its upstream HTTP filters start with an
ext_proc that sees every attempt whole, request and response (headers SEND, bodies
BUFFERED), so the sidecar translates the request on the way up and the answer on the way
back. Native clusters never ask for the response: streams pass through them untouched.
"""

from __future__ import annotations

from envoy_data_plane.envoy.extensions.filters.http.upstream_codec.v3 import UpstreamCodec
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.google.protobuf import Any

from sidecar.envoy_config.fallback import attempt_processor, request_only_mode, strip_filter


def bridge_filters(message_timeout_ms: int, credential_headers: tuple[str, ...],
                   cleared_headers: tuple[str, ...], held: HttpFilter,
                   injectors: list[HttpFilter]) -> list[HttpFilter]:
    """Hold bounded replies (as every target cluster does), translate (every attempt, first
    ones included), strip, inject this target's key, then the codec."""
    processor = attempt_processor(message_timeout_ms, credential_headers,
                                  request_only_mode(with_response=True))
    return [
        held,
        HttpFilter(name="envoy.filters.http.ext_proc", typed_config=Any.pack(processor)),
        strip_filter(credential_headers, cleared_headers),
        *injectors,
        HttpFilter(name="envoy.filters.http.upstream_codec",
                   typed_config=Any.pack(UpstreamCodec())),
    ]
