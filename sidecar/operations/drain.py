"""Graceful drain on SIGTERM (docs/reload.md §5): what a pod being replaced, or a rolling
update, needs so that no request is cut.

1. The gRPC health service answers NOT_SERVING at once (Kubernetes' readiness probe and
   Envoy's health checks take the sidecar out of rotation).
2. For `drain_seconds`, ext_proc streams in flight and new ones are served as before; with
   an Envoy of its own (`sidecar up`), Envoy's readiness path (`GET /ready` on the client
   listener, envoy_config/readiness.py) answers 503 at once, Envoy drains its listener (every
   response from then on carries `connection: close`, HTTP/2 clients get GOAWAY: Envoy runs
   with `--drain-strategy immediate`), the sidecar keeps serving for `grace_seconds` so a
   balancer notices, and the drain ends once Envoy has no request left. Without one
   (`serve`), the drain ends early once Envoy has gone: every connection that carried its
   calls has closed and no stream is in flight, so no request can arrive any more (compose
   stops Envoy before the sidecar; in a pod, Envoy exits after its preStop wait). A sidecar
   that no Envoy has called yet cannot tell a gone Envoy from an idle one, and serves the
   whole period, as does the grpcio server, which does not show its connections.
3. Then the sidecar stops, flushing telemetry on the way (RunningSidecar.stop).
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from sidecar.grpcwire import GrpcServer
from sidecar.operations.assembly import RunningSidecar

log = logging.getLogger("sidecar.drain")

# Envoy's count of requests it is serving on the model-groups listener.
ACTIVE_REQUESTS_STAT = "http.model_groups.downstream_rq_active"


async def drain(sidecar: RunningSidecar, drain_seconds: float,
                envoy_admin: str | None = None, grace_seconds: float = 0.0) -> None:
    started = time.monotonic()
    health = sidecar.server.health
    if health is not None:
        health.stop_serving()
    log.info("draining: health NOT_SERVING, serving what comes for up to %.0f s",
             drain_seconds)
    if envoy_admin is None:
        ended = await _until_envoy_gone(sidecar, started + drain_seconds)
        log.info("drained in %.1f s (%s)", time.monotonic() - started, ended)
        return
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        try:
            # Balancers see /ready fail; keep-alive clients are told to go.
            await client.post(f"http://{envoy_admin}/healthcheck/fail")
            await client.post(f"http://{envoy_admin}/drain_listeners?graceful")
        except httpx.HTTPError:
            return  # no Envoy to wait for
        grace = min(grace_seconds, drain_seconds)
        if grace > 0:
            log.info("serving %.1f s more so that load balancers notice", grace)
            await asyncio.sleep(grace)
        while time.monotonic() - started < drain_seconds:
            if await _envoy_idle(client, envoy_admin) and sidecar.processor.active_streams == 0:
                break
            await asyncio.sleep(0.1)
    log.info("drained in %.1f s", time.monotonic() - started)


async def _until_envoy_gone(sidecar: RunningSidecar, deadline: float) -> str:
    """Serve until `deadline`, or until the Envoy that called has closed every connection
    with no stream left in flight. Says which ended the drain."""
    server = sidecar.server
    if not isinstance(server, GrpcServer):
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        return "the drain period"
    while time.monotonic() < deadline:
        if (server.peers_seen and server.peers_open == 0
                and sidecar.processor.active_streams == 0):
            return "Envoy has closed its connections"
        await asyncio.sleep(0.1)
    return "the drain period"


async def _envoy_idle(client: httpx.AsyncClient, envoy_admin: str) -> bool:
    try:
        answer = await client.get(f"http://{envoy_admin}/stats",
                                  params={"filter": f"^{ACTIVE_REQUESTS_STAT}$"})
    except httpx.HTTPError:
        return True
    for line in answer.text.splitlines():
        name, _, value = line.partition(": ")
        if name == ACTIVE_REQUESTS_STAT:
            return value.strip() == "0"
    return True
