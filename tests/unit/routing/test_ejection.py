"""Ejection with memory and recovery by probing (issue 14, items 2 and 3), simulated at the
router with an injected clock: a target that failed a threshold stays out after its evidence
ages out (it used to come back cold at full weight), is probed at a bounded, deterministic
rate once its ejection ends, re-enters after PROBE_SUCCESSES good probes with its window
restarted, and goes out for longer after a failed probe."""

from __future__ import annotations

from collections import Counter

from sidecar.routing.decision import Decision
from sidecar.routing.ejection import MAX_BACKOFF, PROBE_INTERVAL, PROBE_SUCCESSES, Health
from sidecar.routing.observations import TargetObservations
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request, warm

GROUP = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: good, weight: 50}
      - {provider: p, model_ref: sick, weight: 50}
    routing_policy:
      dynamic_score:
        min_observations: 10
        observation_window_seconds: 30
        thresholds: {max_error_rate: 0.03}
""")
SICK = "p/sick"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class View:
    """Observations by target and window: `figures[label]` is what the full window shows,
    `recent[label]` what a short window (a probe's or a re-entered target's) shows."""

    def __init__(self) -> None:
        self.figures: dict[str, TargetObservations] = {}
        self.recent: dict[str, TargetObservations] = {}

    def get(self, label: str, window: int) -> TargetObservations:
        if window < 30 and label in self.recent:
            return self.recent[label]
        return self.figures.get(label, TargetObservations())


def setup() -> tuple[Router, Clock, View]:
    clock = Clock()
    view = View()
    view.figures = {"p/good": warm(50), SICK: warm(50, error_rate=0.2)}
    return Router(GROUP, clock), clock, view


def decide(router: Router, view: View) -> Decision:
    outcome = router.decide(request(), view)
    assert isinstance(outcome, Decision)
    return outcome


def test_a_drained_target_stays_out_after_its_evidence_ages_out() -> None:
    router, clock, view = setup()
    first = decide(router, view)
    assert (SICK, "thresholds.max_error_rate") in first.trace.exclusions
    view.figures[SICK] = TargetObservations()  # its bad evidence aged out: it looks cold
    clock.now += 10
    later = decide(router, view)
    assert (SICK, "thresholds.ejected") in later.trace.exclusions
    assert [c.label for c in later.ordered] == ["p/good"]


def test_probes_are_bounded_deterministic_and_never_pinned() -> None:
    router, clock, view = setup()
    decide(router, view)
    ejections = router.ejections("g")
    clock.now += ejections.base_seconds + 1
    view.figures[SICK] = TargetObservations()
    decisions = [decide(router, view) for _ in range(10 * PROBE_INTERVAL)]
    assert ejections.health(SICK, clock.now) is Health.PROBING
    probes = [d for d in decisions if d.trace.probe == SICK]
    assert len(probes) == 10  # exactly one decision in PROBE_INTERVAL
    for probe in probes:
        assert [c.label for c in probe.ordered] == [SICK, "p/good"]  # fallback follows
    others = Counter(d.primary.label for d in decisions if d.trace.probe is None)
    assert set(others) == {"p/good"}


def test_good_probes_bring_it_back_at_once_with_its_live_figures() -> None:
    router, clock, view = setup()
    decide(router, view)
    ejections = router.ejections("g")
    clock.now += ejections.base_seconds + 1
    view.figures[SICK] = warm(50, error_rate=0.2)  # the full window still remembers
    view.recent[SICK] = warm(PROBE_SUCCESSES)      # what its probes did: all fine
    back = decide(router, view)
    assert ejections.health(SICK, clock.now) is Health.IN
    assert SICK in {c.label for c in back.ordered}
    assert not any(target == SICK for target, _ in back.trace.exclusions)
    # Judged from then on by what it did since it re-entered, not by the old window.
    clock.now += 5
    assert SICK in {c.label for c in decide(router, view).ordered}
    # Long after, the group has nothing to remember (and decisions take the fast path).
    view.figures[SICK] = warm(50)
    clock.now += MAX_BACKOFF * ejections.base_seconds + 30
    decide(router, view)
    assert ejections.idle


def test_a_failed_probe_ejects_it_again_for_longer_up_to_the_cap() -> None:
    router, clock, view = setup()
    decide(router, view)
    ejections = router.ejections("g")
    lengths = []
    view.recent[SICK] = warm(1, error_rate=1.0)  # every probe fails
    for _ in range(6):
        start = clock.now
        while ejections.health(SICK, clock.now) is Health.EJECTED:
            clock.now += 1
        lengths.append(clock.now - start)
        decide(router, view)  # probing: the failed probe's evidence ejects it again
    base = ejections.base_seconds
    assert lengths[1] >= 2 * base - 1 and lengths[2] >= 4 * base - 1
    assert max(lengths) <= MAX_BACKOFF * base + 1


def test_ejection_never_leaves_a_request_without_a_target() -> None:
    router, clock, view = setup()
    decide(router, view)  # sick is ejected
    tools_only = config("""
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: sick, weight: 1}
    routing_policy:
      dynamic_score:
        min_observations: 10
        thresholds: {max_error_rate: 0.03}
""")
    alone = Router(tools_only, clock)
    for _ in range(3):
        outcome = decide(alone, view)
        assert [c.label for c in outcome.ordered] == [SICK]
        assert outcome.trace.thresholds_relaxed
