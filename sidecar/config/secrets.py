"""Reading the secrets a configuration points at: provider keys and caller tokens.

Secrets are read once at start-up, never logged, and never part of an error message; a
missing one is reported by *where* it was expected (variable or file name) only.
`secret_problems` is the last layer of `check-config --secrets` and of a reload: every
caller token and provider key that cannot be read, as problems at their YAML paths, for
each part of the configuration that validated (references.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sidecar.config.models import Caller, Credential
from sidecar.config.problems import ConfigProblem
from sidecar.config.references import ConfigView


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


def caller_digests(callers: Sequence[Caller | None], environ: Mapping[str, str] = os.environ,
                   ) -> tuple[dict[str, Caller], list[ConfigProblem]]:
    """Each caller by the digest of its token, and the callers whose token cannot be read
    or is another caller's (`callers[i]` of `callers`; None stands for an invalid entry)."""
    by_digest: dict[str, Caller] = {}
    index_of: dict[str, int] = {}
    problems: list[ConfigProblem] = []
    for index, caller in enumerate(callers):
        if caller is None:
            continue
        path = f"callers[{index}].{_token_source(caller)}"
        try:
            digest = caller_digest(caller, environ)
        except SecretError as exc:
            problems.append(ConfigProblem(path, f"{exc} (caller '{caller.name}')"))
            continue
        if digest in by_digest:
            problems.append(ConfigProblem(path, f"caller '{caller.name}' has the same token as "
                                                f"'{by_digest[digest].name}' "
                                                f"(callers[{index_of[digest]}])"))
            continue
        by_digest[digest] = caller
        index_of[digest] = index
    return by_digest, problems


def _token_source(caller: Caller) -> str:
    if caller.token_env is not None:
        return "token_env"
    return "token_file" if caller.token_file is not None else "token_sha256"


def unreadable_provider_keys(view: ConfigView, environ: Mapping[str, str] = os.environ,
                             ) -> Iterator[ConfigProblem]:
    """Each provider key a (valid) target needs that cannot be read. The values read are
    dropped at once."""
    providers = view.providers or {}
    used = {target.provider for group in (view.groups or {}).values()
            for target in group.targets if target is not None}
    for name in sorted(used):
        provider = providers.get(name)
        credential = provider.credential if provider is not None else None
        if credential is None:
            continue
        try:
            credential_value(credential, environ)
        except SecretError as exc:
            source = "env" if credential.env is not None else "file"
            yield ConfigProblem(f"providers.{name}.credential.{source}", str(exc))


def secret_problems(view: ConfigView, environ: Mapping[str, str] = os.environ, *,
                    caller_tokens: bool = True, provider_keys: bool = True,
                    ) -> list[ConfigProblem]:
    """Every caller token and every provider key (each as asked) that cannot be read."""
    problems: list[ConfigProblem] = []
    if caller_tokens:
        problems += caller_digests([c.caller for c in view.callers], environ)[1]
    if provider_keys:
        problems += unreadable_provider_keys(view, environ)
    return problems
