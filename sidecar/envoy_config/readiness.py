"""The client listener's readiness path, for a load balancer in front of several replicas.

Balancers need a health check they can reach without Envoy's admin port (which must stay
private): `GET /ready` on the client listener, answered by Envoy's own health-check filter
(200 while serving; 503 once the drain has called Envoy's `/healthcheck/fail`), so a
draining replica is taken out of rotation while it still serves what comes
(operations/drain.py). The answer says nothing but the status.

It also follows the sidecar: Envoy health-checks the sidecar's gRPC health service every
second, and `/ready` answers 503 while the sidecar is not SERVING. So a sidecar that
drains (SIGTERM) takes its Envoy out of rotation within a second even where it cannot reach
Envoy's admin (`sidecar serve` beside an Envoy of its own container, in compose or a pod);
requests still reach the draining sidecar meanwhile (one host, all unhealthy: Envoy's
panic mode routes to it anyway)."""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.core.v3 import HealthCheck as ClusterHealthCheck
from envoy_data_plane.envoy.config.core.v3 import HealthCheckGrpcHealthCheck
from envoy_data_plane.envoy.config.route.v3 import HeaderMatcher
from envoy_data_plane.envoy.extensions.filters.http.health_check.v3 import HealthCheck
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any

from sidecar.envoy_contract import EXT_PROC_CLUSTER
from sidecar.grpcwire.time_scale import time_scale

READY_PATH = "/ready"
READINESS_FILTER = "envoy.filters.http.health_check"


def readiness_filter() -> HttpFilter:
    """First in the chain: a readiness probe costs no ext_proc exchange and no access log."""
    check = HealthCheck(pass_through_mode=False, headers=[HeaderMatcher(
        name=":path", string_match=StringMatcher(exact=READY_PATH))],
        cluster_min_healthy_percentages={EXT_PROC_CLUSTER: Percent(value=100.0)})
    return HttpFilter(name=READINESS_FILTER, typed_config=Any.pack(check))


def sidecar_health_check() -> ClusterHealthCheck:
    """Envoy asks the sidecar's gRPC health service (the server as a whole) every second,
    traffic or not; one answer changes the state either way. (The soak's test knob makes
    the interval shorter, never the timeout: grpcwire/time_scale.py.)"""
    second = timedelta(seconds=1)
    interval = timedelta(seconds=1 / time_scale())
    return ClusterHealthCheck(
        timeout=second, interval=interval, no_traffic_interval=interval,
        unhealthy_threshold=1, healthy_threshold=1,
        grpc_health_check=HealthCheckGrpcHealthCheck(service_name=""))
