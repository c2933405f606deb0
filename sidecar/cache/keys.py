"""What makes two requests "the same" for the response cache: the group, the caller (unless
the group shares its cache), the API, the caller headers that reach the provider and can
change its answer (`anthropic-beta`, `anthropic-version`, `openai-beta`, a provider's
`pass_request_headers`: header_policy.answer_varying_headers), and the body as JSON values —
key order, whitespace and an explicit `"stream": false` do not count. Keys are SHA-256
digests: the cache holds no caller name and no request text, only answers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sidecar.dialects.apis import Dialect


def cache_key(group: str, caller: str | None, dialect: Dialect,
              payload: Mapping[str, Any],
              headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """`headers`: the request's answer-varying headers, (name, value) by name."""
    body = {name: value for name, value in payload.items()
            if not (name == "stream" and value is False)}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256()
    digest.update(f"{group}\0{caller or ''}\0{dialect.value}\0".encode())
    for name, value in headers:
        digest.update(f"{name}\0{value}\0".encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(canonical.encode("utf-8", "surrogatepass"))
    return digest.digest()


def cache_directives(value: str) -> tuple[bool, bool]:
    """(may look up, may store) from the caller's `cache-control`: `no-store` forbids both,
    `no-cache` only the lookup (the fresh answer is still stored)."""
    directives = {part.strip().split("=", 1)[0].lower() for part in value.split(",")}
    no_store = "no-store" in directives
    return not (no_store or "no-cache" in directives), not no_store
