"""The decision trace: safe scalar diagnostics of why a target won and the others lost.

Only bucket names, config key names, target labels (``provider/model_ref``) and numbers:
never prompt text, tokens or keys. `to_dict` is what `sidecar explain` prints and what
telemetry will persist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

_FIFTHS = ("0.0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0")


def bucket(value: float) -> str:
    """Coarse fifths for reports: `0.0-0.2` … `0.8-1.0` (values above 1 go to `>1.0`)."""
    if value > 1.0:
        return ">1.0"
    return _FIFTHS[min(4, max(0, int(value * 5)))]


@dataclass
class CandidateTrace:
    target: str
    weight_share: float
    warm: bool = False
    observations: int = 0
    scores: dict[str, float] = field(default_factory=dict)
    term_value: float | None = None
    final_share: float = 0.0


# Builds the candidate rows: all of them (None) or one target's.
RowBuilder = Callable[[str | None], list[CandidateTrace]]
# One target's figures, unrounded: scores, term value, final share, observations.
Figures = tuple[dict[str, float], float | None, float, int]


@dataclass
class DecisionTrace:
    strategy: str
    target_count: int
    candidate_count: int = 0
    order: str = ""
    exclusions: list[tuple[str, str]] = field(default_factory=list)
    signals: tuple[str, ...] = ()
    request_shape: dict[str, str | bool] = field(default_factory=dict)
    prompt_features: tuple[str, ...] = ()
    complexity: str | None = None
    cold_start: str | None = None
    score_terms: tuple[str, ...] = ()
    require_tags_relaxed: bool = False
    thresholds_relaxed: bool = False
    # (target, threshold) over its limit on too little evidence to act on (thresholds.py).
    unproven: list[tuple[str, str]] = field(default_factory=list)
    reasoning: dict[str, str | int | None] | None = None
    affinity: str = "not_applicable"
    # The target this decision probes (an ejected target whose ejection ended), if any.
    probe: str | None = None
    # A hash of the group's configuration (`policy_version`): which policy decided.
    policy_version: str = ""
    # In a group with a canary (routing/canary.py): `canary` (its candidate decided),
    # `live`, or `withdrawn` (the candidate would have, but a guard withdrew it).
    canary: str | None = None
    # The odds of this decision (docs/policy-evaluation.md): each candidate's probability of
    # being picked as primary by the strategy's own selection (blend shares, weights), and
    # the chosen primary's probability with why: `blend` or `weights` (its share), `pin`,
    # `probe`, `declared_order`, `script_rule`, `external` (1: chosen without chance).
    odds: tuple[tuple[str, float], ...] = ()
    selection: tuple[float, str] | None = None
    # How the warm targets' room was shared, when scores moved traffic: the adjustable
    # fraction (`max_score_adjustment_percent` / 100) and the softmax `blend_sharpness`.
    blend: dict[str, float] | None = None
    # `strategy: external`: how the routing service's answer was used — `answered`, or why
    # the fallback strategy decided (`timeout`, `error`, `busy`, `empty`, `unknown_target`,
    # `ineligible_target`, `not_asked`). None for the other strategies.
    external: str | None = None
    # The rows of `candidates`, or the function that builds them on first read: rounding
    # every score of every candidate costs more than the rest of a decision, and most
    # decisions are never explained or logged. Readers get the same rows either way.
    _candidates: list[CandidateTrace] | RowBuilder = field(default_factory=list, init=False)

    @property
    def candidates(self) -> list[CandidateTrace]:
        # Read once: the console builds rows on worker threads, two may build at once.
        rows = self._candidates
        if callable(rows):
            rows = rows(None)
            self._candidates = rows
        return rows

    def candidate(self, target: str) -> CandidateTrace | None:
        """One candidate's row, without building the others' (a telemetry row needs only
        the selected target's)."""
        built = self._candidates
        rows = built(target) if callable(built) else [c for c in built if c.target == target]
        return rows[0] if rows else None

    def figures(self, target: str) -> Figures | None:
        """One candidate's figures as they were computed (the telemetry row buckets them:
        telemetry/rows.py), without building its row where the deferred rows can give
        them (a `figures` method beside the call)."""
        figures: Callable[[str], Figures | None] | None = getattr(
            self._candidates, "figures", None)
        if figures is not None:
            return figures(target)
        row = self.candidate(target)
        return None if row is None else (row.scores, row.term_value, row.final_share,
                                         row.observations)

    def defer_candidates(self, build: RowBuilder) -> None:
        """`candidates` will be `build(None)`, called on first read (if any); `build(label)`
        gives that target's row alone."""
        self._candidates = build

    def chose(self, probability: float, reason: str) -> None:
        self.selection = (probability, reason)

    def exclude(self, target: str, stage: str) -> None:
        self.exclusions.append((target, stage))

    def to_dict(self) -> dict[str, Any]:
        rows = self.candidates
        data = asdict(self)
        if data["external"] is None:  # other strategies' traces keep their keys
            del data["external"]
        if data["canary"] is None:  # and groups without a canary theirs
            del data["canary"]
        data["candidates"] = data.pop("_candidates")  # the last key, as it always was
        data["exclusions"] = [{"target": t, "stage": s} for t, s in self.exclusions]
        data["unproven"] = [{"target": t, "threshold": s} for t, s in self.unproven]
        data["odds"] = [{"target": t, "probability": p} for t, p in self.odds]
        data["selection"] = (None if self.selection is None else
                             {"probability": self.selection[0], "reason": self.selection[1]})
        for row, candidate in zip(data["candidates"], rows, strict=True):
            row["final_share_bucket"] = bucket(candidate.final_share)
            row["term_value_bucket"] = (None if candidate.term_value is None
                                        else bucket(candidate.term_value))
        return data
