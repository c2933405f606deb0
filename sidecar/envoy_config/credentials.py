"""Provider keys live in Envoy, never in the sidecar.

Each target cluster injects its provider's key itself, with Envoy's credential injector
(`envoy.filters.http.credential_injector`, generic credential) as an upstream HTTP filter,
so every attempt, a fallback to another provider included, carries exactly its own
target's key. The key reaches Envoy as an SDS generic secret: one small SDS file per
provider (written by `sidecar up` or `render-envoy --secrets-dir`) that points at the key's
environment variable or file, both of which Envoy reads itself. Envoy's admin shows that
pointer only as `[redacted]`.

Because the sidecar holds no key, no peer of its gRPC port can obtain one from it
(docs/security.md). Before the injector, a static header-mutation filter removes every
header that carries any provider's key or a caller's credential, since header changes made
for one attempt carry over to the next (facts measured on Envoy 1.40: shared ARCHITECTURE).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from envoy_data_plane.envoy.config.core.v3 import (
    ConfigSource,
    PathConfigSource,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.extensions.filters.http.credential_injector.v3 import (
    CredentialInjector,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.http.injected_credentials.generic.v3 import Generic
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import SdsSecretConfig
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.type.matcher.v3 import (
    StringMatcher,
)

from sidecar.config.models import Provider, SidecarConfig, Target
from sidecar.dialects.apis import Dialect
from sidecar.envoy_config.matchers import (
    negated,
    request_header,
    skipped_when,
)
from sidecar.header_policy import credential_header

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def secret_name(provider: str) -> str:
    return f"provider_key__{_UNSAFE.sub('_', provider)}"


def sds_file_name(provider: str) -> str:
    return f"{secret_name(provider)}.yaml"


def injector_filters(config: SidecarConfig, target: Target, secrets_dir: str) -> list[HttpFilter]:
    """The upstream filters that put `target`'s key on each of its attempts. A provider that
    speaks both families with the default headers gets one injector per header, each
    applied only to requests for its dialect's path."""
    provider = config.providers[target.provider]
    if provider.credential is None:
        return []
    by_header: dict[tuple[str, str], list[Dialect]] = {}
    for dialect in config.target_dialects(target):
        by_header.setdefault(credential_header(provider.credential, dialect), []).append(dialect)
    source = _secret_source(target.provider, secrets_dir)
    if len(by_header) == 1:
        (header, prefix), = by_header
        return [_injector(source, header, prefix)]
    filters = []
    for (header, prefix), dialects in sorted(by_header.items()):
        injector = _injector(source, header, prefix)
        anthropic = any(d.is_anthropic for d in dialects)
        # The sidecar rewrote `:path` to the dialect's endpoint: skip the injector on the
        # other family's paths.
        messages = request_header(":path",
                                  StringMatcher(suffix=Dialect.ANTHROPIC_MESSAGES.endpoint))
        filters.append(skipped_when(negated(messages) if anthropic else messages,
                                    f"sidecar.credential.{header}",
                                    "envoy.filters.http.credential_injector",
                                    injector.typed_config))
    return filters


def _secret_source(provider: str, secrets_dir: str) -> SdsSecretConfig:
    path = str(Path(secrets_dir) / sds_file_name(provider))
    return SdsSecretConfig(
        name=secret_name(provider),
        sds_config=ConfigSource(path_config_source=PathConfigSource(path=path)))


def _injector(source: SdsSecretConfig, header: str, prefix: str) -> HttpFilter:
    generic = Generic(credential=source, header=header, header_value_prefix=prefix)
    injector = CredentialInjector(
        # Replace whatever an earlier attempt or the caller left under this name.
        overwrite=True,
        credential=TypedExtensionConfig(name="envoy.http.injected_credentials.generic",
                                        typed_config=Any.pack(generic)),
    )
    return HttpFilter(name="envoy.filters.http.credential_injector",
                      typed_config=Any.pack(injector))


def sds_documents(config: SidecarConfig) -> dict[str, str]:
    """File name → SDS file text, one per provider with a credential that some target
    uses. The file names where the key is (variable or file), never the key."""
    documents = {}
    used = {target.provider for group in config.models.values() for target in group.targets}
    for name in sorted(used):
        provider: Provider = config.providers[name]
        if provider.credential is None:
            continue
        credential = provider.credential
        data_source = ({"environment_variable": credential.env} if credential.env is not None
                       else {"filename": os.path.abspath(credential.file)})
        document = {"resources": [{"@type": SECRET_TYPE, "name": secret_name(name),
                                   "generic_secret": {"secret": data_source}}]}
        documents[sds_file_name(name)] = yaml.safe_dump(document, sort_keys=False)
    return documents


def write_sds_files(config: SidecarConfig, directory: Path) -> list[Path]:
    """Write the SDS files with owner-only permissions, each by atomic rename (Envoy
    watches them and must never read half a file)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    for file_name, text in sds_documents(config).items():
        path = directory / file_name
        partial = directory / f".{file_name}.partial"
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             0o600)
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.replace(partial, path)
        written.append(path)
    return written
