"""Issue #2 point 1: `sidecar up` with no --config runs the demo offline; Ctrl-C leaves no
process behind."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import anthropic
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


def test_port_in_use_is_a_clear_error_and_leaves_nothing_running(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = UpProcess(["--demo-port", "0"], log_path=tmp_path / "up.log")
        up.args[up.args.index("--ext-proc") + 1] = f"127.0.0.1:{port}"
        with pytest.raises(RuntimeError, match="exited early"):
            up.start()
        assert up.process.wait(20) == 1
    log = (tmp_path / "up.log").read_text()
    assert f"error: cannot listen on 127.0.0.1:{port}" in log
    assert "Traceback" not in log
    envoy_pid = int(re.search(r"started Envoy pid (\d+)", log).group(1))
    assert not pid_alive(envoy_pid)
