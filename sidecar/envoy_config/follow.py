"""Keeping an Envoy in step with the sidecar's configuration through the xDS files of
envoy_config/xds_files.py — for `sidecar up` (its own Envoy) and for `sidecar serve
--xds-dir` (an Envoy started from `render-envoy --xds-dir`, sharing the directory).

`render-envoy --xds-dir` records the addresses it rendered with in the directory
(`addresses.json`), so the sidecar renders the same listener and clusters on a reload
without being told them again."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from sidecar.config.models import SidecarConfig
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.render import bootstrap_yaml, rendered_document
from sidecar.envoy_config.xds_files import XdsFiles, dynamic_bootstrap, wait_for_clusters

ADDRESSES_FILE = "addresses.json"


def start_xds(config: SidecarConfig, addresses: EnvoyAddresses, channel_token: str | None,
              directory: Path, listening: bool = True) -> tuple[str, XdsFiles]:
    """Publish the first CDS and LDS into `directory`, record the addresses, and return the
    bootstrap (YAML) that reads them, with the publisher. Not `listening`: the listener
    waits for `XdsFiles.publish_listeners`."""
    xds = XdsFiles(directory)
    document = rendered_document(config, addresses, channel_token)
    xds.publish(document, listening)
    (directory / ADDRESSES_FILE).write_text(json.dumps(dataclasses.asdict(addresses)))
    (directory / ADDRESSES_FILE).chmod(0o600)
    return bootstrap_yaml(dynamic_bootstrap(document, directory)), xds


def recorded_addresses(directory: Path) -> EnvoyAddresses:
    """What `render-envoy --xds-dir` rendered with; ValueError when it is not there."""
    try:
        fields = json.loads((directory / ADDRESSES_FILE).read_text())
        return EnvoyAddresses(**fields)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{directory / ADDRESSES_FILE}: not written by `sidecar "
                         f"render-envoy --xds-dir` ({exc})") from None


def follower(xds: XdsFiles, addresses: EnvoyAddresses, channel_token: str | None,
             envoy_admin: str | None) -> Callable[[SidecarConfig], Awaitable[str | None]]:
    """The reload step that hands Envoy a configuration (operations/reload.py,
    `before_swap`): SDS files, then CDS and LDS (rendered off the event loop), then — when
    Envoy's admin address is known — wait until Envoy has the new clusters."""
    async def follow(config: SidecarConfig) -> str | None:
        def publish() -> list[str]:
            write_sds_files(config, Path(addresses.secrets_dir))
            return xds.publish(rendered_document(config, addresses, channel_token))

        names = await asyncio.to_thread(publish)
        if envoy_admin is None:
            return None
        return await wait_for_clusters(envoy_admin, names)

    return follow


def serve_follower(directory: Path, channel_token: str | None, envoy_admin: str | None,
                   config: SidecarConfig) -> Callable[[SidecarConfig], Awaitable[str | None]]:
    """`sidecar serve --xds-dir`: the addresses `render-envoy --xds-dir` recorded, the files
    carried on, and this sidecar's configuration published once at start (it may be newer
    than the one rendered)."""
    addresses = recorded_addresses(directory)
    xds = XdsFiles.resume(directory)
    write_sds_files(config, Path(addresses.secrets_dir))
    xds.publish(rendered_document(config, addresses, channel_token))
    return follower(xds, addresses, channel_token, envoy_admin)
