"""The Istio EnvoyFilter at work: a gateway-shaped Envoy configuration (one virtual host
routed to a placeholder cluster, as Istio generates it), patched the way Istio applies
the EnvoyFilter, run by the real Envoy binary in front of `sidecar serve`; the official
SDK's requests are routed by the sidecar's decision, with fallback."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import yaml

from sidecar.config import load_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import ProviderThread, free_port
from sidecar.devstack.providers import Behaviour, FakeProvider
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.istio import apply_patches, envoy_filter
from sidecar.grpcwire.auth import ensure_channel_token
from tests.unit.test_istio import HOST, gateway_bootstrap

pytestmark = pytest.mark.e2e

TOKEN = "istio-caller-token"


def test_a_patched_gateway_routes_by_the_sidecar(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = [FakeProvider("flaky", api_key="key-flaky"),
             FakeProvider("good", api_key="key-good")]
    monkeypatch.setenv("KEY_FLAKY", "key-flaky")
    monkeypatch.setenv("KEY_GOOD", "key-good")
    with ProviderThread(fakes) as providers:
        text = (f"providers:\n"
                f"  flaky: {{base_url: '{providers.base_url('flaky')}', "
                f"credential: {{env: KEY_FLAKY}}}}\n"
                f"  good: {{base_url: '{providers.base_url('good')}', "
                f"credential: {{env: KEY_GOOD}}}}\n"
                f"callers: [{{name: team, token_sha256: "
                f"{hashlib.sha256(TOKEN.encode()).hexdigest()}}}]\n"
                "models:\n  chat:\n    strategy: failover\n    targets:\n"
                "      - {provider: flaky, model_ref: flaky-model}\n"
                "      - {provider: good, model_ref: good-model}\n")
        config_path = tmp_path / "config.yaml"
        config_path.write_text(text)
        config = load_config_text(text)
        grpc_port, listen_port = free_port(), free_port()
        token_file = tmp_path / "grpc-token"
        token = ensure_channel_token(token_file)
        write_sds_files(config, tmp_path / "secrets")
        resource = envoy_filter(config, EnvoyAddresses(
            ext_proc=f"127.0.0.1:{grpc_port}", secrets_dir=str(tmp_path / "secrets")),
            HOST, {"istio": "ingressgateway"}, token)
        gateway = gateway_bootstrap()
        listener = gateway["static_resources"]["listeners"][0]
        listener["address"]["socket_address"]["port_value"] = listen_port
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        manager["route_config"]["virtual_hosts"][0]["domains"] = ["*"]
        bootstrap = tmp_path / "gateway.yaml"
        bootstrap.write_text(yaml.safe_dump(apply_patches(gateway, resource), sort_keys=False))
        envoy = start_envoy(bootstrap, "warning")
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
        serve = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "serve", "--config", str(config_path),
             "--listen", f"127.0.0.1:{grpc_port}", "--admin-http",
             f"127.0.0.1:{free_port()}", "--grpc-token-file", str(token_file),
             "--drain-seconds", "0"], stdout=log, stderr=log)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{listen_port}/v1",
                                   api_key=TOKEN, max_retries=0)
            providers.provider("flaky").behaviour = Behaviour(status=503)
            deadline = time.monotonic() + 30
            while True:
                try:
                    answer = client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "hi"}])
                    break
                except openai.APIError:
                    assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                    time.sleep(0.2)
            # Failover: the first target failed before answering, the second served.
            assert answer.model == "good-model"
            assert providers.provider("flaky").received and providers.provider("good").received
            # The provider got its own key (injected by the gateway), never the caller's.
            received = providers.provider("good").received[-1]
            assert received.headers["authorization"] == "Bearer key-good"
        finally:
            serve.terminate()
            serve.wait(20)
            envoy.terminate()
            envoy.wait(20)
            log.close()
