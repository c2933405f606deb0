"""Issue 41: a target that is still sick gets at most PROBE_SHARE of its group's decisions
in probes, whatever its error rate, the time its answers take and the number of targets
in the group; probing rounds end on the futility test's first evidence; a target that
recovers comes back once its hold is paid."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.routing.ejection import PROBE_SHARE, Health
from sidecar.routing.observations import TargetObservations
from sidecar.routing.router import Router
from sidecar.routing.thresholds import judge_probes
from tests.unit.routing.helpers import config, warm
from tests.unit.routing.test_ejection import SICK, Clock, View, decide

THRESHOLDS = "thresholds: {max_error_rate: 0.03}"


def group(healthy: int):  # type: ignore[no-untyped-def]
    targets = "\n".join(f"      - {{provider: p, model_ref: good{n}, weight: 30}}"
                        for n in range(healthy))
    return config(f"""
  g:
    strategy: dynamic_score
    targets:
{targets}
      - {{provider: p, model_ref: sick, weight: 40}}
    routing_policy:
      dynamic_score:
        min_observations: 10
        observation_window_seconds: 30
        {THRESHOLDS}
""")


class Sick:
    """A group at `rate` decisions a second whose target SICK fails `error_rate` of its
    requests and answers each probe `delay` decisions after it was sent."""

    def __init__(self, healthy: int, error_rate: float, delay: int, seed: int,
                 rate: float = 8.0) -> None:
        self.clock = Clock()
        self.view = View()
        self.view.figures = {f"p/good{n}": warm(50) for n in range(healthy)}
        self.view.figures[SICK] = warm(50, error_rate=0.2)
        self.router = Router(group(healthy), self.clock)
        self.error_rate, self.delay, self.step = error_rate, delay, 1 / rate
        self.chance = random.Random(seed)
        self.pending: list[int] = []   # decisions at which a probe's answer comes back
        self.decisions = self.probes = 0
        self.rounds: list[tuple[int, int]] = []   # (probes, decisions since it left) at starts

        decide(self.router, self.view)  # the window shows it sick: ejected
        self.view.figures[SICK] = TargetObservations()  # its evidence ages out
        self.ejections = self.router.ejections("g")
        self.before = Health.EJECTED

    def run(self, decisions: int) -> None:
        for _ in range(decisions):
            self.clock.now += self.step
            while self.pending and self.pending[0] <= self.decisions:
                self.pending.pop(0)
                failed = self.chance.random() < self.error_rate
                self.view.arrive(SICK, 1, error_rate=float(failed))
            health = self.ejections.health(SICK, self.clock.now)
            if self.before is Health.EJECTED and health is Health.PROBING:
                self.rounds.append((self.probes, self.decisions))
            self.before = health
            outcome = decide(self.router, self.view)
            self.decisions += 1
            if outcome.trace.probe == SICK:
                self.probes += 1
                self.pending.append(self.decisions + self.delay)

    def health(self) -> Health:
        return self.ejections.health(SICK, self.clock.now)


@settings(max_examples=25, deadline=None)
@given(healthy=st.integers(1, 3), error_rate=st.floats(0.05, 0.6),
       delay=st.integers(0, 40), seed=st.integers(0, 10_000))
def test_a_sick_targets_probes_stay_within_the_share_at_every_rounds_start(
        healthy: int, error_rate: float, delay: int, seed: int) -> None:
    sim = Sick(healthy, error_rate, delay, seed)
    sim.run(4_000)
    assert sim.rounds, "it was never probed"
    for probes, decisions in sim.rounds:
        assert probes <= PROBE_SHARE * decisions + 1, (probes, decisions)
    assert sim.health() is not Health.IN


def test_the_long_run_share_of_a_target_failing_one_request_in_ten() -> None:
    """The issue's degraded target (10 % errors), answers slow enough for several probes to
    be in flight, 20 seeds of 20,000 decisions: the share is PROBE_SHARE and whatever the
    round under way adds (measured 0.50-0.88 %, median 0.53 %), never the goal's 1 %."""
    shares = []
    for seed in range(20):
        sim = Sick(1, 0.10, 16, seed)
        sim.run(20_000)
        shares.append(sim.probes / sim.decisions)
    assert max(shares) < 2 * PROBE_SHARE, shares
    assert sorted(shares)[len(shares) // 2] < 1.2 * PROBE_SHARE, shares


def test_futility_ends_a_round_on_one_failure_among_the_first_dozen_probes() -> None:
    thresholds = group(1).models["g"].routing_policy.dynamic_score.thresholds
    one_in = {n: judge_probes(thresholds, TargetObservations(count=n, error_rate=1 / n))
              for n in (1, 5, 12, 13, 40)}
    assert [n for n, verdict in one_in.items() if verdict.violation] == [1, 5, 12]
    # Nothing failed: no round ends, however few the answers.
    assert judge_probes(thresholds, TargetObservations(count=1)).violation is None


def test_a_target_that_recovers_comes_back_once_its_hold_is_paid() -> None:
    sim = Sick(1, 0.10, 4, seed=3)
    sim.run(2_000)
    probes, decisions = sim.probes, sim.decisions
    sim.error_rate = 0.0  # it recovers
    while sim.health() is not Health.IN and sim.decisions < 30_000:
        sim.run(10)
    assert sim.health() is Health.IN
    # No later than its hold (its probes while sick / PROBE_SHARE decisions since it left)
    # plus the rounds that collect the evidence re-admission needs (88 clean answers at one
    # decision in two, and the slow start's first rounds).
    assert sim.decisions <= max(decisions, probes / PROBE_SHARE) + 400, (
        sim.decisions, probes, decisions)
