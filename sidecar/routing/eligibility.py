"""Request eligibility shared by every strategy: which of the group's targets can serve this
request as the caller asked. Each rule is named after what it protects and reports why it
removed a target, so the decision trace can say which rule excluded what."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.apis import Dialect
from sidecar.config.models import Target
from sidecar.routing.decision import TargetChoice
from sidecar.routing.request import RequestSummary


@dataclass(frozen=True, slots=True)
class Exclusion:
    choice: TargetChoice
    rule: str

    def describe(self) -> str:
        return f"excluded {self.choice.label} by {self.rule}"


def api_skin_preserved(request: RequestSummary, dialects: Sequence[Dialect]) -> bool:
    """The caller's API dialect must reach the upstream unchanged (no bridges yet)."""
    return request.dialect in dialects


def split_eligible(
    request: RequestSummary,
    targets: Sequence[Target],
    dialects_of: Callable[[Target], Sequence[Dialect]],
) -> tuple[list[TargetChoice], list[Exclusion]]:
    eligible: list[TargetChoice] = []
    excluded: list[Exclusion] = []
    for index, target in enumerate(targets):
        choice = TargetChoice(index, target)
        if not api_skin_preserved(request, dialects_of(target)):
            excluded.append(Exclusion(choice, "api_skin"))
        else:
            eligible.append(choice)
    return eligible, excluded
