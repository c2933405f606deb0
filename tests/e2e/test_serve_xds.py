"""`render-envoy --xds-dir` + `serve --xds-dir` (the deployment where the operator runs
Envoy, as in Kubernetes): real Envoy started from the rendered bootstrap, the sidecar
serving beside it; a reload that adds a target reaches Envoy through the shared files and
serves without restarting Envoy."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import ProviderThread, free_port
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "serve-xds-caller-token"
NAMES = ("first", "second")


def config_text(providers: ProviderThread, names: tuple[str, ...]) -> str:
    return ("providers:\n" + "".join(
        f"  {n}: {{base_url: '{providers.base_url(n)}', credential: {{env: KEY_{n.upper()}}}}}\n"
        for n in NAMES)
        + f"callers: [{{name: team, token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]\n"
        + "models:\n  chat:\n    targets:\n" + "".join(
            f"      - {{provider: {n}, model_ref: {n}-model}}\n" for n in names))


def test_serve_keeps_an_operator_run_envoy_in_step(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = [FakeProvider(n, api_key=f"key-{n}") for n in NAMES]
    for n in NAMES:  # Envoy (started from here) reads the keys its SDS files name
        monkeypatch.setenv(f"KEY_{n.upper()}", f"key-{n}")
    env = dict(os.environ)
    listen, admin, ext_proc = (f"127.0.0.1:{free_port()}" for _ in range(3))
    with ProviderThread(fakes) as providers:
        config = tmp_path / "config.yaml"
        config.write_text(config_text(providers, ("first",)))
        xds, secrets = tmp_path / "xds", tmp_path / "secrets"
        token = tmp_path / "grpc-token"
        bootstrap = tmp_path / "envoy.yaml"
        subprocess.run([sys.executable, "-m", "sidecar", "render-envoy", "--config",
                        str(config), "--listen", listen, "--admin", admin, "--ext-proc",
                        ext_proc, "--grpc-token-file", str(token), "--secrets-dir",
                        str(secrets), "--sds-output", str(secrets), "--xds-dir", str(xds),
                        "--output", str(bootstrap)], check=True, env=env, timeout=60)
        assert {p.name for p in xds.iterdir()} >= {"cds.json", "lds.json", "addresses.json"}
        envoy = start_envoy(bootstrap, "warning")
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
        serve = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--listen",
             ext_proc, "--admin-http", f"127.0.0.1:{free_port()}", "--grpc-token-file",
             str(token), "--xds-dir", str(xds), "--envoy-admin", admin,
             "--drain-seconds", "0"], stdout=log, stderr=log, env=env)
        try:
            client = openai.OpenAI(base_url=f"http://{listen}/v1", api_key=TOKEN,
                                   max_retries=0)

            def ask() -> None:
                client.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}])

            deadline = time.monotonic() + 30
            while True:  # Envoy and the sidecar are starting
                try:
                    ask()
                    break
                except openai.APIError:
                    assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                    time.sleep(0.2)
            assert len(providers.provider("first").received) >= 1

            config.write_text(config_text(providers, ("second",)))
            serve.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while not providers.provider("second").received:
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                ask()
                time.sleep(0.05)
            assert envoy.poll() is None  # the same Envoy: no restart
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(20)
            envoy.terminate()
            envoy.wait(20)
            log.close()
