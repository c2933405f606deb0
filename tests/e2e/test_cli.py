"""The `sidecar` command line as a user runs it: check-config, serve (with gRPC health),
render-envoy and demo-config."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.devstack.harness import free_port

pytestmark = pytest.mark.e2e
FIXTURES = Path(__file__).parent.parent / "fixtures"


def sidecar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_check_config_accepts_the_spec_sample() -> None:
    result = sidecar("check-config", str(FIXTURES / "spec_sample.yaml"))
    assert result.returncode == 0, result.stderr
    assert "OK (1 model groups, 0 callers)" in result.stdout


def test_check_config_says_where_shadow_traffic_needs_a_listener(tmp_path: Path) -> None:
    config = tmp_path / "mirror.yaml"
    config.write_text(
        "providers:\n  p: {base_url: 'http://127.0.0.1:9/v1'}\n"
        "  q: {base_url: 'http://127.0.0.1:9/v1'}\n"
        "models:\n  g:\n    targets:\n      - {provider: p, model_ref: a}\n"
        "      - {provider: q, model_ref: b, pricing: {input_per_mtok: 1, "
        "output_per_mtok: 1}}\n"
        "    rollout: {shadow_traffic: {target: q/b, shadow_only: true}}\n")
    result = sidecar("check-config", str(config))
    assert result.returncode == 0, result.stderr
    assert "models.g.rollout.shadow_traffic is sent through Envoy's shadow listener" in \
        result.stdout
    unpriced = tmp_path / "unpriced.yaml"
    unpriced.write_text(config.read_text().replace(
        ", pricing: {input_per_mtok: 1, output_per_mtok: 1}", ""))
    result = sidecar("check-config", str(unpriced))
    assert result.returncode == 2
    assert "rollout.shadow_traffic needs the candidate's pricing" in result.stderr


def test_check_config_lists_every_problem_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((FIXTURES / "spec_sample.yaml").read_text()
                   .replace("max_score_adjustment_percent: 70", "max_score_adjustment_percent: 150")
                   .replace("weight: 25", "weight: -25"))
    result = sidecar("check-config", str(bad))
    assert result.returncode == 2
    assert ("models.adaptive-agent.routing_policy.dynamic_score.max_score_adjustment_percent: "
            "must be between 0 and 100 (got 150)") in result.stderr
    assert "models.adaptive-agent.targets[1].weight: must be at least 0 (got -25)" in result.stderr
    assert f"{bad}: check failed, 2 problems:" in result.stderr


def test_check_config_secrets_names_the_missing_variable(tmp_path: Path) -> None:
    result = sidecar("check-config", "--secrets", str(FIXTURES / "spec_sample.yaml"),
                     env={"BASETEN_API_KEY": "", "MINIMAX_API_KEY": "m", "OPENAI_API_KEY": "o"})
    assert result.returncode == 2
    assert "check failed, 1 problem:" in result.stderr
    assert "providers.baseten.credential.env: environment variable BASETEN_API_KEY" in result.stderr
    assert "cannot start" not in result.stderr  # it only checks (issue #29.5)
    ok = sidecar("check-config", "--secrets", str(FIXTURES / "spec_sample.yaml"),
                 env={"BASETEN_API_KEY": "b", "MINIMAX_API_KEY": "m", "OPENAI_API_KEY": "o"})
    assert ok.returncode == 0, ok.stderr
    assert "caller tokens and provider keys readable" in ok.stdout


def test_check_config_secrets_lists_every_layer_in_one_run(tmp_path: Path) -> None:
    """Issue #29.5: the field errors came first; only once they were fixed did the unknown
    script target, then the caller token, then the provider key show up, under
    `cannot start:`."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("""
providers: {local: {base_url: "http://127.0.0.1:9/v1", credential: {env: NO_SUCH_KEY_29}}}
callers: [{name: a, token_env: NO_SUCH_TOKEN_29, models: [nope]}]
models:
  bad:
    strategy: script
    targets: [{provider: local, model_ref: m}]
    script:
      rules:
        - {order: [local/zzz]}
        - {when: "((", order: [local/m]}
  g:
    targets: [{provider: local, model_ref: m, weight: -1}]
""")
    result = sidecar("check-config", "--secrets", str(bad))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == f"{bad}: check failed, 6 problems:", result.stderr
    assert sorted(line.strip().split(": ", 1)[0] for line in lines[1:]) == [
        "callers[0].models", "callers[0].token_env", "models.bad.script.rules[0].order",
        "models.bad.script.rules[1].when", "models.g.targets[0].weight",
        "providers.local.credential.env"], result.stderr
    assert ("  models.bad.script.rules[0].order: no target 'local/zzz' in this group "
            "(targets: local/m)") in lines


def test_check_config_gives_the_yaml_parsers_reason_and_place(tmp_path: Path) -> None:
    bad = tmp_path / "indent.yaml"
    bad.write_text("models:\n  g:\n    targets:\n      - provider: openai\n"
                   "        model_ref: m\n     weight: 2\n")
    result = sidecar("check-config", str(bad))
    assert result.returncode == 2
    assert ("  models.g: not valid YAML at line 6, column 6: did not find expected key (in the "
            "block mapping that starts at line 3, column 5)") in result.stderr.splitlines()


def test_serve_answers_grpc_health_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    digest = hashlib.sha256(b"t").hexdigest()
    config.write_text("providers: {p: {base_url: 'http://127.0.0.1:9/v1'}}\n"
                      f"callers: [{{name: a, token_sha256: {digest}}}]\n"
                      "models: {g: {targets: [{provider: p, model_ref: m}]}}\n")
    port = free_port()
    log = tmp_path / "serve.log"
    token = tmp_path / "grpc-token"
    token.write_text("t" * 40 + "\n")
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "serve", "--config", str(config),
             "--listen", f"127.0.0.1:{port}", "--admin-http", f"127.0.0.1:{free_port()}",
             "--grpc-token-file", str(token), "--drain-seconds", "0.5"],
            stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=30)
            except grpc.FutureTimeoutError:
                raise AssertionError(f"serve did not come up: {log.read_text()}") from None
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "envoy.service.ext_proc.v3.ExternalProcessor"):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # The container health check compose runs.
        checked = sidecar("health", "--grpc", f"127.0.0.1:{port}")
        assert checked.returncode == 0 and checked.stdout.strip() == "SERVING"
        assert sidecar("health", "--grpc", f"127.0.0.1:{free_port()}",
                       "--timeout", "0.5").returncode == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_refuses_to_start_without_a_usable_channel_token(tmp_path: Path) -> None:
    """The gRPC port serves only the Envoy holding the token; `serve` needs no provider key
    (Envoy injects those), but it will not start with a missing or weak token."""
    short = tmp_path / "short"
    short.write_text("too-short")
    for path, message in ((tmp_path / "missing", "cannot read the gRPC channel token file"),
                          (short, "must have at least 32 characters")):
        started = time.monotonic()
        result = sidecar("serve", "--config", str(FIXTURES / "spec_sample.yaml"),
                         "--listen", f"127.0.0.1:{free_port()}", "--grpc-token-file", str(path),
                         env={"BASETEN_API_KEY": "", "MINIMAX_API_KEY": "",
                              "OPENAI_API_KEY": ""})
        assert result.returncode == 2
        assert time.monotonic() - started < 30
        assert message in result.stderr
        assert "too-short" not in result.stderr


def test_serve_refuses_an_admin_endpoint_beyond_loopback_without_a_token(
        tmp_path: Path) -> None:
    """192.0.2.1 (TEST-NET-1) is on no interface here: even if the check failed, nothing
    would listen beyond loopback."""
    token = tmp_path / "grpc-token"
    token.write_text("t" * 40)
    result = sidecar("serve", "--config", str(FIXTURES / "spec_sample.yaml"),
                     "--listen", f"127.0.0.1:{free_port()}", "--grpc-token-file", str(token),
                     "--admin-http", "192.0.2.1:9901",
                     env={"BASETEN_API_KEY": "b", "MINIMAX_API_KEY": "m", "OPENAI_API_KEY": "o"})
    assert result.returncode == 1
    assert "reachable beyond this host" in result.stderr
    assert "--admin-token-file" in result.stderr


def test_up_refuses_to_start_without_provider_keys(tmp_path: Path) -> None:
    result = sidecar("up", "--config", str(FIXTURES / "spec_sample.yaml"),
                     "--listen", f"127.0.0.1:{free_port()}", "--admin", f"127.0.0.1:{free_port()}",
                     "--ext-proc", f"127.0.0.1:{free_port()}",
                     "--admin-http", f"127.0.0.1:{free_port()}",
                     env={"BASETEN_API_KEY": "", "MINIMAX_API_KEY": "", "OPENAI_API_KEY": "o"})
    assert result.returncode == 2
    for name in ("BASETEN_API_KEY", "MINIMAX_API_KEY"):
        assert f"environment variable {name} is not set" in result.stderr
    assert "OPENAI_API_KEY" not in result.stderr


def test_up_names_every_unreadable_secret_at_once(tmp_path: Path) -> None:
    """Issue #29.5: `up` named the callers' tokens first and the provider keys only once
    those were fixed."""
    config = tmp_path / "config.yaml"
    config.write_text("providers:\n  p: {base_url: 'http://127.0.0.1:9', credential: "
                      "{env: NO_SUCH_PROVIDER_KEY}}\n"
                      "callers: [{name: a, token_env: NO_SUCH_CALLER_TOKEN}]\n"
                      "models:\n  g: {targets: [{provider: p, model_ref: m}]}\n")
    result = sidecar("up", "--config", str(config),
                     "--listen", f"127.0.0.1:{free_port()}", "--admin", f"127.0.0.1:{free_port()}",
                     "--ext-proc", f"127.0.0.1:{free_port()}",
                     "--admin-http", f"127.0.0.1:{free_port()}",
                     env={"NO_SUCH_PROVIDER_KEY": "", "NO_SUCH_CALLER_TOKEN": ""})
    assert result.returncode == 2
    assert "NO_SUCH_CALLER_TOKEN" in result.stderr and "NO_SUCH_PROVIDER_KEY" in result.stderr
    assert "Traceback" not in result.stderr


def test_render_envoy_makes_a_channel_token_once_and_the_sds_files(tmp_path: Path) -> None:
    token = tmp_path / "run" / "grpc-token"
    args = ("render-envoy", "--config", str(FIXTURES / "spec_sample.yaml"),
            "--grpc-token-file", str(token), "--secrets-dir", str(tmp_path / "sds"),
            "--sds-output", str(tmp_path / "sds"))
    first = sidecar(*args)
    assert first.returncode == 0, first.stderr
    value = token.read_text().strip()
    assert value in first.stdout and token.stat().st_mode & 0o077 == 0
    again = sidecar(*args)
    assert token.read_text().strip() == value and value in again.stdout
    names = sorted(p.name for p in (tmp_path / "sds").iterdir())
    assert names == ["provider_key__baseten.yaml", "provider_key__minimax.yaml",
                     "provider_key__openai.yaml"]
    placeholder = sidecar("render-envoy", "--config", str(FIXTURES / "spec_sample.yaml"))
    assert "placeholder channel token" in placeholder.stderr


def test_render_envoy_and_demo_config_print_usable_files(tmp_path: Path) -> None:
    demo = sidecar("demo-config", "--providers-url", "http://127.0.0.1:18080")
    assert demo.returncode == 0 and "adaptive-agent:" in demo.stdout
    config = tmp_path / "demo.yaml"
    config.write_text(demo.stdout)
    rendered = sidecar("render-envoy", "--config", str(config), "--listen", "127.0.0.1:10001")
    assert rendered.returncode == 0, rendered.stderr
    assert "port_value: 10001" in rendered.stdout
    assert "target__adaptive-agent__0__baseten" in rendered.stdout


def test_demo_providers_show_a_named_provider_behaviour() -> None:
    """`sidecar demo-providers --behaviour PROVIDER=NAME`: the demo's providers behave as
    the real ones the names follow (sidecar/devstack/provider_behaviours.py)."""
    import httpx

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "demo-providers", "--listen", f"127.0.0.1:{port}",
         "--behaviour", "anthropic=anthropic_rate_limited"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                limited = httpx.post(f"http://127.0.0.1:{port}/anthropic/v1/messages",
                                     json={"model": "m"}, timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
        healthy = httpx.post(f"http://127.0.0.1:{port}/openai/v1/chat/completions",
                             json={"model": "m"}, timeout=5)
        assert healthy.status_code == 200
    finally:
        process.terminate()
        process.wait(10)
    listed = sidecar("demo-providers", "--behaviour", "list")
    assert listed.returncode == 0 and "anthropic_overloaded_in_stream: " in listed.stdout
    refused = sidecar("demo-providers", "--behaviour", "nobody=chunked_json")
    assert refused.returncode == 2 and "--behaviour list" in refused.stderr


def test_check_config_on_a_file_nested_to_death_is_a_problem_not_a_crash(
        tmp_path: Path) -> None:
    nested = tmp_path / "nested.yaml"
    nested.write_text("models: " + "[" * 20000 + "]" * 20000)
    result = sidecar("check-config", str(nested))
    assert result.returncode == 2, result.stderr
    assert "exceeded maximum nesting depth" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
