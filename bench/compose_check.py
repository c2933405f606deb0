"""The docker compose stack on a real Docker engine, end to end (issue #29).

Builds the images, brings docker-compose.yaml up under its own project name, waits until
every health check passes, and drives the stack through Envoy's published port with the
official `openai` and `anthropic` SDKs:

  unary and stream   a chat completion and a Messages call, each both ways
  bad token          both SDKs get a 401 whose body is JSON in their own dialect
  live reload        the configuration folder's file replaced the way an editor saves
                     (a new file renamed over the old), then SIGHUP: the container sees the
                     new file, and a group it adds is listed and serves; the original put
                     back the same way, and the group is gone again

then brings the stack down (`down -v`) and prints the timings: build, time to healthy,
requests served (as the SDKs saw them, and as Envoy counted them), time for `down` and the
sidecar's own drain line.

The check mounts a copy of envoy/compose (SIDECAR_CONFIG_DIR), so the repository's file
is never touched. Compose v2 (`docker compose`) is used where it is installed, else v1
(`docker-compose`); `--compose` chooses. Everything it publishes is on 127.0.0.1.

Usage:  .venv/bin/python bench/compose_check.py [--output bench/results/compose_check.md]
A few minutes with images to build, under a minute once they are cached.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx
import openai
import yaml
from compose_engine import (
    REPO,
    CheckFailed,
    Compose,
    LogFollower,
    base_images,
    containers,
    docker,
    envoy_counts,
    find_compose,
    logs,
    port_in_use,
    wait_healthy,
)

BASE_URL = "http://127.0.0.1:10000"
CONFIG_NAME = "sidecar-config.yaml"  # inside the mounted folder
RELOADED_GROUP = "reloaded-agent"
HEALTH_TIMEOUT_S = 180.0
RELOAD_TIMEOUT_S = 30.0


@dataclass
class Tally:
    """Requests the check made through Envoy, by what came back."""

    served: int = 0
    refused_401: int = 0
    steps: list[tuple[str, float, str]] = field(default_factory=list)

    def step(self, name: str, action: Callable[[], str]) -> None:
        started = time.monotonic()
        detail = action()
        self.steps.append((name, time.monotonic() - started, detail))
        print(f"  {name}: {detail} ({time.monotonic() - started:.2f} s)")


def drive(tally: Tally, token: str) -> None:
    chat = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=token, max_retries=0, timeout=30)
    messages = anthropic.Anthropic(base_url=BASE_URL, api_key=token, max_retries=0,
                                   timeout=30)
    hello = [{"role": "user", "content": "hello"}]

    def models() -> str:
        listed = {m.id for m in chat.models.list()}
        tally.served += 1
        if not {"adaptive-agent", "claude-agent"} <= listed:
            raise CheckFailed(f"/v1/models lists {sorted(listed)}")
        return f"{len(listed)} groups listed"

    def openai_unary() -> str:
        answer = chat.chat.completions.create(model="adaptive-agent", messages=hello)
        tally.served += 1
        if not answer.choices[0].message.content:
            raise CheckFailed("an empty chat completion")
        return f"answered by {answer.model}"

    def openai_stream() -> str:
        pieces = [chunk.choices[0].delta.content or "" for chunk in
                  chat.chat.completions.create(model="adaptive-agent", messages=hello,
                                               stream=True) if chunk.choices]
        tally.served += 1
        if not "".join(pieces):
            raise CheckFailed("a chat stream without text")
        return f"{len(pieces)} chunks"

    def anthropic_unary() -> str:
        answer = messages.messages.create(model="claude-agent", max_tokens=64, messages=hello)
        tally.served += 1
        if answer.content[0].type != "text" or not answer.content[0].text:
            raise CheckFailed(f"an unexpected Messages answer: {answer}")
        return f"answered by {answer.model}"

    def anthropic_stream() -> str:
        with messages.messages.stream(model="claude-agent", max_tokens=64,
                                      messages=hello) as stream:
            text = "".join(stream.text_stream)
        tally.served += 1
        if not text:
            raise CheckFailed("a Messages stream without text")
        return f"{len(text)} characters"

    def bad_token() -> str:
        wrong_chat = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="not-a-caller",
                                   max_retries=0, timeout=30)
        try:
            wrong_chat.chat.completions.create(model="adaptive-agent", messages=hello)
        except openai.AuthenticationError as refused:
            check_json_401(refused.response, refused.body, "openai")
            if getattr(refused, "code", None) != "invalid_api_key":
                raise CheckFailed(f"openai 401 body: {refused.body}") from None
        else:
            raise CheckFailed("a wrong token was served (openai)")
        wrong_messages = anthropic.Anthropic(base_url=BASE_URL, api_key="not-a-caller",
                                             max_retries=0, timeout=30)
        try:
            wrong_messages.messages.create(model="claude-agent", max_tokens=8, messages=hello)
        except anthropic.AuthenticationError as refused:
            check_json_401(refused.response, refused.body, "anthropic")
            body = refused.body if isinstance(refused.body, dict) else {}
            if body.get("type") != "error" or \
                    body.get("error", {}).get("type") != "authentication_error":
                raise CheckFailed(f"anthropic 401 body: {refused.body}") from None
        else:
            raise CheckFailed("a wrong token was served (anthropic)")
        tally.refused_401 += 2
        return "401 with a JSON error body in each dialect"

    for name, action in (("models", models), ("openai unary", openai_unary),
                         ("openai stream", openai_stream),
                         ("anthropic unary", anthropic_unary),
                         ("anthropic stream", anthropic_stream), ("bad token", bad_token)):
        tally.step(name, action)


def check_json_401(response: httpx.Response, body: object, sdk: str) -> None:
    kind = response.headers.get("content-type", "")
    if response.status_code != 401 or not kind.startswith("application/json"):
        raise CheckFailed(f"{sdk}: {response.status_code} {kind!r}, not a JSON 401")
    response.json()  # parses
    if not isinstance(body, dict):
        raise CheckFailed(f"{sdk}: the SDK read no JSON object from the 401: {body!r}")


def save_like_an_editor(path: Path, text: str) -> None:
    """A new file next to the old one, renamed over it: the old inode is gone."""
    temporary = path.with_name(f".{path.name}.saving")
    temporary.write_text(text)
    temporary.chmod(0o644)  # the sidecar reads it as uid 10001
    os.replace(temporary, path)


def reload_and_verify(compose: Compose, tally: Tally, token: str) -> None:
    path = compose.config_dir / CONFIG_NAME
    original = path.read_text()
    document = yaml.safe_load(original)
    original_groups = len(document["models"])
    document["models"][RELOADED_GROUP] = {
        "strategy": "weighted",
        "description": "Added by bench/compose_check.py's live reload.",
        "targets": [{"provider": "openai", "model_ref": "gpt-5.4-nano"}],
    }
    chat = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=token, max_retries=0, timeout=30)

    def listed() -> set[str]:
        groups = {m.id for m in chat.models.list()}
        tally.served += 1
        return groups

    sidecar = containers()["sidecar"][0]

    def sighup_reloads() -> list[int]:
        """The model-group count of each SIGHUP reload the sidecar has logged."""
        return [int(n) for n in re.findall(
            r"configuration reloaded \(sighup\): (\d+) model groups", logs(sidecar))]

    def reload(text: str, present: bool) -> str:
        inode = path.stat().st_ino
        save_like_an_editor(path, text)
        if path.stat().st_ino == inode:
            raise CheckFailed("the save kept the inode: not an editor-style save")
        seen = compose.run("exec", "-T", "sidecar", "cat", f"/etc/sidecar/{CONFIG_NAME}").stdout
        if (RELOADED_GROUP in seen) != present:
            raise CheckFailed("the container does not see the saved file (a stale mount?)")
        before = len(sighup_reloads())
        started = time.monotonic()
        compose.run("kill", "-s", "SIGHUP", "sidecar")
        while len(groups := sighup_reloads()) == before:
            if time.monotonic() - started > RELOAD_TIMEOUT_S:
                raise CheckFailed(f"no SIGHUP reload logged within {RELOAD_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
        wanted = len(document["models"]) if present else original_groups
        if groups[-1] != wanted:  # what the issue saw: HUP read the old inode's content
            raise CheckFailed(f"SIGHUP reloaded {groups[-1]} model groups, not {wanted}: "
                              "the content of the file before the save")
        logged = time.monotonic() - started
        while (RELOADED_GROUP in listed()) != present:
            if time.monotonic() - started > RELOAD_TIMEOUT_S:
                raise CheckFailed(f"the reload did not take within {RELOAD_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
        listed_after = time.monotonic() - started
        if not present:
            return (f"SIGHUP reload of {groups[-1]} groups logged after {logged:.2f} s, "
                    f"{RELOADED_GROUP} gone {listed_after:.2f} s after SIGHUP")
        while True:  # Envoy takes the new clusters from the shared xDS folder
            try:
                answer = chat.chat.completions.create(
                    model=RELOADED_GROUP, messages=[{"role": "user", "content": "again"}])
                tally.served += 1
                break
            except openai.APIStatusError as error:
                if time.monotonic() - started > RELOAD_TIMEOUT_S:
                    raise CheckFailed(f"{RELOADED_GROUP} never served: {error}") from None
                time.sleep(0.2)
        return (f"SIGHUP reload of {groups[-1]} groups logged after {logged:.2f} s, "
                f"{RELOADED_GROUP} listed after {listed_after:.2f} s and served (by "
                f"{answer.model}) {time.monotonic() - started:.2f} s after SIGHUP")

    tally.step("reload: editor-style save + SIGHUP",
               lambda: reload(yaml.safe_dump(document, sort_keys=False), True))
    tally.step("reload: original put back + SIGHUP", lambda: reload(original, False))
    reloads = re.findall(r"configuration reloaded \(([^)]*)\): (\d+) model groups",
                         logs(sidecar))
    print("  the sidecar's reloads (trigger, groups): "
          + ", ".join(f"{trigger} {groups}" for trigger, groups in reloads))


@dataclass
class Figures:
    compose: str
    docker: str
    images: list[str] = field(default_factory=list)
    build_s: float = 0.0
    up_s: float = 0.0
    healthy_s: float = 0.0
    down_s: float = 0.0
    drain_line: str = "(not seen)"
    envoy: dict[str, int] = field(default_factory=dict)


def run(compose: Compose, figures: Figures) -> Tally:
    compose_file = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose_file["services"]
    token = services["sidecar"]["environment"]["SIDECAR_DEMO_TOKEN"]
    tally = Tally()
    compose.run("down", "-v", timeout=120)  # what an interrupted earlier check left
    if port_in_use(10000):
        raise CheckFailed("127.0.0.1:10000 is in use: the stack publishes Envoy there")
    print(f"building the images ({compose.version}) ...")
    started = time.monotonic()
    compose.run("build", timeout=1800)
    figures.build_s = time.monotonic() - started
    print(f"  built in {figures.build_s:.1f} s")
    figures.images = base_images(services)
    print(f"  base images: {', '.join(figures.images)}")
    started = time.monotonic()
    try:
        compose.run("up", "-d", timeout=HEALTH_TIMEOUT_S)
        figures.up_s = time.monotonic() - started
        wait_healthy(services, HEALTH_TIMEOUT_S)
        figures.healthy_s = time.monotonic() - started
        print(f"  up -d returned after {figures.up_s:.1f} s; every health check passed "
              f"{figures.healthy_s:.1f} s after `up`")
        print("driving the stack through 127.0.0.1:10000:")
        drive(tally, token)
        reload_and_verify(compose, tally, token)
        figures.envoy = envoy_counts(compose)
        print(f"  Envoy counted {figures.envoy}")
    finally:
        try:
            sidecar = containers().get("sidecar")
        except CheckFailed:
            sidecar = None
        follower = LogFollower(sidecar[0]) if sidecar else None
        print("bringing the stack down ...")
        started = time.monotonic()
        compose.run("down", "-v", timeout=120)
        figures.down_s = time.monotonic() - started
        if follower is not None:
            drained = [line for line in follower.close() if "drained in" in line]
            if drained:
                figures.drain_line = drained[-1].split("sidecar.drain", 1)[-1].strip(" :")
        print(f"  down -v took {figures.down_s:.1f} s; sidecar: {figures.drain_line}")
    return tally


def report(figures: Figures, tally: Tally) -> str:
    envoy = figures.envoy
    lines = [
        f"# docker compose check ({datetime.date.today().isoformat()})",
        "",
        f"{figures.compose}; Docker engine {figures.docker}; base images "
        f"{', '.join(figures.images)}; `bench/compose_check.py`.",
        "",
        "| step | figure |",
        "| --- | --- |",
        f"| build (`compose build`) | {figures.build_s:.1f} s |",
        f"| `up -d` returned | {figures.up_s:.1f} s |",
        f"| every health check passed (from `up`) | {figures.healthy_s:.1f} s |",
        f"| requests served through Envoy (SDKs and /v1/models) | {tally.served} |",
        f"| refused with a JSON 401 (bad token, both SDKs) | {tally.refused_401} |",
        f"| Envoy's count: completed / 2xx / 4xx / 5xx | "
        f"{envoy.get('downstream_rq_completed')} / {envoy.get('downstream_rq_2xx')} / "
        f"{envoy.get('downstream_rq_4xx')} / {envoy.get('downstream_rq_5xx')} |",
        f"| `down -v` | {figures.down_s:.1f} s |",
        f"| the sidecar's drain | {figures.drain_line} |",
        "",
        "| request | seconds | result |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {name} | {seconds:.2f} | {detail} |" for name, seconds, detail in tally.steps]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path, help="also write the figures (markdown)")
    parser.add_argument("--compose", help='the compose command, e.g. "docker compose" or '
                                          '"docker-compose" (default: v2 where installed)')
    args = parser.parse_args()
    try:
        argv, version = find_compose(args.compose)
        engine = docker("version", "-f", "{{.Server.Version}}").strip()
    except CheckFailed as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="compose-check-") as workdir:
        config_dir = Path(workdir) / "config"
        shutil.copytree(REPO / "envoy" / "compose", config_dir)
        for path in (config_dir, *config_dir.iterdir()):  # read by the containers' uid 10001
            path.chmod(0o755 if path.is_dir() else 0o644)
        Path(workdir).chmod(0o755)
        compose = Compose(argv, version, config_dir)
        figures = Figures(version, engine)
        try:
            tally = run(compose, figures)
        except CheckFailed as problem:
            print(f"FAILED: {problem}", file=sys.stderr)
            return 1
    text = report(figures, tally)
    print("\n" + text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
