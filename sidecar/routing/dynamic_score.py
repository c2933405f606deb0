"""`strategy: dynamic_score` after the shared gates: thresholds → signals → scores →
score_terms → cold start and the capped blend → deterministic selection.

See docs/dynamic-score.md for every key and formula; each step below is named after the
configuration key it implements and leaves its mark in the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.config.policy import DynamicScorePolicy, ScoreTerm
from sidecar.routing.affinity import AffinityOutcome, AffinityStore
from sidecar.routing.blend import blended_shares, weight_shares
from sidecar.routing.decision import TargetChoice
from sidecar.routing.expression import Evaluator, compile_expression
from sidecar.routing.gates import output_budget
from sidecar.routing.observations import ObservationView, TargetObservations
from sidecar.routing.request import RequestSummary
from sidecar.routing.scores import Candidate, estimated_cost_usd, score_candidates
from sidecar.routing.signals import (
    ComplexityResult,
    complexity,
    detect_prompt_features,
    request_shape_buckets,
)
from sidecar.routing.thresholds import least_bad, threshold_violation
from sidecar.routing.trace import CandidateTrace, DecisionTrace
from sidecar.routing.weighted import WeightedRotation

_SIGNAL_NAMES = ("request_shape", "prompt_features", "complexity", "observed_performance",
                 "cost", "evaluation_metadata")


@dataclass(frozen=True)
class CompiledTerm:
    term: ScoreTerm
    evaluate: Evaluator

    def applies(self, bucket: ComplexityResult | None) -> bool:
        when = self.term.when
        if when.complexity_lte is None and when.complexity_gte is None:
            return True
        if bucket is None:  # complexity signal off: conditional terms cannot match
            return False
        rank = bucket.bucket.rank
        if when.complexity_lte is not None and rank > when.complexity_lte.rank:
            return False
        return not (when.complexity_gte is not None and rank < when.complexity_gte.rank)


def compile_terms(policy: DynamicScorePolicy) -> tuple[CompiledTerm, ...]:
    return tuple(CompiledTerm(t, compile_expression(t.expression)) for t in policy.score_terms)


def dynamic_order(
    request: RequestSummary,
    eligible: list[TargetChoice],
    policy: DynamicScorePolicy,
    terms: Sequence[CompiledTerm],
    observations: ObservationView,
    rotation_for: Callable[[tuple[int, ...]], WeightedRotation],
    trace: DecisionTrace,
    affinity: AffinityStore | None = None,
) -> list[TargetChoice]:
    window = policy.observation_window_seconds
    observed = {c.index: observations.get(c.label, window) for c in eligible}
    warm = {c.index: observed[c.index].count >= policy.min_observations for c in eligible}

    signals = policy.signals
    trace.signals = tuple(n for n in _SIGNAL_NAMES if getattr(signals, n).enabled)
    if signals.request_shape.enabled:
        trace.request_shape = request_shape_buckets(request)
    features = detect_prompt_features(request, signals)
    trace.prompt_features = tuple(sorted(features))
    bucket = complexity(request, features, signals)
    trace.complexity = bucket.bucket.value if bucket else None

    matching = [t for t in terms if t.applies(bucket)]
    trace.score_terms = tuple(t.term.name for t in matching)
    # Quality floors (require_tags) before health: if thresholds must relax, they relax
    # among the targets the floor allows, never across it.
    eligible = _apply_require_tags(eligible, matching, trace)
    eligible = _apply_thresholds(eligible, policy, observed, warm, trace)
    trace.candidate_count = len(eligible)

    candidates = [
        Candidate(c.target, observed[c.index], warm[c.index],
                  estimated_cost_usd(c.target, request.estimated_input_tokens,
                                     output_budget(request)))
        for c in eligible
    ]
    scores = score_candidates(candidates, signals, bucket.score if bucket else None)
    hot = [warm[c.index] for c in eligible]
    # Only warm targets move by score; a cold target's term value is not computed.
    values = [sum(t.evaluate(s) for t in matching) if matching and h else None
              for s, h in zip(scores, hot, strict=True)]
    shares = weight_shares([c.target.weight for c in eligible])
    trace.cold_start = ("all_cold" if not any(hot) else "all_warm" if all(hot) else "mixed")
    final, blended = blended_shares(shares, hot, values,
                                    policy.max_score_adjustment_percent / 100)
    trace.candidates = [
        CandidateTrace(c.label, round(share, 6), warm[c.index], observed[c.index].count,
                       {k: round(v, 6) for k, v in s.items()},
                       None if value is None else round(value, 6), round(f, 6))
        for c, share, s, value, f in zip(eligible, shares, scores, values, final, strict=True)
    ]
    trace.order = "blended_shares" if blended else "weight_shares"

    def rotate() -> int:
        return rotation_for(tuple(c.index for c in eligible)).pick(
            [c.index for c in eligible], final)

    picked = _pinned_or(rotate, request, policy, affinity, {c.index for c in eligible}, trace)
    by_share = sorted(zip(final, eligible, strict=True), key=lambda p: (-p[0], p[1].index))
    primary = next(c for c in eligible if c.index == picked)
    return [primary, *(c for _, c in by_share if c.index != picked)]


def _pinned_or(rotate: Callable[[], int], request: RequestSummary, policy: DynamicScorePolicy,
               affinity: AffinityStore | None, eligible: set[int], trace: DecisionTrace) -> int:
    """Conversation affinity: a live pin on a still-eligible target wins (the rotation does
    not advance); otherwise the rotation picks and the pin is created or replaced."""
    if not policy.affinity.enabled:
        trace.affinity = AffinityOutcome.DISABLED
        return rotate()
    key = request.conversation_key
    if affinity is None or key is None:
        trace.affinity = AffinityOutcome.NOT_APPLICABLE
        return rotate()
    pinned, expired = affinity.lookup(key)
    if pinned is not None and not expired and pinned in eligible:
        trace.affinity = AffinityOutcome.HIT
        return pinned
    picked = rotate()
    affinity.pin(key, picked)  # the initially selected primary, before any upstream result
    trace.affinity = (AffinityOutcome.MISS_CREATED if pinned is None
                      else AffinityOutcome.EXPIRED_REPLACED if expired
                      else AffinityOutcome.INELIGIBLE_REPLACED)
    return picked


def _apply_thresholds(eligible: list[TargetChoice], policy: DynamicScorePolicy,
                      observed: dict[int, TargetObservations], warm: dict[int, bool],
                      trace: DecisionTrace) -> list[TargetChoice]:
    kept: list[TargetChoice] = []
    removed: list[tuple[TargetChoice, str]] = []
    for choice in eligible:
        violation = (threshold_violation(policy.thresholds, observed[choice.index])
                     if warm[choice.index] else None)
        if violation is None:
            kept.append(choice)
        else:
            removed.append((choice, violation))
    if not kept and removed:
        survivor = least_bad(policy.thresholds, [
            (c.index, c.target.weight, observed[c.index]) for c, _ in removed])
        kept = [c for c, _ in removed if c.index == survivor]
        removed = [(c, v) for c, v in removed if c.index != survivor]
        trace.thresholds_relaxed = True
    for choice, violation in removed:
        trace.exclude(choice.label, violation)
    return kept


def _apply_require_tags(eligible: list[TargetChoice], matching: Sequence[CompiledTerm],
                        trace: DecisionTrace) -> list[TargetChoice]:
    """While a term applies, only targets with all its `require_tags` are candidates. If
    that would leave none, the restriction is dropped and the trace says so."""
    required = {tag for t in matching for tag in t.term.require_tags}
    if not required:
        return eligible
    kept = [c for c in eligible if required <= set(c.target.tags)]
    if not kept:
        trace.require_tags_relaxed = True
        return eligible
    for choice in eligible:
        if choice not in kept:
            trace.exclude(choice.label, "score_terms.require_tags")
    return kept
