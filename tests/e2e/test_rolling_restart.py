"""A rolling restart behind a real load balancer (issue #30.4): three `sidecar up` replicas
behind Debian's HAProxy in TCP mode, health-checking each replica's `GET /ready`, while a
keep-alive client sends requests without pause. Each replica in turn is SIGTERMed and
started again on the same ports. No request may fail: a draining replica fails `/ready` at
once, tells its clients to go (`connection: close`) and serves its grace period, so the
balancer has marked it down before it stops listening. (HAProxy's `on-marked-down
shutdown-sessions` must not be set: it cut requests in flight on the draining replica,
one per restart in three runs.)"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from sidecar.devstack.harness import ProviderThread, UpProcess, free_port
from sidecar.devstack.providers import FakeProvider

pytestmark = pytest.mark.e2e
# Debian puts it in /usr/sbin, which a non-root PATH may not have.
HAPROXY_BIN = shutil.which("haproxy") or next(
    (path for path in ("/usr/sbin/haproxy",) if os.access(path, os.X_OK)), None)
TOKEN = "rolling-caller-token"
CONFIG = """\
providers:
  only: {{base_url: '{url}', credential: {{env: KEY_ONLY}}}}
callers: [{{name: rolling, token_sha256: {digest}}}]
models:
  chat:
    targets: [{{provider: only, model_ref: only-model}}]
"""
# HAProxy 2.6: TCP mode as the fleet ran it; a check every 200 ms, down after one
# failure; a connection that cannot reach a server is retried on another.
HAPROXY = """\
global
  maxconn 256
defaults
  mode tcp
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  retries 3
  option redispatch
frontend gateway
  bind 127.0.0.1:{port}
  default_backend replicas
backend replicas
  balance roundrobin
  # HTTP/1.1 with a host: Envoy refuses HAProxy's default HTTP/1.0 check (426).
  option httpchk
  http-check send meth GET uri /ready ver HTTP/1.1 hdr host replica
  http-check expect status 200
  default-server inter 200ms fall 1 rise 2
{servers}
"""


def _replica(config: Path, log: Path, like: UpProcess | None = None) -> UpProcess:
    """A replica; `like`: on the same ports as that one (a restart)."""
    up = UpProcess(["--config", str(config), "--drain-seconds", "10",
                    "--drain-grace-seconds", "2"], env={"KEY_ONLY": "key-only"},
                   log_path=log)
    if like is not None:
        up.args, up.listen_port, up.admin_http_port = like.args, like.listen_port, \
            like.admin_http_port
    return up


@pytest.mark.skipif(HAPROXY_BIN is None,
                    reason="HAProxy is not installed (.ci/services installs Debian's)")
def test_a_rolling_restart_behind_haproxy_fails_no_request(tmp_path: Path) -> None:
    provider = FakeProvider("only", api_key="key-only")
    with ProviderThread([provider]) as providers:
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG.format(url=providers.base_url("only"),
                                        digest=hashlib.sha256(TOKEN.encode()).hexdigest()))
        replicas = [_replica(config, tmp_path / f"r{i}.log") for i in range(3)]
        for up in replicas:
            up.start()
        port = free_port()
        servers = "\n".join(f"  server r{i} 127.0.0.1:{up.listen_port} check"
                            for i, up in enumerate(replicas))
        (tmp_path / "haproxy.cfg").write_text(HAPROXY.format(port=port, servers=servers))
        balancer_log = (tmp_path / "haproxy.log").open("w")
        balancer = subprocess.Popen([str(HAPROXY_BIN), "-f", str(tmp_path / "haproxy.cfg"),
                                     "-db"], stdout=balancer_log, stderr=subprocess.STDOUT)
        outcomes: Counter[str] = Counter()
        stopping = threading.Event()

        def client() -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10,
                              headers={"authorization": f"Bearer {TOKEN}"}) as http:
                while not stopping.is_set():
                    try:
                        answer = http.post("/v1/chat/completions", json={
                            "model": "chat", "messages": [{"role": "user", "content": "hi"}]})
                        outcomes[str(answer.status_code)] += 1
                    except httpx.TransportError as exc:
                        outcomes[type(exc).__name__] += 1

        try:
            deadline = time.monotonic() + 20
            while True:  # the servers up in HAProxy's eyes (rise 2 × 200 ms)
                try:
                    if httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                  headers={"authorization": f"Bearer {TOKEN}"}, timeout=5,
                                  json={"model": "chat", "messages": [
                                      {"role": "user", "content": "hi"}]}).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "HAProxy never served"
                time.sleep(0.2)
            time.sleep(1.0)
            threads = [threading.Thread(target=client) for _ in range(4)]
            for thread in threads:
                thread.start()
            for index, up in enumerate(list(replicas)):
                time.sleep(1.0)
                assert up.process is not None
                os.kill(up.process.pid, signal.SIGTERM)
                assert up.process.wait(30) == 0
                replicas[index] = _replica(config, tmp_path / f"r{index}-again.log", like=up)
                replicas[index].start()
                time.sleep(1.0)  # rise 2 × 200 ms, and traffic on it again
            stopping.set()
            for thread in threads:
                thread.join(20)
        finally:
            stopping.set()
            balancer.terminate()
            balancer.wait(10)
            balancer_log.close()
            for up in replicas:
                if up.process is not None and up.process.poll() is None:
                    up.interrupt()
                up.kill()
        failed = {kind: count for kind, count in outcomes.items() if kind != "200"}
        assert outcomes["200"] > 50, outcomes
        assert failed == {}, outcomes
