"""The canary's guards: judge what the candidate's requests did, withdraw it on a breach.

Off the request path: it hears of a decision the candidate made (`decided`, a dictionary
insert) and of that request's end from the access log (`finished`, `fallback`), like the
telemetry join. Every second at most it judges each canary on its requests within the
group's observation window (the window the rest of routing reads); on a breach it sets the
router's split to withdrawn — for good: the same candidate never serves again until the
operator changes it — logs one line, counts it for `/metrics` and hands a row to
telemetry (`canary_events`). The live configuration is never touched: promotion and
rollback are the operator's edits (docs/rollout.md).

Bounded: requests waiting for their end at most MAX_PENDING (oldest dropped first, and
never longer than the longest a request can take), outcomes per canary at most
MAX_OUTCOMES (the newest kept), so what a burst of traffic makes it hold has a ceiling.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sidecar.config.models import SidecarConfig
from sidecar.config.rollout import CanaryGuards
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.observe.records import attempt_failed, request_failed
from sidecar.routing.canary import CANARY, CanarySplit
from sidecar.routing.router import Router
from sidecar.routing.thresholds import wilson_bounds
from sidecar.telemetry.aggregate import percentile
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.rows import CanaryEventRow, cost_usd

log = logging.getLogger("sidecar.canary")
_limited = LogLimiter(log, burst=1, interval=60.0)

MAX_PENDING = 20_000
MAX_OUTCOMES = 5_000
MAX_RECENT = 4_096   # ended requests a late fallback transition can still mark failed
JUDGE_EVERY_S = 1.0
# How often a serving canary's recorded withdrawals are read (another replica's, or this
# replica's before a restart), when telemetry is on.
READ_RECORDED_EVERY_S = 5.0
WILSON_Z = 1.96   # the 95 % interval, as the thresholds' default confidence


@dataclass(slots=True)
class _Ended:
    at: float
    failed: bool
    latency_ms: float | None
    ttfb_ms: float | None
    cost_usd: float | None


@dataclass(slots=True)
class CanaryFigures:
    """What the guards read, over one window of one canary's requests."""

    requests: int = 0
    errors: int = 0
    p95_latency_ms: float | None = None
    p95_ttft_ms: float | None = None
    cost_per_request_usd: float | None = None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None


@dataclass(slots=True)
class _Canary:
    version: str
    ended: deque[_Ended] = field(default_factory=lambda: deque(maxlen=MAX_OUTCOMES))


@dataclass(frozen=True, slots=True)
class Breach:
    guard: str        # the guard's configuration name, e.g. max_error_rate
    figure: float     # what was judged (for a rate: its lower confidence bound)
    limit: float


def breach(guards: CanaryGuards, figures: CanaryFigures) -> Breach | None:
    """The first guard `figures` breach, in the configuration's order; None before
    `min_requests` or when none is breached. A rate is judged by the lower bound of its
    95 % Wilson interval: withdrawn only when the candidate is worse with confidence."""
    if figures.requests < guards.min_requests:
        return None
    rate = figures.error_rate
    if guards.max_error_rate is not None and rate is not None:
        low, _ = wilson_bounds(rate, figures.requests, WILSON_Z)
        if low > guards.max_error_rate:
            return Breach("max_error_rate", low, guards.max_error_rate)
    for name, figure, limit in (
            ("max_p95_latency_ms", figures.p95_latency_ms, guards.max_p95_latency_ms),
            ("max_p95_ttft_ms", figures.p95_ttft_ms, guards.max_p95_ttft_ms),
            ("max_cost_per_request_usd", figures.cost_per_request_usd,
             guards.max_cost_per_request_usd)):
        if limit is not None and figure is not None and figure > limit:
            return Breach(name, figure, limit)
    return None


def figures_of(ended: deque[_Ended], since: float) -> CanaryFigures:
    kept = [e for e in ended if e.at >= since]
    answered = [e for e in kept if not e.failed]
    costs = [e.cost_usd for e in answered if e.cost_usd is not None]
    return CanaryFigures(
        requests=len(kept), errors=sum(e.failed for e in kept),
        p95_latency_ms=percentile(
            [e.latency_ms for e in answered if e.latency_ms is not None], 0.95),
        p95_ttft_ms=percentile([e.ttfb_ms for e in answered if e.ttfb_ms is not None], 0.95),
        cost_per_request_usd=sum(costs) / len(costs) if costs else None)


class CanaryGuard:
    """Told of decisions by the gateway, and a telemetry sink of the access-log receiver.
    `router` and `config` give the current ones (a reload replaces both); `events` receives
    each withdrawal's row (the telemetry hand-off), if telemetry is on."""

    def __init__(self, router: Callable[[], Router], config: Callable[[], SidecarConfig],
                 events: Callable[[CanaryEventRow], None] | None = None,
                 recorded: Callable[[dict[str, str]], Awaitable[set[tuple[str, str]]]]
                 | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 max_request_s: float = 3600.0) -> None:
        self._router = router
        self._config = config
        self._events = events
        self._recorded = recorded
        self._priced: tuple[object, dict] = (None, {})
        self._clock = clock
        self._wall_clock = wall_clock
        self.max_request_s = max_request_s
        # request id → (group, candidate version, when decided, an attempt failed)
        self._pending: OrderedDict[str, list] = OrderedDict()
        self._recent: OrderedDict[str, _Ended] = OrderedDict()
        self._canaries: dict[str, _Canary] = {}
        self._judged_at = -math.inf
        # `/metrics`: decisions by group and side, withdrawals by group and guard.
        self.sides: dict[tuple[str, str], int] = {}
        self.withdrawals: dict[tuple[str, str], int] = {}
        self.dropped = 0   # requests no longer followed (MAX_PENDING, or too old)

    # ---- the gateway's decisions ------------------------------------------------------

    def decided(self, request_id: str, group: str, side: str, version: str) -> None:
        """A decision in a group with a canary: `side` as the trace says, `version` the
        policy version that decided."""
        key = (group, side)
        self.sides[key] = self.sides.get(key, 0) + 1
        if side != CANARY or not request_id:
            return
        pending = self._pending
        if len(pending) >= MAX_PENDING:
            pending.popitem(last=False)
            self.dropped += 1
        pending[request_id] = [group, version, self._clock(), False]

    # ---- the access log ---------------------------------------------------------------

    def wants(self, request_id: str) -> bool:
        return request_id in self._pending

    def fallback(self, transition) -> None:  # observe/attempts.py Transition
        """An attempt of a canary request failed (the per-attempt log may tell of it after
        the request's own entry: then the request, already counted, is marked failed)."""
        if not attempt_failed(transition.error_class):
            return
        entry = self._pending.get(transition.request_id)
        if entry is not None:
            entry[3] = True
            return
        ended = self._recent.get(transition.request_id)
        if ended is not None:
            ended.failed, ended.cost_usd = True, None

    def finished(self, result: RequestResult) -> None:
        entry = self._pending.pop(result.request_id, None)
        if entry is None:
            return
        group, version, _, an_attempt_failed = entry
        split = self._router().canary(group)
        if split is None or split.version != version:  # a reload replaced that canary
            return
        canary = self._canaries.get(group)
        if canary is None or canary.version != version:
            canary = self._canaries[group] = _Canary(version)
        # Failed when it ended so, or when any attempt failed: a fallback hides a failure
        # from the caller, not from the canary's judge.
        failed = an_attempt_failed or request_failed(result.status, result.error_class)
        price = self._prices().get(result.serving_target or "")
        ended = _Ended(self._clock(), failed, result.latency_ms, result.ttfb_ms,
                       cost_usd(price, result) if not failed else None)
        canary.ended.append(ended)
        recent = self._recent
        recent[result.request_id] = ended
        if len(recent) > MAX_RECENT:
            recent.popitem(last=False)
        self.judge()

    def _prices(self) -> dict:
        config = self._config()
        if self._priced[0] is not config:  # once per configuration, not per request
            self._priced = (config, config.target_prices)
        return self._priced[1]

    # ---- judging ------------------------------------------------------------------------

    def judge(self, force: bool = False) -> None:
        """Each serving canary against its guards, at most every JUDGE_EVERY_S."""
        now = self._clock()
        if not force and now - self._judged_at < JUDGE_EVERY_S:
            return
        self._judged_at = now
        self._forget_old(now)
        config, router = self._config(), self._router()
        for group, canary in self._canaries.items():
            split = router.canary(group)
            model = config.models.get(group)
            if split is None or model is None or split.version != canary.version:
                continue
            window = model.dynamic_score.observation_window_seconds
            if split.withdrawn:
                continue
            figures = figures_of(canary.ended, now - window)
            guards = model.rollout.canary.guards  # type: ignore[union-attr]
            found = breach(guards, figures)
            if found is not None:
                self._withdraw(group, split, found, figures, router, window)

    def figures(self) -> dict[str, CanaryFigures]:
        """Each group's canary figures now (`/metrics`), over the window its guards read."""
        config, now = self._config(), self._clock()
        found = {}
        for group, canary in self._canaries.items():
            model = config.models.get(group)
            if model is not None:
                window = model.dynamic_score.observation_window_seconds
                found[group] = figures_of(canary.ended, now - window)
        return found

    async def run(self) -> None:
        """Judge every JUDGE_EVERY_S as well: the last requests before a quiet spell are
        judged without waiting for the next one to end. Every READ_RECORDED_EVERY_S, apply
        the withdrawals the telemetry database records (first at once, at start)."""
        read_at = -math.inf
        while True:
            try:
                self.judge()
                if self._recorded is not None and \
                        self._clock() - read_at >= READ_RECORDED_EVERY_S:
                    read_at = self._clock()
                    await self.apply_recorded()
            except Exception:  # a bug or the database away: the next round tries again
                _limited.exception("canary_guard", "canary guards could not be judged or "
                                   "their recorded withdrawals read")
            await asyncio.sleep(JUDGE_EVERY_S)

    async def apply_recorded(self) -> None:
        """Withdraw the serving candidates the database says were withdrawn."""
        router = self._router()
        serving = {group: split.version for group in self._config().models
                   if (split := router.canary(group)) is not None and not split.withdrawn}
        if not serving or self._recorded is None:
            return
        for group, version in await self._recorded(serving):
            split = self._router().canary(group)
            if split is not None and split.version == version and not split.withdrawn:
                split.withdrawn = True
                key = (group, "recorded")
                self.withdrawals[key] = self.withdrawals.get(key, 0) + 1
                log.warning("%s", json.dumps({
                    "event": "canary_withdrawn", "group": group, "candidate": version,
                    "guard": "recorded"}, separators=(",", ":")))

    def _forget_old(self, now: float) -> None:
        pending = self._pending
        while pending:
            request_id, entry = next(iter(pending.items()))
            if now - entry[2] <= self.max_request_s:
                break
            del pending[request_id]
            self.dropped += 1

    def _withdraw(self, group: str, split: CanarySplit, found: Breach,
                  figures: CanaryFigures, router: Router, window: float) -> None:
        split.withdrawn = True
        key = (group, found.guard)
        self.withdrawals[key] = self.withdrawals.get(key, 0) + 1
        live = router.live_version(group)
        log.warning("%s", json.dumps({
            "event": "canary_withdrawn", "group": group, "candidate": split.version,
            "live": live, "guard": found.guard, "figure": round(found.figure, 6),
            "limit": found.limit, "requests": figures.requests, "window_s": window},
            separators=(",", ":")))
        if self._events is not None:
            self._events(CanaryEventRow(
                self._wall_clock(), group, live, split.version, "withdrawn", found.guard,
                found.figure, found.limit, figures.requests, figures.errors))
