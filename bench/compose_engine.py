"""The Docker and compose plumbing bench/compose_check.py drives the stack with: one
compose command line bound to the check's project, the containers' states and health,
their logs, Envoy's counters read inside its container, and the base images the stack was
built from."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = "sidecar-compose-check"
ENVOY_STATS = ("downstream_rq_completed", "downstream_rq_2xx", "downstream_rq_4xx",
               "downstream_rq_5xx")


class CheckFailed(Exception):
    """A step of the check did not do what it should; the message says which and why."""


@dataclass
class Compose:
    """One compose command line (v2 or v1) bound to this check's project and folder."""

    argv: list[str]
    version: str
    config_dir: Path

    def run(self, *args: str, timeout: float = 120.0, check: bool = True,
            capture: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "SIDECAR_CONFIG_DIR": str(self.config_dir)}
        result = subprocess.run([*self.argv, "-p", PROJECT, "-f", "docker-compose.yaml",
                                 *args], cwd=REPO, env=env, text=True, timeout=timeout,
                                capture_output=capture)
        if check and result.returncode != 0:
            raise CheckFailed(f"`{shlex.join(['compose', *args])}` exited "
                              f"{result.returncode}:\n{(result.stdout or '')[-3000:]}"
                              f"{(result.stderr or '')[-3000:]}")
        return result


def find_compose(choice: str | None) -> tuple[list[str], str]:
    candidates = [shlex.split(choice)] if choice else [["docker", "compose"], ["docker-compose"]]
    for argv in candidates:
        if shutil.which(argv[0]) is None:
            continue
        result = subprocess.run([*argv, "version", "--short"], capture_output=True,
                                text=True, timeout=30)
        if result.returncode == 0 and result.stdout.strip():
            return argv, f"{' '.join(argv)} {result.stdout.strip()}"
    raise CheckFailed("no compose found: install compose v2 (`docker compose`) or v1 "
                      "(`docker-compose`), or name one with --compose")


def docker(*args: str, timeout: float = 60.0) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise CheckFailed(f"docker {shlex.join(args)}: {result.stderr.strip()}")
    return result.stdout


def logs(container: str) -> str:
    """What the container has written so far, both streams."""
    return subprocess.run(["docker", "logs", container], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=30).stdout


def containers() -> dict[str, tuple[str, str, int, str]]:
    """service -> (container id, state, exit code, health or "-"), stopped ones included."""
    ids = docker("ps", "-a", "-q", "--filter",
                 f"label=com.docker.compose.project={PROJECT}").split()
    found = {}
    for container in json.loads(docker("inspect", *ids)) if ids else []:
        state = container["State"]
        service = container["Config"]["Labels"]["com.docker.compose.service"]
        found[service] = (container["Id"], state["Status"], state["ExitCode"],
                          state.get("Health", {}).get("Status", "-"))
    return found


def wait_healthy(services: dict, timeout: float) -> None:
    """Every service with a health check healthy; the one-shot one exited 0."""
    deadline = time.monotonic() + timeout
    while True:
        state = containers()
        pending, failed = [], []
        for name, service in services.items():
            if name not in state:
                pending.append(name)
                continue
            _, status, code, health = state[name]
            if "healthcheck" in service:
                if health == "unhealthy" or status in ("exited", "dead"):
                    failed.append(f"{name} ({status}, {health})")
                elif health != "healthy":
                    pending.append(name)
            elif status == "exited" and code != 0:
                failed.append(f"{name} (exited {code})")
            elif status not in ("exited", "running"):
                pending.append(name)
        if failed:
            raise CheckFailed(f"unhealthy: {', '.join(failed)}")
        if not pending:
            return
        if time.monotonic() > deadline:
            raise CheckFailed(f"not healthy within {timeout:.0f} s: {', '.join(pending)}")
        time.sleep(0.5)


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def envoy_counts(compose: Compose) -> dict[str, int]:
    """Envoy's own counters of the model-groups listener (its admin is on its loopback)."""
    request = ("GET /stats?filter=^http\\.model_groups\\.downstream_rq_ HTTP/1.1\\r\\n"
               "Host: localhost\\r\\nConnection: close\\r\\n\\r\\n")
    script = f"exec 3<>/dev/tcp/127.0.0.1/9901 && printf '{request}' >&3 && cat <&3"
    text = compose.run("exec", "-T", "envoy", "bash", "-c", script).stdout
    counts = {}
    for name in ENVOY_STATS:
        match = re.search(rf"^http\.model_groups\.{name}: (\d+)", text, re.M)
        counts[name] = int(match.group(1)) if match else -1
    return counts


class LogFollower:
    """`docker logs -f` of one container, read until the container is gone."""

    def __init__(self, container: str) -> None:
        self.lines: list[str] = []
        self._process = subprocess.Popen(["docker", "logs", "-f", "--since", "0s", container],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.lines.append(line.rstrip())

    def close(self) -> list[str]:
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.terminate()
            self._process.wait(5)
        self._reader.join(5)
        return self.lines


def base_images(services: dict) -> list[str]:
    """The images the stack starts from, each marked when it is a local stand-in (a
    `compose-standins` label: built on a machine that reaches no registry) rather than
    the official image of that name."""
    stages = re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)", (REPO / "Dockerfile").read_text(),
                        re.M | re.I)
    built_on = {stage for _, stage in stages}
    names = list(dict.fromkeys(base for base, _ in stages if base not in built_on))
    names += [service["image"] for service in services.values() if "image" in service]
    described = []
    for name in names:
        labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", name))
        standin = "compose-standins" in (labels or {})
        described.append(f"{name}{' (local stand-in)' if standin else ''}")
    return described
