"""Assemble a running sidecar: routing runtime, observation store, gRPC server (ext_proc,
access logs, health) and the admin HTTP endpoint. Used by `sidecar serve` and `sidecar up`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.cache.caches import ResponseCaches
from sidecar.cache.metrics import add_cache_metrics
from sidecar.config.models import SidecarConfig
from sidecar.console.app import Console, ConsoleSources
from sidecar.console.decision_ring import DecisionRing
from sidecar.envoy_config.addresses import split_host_port
from sidecar.evaluation.metrics import add_shadow_metrics
from sidecar.evaluation.shadow import ShadowLoop
from sidecar.external.client import ExternalCalls
from sidecar.extproc.processor import ExternalProcessor
from sidecar.extproc.server import start_server
from sidecar.fleet.assembly import fleet_channel
from sidecar.fleet.channel import FleetChannel
from sidecar.gateway import Gateway, Runtime
from sidecar.gateway.hedging import add_hedge_metrics
from sidecar.grpcwire import GrpcServer
from sidecar.grpcwire.auth import ChannelAuth
from sidecar.observe.access_log import AccessLogReceiver, FanOut
from sidecar.observe.store import ObservationStore
from sidecar.operations.admin import AdminServer, check_exposure
from sidecar.operations.log_format import current as log_format_now
from sidecar.quotas.admission import Quotas
from sidecar.quotas.metrics import add_quota_metrics
from sidecar.rollout.canary_guard import CanaryGuard
from sidecar.rollout.canary_metrics import add_canary_metrics
from sidecar.rollout.shadow_traffic import ShadowTraffic
from sidecar.rollout.shadow_traffic_metrics import add_shadow_traffic_metrics
from sidecar.routing.router import Router
from sidecar.telemetry.admin_reports import AdminReports
from sidecar.telemetry.database import open_database
from sidecar.telemetry.handoff import TelemetryHandoff
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.rows import price_records
from sidecar.telemetry.traces import RequestSpans
from sidecar.telemetry.worker import Start

# How long a replaced external routing client stays open for calls already waiting (the
# deadline of any call is below Envoy's message timeout, at most 60 s).
RETIRE_AFTER_S = 60.0

if TYPE_CHECKING:
    from sidecar.extproc.grpcio_server import GrpcioServer
    from sidecar.operations.reload import Reloader


@dataclass
class RunningSidecar:
    server: GrpcServer | GrpcioServer
    admin: AdminServer
    store: ObservationStore
    gateway: Gateway
    receiver: AccessLogReceiver | None
    quotas: Quotas
    max_request_s: float
    metrics: Metrics
    processor: ExternalProcessor
    telemetry: TelemetryHandoff | None = field(default=None)
    fleet: FleetChannel | None = field(default=None)
    shadows: ShadowLoop | None = field(default=None)
    reloader: Reloader | None = field(default=None)
    # Judges groups' canaries every second (rollout/canary_guard.py).
    canary_guards: asyncio.Task | None = field(default=None)
    # External routing clients a reload replaced: closed once their calls are done.
    _retired: list[ExternalCalls] = field(default_factory=list)

    def retire(self, external: ExternalCalls) -> None:
        """Close `external` after the longest a call of it can still wait."""
        self._retired.append(external)
        loop = asyncio.get_running_loop()
        loop.call_later(RETIRE_AFTER_S, lambda: loop.create_task(self._close(external)))

    async def _close(self, external: ExternalCalls) -> None:
        if external in self._retired:
            self._retired.remove(external)
            await external.close()

    async def stop(self, grace: float = 2.0) -> None:
        if self.reloader is not None and self.reloader.watcher is not None:
            self.reloader.watcher.cancel()
        await self.admin.stop()
        if self.canary_guards is not None:
            self.canary_guards.cancel()
        if self.gateway.mirror is not None:
            await self.gateway.mirror.stop()
        await self.server.stop(grace=grace)
        await self.quotas.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.shadows is not None:
            await self.shadows.stop()  # its last rollup before telemetry stops
        if self.telemetry is not None:
            await self.telemetry.stop()
        for external in [self.gateway.external, *self._retired]:
            if external is not None:
                await external.close()


def observation_store(config: SidecarConfig) -> ObservationStore:
    return ObservationStore.for_config(config)


def longest_request_s(config: SidecarConfig) -> float:
    """The longest time a request's attempts can span, plus the access-log flush delay."""
    deadlines = [config.deadline_seconds(group) for group in config.models.values()]
    return max(deadlines) + 2 * config.observations.flush_interval_ms / 1000 + 1


def telemetry_for(config: SidecarConfig, metrics: Metrics) -> TelemetryHandoff:
    """The hand-over to a worker process that joins, counts, traces and stores the rows.
    Raises what the settings would raise in the worker (an unreadable DSN, a missing extra)
    here, at start, rather than there."""
    settings = config.telemetry
    open_database(settings)
    if settings.traces is not None:
        RequestSpans.check_available()
    level, log_format = log_format_now()
    start = Start(settings, longest_request_s(config), price_records(config.target_prices),
                  level, log_format)
    return TelemetryHandoff(start, metrics.add_counts, settings.handoff_size)


async def start_sidecar(config: SidecarConfig, runtime: Runtime, grpc_address: str,
                        admin_address: str, log_decisions: bool = False,
                        channel_token: str | None = None,
                        grpc_server: str = "own",
                        admin_token: str | None = None,
                        shadow_address: str | None = None,
                        replay_reports: Path | None = None) -> RunningSidecar:
    """Raises OSError when an address cannot be bound; nothing is left running then.
    With `channel_token`, ext_proc and access-log calls must present it (grpcwire/auth.py);
    without, the gRPC port trusts every peer (only for tests of the port itself).
    `grpc_server`: "own" (sidecar/grpcwire) or "grpcio" (extproc/grpcio_server.py).
    Raises ValueError for an admin address beyond loopback without `admin_token`.
    `shadow_address`: Envoy's shadow listener, where groups' shadow traffic goes (none
    without it, nor without `channel_token`, which that listener requires).
    `replay_reports`: a folder of `sidecar replay --format json` reports for the console."""
    host, port = split_host_port(admin_address)
    check_exposure(host, admin_token)
    store = observation_store(config)
    enabled = config.observations.enabled
    metrics = Metrics(store)
    telemetry = (await telemetry_for(config, metrics).start()
                 if enabled and config.telemetry.enabled else None)
    external = ExternalCalls.for_config(config)
    caches = ResponseCaches.for_config(config, longest_request_s(config))
    # Always there (a reload may give a caller quotas); a caller without any costs one
    # dictionary lookup.
    quotas = Quotas(config, longest_request_s(config))
    gateway = Gateway(runtime, observations=store, log_decisions=log_decisions,
                      telemetry=telemetry, external=external, caches=caches, quotas=quotas)
    fleet = fleet_channel(config, gateway, store) if enabled else None
    # Groups' canaries, judged on their requests' ends (docs/rollout.md); the withdrawals
    # the telemetry database records reach every replica that shares it, and a restart.
    reports = AdminReports(config.telemetry) if telemetry is not None else None
    canary = CanaryGuard(lambda: gateway.runtime.router, lambda: gateway.runtime.config,
                         telemetry.canary if telemetry is not None else None,
                         reports.withdrawn_canaries if reports is not None else None,
                         max_request_s=longest_request_s(config))
    # Groups' shadow traffic (docs/rollout.md §4): sent off the request path, paired with
    # the live answers the access log brings.
    mirror = ShadowTraffic(config, shadow_address, channel_token,
                           telemetry.mirror if telemetry is not None else None,
                           max_request_s=longest_request_s(config))
    gateway.mirror = mirror
    if enabled:
        gateway.canary = canary
    # The console's recent decisions (console/decision_ring.py), told how each ended.
    ring = DecisionRing()
    gateway.recent = ring
    sinks = [sink for sink in (telemetry, quotas.ledger, canary if enabled else None,
                               mirror if enabled else None, ring) if sink is not None]
    receiver = (AccessLogReceiver(store, runtime.cluster_targets, runtime.cluster_groups,
                                  attempt_window_s=longest_request_s(config),
                                  telemetry=FanOut(sinks), hedges=lambda: gateway.hedges)
                if enabled else None)
    if receiver is not None:
        receiver.mirror = mirror
    processor = ExternalProcessor(gateway)
    auth = ChannelAuth(channel_token) if channel_token is not None else None
    try:
        server = await start_server(processor, grpc_address, receiver, auth, grpc_server)
    except OSError:
        if telemetry is not None:
            await telemetry.stop()
        raise
    if telemetry is not None:
        metrics.add_gauges(telemetry.gauges)
    metrics.add_gauges(lambda: {f"grpc_{name}": float(value)
                                for name, value in server.counters.as_dict().items()})
    metrics.add_gauges(lambda: {"ext_proc_streams": float(processor.active_streams)})
    metrics.add_handling_times(processor.handling)
    add_routing_metrics(metrics, gateway)
    add_shadow_metrics(metrics, lambda: gateway.shadows)
    add_hedge_metrics(metrics, lambda: gateway.hedges)
    add_canary_metrics(metrics, canary, lambda: gateway.runtime.router,
                       lambda: list(gateway.runtime.config.models))
    add_shadow_traffic_metrics(metrics, mirror)
    if receiver is not None:
        metrics.add_counter("access_log_entries", "Envoy access-log entries received, by log",
                            ("log",), lambda: {(name,): n for name, n in receiver.entries.items()})
        metrics.add_counter("unrecognised_refusals",
                            "provider refusals (400, 413, 422) no entry of the refusal "
                            "catalogue knows, passed through as sent, by provider",
                            ("provider",), lambda: {(name,): n for name, n in
                                                    receiver.unrecognised_refusals.items()})
        metrics.add_gauges(lambda: {"access_log_attempts_waiting":
                                    float(receiver.attempts_waiting)})
    shadows = ShadowLoop(lambda: gateway.shadows,
                         telemetry.shadow if telemetry is not None else None,
                         lambda: gateway.retired_shadows)
    shadows.start()
    add_cache_metrics(metrics, lambda: gateway.caches)
    add_quota_metrics(metrics, quotas)
    quotas.start()
    if fleet is not None:
        metrics.add_gauges(fleet.gauges)
        metrics.add_counter("fleet_rounds", "fleet channel rounds by outcome", ("outcome",),
                            lambda: {(k,): v for k, v in fleet.rounds.items()})
        fleet.start()
    admin = AdminServer(store, host, port, processor, server.counters.as_dict, metrics,
                        token=admin_token, reports=reports)
    admin.console = Console(ConsoleSources(
        lambda: gateway.runtime, store, ring, quotas,
        fleet.gauges if fleet is not None else None,
        config.telemetry if telemetry is not None else None, replay_reports),
        admin_token, port)
    try:
        await admin.start()
    except OSError as exc:
        await server.stop(grace=0)
        await shadows.stop()
        if fleet is not None:
            await fleet.stop()
        if telemetry is not None:
            await telemetry.stop()
        raise OSError(f"cannot listen on {admin_address} (admin): {exc.strerror}") from None
    running = RunningSidecar(server, admin, store, gateway, receiver, quotas,
                             longest_request_s(config), metrics, processor, telemetry, fleet,
                             shadows)
    if enabled:
        running.canary_guards = asyncio.get_running_loop().create_task(canary.run())
    return running


def add_routing_metrics(metrics: Metrics, gateway: Gateway) -> None:
    """Per-group routing state, read through the gateway's current configuration (a reload
    replaces it)."""
    def by_group(read: Callable[[Router, str], float | None]) -> Callable[[], dict]:
        def figures() -> dict[str, float]:
            router = gateway.runtime.router
            return {group: value for group in gateway.runtime.config.models
                    if (value := read(router, group)) is not None}
        return figures

    metrics.add_group_gauge("affinity_pins", "conversation pins held", by_group(
        lambda router, group: None if (pins := router.affinity_store(group)) is None
        else float(len(pins))))
    metrics.add_group_gauge("ejected_targets", "targets ejected or probing", by_group(
        lambda router, group: None if (state := router.ejections(group)) is None
        else float(state.ejected_count())))
    metrics.add_counter("external_decisions", "decisions of strategy: external groups by "
                        "how the routing service's answer was used", ("group", "outcome"),
                        lambda: dict(gateway.external.outcomes) if gateway.external else {})
