"""`sidecar rollout check` through real Envoy (issue 42): the SPEC's rollout list sent to a
live group as a caller sends it, each request's row read back from the admin endpoint, a
table and JSON, and an exit code a CI pipeline can use. Three groups: the SPEC's sample
(the kinds its targets do not declare are refused, and said so), a group declaring every
capability (every item runs, TTL expiry included), and a group whose target's real context
window is smaller than the configuration says (the code prompt fails: ✘, exit 1)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

SPEC = Path(__file__).parents[1] / "fixtures" / "spec_sample.yaml"
TOKENS = {"team-a": "rollout-check-token-a", "team-b": "rollout-check-token-b"}
# Streams long enough for the check to close one after its first event.
STREAMING = Behaviour(inter_event_delay_s=0.2)
EXTRA_GROUPS = """\
every-kind:
  strategy: dynamic_score
  targets:
    - provider: capable
      model_ref: all-in-one
      tags: [validated, tool_capable]
      input_modalities: [text, image]
      supports_tools: true
      supports_structured_output: true
      supports_reasoning: true
  routing_policy:
    dynamic_score:
      affinity: {ttl_seconds: 2}
narrow-window:
  strategy: dynamic_score
  targets:
    - provider: narrow
      model_ref: small
      tags: [validated, tool_capable]
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, Path]]:
    workdir = tmp_path_factory.mktemp("rollout-check")
    names = ("baseten", "minimax", "openai", "capable", "narrow")
    fakes = [FakeProvider(name, behaviour=STREAMING) for name in names]
    # Its configuration declares no window; the real one takes 80 tokens (about 320 bytes
    # of request): the simple prompts fit, the code prompt does not.
    fakes[-1].behaviour = Behaviour(inter_event_delay_s=0.2, context_window_tokens=80)
    with ProviderThread(fakes) as providers:
        config = yaml.safe_load(SPEC.read_text())
        config["models"].update(yaml.safe_load(EXTRA_GROUPS))
        config["providers"] = {name: {"base_url": providers.base_url(name), "credential": None}
                               for name in names}
        config["callers"] = [{"name": name, "token_sha256": hashlib.sha256(
            token.encode()).hexdigest()} for name, token in TOKENS.items()]
        config["telemetry"] = {"sqlite_path": str(workdir / "telemetry.db")}
        path = workdir / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        for name, token in TOKENS.items():
            (workdir / f"{name}.token").write_text(token + "\n")
        up = UpProcess(["--config", str(path)], log_path=workdir / "up.log")
        with up.running():
            yield up, workdir


def check(gateway: tuple[UpProcess, Path], group: str, *extra: str
          ) -> subprocess.CompletedProcess[str]:
    up, workdir = gateway
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "rollout", "check", "--config",
         str(workdir / "config.yaml"), "--group", group, "--url", up.base_url,
         "--admin", f"http://127.0.0.1:{up.admin_http_port}",
         "--token-file", str(workdir / "team-a.token"), *extra],
        capture_output=True, text=True, timeout=300)


def rows_of(result: subprocess.CompletedProcess[str]) -> dict[tuple[str, int], dict]:
    document = json.loads(result.stdout)
    return {(row["item"], row["turn"]): row for row in document["rows"]}


def test_the_spec_sample_group_passes_and_says_what_it_cannot_serve(gateway) -> None:
    _, workdir = gateway
    result = check(gateway, "adaptive-agent", "--second-token-file",
                   str(workdir / "team-b.token"), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = rows_of(result)
    failed = [key for key, row in rows.items() if row["result"] == "fail"]
    assert failed == []
    for kind in ("images", "structured_output", "reasoning"):
        row = rows[kind, 1]
        assert row["should"].startswith("refused (400)") and row["result"] == "pass"
        assert row["happened"].startswith("400: ")
    assert rows["code_debug", 1]["should"].endswith("complexity complex")
    assert "complexity complex" in rows["code_debug", 1]["happened"]
    assert "affinity hit" in rows["multi_turn_affinity", 2]["happened"]
    assert "affinity miss_created" in rows["caller_isolation", 2]["happened"]
    assert "error class client_cancel" in rows["streaming_cancellation", 1]["happened"]
    assert rows["ttl_expiry", 0]["result"] == "skipped"
    assert "--wait-ttl" in rows["ttl_expiry", 0]["happened"]
    # The rows say where these requests came from.
    with sqlite3.connect(workdir / "telemetry.db") as db:
        origins = dict(db.execute("SELECT origin, count(*) FROM request_rows "
                                  "WHERE group_name = 'adaptive-agent' GROUP BY origin"))
    assert origins.get("rollout_check", 0) >= 12 and set(origins) == {"rollout_check"}


def test_a_group_declaring_every_capability_runs_every_item(gateway) -> None:
    _, workdir = gateway
    result = check(gateway, "every-kind", "--second-token-file",
                   str(workdir / "team-b.token"), "--wait-ttl")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "rollout check of group every-kind: 16 passed, 0 failed, 0 not run"
    ttl = [line for line in lines if " ttl_expiry " in f" {line} "]
    assert len(ttl) == 3 and "affinity hit" in ttl[1], ttl
    assert "affinity expired_replaced" in ttl[2], ttl
    assert all(line.startswith("✔") for line in lines[3:] if line.strip())


def test_a_failing_item_is_marked_and_the_exit_code_says_so(gateway) -> None:
    result = check(gateway, "narrow-window", "--format", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = rows_of(result)
    assert rows["code_debug", 1]["result"] == "fail"
    assert rows["code_debug", 1]["happened"].startswith("400")
    assert rows["simple_text", 1]["result"] == "pass"
    document = json.loads(result.stdout)
    assert document["failed"] >= 1


def test_a_configuration_that_is_not_what_the_gateway_runs_fails(gateway) -> None:
    """The operator's file says the group pins nothing; the gateway pins: the affinity
    items say ✘ (the check judges the gateway against the file it is given)."""
    up, workdir = gateway
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["models"]["every-kind"]["routing_policy"]["dynamic_score"]["affinity"] = {
        "enabled": False}
    drifted = workdir / "drifted.yaml"
    drifted.write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "rollout", "check", "--config", str(drifted),
         "--group", "every-kind", "--url", up.base_url,
         "--admin", f"http://127.0.0.1:{up.admin_http_port}",
         "--token-file", str(workdir / "team-a.token"), "--format", "json"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = rows_of(result)
    first = rows["multi_turn_affinity", 1]
    assert first["result"] == "fail" and "affinity disabled" in first["should"]
    assert "affinity miss_created" in first["happened"]
    assert rows["multi_turn_affinity", 2]["result"] == "fail"
    assert rows["simple_text", 1]["result"] == "pass"  # nothing about affinity expected


def test_bad_arguments_are_clear(gateway) -> None:
    result = check(gateway, "no-such-group")
    assert result.returncode == 2 and "unknown model group 'no-such-group'" in result.stderr
    _, workdir = gateway
    missing = subprocess.run(
        [sys.executable, "-m", "sidecar", "rollout", "check", "--config",
         str(workdir / "config.yaml"), "--group", "every-kind", "--token-env",
         "ROLLOUT_CHECK_UNSET_TOKEN"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "ROLLOUT_CHECK_UNSET_TOKEN is not set" in missing.stderr, (
        missing.stderr)
