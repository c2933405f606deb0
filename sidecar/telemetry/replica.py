"""Which replica wrote a row: replicas usually share one configuration file, so the name
comes from where each one differs — its command line or its environment (a pod name) —
before the file, and from the host name when nobody says."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

# Set by `--replica` for the processes the sidecar starts (its telemetry worker), and by a
# deployment (Kubernetes: the pod name through the downward API).
REPLICA_ENV = "SIDECAR_REPLICA"


def replica_name(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """`SIDECAR_REPLICA` (what `--replica` sets), else `telemetry.replica`, else the host
    name."""
    environ = os.environ if environ is None else environ
    return environ.get(REPLICA_ENV, "").strip() or configured or socket.gethostname()
