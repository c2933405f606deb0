"""The client listener's readiness path, for a load balancer in front of several replicas.

Balancers need a health check they can reach without Envoy's admin port (which must stay
private): `GET /ready` on the client listener, answered by Envoy's own health-check filter
(200 while serving; 503 once the drain has called Envoy's `/healthcheck/fail`), so a
draining replica is taken out of rotation while it still serves what comes
(operations/drain.py). The answer says nothing but the status."""

from __future__ import annotations

from envoy_data_plane.envoy.config.route.v3 import HeaderMatcher
from envoy_data_plane.envoy.extensions.filters.http.health_check.v3 import HealthCheck
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Any

READY_PATH = "/ready"
READINESS_FILTER = "envoy.filters.http.health_check"


def readiness_filter() -> HttpFilter:
    """First in the chain: a readiness probe costs no ext_proc exchange and no access log."""
    check = HealthCheck(pass_through_mode=False, headers=[HeaderMatcher(
        name=":path", string_match=StringMatcher(exact=READY_PATH))])
    return HttpFilter(name=READINESS_FILTER, typed_config=Any.pack(check))
