"""The routing core's output: an ordered list of targets and the reasons for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.config.models import Target
from sidecar.routing.trace import DecisionTrace


@dataclass(frozen=True, slots=True)
class TargetChoice:
    """A target of the requested group, identified by its position in `targets[]`."""

    index: int
    target: Target
    # Safe scalar name for traces, logs and observation keys: ``provider/model_ref``.
    label: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", f"{self.target.provider}/{self.target.model_ref}")


@dataclass(frozen=True, slots=True)
class Decision:
    """Primary first, then the fallback order, with the trace that explains them."""

    group: str
    strategy: str
    ordered: tuple[TargetChoice, ...]
    trace: DecisionTrace

    @property
    def primary(self) -> TargetChoice:
        return self.ordered[0]

    @property
    def fallbacks(self) -> tuple[TargetChoice, ...]:
        return self.ordered[1:]


@dataclass(frozen=True, slots=True)
class NoEligibleTarget:
    """No target of the group can serve this request as asked; `reason` is caller-safe.
    `retry_after_s`: every target that could have served is waiting out its provider's
    `retry-after`, the earliest ends this many seconds from now (the caller may retry
    then: a 429, not a 400)."""

    group: str
    reason: str
    trace: DecisionTrace
    retry_after_s: float | None = None
