"""The demo configuration and the demo providers that back it."""

from __future__ import annotations

import json
import os
import secrets
from importlib import resources
from pathlib import Path

from sidecar.devstack.providers import Behaviour, FakeProvider, ProviderServer

DEMO_PROVIDER_NAMES = ("baseten", "minimax", "openai", "anthropic")
DEMO_TOKEN_ENV = "SIDECAR_DEMO_TOKEN"
DEMO_PROVIDER_KEY_ENV = "SIDECAR_DEMO_PROVIDER_KEY"
DEFAULT_DEMO_TOKEN = "demo-caller-token"
DEFAULT_DEMO_PORT = 18080


# What the demo's files are called in its state folder (demo_state_dir).
DEMO_TELEMETRY_FILE = "demo-telemetry.db"
DEMO_CONFIG_COPY = "demo-config.yaml"
DEMO_REQUEST_FILE = "demo-request.json"


def demo_state_dir() -> Path:
    """Where the demo keeps what outlives one run (its telemetry database, a copy of its
    configuration for `explain`): $XDG_STATE_HOME/model-group-sidecar, by default
    ~/.local/state/model-group-sidecar."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "model-group-sidecar"


def demo_config_text(providers_root: str, telemetry_db: Path | None = None) -> str:
    """The packaged demo configuration with providers at `providers_root` (scheme://host:port),
    writing telemetry to `telemetry_db` when one is given."""
    template = resources.files("sidecar.devstack").joinpath("demo-config.yaml").read_text()
    text = template.replace("{{DEMO_PROVIDERS}}", providers_root.rstrip("/"))
    if telemetry_db is not None:
        text += ("\n# Request rows for `sidecar report` and GET /reports/* "
                 "(docs/telemetry.md).\n"
                 f"telemetry:\n  sqlite_path: {json.dumps(str(telemetry_db))}\n")
    return text


def write_demo_files(state_dir: Path, config_text: str) -> tuple[Path, Path]:
    """The running demo's configuration and an example request, for `sidecar explain`."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = state_dir / DEMO_CONFIG_COPY
    config.write_text(config_text)
    request = state_dir / DEMO_REQUEST_FILE
    request.write_text(json.dumps({"model": "adaptive-agent", "messages": [
        {"role": "user", "content": "Fix this stack trace:\nTraceback (most recent call "
                                    "last):\n  File \"app.py\", line 3\nKeyError: 'id'"}]},
        indent=1) + "\n")
    return config, request


def demo_provider_server(host: str, port: int, api_key: str | None,
                         inter_event_delay_s: float = 0.05) -> ProviderServer:
    return ProviderServer(
        [
            FakeProvider(name, api_key=api_key,
                         behaviour=Behaviour(inter_event_delay_s=inter_event_delay_s))
            for name in DEMO_PROVIDER_NAMES
        ],
        host=host,
        port=port,
    )


def new_provider_key() -> str:
    return "demo-provider-" + secrets.token_hex(8)
