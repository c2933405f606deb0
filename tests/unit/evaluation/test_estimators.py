"""The off-policy estimators against known truth (issue #31): over many synthetic logs whose
outcome distributions are known, the 95 % intervals cover the candidate's true value at
about their stated rate, and the point estimates are unbiased. The logged primaries come
from the real router's rotation, as in production (docs/policy-evaluation.md §1)."""

from __future__ import annotations

import random

from sidecar.evaluation.estimators import Sample, estimate, target_shares
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request

LOGGING = config("""
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: a, weight: 6}
      - {provider: p, model_ref: b, weight: 3}
      - {provider: p, model_ref: c, weight: 1}
""")
TARGETS = ("p/a", "p/b", "p/c")
# The true mean outcome of each target for each class of request (latency-like: ms).
TRUTH = {("p/a", "simple"): 900.0, ("p/b", "simple"): 400.0, ("p/c", "simple"): 1500.0,
         ("p/a", "complex"): 3000.0, ("p/b", "complex"): 5000.0, ("p/c", "complex"): 2000.0}
CANDIDATE = {"simple": {"p/a": 0.1, "p/b": 0.8, "p/c": 0.1},
             "complex": {"p/a": 0.3, "p/b": 0.1, "p/c": 0.6}}


def synthetic_log(seed: int, n: int = 400) -> tuple[list[Sample], float]:
    """A log made by the router's weighted rotation, outcomes drawn around TRUTH (log-normal
    noise), and the candidate's true value on these requests."""
    chance = random.Random(seed)
    router = Router(LOGGING)
    samples, truth = [], 0.0
    for _ in range(n):
        cell = "complex" if chance.random() < 0.3 else "simple"
        decision = router.decide(request())
        action = decision.primary.label
        probability = decision.trace.selection[0]
        mean = TRUTH[action, cell]
        outcome = mean * chance.lognormvariate(0, 0.5) / 1.1331  # E[lognorm(0, .5)] = 1.1331
        samples.append(Sample(action, probability, outcome, CANDIDATE[cell], cell))
        truth += sum(p * TRUTH[t, cell] for t, p in CANDIDATE[cell].items())
    return samples, truth / n


def test_the_intervals_cover_the_truth_at_their_stated_rate() -> None:
    logs = 300
    covered = {"ips": 0, "snips": 0, "dr": 0}
    errors = {"ips": 0.0, "dr": 0.0}
    for seed in range(logs):
        samples, truth = synthetic_log(seed)
        found = estimate(samples)
        for name in covered:
            covered[name] += getattr(found, name).covers(truth)
        for name in errors:
            errors[name] += getattr(found, name).value - truth
    for name, hits in covered.items():
        assert 0.91 * logs <= hits <= 0.99 * logs, (name, hits / logs)
    for name, total in errors.items():  # unbiased: the mean error is small beside the truth
        assert abs(total / logs) < 0.02 * 1500, (name, total / logs)


def test_the_doubly_robust_interval_is_the_tightest() -> None:
    samples, _ = synthetic_log(1)
    found = estimate(samples)
    width = {name: getattr(found, name).high - getattr(found, name).low
             for name in ("ips", "snips", "dr")}
    assert width["dr"] < width["snips"] < width["ips"]


def test_replaying_the_logging_policy_changes_nothing() -> None:
    """The candidate is the logging policy: every weight is 1, the estimates are the logged
    mean and the difference is 0."""
    samples, _ = synthetic_log(2)
    same = [Sample(s.action, s.logged_probability, s.outcome,
                   {"p/a": 0.6, "p/b": 0.3, "p/c": 0.1}, s.cell) for s in samples]
    found = estimate(same)
    assert abs(found.ips.value - found.logged.value) < 1e-6
    assert abs(found.snips.value - found.logged.value) < 1e-6
    assert found.delta.covers(0.0)
    assert found.effective_n > 0.99 * len(same)


def test_target_shares_logged_and_expected() -> None:
    samples, _ = synthetic_log(3, n=100)
    logged, candidate = target_shares(samples)
    assert abs(logged["p/a"] - 0.6) <= 0.01 and abs(logged["p/c"] - 0.1) <= 0.01
    assert abs(sum(candidate.values()) - 1) < 1e-9


def test_no_samples_no_estimate() -> None:
    assert estimate([]) is None


def test_no_doubly_robust_estimate_for_targets_no_row_shows() -> None:
    """A model of a target never logged would be made up: DR is not estimable."""
    import math
    samples = [Sample("p/a", 1.0, 100.0 + n, {"p/b": 1.0}) for n in range(10)]
    found = estimate(samples)
    assert found.ips.value == 0.0  # IPS sees no outcome of p/b (the report warns)
    assert math.isnan(found.dr.value) and math.isnan(found.delta.value)
