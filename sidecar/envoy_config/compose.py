"""The file docker-compose.yaml mounts, rendered from the same sources `sidecar up` uses:
the demo configuration with the compose service names. (Envoy's bootstrap is not
committed: compose's `envoy-config` service renders it at start with a fresh channel
token; `COMPOSE_ADDRESSES` is what its command line says, checked by a test.)

Run ``python -m sidecar.envoy_config.compose`` after changing the demo configuration; a
test fails while the committed copy differs from a fresh rendering.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.devstack.demo import demo_config_text
from sidecar.envoy_config.addresses import EnvoyAddresses

COMPOSE_PROVIDERS_URL = "http://demo-providers:18080"
COMPOSE_ADDRESSES = EnvoyAddresses(listen="0.0.0.0:10000", admin="127.0.0.1:9901",
                                   ext_proc="sidecar:50051",
                                   ca_bundle="/etc/ssl/certs/ca-certificates.crt",
                                   secrets_dir="/run/sidecar/secrets")
SIDECAR_CONFIG = Path("envoy/compose/sidecar-config.yaml")


def compose_files() -> dict[Path, str]:
    return {SIDECAR_CONFIG: demo_config_text(COMPOSE_PROVIDERS_URL)}


def main(root: str = ".") -> int:
    for relative, text in compose_files().items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
