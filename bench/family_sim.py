"""One member of the workload family, simulated on the real routing core.

The router (`sidecar.routing.router.Router`, with its rotation, pins, thresholds,
ejections and probes) and the observation store (`sidecar.observe.store`, with its slices,
percentiles and `retry-after` holds) are the shipped code, on one simulated clock. Only the
providers and the network are simulated, from the member's profiles: time to the first
token (log-normal around the profile's median), generation at the profile's tokens per
second, failures as 503s or 429s with `retry-after`. A request is decided when it arrives,
then tried along its decision's attempt order (`fallback.attempt_order`: at most
`max_attempts`, 3) until one attempt succeeds, as Envoy's retries do; a 503, or a 429
whose `retry-after` the group waits out (after that wait), puts the same target next as
the stack's reply gate does (`order_after_failure`, `retry_same_target`; issue 41: left
out, the simulator under-counted a sick target's attempts by a third); every attempt is
observed when it ends, as the access log reports it. Unary replies send their first byte
once generated (their generation is inside their time to first byte), streams with their
first token. Requests are the bodies the stack's client sends (family_requests.py): routed
on the gateway's own summary of them, priced on their whole body as the fake providers
count it, and a conversation goes on after a deterministic pause unless its turn failed
(issue 41: the simulator routed and priced a prompt string of its own).

Why a simulation: twenty seeds of a family through real Envoy take hours; on the
simulated clock a five-minute run takes about a second, and the decisions are the shipped
core's. `routing_quality.py --envoy` runs one member through the real stack to check that
both agree (docs/routing-under-drift.md §8).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from family_requests import body, follow_up, input_tokens, opening, reply_text, think_s
from family_workloads import AGENT, CHAT, TURNS, Job, Member, Profile, arrivals

from sidecar.config.loading import load_config_data
from sidecar.dialects.apis import Dialect
from sidecar.dialects.shape import request_shape
from sidecar.gateway.attempt_orders import earns_same_target, order_after_failure
from sidecar.gateway.handler import affinity_key
from sidecar.gateway.scan import scan_limit
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.routing.decision import Decision
from sidecar.routing.router import Router

GROUP = "family"
CALLER = "bench"
SPEC_SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "spec_sample.yaml"
# Phase lengths in observation windows: warm, steady, degrade, recover.
PHASE_WINDOWS = {"warm": 1.0, "steady": 1.0, "degrade": 3.0, "recover": 3.0}


def phases(window: int) -> tuple[dict[str, float], float]:
    """Each phase's start (s) and the run's length for this window."""
    starts, at = {}, 0.0
    for name, windows in PHASE_WINDOWS.items():
        starts[name] = at
        at += windows * window
    return starts, at

SICK_LATENCY = 10.0
SICK_ERRORS = 0.25
SICK_RATE_LIMITS = 0.60
RETRY_AFTER_S = 2.0
FLAP_ERRORS = 0.05
FLAP_LATENCY = 3.0


def spec_policy(window: int, basis: str | None) -> dict:
    """The SPEC sample's dynamic_score policy as written, with the window the benchmark
    runs at (and, when asked, another latency basis)."""
    sample = yaml.safe_load(SPEC_SAMPLE.read_text())
    policy = sample["models"]["adaptive-agent"]["routing_policy"]["dynamic_score"]
    policy = {**policy, "observation_window_seconds": window}
    if basis is not None:
        policy["latency_basis"] = basis
    return policy


def group_config(member: Member, strategy: str, window: int):  # type: ignore[no-untyped-def]
    """`strategy`: weighted, dynamic_score, or dynamic_score@<latency basis>."""
    return load_config_data(config_data(member, strategy, window))


def config_data(member: Member, strategy: str, window: int) -> dict:
    """The member's configuration as data (family_stack.py fills in real addresses)."""
    name, _, basis = strategy.partition("@")
    targets = [{"provider": slot, "model_ref": profile.kind, "weight": weight,
                "tags": (["validated", "tool_capable"] if profile.validated
                         else ["low_cost", "tool_capable"]),
                "supports_tools": True,
                "pricing": {"input_per_mtok": profile.input_per_mtok,
                            "output_per_mtok": profile.output_per_mtok},
                "evaluation": {"quality_score": profile.quality}}
               for slot, profile, weight in member.targets]
    data = {"providers": {slot: {"base_url": "http://127.0.0.1:9/v1"}
                          for slot, _, _ in member.targets},
            "callers": [{"name": "bench", "token_sha256": "0" * 64}],
            "models": {GROUP: {"strategy": name, "targets": targets,
                               "routing_policy": {"dynamic_score":
                                                  spec_policy(window, basis or None)}}}}
    return data


@dataclass
class Served:
    """One request's end, as the caller saw it."""

    kind: str
    ident: int
    turn: int
    at: float
    latency: float
    primary: str | None
    serving: str | None
    complexity: str | None
    cost: float
    error: bool
    forced: bool           # a follow-up whose pinned target was excluded in its decision
    probe: bool


@dataclass
class Run:
    member: Member
    strategy: str
    window: int
    results: list[Served] = field(default_factory=list)
    attempts: list[tuple[float, str]] = field(default_factory=list)  # (sent at, slot)
    # How late each conversation's first turn left the client against its arrival (s):
    # none here; the stack's client may fall behind (family_stack.py, issue 41).
    lateness: list[float] = field(default_factory=list)


class _Clock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Simulation:
    def __init__(self, member: Member, strategy: str, window: int, rate: float,
                 noise: int = 0) -> None:
        """`noise`: another draw of the providers' chance on the same member and arrivals
        (0: the draw the committed figures used); what one run of the real stack may land
        on is the spread over draws (routing_stack_family.py)."""
        self.member = member
        self.clock = _Clock()
        config = group_config(member, strategy, window)
        self.store = ObservationStore.for_config(config, self.clock)
        self.router = Router(config, clock=self.clock, wall_clock=self.clock)
        self.group = config.models[GROUP]
        self.fallback = self.group.fallback  # the shipped attempt order
        self.scan = scan_limit(self.group)
        self.profiles = {slot: profile for slot, profile, _ in member.targets}
        self.outcome_chance = random.Random(member.seed * 15_485_863 + noise * 6_700_417)
        self.phases, total = phases(window)
        self.jobs = arrivals(member.seed, member.mix, total, rate)
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.run = Run(member, strategy, window)

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.order), action))

    def simulate(self) -> Run:
        for job in self.jobs:
            self.at(job.at, lambda job=job: self.request(job, 0, opening(job), None))
        while self.events:
            when, _, action = heapq.heappop(self.events)
            self.clock.now = when
            action()
        return self.run

    # A request: decided on arrival, then tried along its order.
    def request(self, job: Job, turn: int, messages: list[dict], before: str | None) -> None:
        # The gateway's own summary of the body the stack's client sends (family_requests).
        payload = body(job, messages, GROUP)
        summary = request_shape(Dialect.OPENAI_CHAT, payload, self.scan).summary(
            GROUP, CALLER, Dialect.OPENAI_CHAT, conversation_key=affinity_key(
                CALLER, GROUP, self.group, Dialect.OPENAI_CHAT, payload))
        decision = self.router.decide(summary, self.store)
        start = self.clock.now
        if not isinstance(decision, Decision):
            self.finish(job, turn, start, None, None, None, 0.0, True, False, False, messages,
                        0)
            return
        trace = decision.trace
        excluded = {target for target, _ in trace.exclusions}
        forced = before is not None and f"{before}/{self.profiles[before].kind}" in excluded
        order = [c.target.provider
                 for c in self.fallback.attempt_order(decision.ordered)]
        context = (job, turn, start, order[0], trace.complexity, forced,
                   trace.probe is not None, messages)
        self.attempt(order, 0, context, self.fallback.retries_lone_target(
            len(decision.ordered)))

    def attempt(self, order: list[str], index: int, context: tuple, lone: bool) -> None:
        """`lone`: a decision of one target, on Envoy's route that retries it only after
        a failure of the provider's own (envoy_config/fallback.py, LONE_RETRY_ON)."""
        slot = order[index]
        profile = self.profiles[slot]
        job = context[0]
        self.run.attempts.append((self.clock.now, slot))
        duration, ttfb, outcome, retry_after, tokens = self.serve(profile, slot, job)
        started = self.clock.now

        def done() -> None:
            failed = outcome is not Outcome.OK
            more = failed and index + 1 < len(order) and not (
                lone and outcome is Outcome.RATE_LIMITED)
            if retry_after:
                self.store.rate_limited(f"{slot}/{profile.kind}", retry_after)
            upstream_ms = 1000 * duration
            self.store.record(Observation(
                f"{slot}/{profile.kind}", outcome, latency_ms=upstream_ms,
                ttfb_ms=None if failed else 1000 * ttfb, upstream_ms=upstream_ms,
                output_tokens=None if failed else tokens, streamed=job.stream,
                failed_over=more))
            if more:
                status = 429 if outcome is Outcome.RATE_LIMITED else 503
                wait = self.fallback.same_target_wait_seconds
                after = order
                if not lone and earns_same_target(status, retry_after or None, wait):
                    after = list(order_after_failure(order, index + 1,
                                                     self.fallback.retry_same_target))
                delay = retry_after if after[index + 1] == slot and retry_after else 0.0
                self.at(self.clock.now + delay,
                        lambda: self.attempt(after, index + 1, context, lone))
                return
            _, turn, start, primary, complexity, forced, probe, messages = context
            cost = 0.0 if failed else (
                input_tokens(job, messages, profile.kind) * profile.input_per_mtok
                + tokens * profile.output_per_mtok) / 1e6
            self.finish(job, turn, start, primary, None if failed else slot, complexity, cost,
                        failed, forced, probe, messages, tokens)

        self.at(started + duration, done)

    def serve(self, profile: Profile, slot: str, job: Job
              ) -> tuple[float, float, Outcome, float, int]:
        """(duration s, time to first byte s, outcome, retry-after s, output tokens)."""
        draw = self.outcome_chance.random()
        now = self.clock.now
        sick = (slot == self.member.sick
                and self.phases["degrade"] <= now < self.phases["recover"])
        drift = self.member.drift if sick else None
        slow = SICK_LATENCY if drift == "latency" else 1.0
        flapping = (profile.flap_period_s > 0
                    and (now % profile.flap_period_s) >= profile.flap_period_s / 2)
        if flapping:
            slow *= FLAP_LATENCY
        prefill = profile.ttfb_s * slow * math.exp(self.outcome_chance.gauss(0.0, 0.35))
        error_rate = profile.error_rate
        if drift == "errors":
            error_rate = SICK_ERRORS
        if flapping:
            error_rate = max(error_rate, FLAP_ERRORS)
        if drift == "rate_limits" and draw < SICK_RATE_LIMITS:
            return 0.05, 0.05, Outcome.RATE_LIMITED, RETRY_AFTER_S, 0
        if self.outcome_chance.random() < error_rate:
            return 0.5 * prefill, 0.5 * prefill, Outcome.SERVER_ERROR, 0.0, 0
        tokens = max(1, round(job.output_tokens * profile.verbosity))
        generation = tokens / (profile.tokens_per_s / slow)
        if job.stream:
            return prefill + generation, prefill, Outcome.OK, 0.0, tokens
        return prefill + generation + 0.02, prefill + generation, Outcome.OK, 0.0, tokens

    def finish(self, job: Job, turn: int, start: float, primary: str | None,
               serving: str | None, complexity: str | None, cost: float, error: bool,
               forced: bool, probe: bool, messages: list[dict], tokens: int) -> None:
        self.run.results.append(Served(job.kind, job.ident, turn, start,
                                         self.clock.now - start, primary, serving,
                                         complexity, cost, error, forced, probe))
        # As the stack's client: a conversation goes on after its user's pause, with the
        # reply in its history, unless the turn failed.
        if job.kind in (CHAT, AGENT) and turn + 1 < TURNS and not error:
            follow = follow_up(messages, reply_text(tokens), job, turn + 1)
            self.at(self.clock.now + think_s(job),
                    lambda: self.request(job, turn + 1, follow, primary))


def simulate(member: Member, strategy: str, window: int = 30, rate: float = 8.0,
             noise: int = 0) -> Run:
    return Simulation(member, strategy, window, rate, noise).simulate()
