"""`strategy: dynamic_score` after the shared gates: thresholds → signals → scores →
score_terms → cold start and the capped blend → deterministic selection.

See docs/dynamic-score.md for every key and formula; each step below is named after the
configuration key it implements and leaves its mark in the trace. What depends on the
configuration alone is resolved once per group, at load (`DynamicScore`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.config.models import ModelGroup
from sidecar.config.policy import Complexity, DynamicScorePolicy, ScoreTerm
from sidecar.routing.affinity import AffinityOutcome, AffinityStore
from sidecar.routing.blend import blended_shares, weight_shares
from sidecar.routing.capabilities import eval_quality
from sidecar.routing.decision import TargetChoice
from sidecar.routing.ejection import PROBE_SUCCESSES, Ejections, Health
from sidecar.routing.expression import Evaluator, compile_expression
from sidecar.routing.gates import output_budget
from sidecar.routing.observations import ObservationView, TargetObservations
from sidecar.routing.request import RequestSummary
from sidecar.routing.scores import Candidate, estimated_cost_usd, score_candidates
from sidecar.routing.signals import (
    ComplexityResult,
    complexity,
    prompt_feature_detector,
    request_shape_buckets,
)
from sidecar.routing.thresholds import judge, judge_probes, least_bad, proven_well
from sidecar.routing.trace import CandidateTrace, DecisionTrace, Figures
from sidecar.routing.weighted import WeightedRotation

_SIGNAL_NAMES = ("request_shape", "prompt_features", "complexity", "observed_performance",
                 "cost", "evaluation_metadata")
# Every complexity bucket a request can get; None when the complexity signal is off.
_BUCKETS: tuple[Complexity | None, ...] = (None, *Complexity)
_MAX_BLENDS = 256


@dataclass(frozen=True)
class CompiledTerm:
    term: ScoreTerm
    evaluate: Evaluator

    def applies(self, bucket: Complexity | None) -> bool:
        when = self.term.when
        if when.complexity_lte is None and when.complexity_gte is None:
            return True
        if bucket is None:  # complexity signal off: conditional terms cannot match
            return False
        rank = bucket.rank
        if when.complexity_lte is not None and rank > when.complexity_lte.rank:
            return False
        return not (when.complexity_gte is not None and rank < when.complexity_gte.rank)


@dataclass(frozen=True, slots=True)
class ApplicableTerms:
    """The score terms that apply to requests of one complexity bucket."""

    terms: tuple[CompiledTerm, ...]
    names: tuple[str, ...]
    required_tags: frozenset[str]


@dataclass(frozen=True, slots=True)
class Blend:
    """What the scoring steps made of one set of inputs (shared: never mutated)."""

    candidates: list[Candidate]
    shares: list[float]              # configured weight shares
    scores: list[dict[str, float]]
    values: list[float | None]       # score-term values (warm targets)
    final: list[float]               # shares after cold start and the capped blend
    blended: bool
    cold_start: str
    by_share: tuple[TargetChoice, ...]  # by final share, then declared order
    odds: tuple[tuple[str, float], ...]  # each candidate's final share, by label


def compile_terms(policy: DynamicScorePolicy) -> tuple[CompiledTerm, ...]:
    return tuple(CompiledTerm(t, compile_expression(t.expression)) for t in policy.score_terms)


def applicable_terms(terms: Sequence[CompiledTerm], bucket: Complexity | None) -> ApplicableTerms:
    matching = tuple(t for t in terms if t.applies(bucket))
    return ApplicableTerms(matching, tuple(t.term.name for t in matching),
                           frozenset(tag for t in matching for tag in t.term.require_tags))


class DynamicScore:
    """One group's dynamic_score steps, with what depends on configuration alone resolved
    at load: the enabled signals, the prompt-feature scan, the score terms that apply to
    each complexity bucket, and each target's tags and evaluation quality."""

    def __init__(self, group: ModelGroup) -> None:
        self.policy = policy = group.dynamic_score
        signals = policy.signals
        self._signal_names = tuple(n for n in _SIGNAL_NAMES if getattr(signals, n).enabled)
        self._features_of = prompt_feature_detector(signals)
        terms = compile_terms(policy)
        self._terms = {bucket: applicable_terms(terms, bucket) for bucket in _BUCKETS}
        self._tags = tuple(frozenset(t.tags) for t in group.targets)
        self._qualities = tuple(eval_quality(t) for t in group.targets)
        self._adjustment = policy.max_score_adjustment_percent / 100
        self._sharpness = policy.blend_sharpness
        self._blend_trace = {"adjustment": self._adjustment, "sharpness": self._sharpness}
        self._blends: dict[tuple[object, ...], Blend] = {}

    def order(
        self,
        request: RequestSummary,
        eligible: list[TargetChoice],
        observations: ObservationView,
        rotation_for: Callable[[tuple[int, ...]], WeightedRotation],
        trace: DecisionTrace,
        affinity: AffinityStore | None = None,
        ejections: Ejections | None = None,
    ) -> list[TargetChoice]:
        policy = self.policy
        window = policy.observation_window_seconds
        # Ejection state matters only while some target is ejected, probing or just back.
        active = ejections if ejections is not None and not ejections.idle else None
        now = 0.0
        if active is not None:
            now = active.now()
            active.decided()
        observed = {c.index: observations.get(c.label, window) for c in eligible}
        if active is not None:  # a re-entered target is judged by what it did since
            for c in eligible:
                since = active.observed(c.label, now, observations)
                if since is not None:
                    observed[c.index] = since

        signals = policy.signals
        trace.signals = self._signal_names
        if signals.request_shape.enabled:
            trace.request_shape = request_shape_buckets(request)
        features = self._features_of(request)
        trace.prompt_features = tuple(sorted(features))
        bucket = complexity(request, features, signals)
        trace.complexity = bucket.bucket.value if bucket else None

        applicable = self._terms[bucket.bucket if bucket else None]
        matching = applicable.terms
        trace.score_terms = applicable.names
        # Quality floors (require_tags) before health: if thresholds must relax, they relax
        # among the targets the floor allows, never across it.
        eligible = self._apply_require_tags(eligible, applicable.required_tags, trace)
        floor = eligible  # within the quality floor, before health
        probing: list[tuple[TargetChoice, int]] = []
        if active is not None:
            eligible, probing = _apply_ejections(eligible, policy, observations, observed,
                                                 active, now, trace)
        warm = {index: o.count >= policy.min_observations for index, o in observed.items()}
        if active is not None:  # back with its probes' evidence: warm, with its live score
            for c in eligible:
                if active.reentered(c.label):
                    warm[c.index] = observed[c.index].count >= PROBE_SUCCESSES
        eligible = _apply_thresholds(eligible, policy, observed, warm, trace, ejections)
        trace.candidate_count = len(eligible)

        indices = tuple(c.index for c in eligible)
        tokens, budget = request.estimated_input_tokens, output_budget(request)
        figures = tuple(observed[index] for index in indices)
        costs = tuple(estimated_cost_usd(c.target, tokens, budget,
                                         observed[c.index].cache_read_share or 0.0)
                      for c in eligible)
        hot = tuple(warm[index] for index in indices)
        blend = self._blend(eligible, indices, figures, costs, bucket, matching, hot,
                            request.budget_pressure)
        trace.cold_start = blend.cold_start
        trace.defer_candidates(_BlendRows(eligible, blend))
        trace.order = "blended_shares" if blend.blended else "weight_shares"
        if blend.blended:
            trace.blend = self._blend_trace

        pin = _affinity_lookup(request, policy, affinity, indices, trace)
        picked = pin if pin is not None else rotation_for(indices).pick(indices, blend.final)
        position = indices.index(picked)
        primary = eligible[position]
        ordered = [primary, *(c for c in blend.by_share if c.index != picked),
                   *_last_resort(floor, indices)]
        trace.odds = blend.odds
        if trace.affinity is AffinityOutcome.HIT:
            trace.chose(1.0, "pin")
        else:
            trace.chose(blend.odds[position][1], "blend" if blend.blended else "weights")
        if probing and ejections is not None and trace.affinity is not AffinityOutcome.HIT:
            probe, evidence = probing[0]
            if ejections.probe_due(probe.label, now, evidence):
                # The probe leads; the decision's own order follows as its fallbacks. It
                # never carries a pinned conversation's turn. A first turn it carries is
                # pinned to it (issue 41: the pin records the initially selected primary,
                # which the probe is): the next turn stays there once it is back, or
                # moves for a reason its trace names (the target still probing), never
                # silently to the rotation's pick.
                trace.probe = probe.label
                trace.chose(1.0, "probe")
                attempts = [probe, *(c for c in ordered if c.index != probe.index)]
                # Chosen with certainty: the probe 1, every other target 0.
                trace.odds = tuple((c.label, 1.0 if c is probe else 0.0)
                                   for c in (probe, *blend.by_share))
                _pin_first_turn(request, affinity, probe.index, trace)
                return attempts
        _pin_first_turn(request, affinity, picked, trace)
        return ordered

    def _blend(self, eligible: list[TargetChoice], indices: tuple[int, ...],
               figures: tuple[TargetObservations, ...], costs: tuple[float | None, ...],
               bucket: ComplexityResult | None, matching: tuple[CompiledTerm, ...],
               hot: tuple[bool, ...], pressure: float = 0.0) -> Blend:
        """Scores → score_terms → cold start and the capped blend, for these inputs. Requests
        with the same inputs get the same result, so it is kept (a few hundred at most) under
        the candidates, their observation figures and warmth, costs, complexity and budget
        pressure (in steps of 0.01)."""
        key = (indices, figures, hot, costs, bucket.points if bucket else None, pressure)
        blend = self._blends.get(key)
        if blend is not None:
            return blend
        candidates = [Candidate(c.target, figure, warm, cost, self._qualities[c.index])
                      for c, figure, warm, cost in zip(eligible, figures, hot, costs,
                                                       strict=True)]
        scores = score_candidates(candidates, self.policy.signals,
                                  bucket.score if bucket else None, self.policy.latency_basis,
                                  pressure)
        # Only warm targets move by score; a cold target's term value is not computed.
        values = [sum(t.evaluate(s) for t in matching) if matching and h else None
                  for s, h in zip(scores, hot, strict=True)]
        shares = weight_shares([c.target.weight for c in eligible])
        final, blended = blended_shares(shares, hot, values, self._adjustment,
                                        self._sharpness)
        by_share = sorted(zip(final, eligible, strict=True), key=lambda p: (-p[0], p[1].index))
        blend = Blend(candidates, shares, scores, values, final, blended,
                      "all_cold" if not any(hot) else "all_warm" if all(hot) else "mixed",
                      tuple(c for _, c in by_share),
                      tuple((c.label, f) for c, f in zip(eligible, final, strict=True)))
        if len(self._blends) >= _MAX_BLENDS:
            self._blends.clear()
        self._blends[key] = blend
        return blend

    def _apply_require_tags(self, eligible: list[TargetChoice], required: frozenset[str],
                            trace: DecisionTrace) -> list[TargetChoice]:
        """While a term applies, only targets with all its `require_tags` are candidates. If
        that would leave none, the restriction is dropped and the trace says so."""
        if not required:
            return eligible
        kept = [c for c in eligible if required <= self._tags[c.index]]
        if not kept:
            trace.require_tags_relaxed = True
            return eligible
        for choice in eligible:
            if not required <= self._tags[choice.index]:
                trace.exclude(choice.label, "score_terms.require_tags")
        return kept


class _BlendRows:
    """The candidate rows of a blended decision, built when read (trace.py), and the
    selected target's figures without its row (what a telemetry row needs)."""

    __slots__ = ("_blend", "_eligible")

    def __init__(self, eligible: Sequence[TargetChoice], blend: Blend) -> None:
        self._eligible = eligible
        self._blend = blend

    def __call__(self, only: str | None = None) -> list[CandidateTrace]:
        blend = self._blend
        return [
            CandidateTrace(c.label, round(share, 6), candidate.warm,
                           candidate.observations.count,
                           {k: round(v, 6) for k, v in s.items()},
                           None if value is None else round(value, 6), round(f, 6))
            for c, candidate, share, s, value, f in zip(
                self._eligible, blend.candidates, blend.shares, blend.scores, blend.values,
                blend.final, strict=True)
            if only is None or c.label == only
        ]

    def figures(self, target: str) -> Figures | None:
        blend = self._blend
        for index, choice in enumerate(self._eligible):
            if choice.label == target:
                return (blend.scores[index], blend.values[index], blend.final[index],
                        blend.candidates[index].observations.count)
        return None


def _last_resort(floor: list[TargetChoice], candidates: tuple[int, ...]) -> list[TargetChoice]:
    """Targets health kept out (ejected, probing, over a threshold) but within the quality
    floor: the decision's last fallbacks, after every healthy candidate, by weight. A
    request whose healthy targets all failed tries a sick one rather than fail (issue #31:
    a quality floor with one healthy target left turned its one-off failures into client
    errors); it is never anyone's primary, so a sick target's share stays the probes'."""
    rest = [c for c in floor if c.index not in candidates]
    return sorted(rest, key=lambda c: (-c.target.weight, c.index)) if rest else rest


def _affinity_lookup(request: RequestSummary, policy: DynamicScorePolicy,
                     affinity: AffinityStore | None, eligible: Sequence[int],
                     trace: DecisionTrace) -> int | None:
    """Conversation affinity: a live pin on a still-eligible target wins (the rotation does
    not advance; the pinned index is returned). Otherwise None, with the trace saying why
    a pin will be created or replaced (`_pin_first_turn`) or why none applies."""
    if not policy.affinity.enabled:
        trace.affinity = AffinityOutcome.DISABLED
        return None
    key = request.conversation_key
    if affinity is None or key is None:
        trace.affinity = AffinityOutcome.NOT_APPLICABLE
        return None
    pinned, expired = affinity.lookup(key)
    if pinned is not None and not expired and pinned in eligible:
        trace.affinity = AffinityOutcome.HIT
        return pinned
    trace.affinity = (AffinityOutcome.MISS_CREATED if pinned is None
                      else AffinityOutcome.EXPIRED_REPLACED if expired
                      else AffinityOutcome.INELIGIBLE_REPLACED)
    return None


def _pin_first_turn(request: RequestSummary, affinity: AffinityStore | None, primary: int,
                    trace: DecisionTrace) -> None:
    """Create or replace the pin where the lookup said so: to the initially selected
    primary (the rotation's pick, or the probe that leads), before any upstream result."""
    if affinity is not None and request.conversation_key is not None and trace.affinity in (
            AffinityOutcome.MISS_CREATED, AffinityOutcome.EXPIRED_REPLACED,
            AffinityOutcome.INELIGIBLE_REPLACED):
        affinity.pin(request.conversation_key, primary)


def _apply_ejections(eligible: list[TargetChoice], policy: DynamicScorePolicy,
                     observations: ObservationView, observed: dict[int, TargetObservations],
                     ejections: Ejections, now: float, trace: DecisionTrace,
                     ) -> tuple[list[TargetChoice], list[tuple[TargetChoice, int]]]:
    """Ejected targets are out; probing ones are out but may be probed (with the count of
    their evidence so far): ejected again once the probes estimate a threshold broken
    (futility, issue 41), back once they show every threshold kept with confidence (at least
    PROBE_SUCCESSES of them; routing/ejection.py), and judged from then on by what they did
    since probing began. If this would leave no candidate, everyone stays (availability
    first)."""
    kept: list[TargetChoice] = []
    out: list[tuple[TargetChoice, str]] = []
    probing: list[tuple[TargetChoice, int]] = []
    for choice in eligible:
        health = ejections.health(choice.label, now)
        if health is Health.IN:
            kept.append(choice)
            continue
        if health is Health.PROBING:
            evidence = ejections.probe_evidence(choice.label, observations)
            if ((evidence.count and judge_probes(policy.thresholds, evidence,
                                                 policy.latency_basis).violation)
                    or ejections.probe_overdue(choice.label, now, evidence.count)):
                ejections.eject(choice.label, now)  # failed probes: out for longer
            elif evidence.count >= PROBE_SUCCESSES and proven_well(
                    policy.thresholds, evidence, policy.latency_basis):
                ejections.reenter(choice.label, now)
                observed[choice.index] = evidence
                kept.append(choice)
                continue
            else:
                probing.append((choice, evidence.count))
                out.append((choice, "thresholds.probing"))
                continue
        out.append((choice, "thresholds.ejected"))
    if not kept:
        trace.thresholds_relaxed = True
        return eligible, []
    for choice, stage in out:
        trace.exclude(choice.label, stage)
    return kept, probing


def _apply_thresholds(eligible: list[TargetChoice], policy: DynamicScorePolicy,
                      observed: dict[int, TargetObservations], warm: dict[int, bool],
                      trace: DecisionTrace, ejections: Ejections | None = None,
                      ) -> list[TargetChoice]:
    kept: list[TargetChoice] = []
    removed: list[tuple[TargetChoice, str]] = []
    for choice in eligible:
        if not warm[choice.index]:
            kept.append(choice)
            continue
        verdict = judge(policy.thresholds, observed[choice.index], policy.latency_basis,
                        policy.min_observations)
        for name in verdict.unproven:  # over its limit on too little evidence: not applied
            trace.unproven.append((choice.label, name))
        if verdict.violation is None:
            kept.append(choice)
        else:
            removed.append((choice, verdict.violation))
    if not kept and removed:
        survivor = least_bad(policy.thresholds, [
            (c.index, c.target.weight, observed[c.index]) for c, _ in removed],
            policy.latency_basis)
        kept = [c for c, _ in removed if c.index == survivor]
        removed = [(c, v) for c, v in removed if c.index != survivor]
        trace.thresholds_relaxed = True
    for choice, violation in removed:
        trace.exclude(choice.label, violation)
        if ejections is not None:  # out until probes show it well (routing/ejection.py)
            ejections.eject(choice.label, ejections.now())
    return kept
