"""docker-compose.yaml, the Dockerfile and .dockerignore read as data, for the tests that
check they agree with each other and with the rendered Envoy configuration
(tests/unit/test_envoy_config.py) and for the test that runs the compose file without
Docker (tests/e2e/test_compose_stack.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stage:
    """What one Dockerfile stage runs as, with what it inherits from its parent stage."""

    name: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str | None = None
    expose: tuple[str, ...] = ()
    copies: tuple[str, ...] = field(default=())


def compose_file() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def dockerfile_stages(text: str | None = None) -> dict[str, Stage]:
    """Every `FROM ... AS name` stage of the Dockerfile; a stage built on another starts
    from that one's ENTRYPOINT, CMD, USER and EXPOSE."""
    text = text if text is not None else (REPO / "Dockerfile").read_text()
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.I)
            assert match, f"an unnamed stage: {line}"
            parent = stages.get(match.group(1))
            current = replace(parent, name=match.group(2)) if parent else Stage(match.group(2))
            stages[current.name] = current
            continue
        assert current is not None, f"{line} before any FROM"
        if word == "ENTRYPOINT":
            current = replace(current, entrypoint=tuple(json.loads(rest)), cmd=())
        elif word == "CMD":
            current = replace(current, cmd=tuple(json.loads(rest)))
        elif word == "USER":
            current = replace(current, user=rest.strip())
        elif word == "EXPOSE":
            current = replace(current, expose=current.expose + tuple(rest.split()))
        elif word == "COPY":
            current = replace(current, copies=current.copies + tuple(rest.split()[:-1]))
        stages[current.name] = current
    return stages


def split_volume(volume: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume; the source may be `${VAR:-default}`."""
    match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(?:ro|rw))?", volume)
    assert match, f"a volume this reader does not know: {volume}"
    return match.group(1), match.group(2)


def config_mount(service: dict) -> tuple[Path, str]:
    """The routing configuration's bind mount of a service: (folder in the repository, as
    the default of its `${VAR:-default}` source; folder in the container)."""
    for volume in service.get("volumes", []):
        source, target = split_volume(volume)
        match = re.fullmatch(r"\$\{(\w+):-([^}]+)\}", source)
        if match and target == "/etc/sidecar":
            return (REPO / match.group(2)).resolve(), target
    raise AssertionError(f"no configuration folder mounted at /etc/sidecar: {service}")


def dockerignored(relative: str, rules: list[str] | None = None) -> bool:
    """Whether .dockerignore keeps `relative` (a path inside the repository) out of the
    build context, as Docker reads it: the last matching rule wins, `!` lets a path back
    in, `*` stays within one path segment, `**` spans any, and a rule matching a parent
    folder matches everything under it."""
    if rules is None:
        rules = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
        rules = [line for line in rules if line and not line.startswith("#")]
    parts = relative.strip("/").split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for rule in rules:
        keep = rule.startswith("!")
        pattern = _glob(rule.lstrip("!").strip("/"))
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            excluded = not keep
    return excluded


def _glob(pattern: str) -> re.Pattern[str]:
    out = ""
    for piece in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
            piece, re.escape(piece))
    return re.compile(out)
