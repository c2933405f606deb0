"""Every problem of a configuration file in one list: `check-config`, and a reload.

The layers, each as far as the one before allows (a later check is skipped only where a
part it reads failed): reading the file, the YAML, every field, the cross-references
(loading.py, references.py), then, when asked, the secrets — caller tokens and provider
keys readable (secrets.py). Nothing read is kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sidecar.config.loading import CheckedConfig, check_config_text, read_config_file
from sidecar.config.problems import ConfigError
from sidecar.config.secrets import secret_problems


def check_config_file(path: Path, environ: Mapping[str, str] | None = None, *,
                      caller_tokens: bool = False, provider_keys: bool = False,
                      ) -> CheckedConfig:
    """The file's check; `config` only when no layer found a problem."""
    try:
        text = read_config_file(path)
    except ConfigError as exc:
        return CheckedConfig(None, None, tuple(exc.problems))
    checked = check_config_text(text)
    if checked.view is None or not (caller_tokens or provider_keys):
        return checked
    unreadable = secret_problems(checked.view, os.environ if environ is None else environ,
                                 caller_tokens=caller_tokens, provider_keys=provider_keys)
    if not unreadable:
        return checked
    return CheckedConfig(None, checked.view, (*checked.problems, *unreadable))
