"""The demo's providers as a newcomer should meet them: each with its own latency, token
rate and occasional errors, and a scripted drift — one target slows down and fails for a
while, then recovers — so the console (docs/console.md) shows the router at work within
the first minutes: shares move, the target is ejected and probed back, pins hold, costs
differ by complexity.

The figures are illustrative, not any provider's measurements; the errors are the 503 a
provider sends when overloaded (platform.openai.com/docs/guides/error-codes: "503 - The
engine is currently overloaded"). Times come from an injectable clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.devstack.providers import Behaviour, ProviderServer

log = logging.getLogger("sidecar.demo")


# provider → its everyday behaviour. The replies keep the demo's text ("Hello from …"):
# costs differ by the prompts (code work sends more) and by the targets' prices.
STEADY: dict[str, Behaviour] = {
    "baseten": Behaviour(latency_s=0.12, latency_spread=0.25, tokens_per_s=900.0,
                         error_rate=0.005, error_latency_s=0.05),
    "minimax": Behaviour(latency_s=0.30, latency_spread=0.3, tokens_per_s=450.0,
                         error_rate=0.01, error_latency_s=0.05),
    "openai": Behaviour(latency_s=0.08, latency_spread=0.2, tokens_per_s=1500.0,
                        error_rate=0.002, error_latency_s=0.05),
    "anthropic": Behaviour(latency_s=0.35, latency_spread=0.25, tokens_per_s=600.0,
                           error_rate=0.005, error_latency_s=0.05),
}


@dataclass(frozen=True)
class Drift:
    """From `start_s` to `end_s` (seconds since the demo began), and again every
    `period_s` after, `provider` answers `slowdown` times slower and fails `error_rate`
    of its requests."""

    provider: str = "baseten"
    start_s: float = 60.0
    end_s: float = 150.0
    period_s: float = 600.0
    slowdown: float = 8.0
    error_rate: float = 0.4

    def active(self, elapsed_s: float) -> bool:
        if elapsed_s < self.start_s:
            return False
        return (elapsed_s - self.start_s) % self.period_s < self.end_s - self.start_s

    def behaviour(self, steady: Behaviour) -> Behaviour:
        rate = steady.tokens_per_s / self.slowdown if steady.tokens_per_s else None
        return dataclasses.replace(steady, latency_s=steady.latency_s * self.slowdown,
                                   tokens_per_s=rate, error_rate=self.error_rate)


DEMO_DRIFT = Drift()


def steady(server: ProviderServer) -> None:
    for name, behaviour in STEADY.items():
        if name in server.providers:
            server.providers[name].behaviour = dataclasses.replace(behaviour)


async def run_drift(server: ProviderServer, drift: Drift = DEMO_DRIFT,
                    clock: Callable[[], float] = time.monotonic, tick_s: float = 1.0) -> None:
    """Apply the drift while it is due (checked every `tick_s`), the steady behaviour
    otherwise; logs each change. Runs until cancelled."""
    began = clock()
    drifting = False
    provider = server.providers[drift.provider]
    while True:
        now_drifting = drift.active(clock() - began)
        if now_drifting != drifting:
            drifting = now_drifting
            normal = STEADY[drift.provider]
            provider.behaviour = drift.behaviour(normal) if drifting else dataclasses.replace(
                normal)
            log.info("demo drift: %s %s", drift.provider,
                     f"slows down {drift.slowdown:g}x and fails {drift.error_rate:.0%} of "
                     "its requests" if drifting else "recovers")
        await asyncio.sleep(tick_s)
