"""`thresholds`: only warm targets with enough evidence are judged (a rate by its lower
confidence bound, issue #31.2); what is over its limit on thin evidence is reported, not
acted on; if all would go, the least bad stays."""

from __future__ import annotations

from tests.unit.routing.helpers import config, decide, excluded, request, snapshot, warm

CFG = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 3}
      - {provider: p, model_ref: b, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 20
        thresholds: {max_error_rate: 0.03, max_timeout_rate: 0.02, max_p95_latency_ms: 10000}
""")


def served(obs) -> list[str]:
    """The candidates health kept, in attempt order (the targets it kept out follow them
    as last-resort fallbacks: test_health_excluded_targets_are_the_last_fallbacks)."""
    return candidates(decide(CFG, request(), obs))


def candidates(decision) -> list[str]:
    out = excluded(decision)
    return [c.target.model_ref for c in decision.ordered if c.label not in out]


def test_max_error_rate() -> None:
    decision = decide(CFG, request(), snapshot(p__a=warm(error_rate=0.10), p__b=warm()))
    assert candidates(decision) == ["b"]
    assert excluded(decision) == {"p/a": "thresholds.max_error_rate"}


def test_max_timeout_rate() -> None:
    decision = decide(CFG, request(), snapshot(p__a=warm(),
                                               p__b=warm(1000, timeout_rate=0.03)))
    assert excluded(decision) == {"p/b": "thresholds.max_timeout_rate"}


def test_one_failure_in_a_handful_is_not_an_error_rate_over_the_limit() -> None:
    """Issue #31.2: 1 failure in 20 (5 %) crossed `max_error_rate: 0.03`. Its lower bound
    at 0.95 is 1 %: not applied, and the trace says so."""
    decision = decide(CFG, request(), snapshot(p__a=warm(20, error_rate=0.05), p__b=warm()))
    assert excluded(decision) == {}
    assert decision.trace.unproven == [("p/a", "thresholds.max_error_rate")]
    assert decision.trace.to_dict()["unproven"] == [
        {"target": "p/a", "threshold": "thresholds.max_error_rate"}]
    # The same rate over 400 requests is evidence (lower bound 3.3 %).
    confident = decide(CFG, request(), snapshot(p__a=warm(400, error_rate=0.055), p__b=warm()))
    assert excluded(confident) == {"p/a": "thresholds.max_error_rate"}


def test_the_evidence_standard_is_configurable() -> None:
    plain = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 3}
      - {provider: p, model_ref: b, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 5
        thresholds: {max_error_rate: 0.03, confidence: 0.5, min_observations: 50}
""")
    thin = snapshot(p__a=warm(20, error_rate=0.05), p__b=warm())
    assert excluded(decide(plain, request(), thin)) == {}  # under thresholds.min_observations
    assert decide(plain, request(), thin).trace.unproven == [
        ("p/a", "thresholds.max_error_rate")]
    # At 0.5 the rate itself is compared once there are enough observations.
    enough = snapshot(p__a=warm(50, error_rate=0.04), p__b=warm())
    assert excluded(decide(plain, request(), enough)) == {"p/a": "thresholds.max_error_rate"}


def test_max_p95_latency_ms() -> None:
    decision = decide(CFG, request(), snapshot(p__a=warm(p95_latency_ms=12_000), p__b=warm()))
    assert excluded(decision) == {"p/a": "thresholds.max_p95_latency_ms"}


def test_limits_are_inclusive() -> None:
    assert served(snapshot(p__a=warm(error_rate=0.03, timeout_rate=0.02,
                                     p95_latency_ms=10_000))) == ["a", "b"]


def test_cold_targets_are_never_judged() -> None:
    obs = snapshot(p__a=warm(count=19, error_rate=0.9), p__b=warm())
    assert sorted(served(obs)) == ["a", "b"]


def test_all_failing_keeps_the_least_bad_and_marks_the_decision() -> None:
    obs = snapshot(p__a=warm(error_rate=0.30), p__b=warm(error_rate=0.06))
    decision = decide(CFG, request(), obs)
    assert candidates(decision) == ["b"]
    assert decision.trace.thresholds_relaxed is True
    assert excluded(decision) == {"p/a": "thresholds.max_error_rate"}


def test_least_bad_compares_ratio_to_the_limit_across_thresholds() -> None:
    # a: latency 2× its limit; b: error rate 3× its limit → a is less bad.
    obs = snapshot(p__a=warm(p95_latency_ms=20_000), p__b=warm(error_rate=0.09))
    assert served(obs) == ["a"]


def test_least_bad_tie_goes_to_the_heavier_target() -> None:
    obs = snapshot(p__a=warm(error_rate=0.06), p__b=warm(error_rate=0.06))
    assert served(obs) == ["a"]


def test_health_excluded_targets_are_the_last_fallbacks() -> None:
    """Issue #31: a target kept out by health is never a primary, but is tried after every
    healthy candidate failed, rather than fail the request."""
    decision = decide(CFG, request(), snapshot(p__a=warm(error_rate=0.10), p__b=warm()))
    assert [c.target.model_ref for c in decision.ordered] == ["b", "a"]
    assert decision.primary.target.model_ref == "b"


def test_a_zero_error_limit_re_admits_a_target_with_no_failure_at_all() -> None:
    """No upper bound is ever under 0: a limit of 0 asks for no failure instead (a probed
    target stuck in probing forever, otherwise)."""
    from sidecar.config.policy import Thresholds
    from sidecar.routing.observations import TargetObservations
    from sidecar.routing.thresholds import clean_answers_needed, proven_well

    zero = Thresholds(max_error_rate=0.0)
    assert proven_well(zero, TargetObservations(count=5))
    assert not proven_well(zero, TargetObservations(count=500, error_rate=0.002))
    assert clean_answers_needed(zero) == 1


def test_probe_evidence_needs_no_minimum_count() -> None:
    """`thresholds.min_observations` guards windows; a probed target's first failures are
    evidence at once (its lower bound is over the limit)."""
    from sidecar.config.policy import Thresholds
    from sidecar.routing.observations import TargetObservations
    from sidecar.routing.thresholds import judge, judge_probes

    strict = Thresholds(max_error_rate=0.03, min_observations=20)
    three_failed = TargetObservations(count=3, error_rate=1.0)
    assert judge(strict, three_failed).violation is None          # a window: too few
    assert judge_probes(strict, three_failed).violation == "thresholds.max_error_rate"
