"""Graceful drain on SIGTERM (docs/reload.md §5): what a pod being replaced, or a rolling
update, needs so that no request is cut.

1. The gRPC health service answers NOT_SERVING at once (Kubernetes' readiness probe and
   Envoy's health checks take the sidecar out of rotation).
2. For `drain_seconds`, ext_proc streams in flight and new ones are served as before; with
   an Envoy of its own (`sidecar up`), Envoy is told to drain its listeners and the drain
   ends early once Envoy has no request left.
3. Then the sidecar stops, flushing telemetry on the way (RunningSidecar.stop).
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from sidecar.operations.assembly import RunningSidecar

log = logging.getLogger("sidecar.drain")

# Envoy's count of requests it is serving on the model-groups listener.
ACTIVE_REQUESTS_STAT = "http.model_groups.downstream_rq_active"


async def drain(sidecar: RunningSidecar, drain_seconds: float,
                envoy_admin: str | None = None) -> None:
    started = time.monotonic()
    health = sidecar.server.health
    if health is not None:
        health.stop_serving()
    log.info("draining: health NOT_SERVING, serving what comes for up to %.0f s",
             drain_seconds)
    if envoy_admin is None:
        await asyncio.sleep(drain_seconds)
        return
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        try:
            await client.post(f"http://{envoy_admin}/drain_listeners?graceful")
        except httpx.HTTPError:
            return  # no Envoy to wait for
        while time.monotonic() - started < drain_seconds:
            if await _envoy_idle(client, envoy_admin) and sidecar.processor.active_streams == 0:
                break
            await asyncio.sleep(0.1)
    log.info("drained in %.1f s", time.monotonic() - started)


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
