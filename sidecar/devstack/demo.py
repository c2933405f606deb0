"""The demo configuration and the demo providers that back it."""

from __future__ import annotations

import secrets
from importlib import resources

from sidecar.devstack.providers import Behaviour, FakeProvider, ProviderServer

DEMO_PROVIDER_NAMES = ("baseten", "minimax", "openai", "anthropic")
DEMO_TOKEN_ENV = "SIDECAR_DEMO_TOKEN"
DEMO_PROVIDER_KEY_ENV = "SIDECAR_DEMO_PROVIDER_KEY"
DEFAULT_DEMO_TOKEN = "demo-caller-token"
DEFAULT_DEMO_PORT = 18080


def demo_config_text(providers_root: str) -> str:
    """The packaged demo configuration with providers at `providers_root` (scheme://host:port)."""
    template = resources.files("sidecar.devstack").joinpath("demo-config.yaml").read_text()
    return template.replace("{{DEMO_PROVIDERS}}", providers_root.rstrip("/"))


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
