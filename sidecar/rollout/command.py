"""`sidecar rollout check`: the command line around the checklist (issue 42)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from sidecar.config import load_config_file
from sidecar.config.models import SidecarConfig
from sidecar.config.secrets import SecretError, caller_digest, read_secret, token_digest
from sidecar.rollout.check_report import as_json, as_table, exit_code
from sidecar.rollout.check_run import Gateway, run
from sidecar.rollout.checklist import checklist


def _token(path: Path | None, env: str | None) -> str | None:
    """A token from its file or environment variable (the secret reader the configuration
    uses), or None when neither is given."""
    if path is None and env is None:
        return None
    return read_secret(env, path, os.environ)


def rollout_check(args: argparse.Namespace) -> int:
    config = load_config_file(args.config)
    if args.group not in config.models:
        print(f"error: unknown model group '{args.group}' (configured: "
              f"{', '.join(config.models)})", file=sys.stderr)
        return 2
    try:
        first = _token(args.token_file, args.token_env)
        second = _token(args.second_token_file, args.second_token_env)
        admin = _token(args.admin_token_file, None)
    except SecretError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    assert first is not None  # argparse requires one of the two
    items = checklist(config, args.group, f"check {secrets.token_hex(6)}",
                      second_caller=second is not None, wait_ttl=args.wait_ttl,
                      caller=_caller_of(config, first))
    gateway = Gateway(args.url, args.admin, (first, second), admin,
                      row_wait_s=args.row_wait_seconds)
    try:
        problem = gateway.preflight()
        if problem is not None:
            print(f"error: {problem} (nothing was sent)", file=sys.stderr)
            return 2
        verdicts = run(items, gateway)
    finally:
        gateway.close()
    print(as_json(args.group, verdicts) if args.format == "json"
          else as_table(args.group, verdicts))
    return exit_code(verdicts)


def _caller_of(config: SidecarConfig, token: str) -> str | None:
    """The configured caller this token belongs to (its spend ceiling shapes what should
    happen), or None when the configuration cannot tell (its digests unreadable here)."""
    digest = token_digest(token)
    for caller in config.callers:
        try:
            if caller_digest(caller) == digest:
                return caller.name
        except SecretError:
            continue
    return None
