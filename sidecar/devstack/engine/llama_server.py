"""One `llama-server` process on a free loopback port: started, waited for (`GET /health`
answers 200 once the model is loaded), stopped, killed and restarted by its own PID, like
the fake providers and the tests' private Redis.

Flags as llama.cpp's tools/server/README.md documents them: `--ctx-size` is the context of
all slots together, `--parallel` the number of slots (requests beyond them queue),
`--jinja` renders the model's own chat template (tool calls), `--metrics` and `--slots`
open `/metrics` and `/slots` (what the tests read to see a task cancelled), `--seed` makes
a request's sampling repeatable (same prompt, same answer, when it runs alone)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from sidecar.devstack.harness import free_port


class EngineWillNotStart(RuntimeError):
    pass


class LlamaServer:
    def __init__(self, binary: Path, model: Path, workdir: Path, *, alias: str = "tiny",
                 ctx_size: int = 2048, parallel: int = 2, threads: int = 1, seed: int = 40,
                 api_key: str | None = None, extra: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.alias = alias
        self.port = free_port()
        self.log_path = workdir / f"llama-server-{alias}-{self.port}.log"
        self.args = [str(binary), "--model", str(model), "--alias", alias,
                     "--host", "127.0.0.1", "--port", str(self.port),
                     "--ctx-size", str(ctx_size), "--parallel", str(parallel),
                     "--threads", str(threads), "--threads-http", "4", "--seed", str(seed),
                     "--jinja", "--metrics",
                     "--slots", "--no-warmup", "--no-webui",
                     *(("--api-key", api_key) if api_key else ()), *extra]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root, as a provider's `base_url` names it."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60) -> LlamaServer:
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineWillNotStart(f"llama-server exited ({self.process.returncode}):\n"
                                         + self.log_tail())
            if self.healthy():
                return self
            time.sleep(0.05)
        self.kill()
        raise EngineWillNotStart(f"no healthy /health within {timeout} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            return httpx.get(self.root_url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM (the server finishes cleanly), SIGKILL if it will not."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

    def kill(self) -> None:
        """The engine dies (SIGKILL): nothing is finished or answered."""
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def restart(self, timeout: float = 60) -> LlamaServer:
        """Again on the same port (what a supervisor restarting a crashed engine does)."""
        self.stop()
        return self.start(timeout)

    def metric(self, name: str) -> float:
        """One sample of the Prometheus text at /metrics (`llamacpp:<name>`)."""
        text = httpx.get(self.root_url + "/metrics", headers=self.headers, timeout=5).text
        for line in text.splitlines():
            if line.startswith(f"llamacpp:{name} ") or line.startswith(f"llamacpp:{name}{{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def busy_slots(self) -> int:
        slots = httpx.get(self.root_url + "/slots", headers=self.headers, timeout=5).json()
        return sum(1 for slot in slots if slot.get("is_processing"))


@contextlib.contextmanager
def llama_server(binary: Path, model: Path, workdir: Path, **options) -> Iterator[LlamaServer]:
    server = LlamaServer(binary, model, workdir, **options)
    try:
        yield server.start()
    finally:
        server.stop()
