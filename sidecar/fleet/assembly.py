"""Build the fleet channel for a running sidecar from its configuration: what each part
reads through the gateway's current runtime, so a reload's new router and targets are
shared from the next round on."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

from sidecar.config.models import SidecarConfig
from sidecar.config.secrets import read_secret
from sidecar.fleet.answers import AnswerSharing
from sidecar.fleet.channel import FleetChannel
from sidecar.fleet.ejections import EjectionSharing
from sidecar.fleet.observations import ObservationSharing
from sidecar.fleet.pins import PinSharing
from sidecar.gateway import Gateway
from sidecar.observe.store import ObservationStore
from sidecar.routing.affinity import AffinityStore
from sidecar.routing.ejection import Ejections
from sidecar.telemetry.replica import replica_name


def fleet_channel(config: SidecarConfig, gateway: Gateway, store: ObservationStore,
                  environ: Mapping[str, str] | None = None) -> FleetChannel | None:
    """None without a Redis for the fleet. Raises ValueError for a secret that cannot be
    read or a URL that is not Redis's (without quoting it)."""
    source = config.fleet_redis
    if source is None:
        return None
    environ = os.environ if environ is None else environ
    url = read_secret(source.env, source.file, environ)
    settings = config.fleet
    # Two processes may carry one name (a copied environment): the suffix keeps their
    # entries apart; a restarted replica's old entries age out with their slices.
    me = f"{replica_name(config.telemetry.replica, environ).replace('|', '_')}#" \
         f"{secrets.token_hex(3)}"
    prefix = settings.key_prefix

    def labels(group: str) -> tuple[str, ...]:
        return tuple(f"{t.provider}/{t.model_ref}"
                     for t in gateway.runtime.config.models[group].targets)

    def ejections() -> dict[str, tuple[Ejections, frozenset[str]]]:
        router = gateway.runtime.router
        return {group: (state, frozenset(labels(group)))
                for group in gateway.runtime.config.models
                if (state := router.ejections(group)) is not None}

    def pins() -> dict[str, tuple[AffinityStore, tuple[str, ...]]]:
        router = gateway.runtime.router
        return {group: (held, labels(group)) for group in gateway.runtime.config.models
                if (held := router.affinity_store(group)) is not None}

    parts = [
        ObservationSharing(store, prefix, me,
                           lambda: frozenset(gateway.runtime.cluster_targets.values())),
        EjectionSharing(prefix, me, ejections),
        PinSharing(prefix, me, pins, lambda: gateway.sessions, settings.max_shared_per_round),
        AnswerSharing(prefix, me, lambda: gateway.caches),
    ]
    return FleetChannel(url, settings.publish_ms, parts, replica=me)
