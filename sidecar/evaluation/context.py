"""What a logged decision saw, rebuilt: the request summary from the row's safe scalars, and
the observation state from every logged attempt that had finished by then.

The summary is exact where routing reads exact values: the caller's cap is the row's output
budget whenever the request was capped, the prompt size gives back the same token estimate
(4 characters a token), and the prompt features are the ones found then (`known_features`:
nothing is scanned). The observation state is an `ObservationStore` on the replayed clock,
fed in completion order — the same windows, percentiles, thresholds, ejections and probes
as live, from the attempts the rows record (a request's serving attempt from its row, the
failed ones from `fallback_transitions`)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from sidecar.config.models import SidecarConfig
from sidecar.dialects.apis import Dialect
from sidecar.evaluation.logged import FailedAttempt, LoggedDecision
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.routing.request import DEFAULT_OUTPUT_TOKENS, Reasoning, RequestSummary


class ReplayClock:
    """The replayed time (epoch seconds of the decision being replayed)."""

    __slots__ = ("now",)

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def summary_of(row: LoggedDecision, config: SidecarConfig) -> RequestSummary:
    shape = row.shape
    tools = shape.get("tools", "none")
    capped = shape.get("max_tokens_cap", "none") != "none"
    reasoning = None
    if shape.get("reasoning"):
        reasoning = Reasoning(row.reasoning_effort, row.reasoning_budget)
    structured = shape.get("structured_output", "none")
    caller = next((c for c in config.callers if c.name == row.caller), None)
    group = config.models.get(row.group)
    return RequestSummary(
        group=row.group, caller=row.caller, dialect=Dialect(shape.get("dialect", "openai_chat")),
        stream=bool(shape.get("stream")), has_tools=tools != "none",
        tool_forced=tools == "forced", has_images=bool(shape.get("images")),
        reasoning=reasoning, max_tokens_cap=row.output_budget if capped else None,
        prompt_chars=4 * (row.input_tokens or 0),
        spend_ceiling_usd=caller.spend_ceiling_usd if caller is not None else None,
        structured_output=None if structured == "none" else structured,
        default_output_tokens=(group.output_budget_tokens if group is not None
                               else DEFAULT_OUTPUT_TOKENS),
        known_features=row.features)


@dataclass(order=True, frozen=True, slots=True)
class _Pending:
    finished_at: float
    order: int
    observation: Observation


class ReplayedObservations:
    """The observation store as it stood at each replayed decision."""

    def __init__(self, config: SidecarConfig, clock: ReplayClock,
                 decisions: list[LoggedDecision], attempts: list[FailedAttempt]) -> None:
        self.clock = clock
        self.store = ObservationStore.for_config(config, clock)
        pending = [_Pending(a.at, n, Observation(a.target, _outcome(a.failure),
                                                 failed_over=True))
                   for n, a in enumerate(attempts)]
        for n, row in enumerate(decisions, start=len(pending)):
            if row.serving is not None and row.error_class is not None:
                pending.append(_Pending(row.finished_at, n, _served(row)))
        heapq.heapify(pending)
        self._pending = pending

    def advance_to(self, now: float) -> None:
        """Record every attempt finished by `now`, each at its own time."""
        pending = self._pending
        while pending and pending[0].finished_at <= now:
            item = heapq.heappop(pending)
            self.clock.now = item.finished_at
            self.store.record(item.observation)
        self.clock.now = now


def _served(row: LoggedDecision) -> Observation:
    outcome = _outcome(row.error_class or "ok")
    latency = row.latency_ms
    return Observation(row.serving or "", outcome, latency_ms=latency, ttfb_ms=row.ttfb_ms,
                       upstream_ms=latency, output_tokens=row.output_tokens,
                       streamed=bool(row.shape.get("stream")))


def _outcome(name: str) -> Outcome:
    try:
        return Outcome(name)
    except ValueError:
        return Outcome.SERVER_ERROR
