"""Issue #2 point 1: `sidecar up` with no --config runs the demo offline; Ctrl-C leaves no
process behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from sidecar.devstack.harness import UpProcess, free_port, pid_alive

pytestmark = pytest.mark.e2e


def test_demo_stack_serves_both_sdks_and_stops_cleanly(tmp_path) -> None:
    up = UpProcess(["--demo-port", str(free_port())], log_path=tmp_path / "up.log")
    try:
        up.start()
        token = up.banner_value(r"^token: (\S+)$")
        assert token == "demo-caller-token"
        envoy_pid = up.envoy_pid
        assert pid_alive(envoy_pid)

        # The printed curl example works as printed.
        curl = up.banner_value(r"^\s+(curl .*)$")
        assert f"{up.base_url}/v1/chat/completions" in curl
        result = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=20)
        assert '"object": "chat.completion"' in result.stdout

        oai = openai.OpenAI(base_url=up.base_url + "/v1", api_key=token, max_retries=0)
        assert [m.id for m in oai.models.list()] == ["adaptive-agent", "claude-agent"]
        reply = oai.chat.completions.create(
            model="adaptive-agent", messages=[{"role": "user", "content": "hi"}])
        assert reply.model in {"gpt-oss-120b", "m3", "gpt-5.4-nano"}
        chunks = list(oai.chat.completions.create(
            model="adaptive-agent", messages=[{"role": "user", "content": "hi"}], stream=True))
        assert len(chunks) >= 5

        claude = anthropic.Anthropic(base_url=up.base_url, api_key=token, max_retries=0)
        message = claude.messages.create(
            model="claude-agent", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        assert re.match(r"Hello from (anthropic|minimax) serving", message.content[0].text)
        with claude.messages.stream(model="claude-agent", max_tokens=64,
                                    messages=[{"role": "user", "content": "hi"}]) as stream:
            assert len(list(stream.text_stream)) == 10

        assert up.interrupt() == 0
        deadline = time.monotonic() + 10
        while pid_alive(envoy_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(envoy_pid), "Envoy outlived `sidecar up`"
        assert "stopped" in up.banner
        assert not Path(up.banner_value(r"Envoy config: (\S+)")).exists()  # temp dir removed
    finally:
        up.kill()


def test_killed_parent_takes_envoy_down(tmp_path) -> None:
    """Even SIGKILL of `sidecar up` leaves no orphan Envoy (parent-death signal)."""
    up = UpProcess(["--demo-port", str(free_port())], log_path=tmp_path / "up.log")
    try:
        up.start()
        envoy_pid = up.envoy_pid
        up.kill()
        deadline = time.monotonic() + 10
        while pid_alive(envoy_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(envoy_pid)
    finally:
        up.kill()


@pytest.mark.parametrize(("flag", "role"), [
    ("--listen", "client listener"), ("--admin", "Envoy admin"),
    ("--ext-proc", "ext_proc (gRPC)"), ("--admin-http", "sidecar admin"),
    ("--demo-port", "demo providers"),
])
def test_a_port_in_use_is_an_error_naming_it_and_nothing_is_left_running(
        tmp_path, flag: str, role: str) -> None:
    """Issue #29.3: with the client port taken, Envoy logged `cannot bind` under a banner
    saying the stack was up."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = UpProcess(["--demo-port", "0"], log_path=tmp_path / "up.log")
        up.args[up.args.index(flag) + 1] = (str(port) if flag == "--demo-port"
                                            else f"127.0.0.1:{port}")
        with pytest.raises(RuntimeError, match="exited early"):
            up.start()
        assert up.process.wait(20) == 1
    log = (tmp_path / "up.log").read_text()
    assert f"error: the {role} port 127.0.0.1:{port} is in use by another process" in log
    assert "Traceback" not in log
    assert "started Envoy" not in log  # checked before anything started


def test_the_start_is_quiet_and_takes_no_request_before_the_sidecar_can_answer(
        tmp_path) -> None:
    """Issue #29.2/3: 25 work-in-progress warnings before the banner; requests that came
    before the banner met `Received gRPC error ... Connection refused`. Issue 40: once the
    banner is out, `/ready` answers 200."""
    up = UpProcess(["--demo-port", "0"], log_path=tmp_path / "up.log")
    answers = []
    try:
        starting = threading.Thread(target=up.start, daemon=True)
        starting.start()
        deadline = time.monotonic() + 60
        while starting.is_alive() and time.monotonic() < deadline:
            # Not listening yet is a refused connection: the caller's retry is safe.
            with contextlib.suppress(httpx.TransportError):
                answers.append(_hello(up))
        starting.join(10)
        # Issue 40: the banner came before Envoy's first passing health check of the
        # sidecar, so a load balancer's first `/ready` could be a 503 (the soak's poller).
        assert httpx.get(up.base_url + "/ready", timeout=5).status_code == 200
        answers.append(_hello(up))
        assert set(answers) == {200}, answers
        assert up.interrupt() == 0
    finally:
        up.kill()
    log = (tmp_path / "up.log").read_text()
    assert "work-in-progress" not in log
    assert "gRPC error" not in log
    assert "warning" not in log.lower(), log


def test_a_killed_stacks_folder_is_removed_by_the_next_start(tmp_path) -> None:
    first = UpProcess(["--demo-port", "0"], log_path=tmp_path / "first.log")
    try:
        first.start()
        folder = Path(first.banner_value(r"Envoy config: (\S+)")).parent
        first.kill()  # SIGKILL: no clean-up of its own
        assert folder.exists()
        second = UpProcess(["--demo-port", "0"], log_path=tmp_path / "second.log")
        with second.running():
            assert not folder.exists()
            assert f"removed {folder}" in (tmp_path / "second.log").read_text()
    finally:
        first.kill()


def test_the_demo_shows_costs_reports_and_explain_as_its_banner_says(tmp_path) -> None:
    """Issue #29.1: the demo had telemetry off (no reports) and no prices (every cost 0)."""
    up = UpProcess(["--demo-port", "0", "--no-demo-traffic"],  # counts one request
                   env={"XDG_STATE_HOME": str(tmp_path / "state")},
                   log_path=tmp_path / "up.log")
    with up.running():
        oai = openai.OpenAI(base_url=up.base_url + "/v1", api_key="demo-caller-token",
                            max_retries=0)
        oai.chat.completions.create(model="adaptive-agent",
                                    messages=[{"role": "user", "content": "hi"}])
        report = up.banner_value(r"^\s+(sidecar report usage .*?)\s+\(or GET")
        document = _until_reported(report)
        assert document["rows"][0]["requests"] == 1
        assert str(tmp_path / "state" / "model-group-sidecar") in report  # the documented place
        assert document["rows"][0]["cost_usd"] > 0  # the illustrative prices
        admin = up.banner_value(r"\(or GET (http://\S+/reports/usage)\)")
        assert httpx.get(admin, timeout=10).status_code == 200
        explain = up.banner_value(r"^\s+(sidecar explain .*)$")
        result = _sidecar_command(explain)
        assert result.returncode == 0, result.stderr
        assert "primary:" in result.stdout
        observations = _sidecar_command(up.banner_value(r"^\s+(sidecar observations.*)$"))
        assert observations.returncode == 0 and "gpt-oss-120b" in observations.stdout


def test_an_edited_copy_of_the_demo_runs_reloads_and_its_curl_hint_works(tmp_path) -> None:
    """Issue #29.1/4: trying reload needed two exported SIDECAR_DEMO_* variables; the
    banner's curl hint put $CALLER_TOKEN in single quotes (a 401 when pasted)."""
    demo_port = free_port()
    copy = tmp_path / "my-demo.yaml"
    printed = _sidecar_command(f"sidecar demo-config --providers-url http://127.0.0.1:{demo_port} "
                               f"--telemetry-db {tmp_path / 'demo.db'}")
    copy.write_text(printed.stdout)
    up = UpProcess(["--config", str(copy), "--demo-providers", "--demo-port", str(demo_port)],
                   log_path=tmp_path / "up.log")
    with up.running():
        curl = up.banner_value(r"^\s+(curl .*)$")
        pasted = subprocess.run(["bash", "-c", curl], capture_output=True, text=True,
                                timeout=20, env={**os.environ, "CALLER_TOKEN": "demo-caller-token"})
        assert '"object": "chat.completion"' in pasted.stdout, pasted.stdout
        # An editor's save: a new file renamed over the old one.
        edited = tmp_path / ".my-demo.yaml.swp"
        edited.write_text(printed.stdout.replace("  claude-agent:", "  claude-edited:"))
        edited.replace(copy)
        oai = openai.OpenAI(base_url=up.base_url + "/v1", api_key="demo-caller-token",
                            max_retries=0)
        deadline = time.monotonic() + 30
        while "claude-edited" not in [m.id for m in oai.models.list()]:
            assert time.monotonic() < deadline, "the edit was not applied"
            time.sleep(0.2)


def _hello(up: UpProcess) -> int:
    return httpx.post(f"{up.base_url}/v1/chat/completions", timeout=10,
                      headers={"authorization": "Bearer demo-caller-token"},
                      json={"model": "adaptive-agent",
                            "messages": [{"role": "user", "content": "hi"}]}).status_code


def _sidecar_command(line: str) -> subprocess.CompletedProcess[str]:
    """A `sidecar ...` line as printed, run with this interpreter's sidecar."""
    words = shlex.split(line)
    assert words[0] == "sidecar"
    return subprocess.run([sys.executable, "-m", "sidecar", *words[1:]], capture_output=True,
                          text=True, timeout=60)


def _until_reported(line: str) -> dict:
    """The report, once the telemetry writer has the request's row."""
    deadline = time.monotonic() + 30
    while True:
        result = _sidecar_command(line + " --format json")
        if result.returncode == 0:
            document = json.loads(result.stdout)
            if document.get("rows"):
                return document
        assert time.monotonic() < deadline, result.stdout + result.stderr
        time.sleep(0.3)
