"""Envoy follows a reload through file-based xDS (docs/reload.md §2).

The bootstrap keeps only what never changes with the routing configuration — the admin
address, the overload manager, the sidecar's own cluster and the no-target cluster — and
reads the target clusters (CDS) and the listener (LDS) from two files in a directory it
watches. A reload rewrites those files atomically (written beside, then renamed into the
directory: Envoy reacts to the move and never reads half a file).

Why files rather than an ADS stream served by the sidecar: Envoy already watches files,
there is nothing to keep in step (no stream, nonces or acknowledgements in the sidecar's
hot process), a file is what an operator can read and diff, and in Kubernetes the two
containers share an `emptyDir`. The price is that only Envoy's admin endpoint says when an
update took: the embedded stack polls `/clusters` before the sidecar routes to new targets.

Clusters are published as the union of the new configuration's and the previous one's, so
requests that started before a reload finish on clusters that still exist; the previous
configuration's clusters leave with the next publication.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from sidecar.envoy_contract import EXT_PROC_CLUSTER, NO_TARGET_CLUSTER

# JSON (a subset of YAML, which Envoy reads by the extension): emitted by the C encoder,
# 26 MB of clusters for 1,000 groups × 5 targets in well under a second.
CDS_FILE = "cds.json"
LDS_FILE = "lds.json"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
STATIC_CLUSTERS = (EXT_PROC_CLUSTER, NO_TARGET_CLUSTER)


def dynamic_bootstrap(document: dict[str, Any], directory: Path) -> dict[str, Any]:
    """`document` (a full static bootstrap) with its target clusters and listener moved
    to the watched files in `directory`."""
    bootstrap = copy.deepcopy(document)
    static = bootstrap["static_resources"]
    static["clusters"] = [c for c in static["clusters"] if c["name"] in STATIC_CLUSTERS]
    static.pop("listeners", None)
    bootstrap["dynamic_resources"] = {
        "cds_config": _watched(directory / CDS_FILE, directory),
        "lds_config": _watched(directory / LDS_FILE, directory),
    }
    return bootstrap


def _watched(path: Path, directory: Path) -> dict[str, Any]:
    return {"resource_api_version": "V3",
            "path_config_source": {"path": str(path),
                                   "watched_directory": {"path": str(directory)}}}


class XdsFiles:
    """The CDS and LDS files of one Envoy, versioned, each publication atomic."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.version = 0
        self._current: dict[str, dict[str, Any]] = {}
        self._listeners: list[dict[str, Any]] = []

    @classmethod
    def resume(cls, directory: Path) -> XdsFiles:
        """Carry on from the files already there (another process wrote them: `sidecar
        render-envoy --xds-dir`): their version goes on, their clusters count as the
        previous publication."""
        files = cls(directory)
        try:
            published = json.loads((directory / CDS_FILE).read_text())
            files.version = int(published["version_info"])
            files._current = {r["name"]: {k: v for k, v in r.items() if k != "@type"}
                              for r in published["resources"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return files

    def publish(self, document: dict[str, Any], listening: bool = True) -> list[str]:
        """Write the target clusters and listener of `document` (a full static bootstrap),
        keeping the previous publication's clusters one more round. Returns the names of
        the clusters Envoy must have before the sidecar may route to them. Not `listening`:
        the listener is held back until `publish_listeners` (an Envoy that starts before
        its sidecar takes no client traffic yet)."""
        static = document["static_resources"]
        clusters = {c["name"]: c for c in static["clusters"] if c["name"] not in STATIC_CLUSTERS}
        published = {**self._current, **clusters}
        self._current = clusters
        self.version += 1
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_atomically(self.directory / CDS_FILE, self._response(
            CLUSTER_TYPE, list(published.values())))
        self._listeners = static["listeners"]
        _write_atomically(self.directory / LDS_FILE, self._response(
            LISTENER_TYPE, self._listeners if listening else []))
        return list(clusters)

    def publish_listeners(self) -> None:
        """The listener the last `publish` held back."""
        self.version += 1
        _write_atomically(self.directory / LDS_FILE, self._response(
            LISTENER_TYPE, self._listeners))

    def _response(self, type_url: str, resources: list[dict[str, Any]]) -> str:
        body = {"version_info": str(self.version),
                "resources": [{"@type": type_url, **resource} for resource in resources]}
        return json.dumps(body, separators=(",", ":"))


def _write_atomically(path: Path, text: str) -> None:
    """Owner-only (the files carry the channel token), then renamed into place."""
    partial = path.with_name(f".{path.name}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.replace(partial, path)


async def wait_for_clusters(admin_address: str, names: list[str],
                            timeout_s: float = 15.0) -> str | None:
    """Poll Envoy's admin `/clusters` until every one of `names` is there; a problem
    (for the reload's answer) if they are not within `timeout_s`."""
    wanted = set(names)
    have: set[str] = set()
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        while True:
            try:
                text = (await client.get(f"http://{admin_address}/clusters")).text
                have = {line.split("::", 1)[0] for line in text.splitlines()}
                if wanted <= have:
                    return None
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                missing = sorted(wanted - have)
                return (f"Envoy did not take the new clusters within {timeout_s:.0f} s "
                        f"(missing: {', '.join(missing[:5])}); the running configuration "
                        "stays")
            await asyncio.sleep(0.05)
