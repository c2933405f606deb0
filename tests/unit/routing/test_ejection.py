"""Ejection with memory and recovery by probing (issue 14, items 2 and 3), simulated at the
router with an injected clock: a target that failed a threshold stays out after its evidence
ages out (it used to come back cold at full weight), is probed one request at a time at a
bounded, deterministic rate once its ejection ends, re-enters warm once its probes show
its error rate's upper confidence bound under the limit (issue #31: three good probes used
to be enough), judged by what it did since probing began, and goes out for longer (never
past half a window) once its probes show it failing."""

from __future__ import annotations

import random

from sidecar.routing.decision import Decision
from sidecar.routing.ejection import (
    PROBE_INTERVAL,
    PROBE_SHARE,
    PROBE_SUCCESSES,
    Health,
    probe_pace,
)
from sidecar.routing.observations import TargetObservations
from sidecar.routing.router import Router
from sidecar.routing.thresholds import clean_answers_needed
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
# Good probes in a row that bring a target back (max_error_rate 0.03 at 0.95: 88).
NEEDED = clean_answers_needed(
    GROUP.models["g"].routing_policy.dynamic_score.thresholds, PROBE_SUCCESSES)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class View:
    """Observations by target: `figures[label]` is what the window shows; `arrive(label,
    figures)` adds evidence that `since` reports to tallies taken before it arrived."""

    def __init__(self) -> None:
        self.figures: dict[str, TargetObservations] = {}
        self.arrivals: dict[str, list[TargetObservations]] = {}

    def get(self, label: str, window: int) -> TargetObservations:
        return self.figures.get(label, TargetObservations())

    def arrive(self, label: str, count: int, **figures: float) -> None:
        self.arrivals.setdefault(label, []).append(TargetObservations(count=count, **figures))

    def tally(self, label: str) -> int:
        return len(self.arrivals.get(label, []))

    def since(self, label: str, tally: object) -> TargetObservations:
        assert isinstance(tally, int)
        after = self.arrivals.get(label, [])[tally:]
        count = sum(o.count for o in after)
        errors = sum(o.count * o.error_rate for o in after)
        return TargetObservations(count=count, error_rate=errors / count if count else 0.0)

    def retry_after_s(self, label: str) -> float:
        return 0.0


def setup() -> tuple[Router, Clock, View]:
    clock = Clock()
    view = View()
    view.figures = {"p/good": warm(50), SICK: warm(50, error_rate=0.2)}
    return Router(GROUP, clock), clock, view


def decide(router: Router, view: View) -> Decision:
    outcome = router.decide(request(), view)
    assert isinstance(outcome, Decision)
    return outcome


def probing(router: Router, clock: Clock, view: View) -> None:
    """Eject the sick target, let its bad evidence age out and its ejection end."""
    decide(router, view)
    clock.now += router.ejections("g").base_seconds + 1
    view.figures[SICK] = TargetObservations()


def test_a_drained_target_stays_out_after_its_evidence_ages_out() -> None:
    router, clock, view = setup()
    first = decide(router, view)
    assert (SICK, "thresholds.max_error_rate") in first.trace.exclusions
    view.figures[SICK] = TargetObservations()  # its bad evidence aged out: it looks cold
    clock.now += 1
    later = decide(router, view)
    assert (SICK, "thresholds.ejected") in later.trace.exclusions
    assert [c.label for c in later.ordered] == ["p/good", SICK]  # only as the last resort


def test_one_probe_at_a_time_in_one_decision_in_probe_interval_never_pinned() -> None:
    router, clock, view = setup()
    probing(router, clock, view)
    ejections = router.ejections("g")
    decisions = [decide(router, view) for _ in range(10 * PROBE_INTERVAL)]
    assert ejections.health(SICK, clock.now) is Health.PROBING
    probes = [d for d in decisions if d.trace.probe == SICK]
    assert len(probes) == 1  # its answer has not come back: no second probe
    assert decisions.index(probes[0]) == PROBE_INTERVAL - 1
    assert [c.label for c in probes[0].ordered] == [SICK, "p/good"]  # fallback follows
    assert {d.primary.label for d in decisions if d.trace.probe is None} == {"p/good"}
    # Unanswered for longer than the longest ejection: a failed probe, ejected again, and
    # probed afresh (its late answer is not in the new tally).
    clock.now += ejections.max_seconds + 0.5
    assert (SICK, "thresholds.ejected") in decide(router, view).trace.exclusions
    view.arrive(SICK, 1, error_rate=1.0)  # the late answer
    clock.now += ejections.max_seconds + 0.5
    # Out until its one probe is paid for (issue 41): PROBE_SHARE of the decisions since
    # it left, however long ago that was.
    held = [decide(router, view).trace.probe for _ in range(round(1 / PROBE_SHARE) - 102)]
    assert set(held) == {None}
    assert [decide(router, view).trace.probe for _ in range(PROBE_INTERVAL)].count(SICK) == 1
    # A good answer arrives: probes go at the faster pace it earned, as many as may be in
    # flight, and wait again.
    view.arrive(SICK, 1)
    later = [decide(router, view) for _ in range(3 * PROBE_INTERVAL)]
    assert [d.trace.probe for d in later].count(SICK) == probe_pace(1)[1] == 2


def test_a_probe_never_carries_a_pinned_conversations_turn() -> None:
    router, clock, view = setup()
    probing(router, clock, view)
    turn = request(conversation_key=b"k" * 32)
    first = router.decide(turn, view)  # pins the conversation to the usual pick
    assert isinstance(first, Decision) and first.primary.label == "p/good"
    follow_ups = [router.decide(turn, view) for _ in range(3 * PROBE_INTERVAL)]
    assert all(isinstance(d, Decision) and d.trace.probe is None
               and d.primary.label == "p/good" for d in follow_ups)
    # The probe waits for a request that is not a pinned turn.
    assert [decide(router, view).trace.probe for _ in range(PROBE_INTERVAL)].count(SICK) == 1


def test_a_first_turn_a_probe_carries_is_pinned_to_the_probe() -> None:
    """Issue 41: the pin recorded the rotation's pick while the probe served the first
    turn, so turn 2 moved to another target with a trace that said `hit`. The probe is the
    initially selected primary: turn 2 stays with it once it is back, and moves while it is
    still probing with a trace that says why."""
    router, clock, view = setup()
    probing(router, clock, view)
    for _ in range(PROBE_INTERVAL - 1):
        decide(router, view)  # the probe is due on the next request
    turn = request(conversation_key=b"c" * 32)
    first = router.decide(turn, view)
    assert isinstance(first, Decision) and first.trace.probe == SICK
    assert first.trace.affinity == "miss_created"
    # Still probing: the next turn moves, and its trace names the reason.
    second = router.decide(turn, view)
    assert isinstance(second, Decision) and second.primary.label == "p/good"
    assert second.trace.affinity == "ineligible_replaced"
    assert (SICK, "thresholds.probing") in second.trace.exclusions


def test_a_conversation_a_probe_began_stays_with_the_target_once_it_is_back() -> None:
    router, clock, view = setup()
    probing(router, clock, view)
    for _ in range(PROBE_INTERVAL - 1):
        decide(router, view)
    turn = request(conversation_key=b"d" * 32)
    first = router.decide(turn, view)
    assert isinstance(first, Decision) and first.trace.probe == SICK
    view.arrive(SICK, NEEDED)  # its probes' answers: all fine
    second = router.decide(turn, view)
    assert isinstance(second, Decision)
    assert router.ejections("g").health(SICK, clock.now) is Health.IN
    assert (second.primary.label, second.trace.affinity) == (SICK, "hit")


def test_evidence_from_before_probing_does_not_count() -> None:
    router, clock, view = setup()
    decide(router, view)  # ejected
    view.arrive(SICK, 5, error_rate=1.0)  # late replies to requests sent before the ejection
    clock.now += router.ejections("g").base_seconds + 1
    view.figures[SICK] = TargetObservations()
    decide(router, view)
    assert router.ejections("g").health(SICK, clock.now) is Health.PROBING


def test_good_probes_bring_it_back_at_once_warm_with_its_live_figures() -> None:
    router, clock, view = setup()
    probing(router, clock, view)
    ejections = router.ejections("g")
    decide(router, view)  # probing began (its tally is taken)
    view.figures[SICK] = warm(50, error_rate=0.2)  # the full window still remembers
    view.arrive(SICK, NEEDED)                     # what its probes did: all fine
    back = decide(router, view)
    assert ejections.health(SICK, clock.now) is Health.IN
    assert SICK in {c.label for c in back.ordered}
    assert not any(target == SICK for target, _ in back.trace.exclusions)
    # Warm at once (its live score, not its cold weight) and judged by what it did since
    # probing began, not by the old window.
    assert back.trace.cold_start == "all_warm"
    clock.now += 5
    again = decide(router, view)
    assert SICK in {c.label for c in again.ordered} and again.trace.cold_start == "all_warm"
    # A window later the group has nothing to remember (and decisions take the fast path).
    view.figures[SICK] = warm(50)
    clock.now += 30
    decide(router, view)
    assert ejections.idle


def test_a_failed_probe_ejects_it_again_for_longer_up_to_a_third_of_a_window() -> None:
    router, clock, view = setup()
    decide(router, view)
    ejections = router.ejections("g")
    lengths = []
    for _ in range(6):
        start = clock.now
        while ejections.health(SICK, clock.now) is Health.EJECTED:
            clock.now += 0.5
        lengths.append(clock.now - start)
        decide(router, view)          # probing begins
        view.arrive(SICK, 1, error_rate=1.0)  # its probe fails
        decide(router, view)          # the failed probe ejects it again
    base = ejections.base_seconds
    assert lengths[0] <= base + 0.5 and lengths[1] >= 2 * base - 0.5
    assert ejections.max_seconds == 10 and max(lengths) <= 10 + 0.5  # a third of 30 s
    assert lengths[-1] >= 10 - 0.5


def test_ejected_again_soon_after_reentry_continues_the_count() -> None:
    router, clock, view = setup()
    probing(router, clock, view)
    ejections = router.ejections("g")
    decide(router, view)
    view.arrive(SICK, NEEDED)
    decide(router, view)  # back
    view.arrive(SICK, 30, error_rate=0.5)  # sick again at once
    clock.now += 2
    decide(router, view)
    assert ejections.health(SICK, clock.now) is Health.EJECTED
    clock.now += ejections.base_seconds + 0.5
    assert ejections.health(SICK, clock.now) is Health.EJECTED  # the second ejection: 2×


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


def test_a_pin_to_a_target_that_gets_ejected_is_replaced_and_never_points_back() -> None:
    router, clock, view = setup()
    view.figures[SICK] = warm(50)  # healthy at first
    turn = request(conversation_key=b"c" * 32)
    for n in range(20):  # distinct conversations until the rotation picks the sick target
        first = router.decide(request(conversation_key=bytes([n]) * 32), view)
        assert isinstance(first, Decision)
        if first.primary.label == SICK:
            turn = request(conversation_key=bytes([n]) * 32)
            break
    else:
        raise AssertionError("the rotation never picked the sick target")
    view.figures[SICK] = warm(50, error_rate=0.2)  # it goes bad: ejected
    moved = router.decide(turn, view)
    assert isinstance(moved, Decision) and moved.primary.label == "p/good"
    assert moved.trace.affinity == "ineligible_replaced"
    # Ejected, then probing: the pin holds on the new target; no probe takes the turn.
    view.figures[SICK] = TargetObservations()
    for _ in range(3):
        clock.now += router.ejections("g").max_seconds + 1
        for _ in range(2 * PROBE_INTERVAL):
            again = router.decide(turn, view)
            assert isinstance(again, Decision) and again.primary.label == "p/good"
            assert again.trace.affinity == "hit" and again.trace.probe is None


def test_three_good_probes_are_not_enough_evidence() -> None:
    """Issue #31.3a: a target failing 10 % of its requests passed three probes in a row 73 %
    of the time and was re-admitted."""
    router, clock, view = setup()
    probing(router, clock, view)
    decide(router, view)
    view.arrive(SICK, PROBE_SUCCESSES)
    decide(router, view)
    assert router.ejections("g").health(SICK, clock.now) is Health.PROBING
    assert NEEDED == 88


def readmitted(error_rate: float, seed: int) -> bool:
    """One probing episode of a target failing `error_rate` of its requests: probes answered
    one by one (seeded) until it is ejected again or re-enters."""
    chance = random.Random(seed)
    router, clock, view = setup()
    probing(router, clock, view)
    ejections = router.ejections("g")
    decide(router, view)
    for _ in range(2000):
        health = ejections.health(SICK, clock.now)
        if health is not Health.PROBING:
            return health is Health.IN
        view.arrive(SICK, 1, error_rate=float(chance.random() < error_rate))
        decide(router, view)
    raise AssertionError("probing never concluded")


def test_probing_readmits_a_sick_target_rarely_and_a_healthy_one_mostly() -> None:
    sick = sum(readmitted(0.10, seed) for seed in range(200))
    healthy = sum(readmitted(0.005, seed) for seed in range(200))
    assert sick <= 4, sick          # was about 146 of 200 (0.9³ = 73 %)
    assert healthy >= 170, healthy


def test_probes_speed_up_as_good_answers_accumulate() -> None:
    """One in PROBE_INTERVAL decisions, one at a time at first; with evidence, faster and
    several in flight, so a recovered target is back within a window at a few requests a
    second."""
    router, clock, view = setup()
    probing(router, clock, view)
    first = [decide(router, view).trace.probe for _ in range(4 * PROBE_INTERVAL)]
    assert first.count(SICK) == 1  # its one probe is still unanswered
    view.arrive(SICK, 48)
    later = [decide(router, view).trace.probe for _ in range(40)]
    interval, in_flight = probe_pace(48)
    assert (interval, in_flight) == (2, 16)  # one in two decisions, up to 16 in flight
    assert later.count(SICK) == min(40 // interval, in_flight)
