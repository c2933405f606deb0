"""One member of the workload family through the real stack (issue 41): `sidecar up` (real
Envoy, the real sidecar, its SQLite telemetry) in front of fake providers that play the
member's profiles and drift, driven by the member's own arrivals with the official
`openai` SDK. It returns the simulator's `Run` (family_sim.py), so the same figures
(family_report.py) are computed from both and set side by side (routing_stack_family.py).

What the simulator gets from its own state, the stack's run reads from what the stack
recorded: the primary, complexity bucket, probe and exclusions of each request from its
telemetry row (joined through Envoy's `x-request-id`, which the providers receive), every
upstream attempt (fallbacks, retries inside Envoy and probes) from the providers, the
serving target and tokens from the reply. Each request carries a marker
`[job <ident>.<turn> reply <tokens>]` in its last user message: the fake providers answer
with that many tokens (times the profile's verbosity), as the simulator's providers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from family_requests import TOOLS, follow_up, opening, think_s
from family_sim import (
    FLAP_ERRORS,
    FLAP_LATENCY,
    GROUP,
    RETRY_AFTER_S,
    SICK_ERRORS,
    SICK_LATENCY,
    SICK_RATE_LIMITS,
    Run,
    Served,
    config_data,
    phases,
)
from family_workloads import AGENT, CHAT, TURNS, Job, Member, Profile, arrivals
from sdk_chat import chat

from sidecar.devstack.harness import ProviderThread, UpProcess
from sidecar.devstack.providers import Behaviour, FakeProvider

TOKEN = "family-stack-token"
# Attempts per request, for the fakes' room: at most the group's `max_attempts` (3; a
# same-target retry takes a place in the order), with a margin.
ATTEMPTS_PER_REQUEST = 4
# The SDK clients the arrivals are spread over (by conversation). httpx's connection pool
# checks every connection it holds at each request and reply (`has_expired`: a getpeername
# and a select per connection); one pool of a few hundred connections at 32 requests a
# second kept the client's loop busy for seconds at a time, so the stack received the
# arrivals in bursts (up to 2.4 s late, p90 1.5 s; issue 41) while the simulator received
# them on time. Spread over 32 pools the client keeps its schedule (`Run.lateness`): p99
# under 0.5 s and no stall of half a second, both strategies' stacks on two cores.
CLIENTS = 32
_MARKER = re.compile(r"\[job (\d+)\.(\d+) reply (\d+)\]")


def _reply_words(verbosity: float):  # type: ignore[no-untyped-def]
    def words(payload: dict[str, Any]) -> int:
        messages = payload.get("messages") or [{}]
        found = _MARKER.search(str(messages[-1].get("content", "")))
        return max(1, round(int(found.group(3)) * verbosity)) if found else 30
    return words


def behaviour(profile: Profile, drift: str | None, flapping: bool) -> Behaviour:
    """The provider a profile describes at one moment: as family_sim.Simulation.serve."""
    slow = (SICK_LATENCY if drift == "latency" else 1.0) * (FLAP_LATENCY if flapping else 1.0)
    error_rate = SICK_ERRORS if drift == "errors" else profile.error_rate
    if flapping:
        error_rate = max(error_rate, FLAP_ERRORS)
    # A 503 after half the time to a first token, a 429 at once (as the simulator's).
    status, headers, error_latency = 503, (), 0.5 * profile.ttfb_s * slow
    if drift == "rate_limits":  # 429s with retry-after, on top of its own rare 503s
        error_rate, status, error_latency = SICK_RATE_LIMITS, 429, 0.05
        headers = (("retry-after", f"{RETRY_AFTER_S:g}"),)
    return Behaviour(latency_s=profile.ttfb_s * slow, latency_spread=0.35,
                     tokens_per_s=profile.tokens_per_s / slow, error_rate=error_rate,
                     error_status=status, error_headers=headers,
                     error_latency_s=error_latency,
                     reply_words=_reply_words(profile.verbosity))


def config_text(member: Member, strategy: str, window: int, providers: ProviderThread,
                telemetry: Path) -> str:
    data = config_data(member, strategy, window)
    for slot in data["providers"]:
        data["providers"][slot] = {"base_url": providers.base_url(slot), "credential": None}
    data["callers"] = [{"name": "bench",
                        "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest()}]
    data["telemetry"] = {"sqlite_path": str(telemetry)}
    return yaml.safe_dump(data, sort_keys=False)


@dataclass
class _Sent:
    job: Job
    turn: int
    at: float
    latency: float
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    error: bool


async def _send(client: openai.AsyncOpenAI, job: Job, turn: int, messages: list[dict],
                start: float) -> tuple[_Sent, str]:
    sent = time.monotonic()
    extra: dict[str, Any] = {"tools": TOOLS} if job.kind == AGENT else {}
    reply = await chat(client, GROUP, messages, job.stream, **extra)
    return _Sent(job, turn, sent - start, reply.seconds, reply.model, reply.prompt_tokens,
                 reply.completion_tokens, reply.error is not None), reply.text


async def _conversation(client: openai.AsyncOpenAI, job: Job, start: float,
                        out: list[_Sent]) -> None:
    await asyncio.sleep(max(0.0, start + job.at - time.monotonic()))
    messages = opening(job)
    turns = TURNS if job.kind in (CHAT, AGENT) else 1
    for turn in range(turns):
        result, text = await _send(client, job, turn, messages, start)
        out.append(result)
        if result.error or turn + 1 == turns:
            return
        await asyncio.sleep(think_s(job))
        messages = follow_up(messages, text, job, turn + 1)


async def _drift(member: Member, fakes: dict[str, FakeProvider], start: float,
                 window: int, total: float) -> None:
    """Every half second, each provider as its profile is at that moment: the sick one
    during the degrade phase, a flapping one in the second half of its period."""
    starts, _ = phases(window)
    profiles = {slot: profile for slot, profile, _ in member.targets}
    while (now := time.monotonic() - start) < total:
        for slot, profile in profiles.items():
            sick = slot == member.sick and starts["degrade"] <= now < starts["recover"]
            flapping = (profile.flap_period_s > 0
                        and now % profile.flap_period_s >= profile.flap_period_s / 2)
            wanted = behaviour(profile, member.drift if sick else None, flapping)
            current = fakes[slot].behaviour
            if (current.latency_s, current.error_rate, current.error_status) != (
                    wanted.latency_s, wanted.error_rate, wanted.error_status):
                fakes[slot].behaviour = wanted
        await asyncio.sleep(0.5)


async def _drive(member: Member, up: UpProcess, fakes: dict[str, FakeProvider], window: int,
                 rate: float, total: float | None = None,
                 also: Callable[[], Awaitable[None]] | None = None
                 ) -> tuple[float, list[_Sent]]:
    """The member's arrivals for `total` seconds (default: its phases), and `also` beside
    them (target_introduction_stack.py reloads the configuration with it)."""
    if total is None:
        _, total = phases(window)
    jobs = arrivals(member.seed, member.mix, total, rate)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=20)
    async with contextlib.AsyncExitStack() as stack:
        clients = [openai.AsyncOpenAI(
            base_url=up.base_url + "/v1", api_key=TOKEN, max_retries=0,
            http_client=await stack.enter_async_context(
                httpx.AsyncClient(limits=limits, timeout=300)))
            for _ in range(CLIENTS)]
        out: list[_Sent] = []
        start = time.monotonic()
        await asyncio.gather(_drift(member, fakes, start, window, total),
                             *([also()] if also is not None else []),
                             *(_conversation(clients[job.ident % CLIENTS], job, start, out)
                               for job in jobs))
        return start, out


def _rows(telemetry: Path) -> dict[str, dict[str, Any]]:
    """Telemetry rows by request id (the sidecar writes them on its way out)."""
    with sqlite3.connect(telemetry) as db:
        db.row_factory = sqlite3.Row
        return {row["request_id"]: dict(row) for row in db.execute(
            "SELECT request_id, complexity, probe, selected_target, serving_target, "
            "exclusions FROM request_rows")}


def run_on_stack(member: Member, strategy: str, window: int, rate: float,
                 workdir: Path) -> Run:
    """The member through `sidecar up` under `strategy`; the simulator's Run of it."""
    fakes = {slot: FakeProvider(slot, seed=member.seed) for slot, _, _ in member.targets}
    # Every attempt is kept: a fake keeps its last 10,000 by default, and at 32 requests
    # a second a busy target's first ones (its steady share) were lost (issue 41).
    room = int(ATTEMPTS_PER_REQUEST * rate * phases(window)[1]) + 1_000
    for slot, profile, _ in member.targets:
        fakes[slot].behaviour = behaviour(profile, None, False)
        fakes[slot].received = deque(maxlen=room)
    name = strategy.replace("@", "-")
    telemetry = workdir / f"{member.seed}-{name}.db"
    with ProviderThread(list(fakes.values())) as providers:
        config = workdir / f"{member.seed}-{name}.yaml"
        config.write_text(config_text(member, strategy, window, providers, telemetry))
        up = UpProcess(["--config", str(config)], log_path=workdir / f"{member.seed}-{name}.log")
        with up.running():
            start, sent = asyncio.run(_drive(member, up, fakes, window, rate))
            time.sleep(3)  # the last rows on their way to SQLite
    return _assemble(member, strategy, window, start, sent, fakes, _rows(telemetry))


def _assemble(member: Member, strategy: str, window: int, start: float, sent: list[_Sent],
              fakes: dict[str, FakeProvider], rows: dict[str, dict[str, Any]]) -> Run:
    for slot, fake in fakes.items():
        if len(fake.received) == fake.received.maxlen:
            raise RuntimeError(f"{slot}: the fake kept only its last {fake.received.maxlen} "
                               "attempts; the figures would miss the first ones")
    run = Run(member, strategy, window)
    run.lateness = [s.at - s.job.at for s in sent if s.turn == 0]
    ids: dict[tuple[int, int], str] = {}
    for slot, fake in fakes.items():
        for request in list(fake.received):
            run.attempts.append((request.at - start, slot))
            # The last marker is this turn's (the history carries the earlier ones).
            found = _MARKER.findall(request.body.decode("utf-8", "replace"))
            request_id = request.headers.get("x-request-id")
            if found and request_id:
                ids.setdefault((int(found[-1][0]), int(found[-1][1])), request_id)
    run.attempts.sort()
    profiles = {slot: profile for slot, profile, _ in member.targets}
    by_model = {profile.kind: slot for slot, profile in profiles.items()}
    previous: dict[int, str | None] = {}
    for s in sorted(sent, key=lambda s: (s.job.ident, s.turn)):
        row = rows.get(ids.get((s.job.ident, s.turn), ""), {})
        primary = _slot(row.get("selected_target"))
        serving = None if s.error else by_model.get(s.model or "", _slot(row.get(
            "serving_target")))
        excluded = {pair.rsplit(":", 1)[0]
                    for pair in (row.get("exclusions") or "").split(",") if pair}
        before = previous.get(s.job.ident)
        forced = s.turn > 0 and before is not None and (
            f"{before}/{profiles[before].kind}" in excluded)
        cost = 0.0
        if serving is not None:
            profile = profiles[serving]
            cost = (s.prompt_tokens * profile.input_per_mtok
                    + s.completion_tokens * profile.output_per_mtok) / 1e6
        run.results.append(Served(s.job.kind, s.job.ident, s.turn, s.at, s.latency, primary,
                                  serving, row.get("complexity"), cost, s.error, forced,
                                  bool(row.get("probe"))))
        previous[s.job.ident] = primary
    joined = sum(r.primary is not None for r in run.results)
    if joined < 0.98 * len(run.results):
        print(f"  {strategy}: only {joined} of {len(run.results)} requests joined to their "
              "telemetry row", flush=True)
    return run


def _slot(label: str | None) -> str | None:
    return label.split("/", 1)[0] if label else None
