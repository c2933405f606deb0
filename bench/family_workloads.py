"""The routing benchmark's family of workloads (issue #31): what a member is made of, and
how a seed picks one. Documented in docs/routing-under-drift.md §8.

A member is a group of three targets, a traffic mix and a drift:

- **Targets**, one from each slot, every figure jittered by a factor in [0.7, 1.4]:
  premium: `fast_dear`; mid: `slow_output_mid` or `long_output_heavy`; budget:
  `slow_cheap` or `flapping`. Weights 50 / 30 / 20, as in the deployment issue #31 describes
  (a group whose mix already favours the cheap target leaves a router little to save).
  Premium and mid are validated (the SPEC's complex term requires it); the budget is not.
- **Traffic** (about `rate` requests a second, Poisson): `chat_heavy`, `code_heavy` or
  `agentic` (multi-turn sessions with tools); conversations resend their opening, so their
  turns share an affinity key.
- **Drift**: one target (any slot) turns sick for the degrade phase and recovers:
  `latency` (ten times slower), `errors` (25 % 503s) or `rate_limits` (60 % 429s with
  `retry-after: 2`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

SIMPLE, CODE, CHAT, AGENT = "simple", "code", "chat", "agent"
MIXES = {  # share of request *starts* (a conversation is one start, four turns)
    "chat_heavy": {SIMPLE: 0.60, CODE: 0.10, CHAT: 0.30 / 4},
    "code_heavy": {SIMPLE: 0.25, CODE: 0.55, CHAT: 0.20 / 4},
    "agentic": {SIMPLE: 0.15, CODE: 0.15, AGENT: 0.70 / 4},
}
DRIFTS = ("latency", "errors", "rate_limits")
TURNS = 4


@dataclass(frozen=True)
class Profile:
    kind: str
    input_per_mtok: float
    output_per_mtok: float
    validated: bool
    quality: float
    ttfb_s: float            # median time to the first token (prompt processing)
    tokens_per_s: float      # generation speed
    error_rate: float
    verbosity: float = 1.0   # how much longer its replies are than the request asks
    flap_period_s: float = 0.0  # flapping: in the second half of each period, three times
    #                             slower with 5 % errors (2.5 % on average: under 3 %)

    def jittered(self, rng: random.Random) -> Profile:
        """Prices and time to first token by a factor in [0.7, 1.4], speed in [0.85, 1.2]:
        wide enough to reorder targets, narrow enough that a healthy target stays within
        the SPEC's thresholds (p95 under 10 s on the longest replies of the mix)."""
        def j(value: float, low: float = 0.7, high: float = 1.4) -> float:
            return value * rng.uniform(low, high)
        return replace(self, input_per_mtok=j(self.input_per_mtok),
                       output_per_mtok=j(self.output_per_mtok), ttfb_s=j(self.ttfb_s),
                       tokens_per_s=j(self.tokens_per_s, 0.85, 1.2))


# Healthy p95 latency on the longest replies (400 tokens, 800 for the verbose one), at the
# slowest jitter: fast_dear 4.6 s, slow_output_mid 8 s, long_output_heavy 8.9 s,
# slow_cheap 8.7 s, flapping 7 s: every target is healthy by the SPEC's thresholds until it
# drifts.
PROFILES = {
    "fast_dear": Profile("fast_dear", 2.50, 10.00, True, 0.92, 0.30, 150.0, 0.002),
    "slow_output_mid": Profile("slow_output_mid", 0.40, 1.60, True, 0.85, 0.50, 70.0, 0.002),
    "long_output_heavy": Profile("long_output_heavy", 0.80, 3.20, True, 0.88, 0.45, 120.0,
                                 0.002, verbosity=2.0),
    "slow_cheap": Profile("slow_cheap", 0.10, 0.40, False, 0.70, 0.80, 70.0, 0.003),
    "flapping": Profile("flapping", 0.12, 0.50, False, 0.72, 0.50, 80.0, 0.003,
                        flap_period_s=40.0),
}
SLOTS = {"premium": ("fast_dear",), "mid": ("slow_output_mid", "long_output_heavy"),
         "budget": ("slow_cheap", "flapping")}


@dataclass(frozen=True)
class Member:
    seed: int
    targets: tuple[tuple[str, Profile, int], ...]   # (slot name, profile, weight)
    mix: str
    drift: str
    sick: str                                       # the slot that drifts

    @property
    def name(self) -> str:
        kinds = "/".join(p.kind for _, p, _ in self.targets)
        weights = "/".join(str(w) for _, _, w in self.targets)
        return f"{kinds} {weights}, {self.mix}, {self.drift} on {self.sick}"


def member(seed: int) -> Member:
    rng = random.Random(seed)
    weights = [50, 30, 20]  # premium / mid / budget, as the deployment has them
    targets = tuple((slot, PROFILES[rng.choice(kinds)].jittered(rng), weight)
                    for (slot, kinds), weight in zip(SLOTS.items(), weights, strict=True))
    return Member(seed, targets, rng.choice(sorted(MIXES)), rng.choice(DRIFTS),
                  rng.choice(sorted(SLOTS)))


@dataclass(frozen=True)
class Job:
    """A request (or a conversation's first turn) arriving at `at` seconds."""

    at: float
    kind: str
    ident: int
    stream: bool
    prompt: str
    output_tokens: int


def _simple(rng: random.Random, ident: int) -> tuple[str, int]:
    topic = rng.choice(("photosynthesis", "a hash map", "inflation", "the CAP theorem",
                        "compound interest", "plate tectonics", "a mutex", "entropy"))
    return f"In one sentence, what is {topic}? (question {ident})", rng.randint(20, 80)


def _code(rng: random.Random, ident: int) -> tuple[str, int]:
    functions = 60 if rng.random() < 0.2 else 3
    code = "\n".join(f"def handler_{ident}_{n}(orders, order_id):\n    total = "
                     f"sum(i.price for i in orders[order_id])\n    return total\n"
                     for n in range(functions))
    evidence = (f'Traceback (most recent call last):\n  File "h.py", line {ident}, in handler\n'
                f"KeyError: 'A-{ident}'" if rng.random() < 0.5 else
                "diff --git a/h.py b/h.py\n@@ -4,3 +4,3 @@\n-    x\n+    y\n")
    return (f"This fails in production, why?\n\n```python\n{code}\n```\n\n{evidence}\n",
            rng.randint(150, 400))


def _chat(rng: random.Random, ident: int) -> tuple[str, int]:
    city = rng.choice(("Lisbon", "Kyoto", "Oslo", "Cusco", "Hanoi", "Porto"))
    return (f"You are a concise travel assistant.\nI am planning a trip to {city} "
            f"(trip {ident}).", rng.randint(60, 150))


def _agent(rng: random.Random, ident: int) -> tuple[str, int]:
    return (f"You are an autonomous agent. Use the available tools to fix ticket {ident}:"
            "\n```python\ndef load(path):\n    return open(path).read()\n```",
            rng.randint(100, 300))


MAKERS = {SIMPLE: _simple, CODE: _code, CHAT: _chat, AGENT: _agent}


def arrivals(seed: int, mix: str, duration_s: float, rate: float) -> list[Job]:
    """Poisson arrivals at about `rate` requests a second in all (turns included); a
    quarter of every kind streamed."""
    rng = random.Random(seed * 7919 + 1)
    shares = MIXES[mix]
    total = sum(shares.values())
    turns = sum(share * (TURNS if kind in (CHAT, AGENT) else 1) for kind, share in shares.items())
    starts_per_s = rate * total / turns
    jobs: list[Job] = []
    at = 0.0
    while True:
        at += rng.expovariate(starts_per_s)
        if at >= duration_s:
            return jobs
        draw = rng.random() * total
        kind = next(k for k, share in _cumulative(shares) if draw < share)
        prompt, tokens = MAKERS[kind](rng, len(jobs) + 1)
        jobs.append(Job(at, kind, len(jobs) + 1, rng.random() < 0.25, prompt, tokens))


def _cumulative(shares: dict[str, float]) -> list[tuple[str, float]]:
    running, out = 0.0, []
    for kind, share in shares.items():
        running += share
        out.append((kind, running))
    return out
