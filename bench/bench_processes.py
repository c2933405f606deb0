"""The processes of the side-by-side benchmark: start them on free loopback ports, read
their CPU time and peak memory from /proc, stop exactly what was started."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from mode_runner import cpu_seconds

from sidecar.config import load_config_text
from sidecar.devstack.envoy_process import start_envoy
from sidecar.devstack.harness import free_port
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.credentials import write_sds_files
from sidecar.envoy_config.render import render_envoy_yaml
from sidecar.grpcwire.auth import ensure_channel_token

SPEC = (Path(__file__).parent.parent / "tests" / "fixtures" / "spec_sample.yaml").read_text()
COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 250, "completion_tokens": 10, "total_tokens": 260}})


MESSAGE = json.dumps({
    "id": "msg-bench", "type": "message", "role": "assistant", "model": "m",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 250, "output_tokens": 10}})


# LiteLLM insists on a master key of this shape; every row of a comparison uses it.
TOKEN = "sk-bench-0123456789abcdef0123456789abcdef"


def status_mb(pid: int, field: str) -> float:
    """A memory figure (kB in /proc/<pid>/status, such as VmRSS or VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Processes:
    """Named processes of one row; a name's CPU includes its descendants (workers), except
    for the names in `apart`, whose descendants are reported as `<name>_children`."""

    named: dict[str, subprocess.Popen] = field(default_factory=dict)
    apart: frozenset[str] = frozenset()

    def add(self, name: str, process: subprocess.Popen) -> None:
        self.named[name] = process

    def cpu_seconds(self) -> dict[str, float]:
        totals = {}
        for name, process in self.named.items():
            own = [process.pid]
            children = _descendants(process.pid)
            groups = {name: own, f"{name}_children": children} if name in self.apart else {
                name: own + children}
            for label, pids in groups.items():
                total = 0.0
                for pid in pids:
                    with contextlib.suppress(OSError):  # a worker that just exited
                        total += cpu_seconds(pid)
                totals[label] = total
        return totals

    def peak_rss_mb(self, name: str) -> float:
        process = self.named.get(name)
        return status_mb(process.pid, "VmHWM") if process is not None else 0.0

    def stop(self) -> None:
        for process in reversed(self.named.values()):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)


def wait_http(port: int, path: str = "/", timeout_s: float = 60.0) -> None:
    """Until something answers HTTP on the port (any status)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                             .encode())
                if sock.recv(12).startswith(b"HTTP/1."):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing answered on 127.0.0.1:{port} within {timeout_s:.0f} s")


def _cluster(name: str, port: int) -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                             "port_value": port}}}}]}]}}


# A provider must read the whole request before it answers: an Envoy that answers from a
# direct response as soon as the headers arrive closes the HTTP/1.1 connection (the body is
# still in flight), and every proxied row would then pay a new upstream connection per request,
# which no real provider makes it do.
_READ_WHOLE_REQUEST = {"name": "envoy.filters.http.buffer", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
    "max_request_bytes": 4 * 1024 * 1024}}


def _envoy(workdir: Path, name: str, routes: list[dict], clusters: list[dict],
           read_whole_request: bool = False) -> tuple[subprocess.Popen, int]:
    port = free_port()
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
                 ".v3.HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
        "http_filters": [*([_READ_WHOLE_REQUEST] if read_whole_request else []),
                         {"name": "envoy.filters.http.router", "typed_config": {
                             "@type": "type.googleapis.com/envoy.extensions.filters.http.router"
                                      ".v3.Router"}}]}
    document = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": free_port()}}},
        "static_resources": {"listeners": [{
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                            "typed_config": manager}]}]}],
            "clusters": clusters}}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    process = start_envoy(path, "error")
    wait_http(port)
    return process, port


def fast_provider(workdir: Path) -> tuple[Processes, int]:
    """An Envoy that answers every request with a fixed OpenAI chat completion, and
    `…/messages` with a fixed Anthropic message."""
    def answer(match: dict, body: str) -> dict:
        return {"match": match, "direct_response": {
            "status": 200, "body": {"inline_string": body}},
            "response_headers_to_add": [{"header": {"key": "content-type",
                                                    "value": "application/json"}}]}

    routes = [answer({"safe_regex": {"regex": ".*/messages"}}, MESSAGE),
              answer({"prefix": "/"}, COMPLETION)]
    process, port = _envoy(workdir, "fast_provider", routes, [], read_whole_request=True)
    return Processes({"provider": process}), port


def start_envoy_direct(workdir: Path, fast_port: int, drip_port: int) -> tuple[Processes, int]:
    """Envoy as a plain proxy: streams (`/drip/…`) to the demo provider, the rest to the
    fast provider."""
    routes = [{"match": {"prefix": "/drip/"}, "route": {"cluster": "drip", "timeout": "60s"}},
              {"match": {"prefix": "/"}, "route": {"cluster": "fast"}}]
    process, port = _envoy(workdir, "envoy_direct", routes,
                           [_cluster("fast", fast_port), _cluster("drip", drip_port)])
    return Processes({"envoy": process}), port


def sidecar_config(strategy: str, fast_port: int, drip_url: str, token: str) -> str:
    """The SPEC's group (its three providers pointed at the fast provider) under the given
    strategy, and a stream group on the demo provider."""
    import hashlib

    group = SPEC[len("models:\n"):]
    if strategy == "weighted":
        group = group.replace("strategy: dynamic_score", "strategy: weighted")
    fast = f"http://127.0.0.1:{fast_port}/v1"
    providers = "".join(f"  {name}: {{base_url: '{fast}', credential: null}}\n"
                        for name in ("baseten", "minimax", "openai"))
    return (f"providers:\n{providers}  drip: {{base_url: '{drip_url}', credential: null}}\n"
            f"callers: [{{name: bench, token_sha256: "
            f"{hashlib.sha256(token.encode()).hexdigest()}}}]\n"
            f"models:\n{group}"
            f"  stream-group:\n    strategy: {strategy}\n    targets:\n"
            "      - {provider: drip, model_ref: drip-a}\n"
            "      - {provider: drip, model_ref: drip-b}\n")


def tree_environment(tree: Path) -> dict:
    """Popen arguments that make `python -m sidecar` import `tree`'s package. PYTHONPATH
    alone does not: `-m` puts the working directory first on sys.path, so from this
    repository's root it would import this tree (which made every versus_revision.py run
    before 2026-12-03 compare this tree with itself). Checked, not assumed."""
    where = {"cwd": str(tree), "env": {**os.environ, "PYTHONPATH": str(tree)}}
    imported = subprocess.run([sys.executable, "-c", "import sidecar; print(sidecar.__file__)"],
                              check=True, capture_output=True, text=True, **where).stdout
    if not Path(imported.strip()).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the sidecar package of {tree} is not the one imported: {imported}")
    return where


def sidecar_stack(workdir: Path, strategy: str, fast_port: int, drip_url: str,
                  token: str, processes: int = 1, extra_config: str = "",
                  config_text: str | None = None, apart: frozenset[str] = frozenset(),
                  tree: Path | None = None,
                  edit: Callable[[dict], None] | None = None) -> tuple[Processes, int]:
    """Envoy + `processes` sidecar processes (one ext_proc cluster endpoint each; Envoy
    spreads the ext_proc streams over them). `extra_config`: top-level YAML appended;
    `config_text`: a whole configuration instead of the SPEC's group; `tree`: the source
    tree whose code the sidecar processes run and whose `render-envoy` makes Envoy's
    bootstrap (default: this one; see `tree_environment`); `edit`:
    changes the rendered bootstrap (as data) before Envoy starts. Provider keys come from
    this process's environment, which Envoy inherits (SDS files in `workdir` name them)."""
    config = workdir / f"sidecar-{strategy}.yaml"
    config.write_text((config_text or sidecar_config(strategy, fast_port, drip_url, token))
                      + extra_config)
    listen = free_port()
    grpc_ports = [free_port() for _ in range(processes)]
    token_file = workdir / f"sidecar-{strategy}.grpc-token"
    token = ensure_channel_token(token_file)
    running = Processes(apart=apart)
    try:  # whatever fails on the way, nothing started here is left running
        where = tree_environment(tree) if tree is not None else {}
        for index, grpc_port in enumerate(grpc_ports):
            admin_http = free_port()
            running.add("sidecar" if index == 0 else f"sidecar{index + 1}", subprocess.Popen(
                [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--listen",
                 f"127.0.0.1:{grpc_port}", "--admin-http", f"127.0.0.1:{admin_http}",
                 "--grpc-token-file", str(token_file), "--log-level", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **where))
            wait_http(admin_http, "/healthz")
        secrets = workdir / f"secrets-{listen}"
        addresses = EnvoyAddresses(listen=f"127.0.0.1:{listen}", admin=f"127.0.0.1:{free_port()}",
                                   ext_proc=f"127.0.0.1:{grpc_ports[0]}", secrets_dir=str(secrets))
        if tree is None:
            loaded = load_config_text(config.read_text())
            write_sds_files(loaded, secrets)
            document = yaml.safe_load(render_envoy_yaml(loaded, addresses, token))
        else:
            document = yaml.safe_load(subprocess.run(
                [sys.executable, "-m", "sidecar", "render-envoy", "--config", str(config),
                 "--listen", addresses.listen, "--admin", addresses.admin, "--ext-proc",
                 addresses.ext_proc, "--grpc-token-file", str(token_file),
                 "--secrets-dir", str(secrets), "--sds-output", str(secrets)],
                check=True, capture_output=True, text=True, **where).stdout)
        for cluster in document["static_resources"]["clusters"]:
            if cluster["name"] == "sidecar_ext_proc":
                endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
                cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
                    {**endpoint, "endpoint": {"address": {"socket_address": {
                        "address": "127.0.0.1", "port_value": port}}}} for port in grpc_ports]
        if edit is not None:
            edit(document)
        envoy_file = workdir / f"envoy-{strategy}.yaml"
        envoy_file.write_text(yaml.safe_dump(document))
        running.named = {"envoy": start_envoy(envoy_file, "error"), **running.named}
        wait_http(listen)
    except BaseException:
        running.stop()
        raise
    return running, listen


def litellm_command(venv: Path, workdir: Path, strategy: str, workers: int, fast_port: int,
                    drip_url: str, token: str) -> tuple[Processes, int]:
    fast = f"http://127.0.0.1:{fast_port}/v1"
    deployments = [("g", f"openai/m{n}", fast) for n in (1, 2)]
    deployments += [("s", f"openai/drip-{n}", drip_url) for n in (1, 2)]
    config = {
        "model_list": [{"model_name": name, "litellm_params": {
            "model": model, "api_base": base, "api_key": "unused"}}
            for name, model, base in deployments],
        "router_settings": {"routing_strategy": strategy},
        "litellm_settings": {"telemetry": False, "drop_params": True},
        "general_settings": {"master_key": token},
    }
    path = workdir / f"litellm-{strategy}-{workers}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
           "DISABLE_SCHEMA_UPDATE": "True"}
    process = subprocess.Popen(
        [str(venv / "bin" / "litellm"), "--config", str(path), "--host", "127.0.0.1",
         "--port", str(port), "--num_workers", str(workers)],
        stdout=subprocess.DEVNULL, stderr=(workdir / f"litellm-{port}.log").open("w"),
        env=env, start_new_session=True)
    try:
        wait_http(port, "/health/liveliness", timeout_s=120)
    except RuntimeError:
        Processes({"litellm": process}).stop()
        log = (workdir / f"litellm-{port}.log").read_text()[-2000:]
        raise RuntimeError(f"LiteLLM did not start:\n{log}") from None
    return Processes({"litellm": process}), port
