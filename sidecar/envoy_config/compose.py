"""The files docker-compose.yaml mounts, rendered from the same sources `sidecar up` uses.

Run ``python -m sidecar.envoy_config.compose`` after changing the renderer or the demo
configuration; a test fails while the committed copies differ from a fresh rendering.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.config import load_config_text
from sidecar.devstack.demo import demo_config_text
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import render_envoy_yaml

COMPOSE_PROVIDERS_URL = "http://demo-providers:18080"
COMPOSE_ADDRESSES = EnvoyAddresses(listen="0.0.0.0:10000", admin="0.0.0.0:9901",
                                   ext_proc="sidecar:50051",
                                   ca_bundle="/etc/ssl/certs/ca-certificates.crt")
SIDECAR_CONFIG = Path("envoy/compose/sidecar-config.yaml")
ENVOY_CONFIG = Path("envoy/envoy-compose.yaml")


def compose_files() -> dict[Path, str]:
    config_text = demo_config_text(COMPOSE_PROVIDERS_URL)
    config = load_config_text(config_text, source="compose demo configuration")
    return {
        SIDECAR_CONFIG: config_text,
        ENVOY_CONFIG: render_envoy_yaml(config, COMPOSE_ADDRESSES),
    }


def main(root: str = ".") -> int:
    for relative, text in compose_files().items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
