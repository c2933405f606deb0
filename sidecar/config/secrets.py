"""Reading the secrets a configuration points at: provider keys and caller tokens.

Secrets are read once at start-up, never logged, and never part of an error message; a
missing one is reported by *where* it was expected (variable or file name) only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from sidecar.config.models import Caller, Credential


class SecretError(Exception):
    """A secret named in the configuration could not be read."""


def read_secret(env: str | None, file: Path | None, environ: Mapping[str, str]) -> str:
    if env is not None:
        value = environ.get(env, "").strip()
        if not value:
            raise SecretError(f"environment variable {env} is not set or empty")
        return value
    assert file is not None
    try:
        value = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SecretError(f"cannot read secret file {file}: {exc.strerror}") from None
    if not value:
        raise SecretError(f"secret file {file} is empty")
    return value


def credential_value(credential: Credential, environ: Mapping[str, str] = os.environ) -> str:
    return read_secret(credential.env, credential.file, environ)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def caller_digest(caller: Caller, environ: Mapping[str, str] = os.environ) -> str:
    if caller.token_sha256 is not None:
        return caller.token_sha256
    return token_digest(read_secret(caller.token_env, caller.token_file, environ))
