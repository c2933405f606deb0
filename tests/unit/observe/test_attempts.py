"""Earlier failed attempts become observations and transitions; final attempts do not."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.observe.attempts import Attempt, AttemptTracker, Transition
from sidecar.observe.records import Outcome


def attempt(target: str, outcome: Outcome, request_id: str = "r1", group: str = "g") -> Attempt:
    return Attempt(request_id, group, target, outcome, 12.5)


def test_a_failure_followed_by_another_attempt_is_a_transition() -> None:
    tracker = AttemptTracker()
    assert tracker.add(attempt("p/a", Outcome.SERVER_ERROR)) == []
    transitions = tracker.add(attempt("p/b", Outcome.RATE_LIMITED))
    assert transitions == [Transition("g", "p/a", "p/b", "server_error", 1, 12.5)]
    assert tracker.add(attempt("p/c", Outcome.OK)) == [Transition(
        "g", "p/b", "p/c", "rate_limited", 2, 12.5)]
    # The answering attempt was in the per-attempt log (it carried a flag): the request's
    # own entry completes nothing more, and nothing is left waiting.
    assert tracker.answered("r1", "g", "p/c", 3) is None
    assert len(tracker) == 0


def test_the_transition_counts_against_the_failed_target_as_failed_over() -> None:
    transition = Transition("g", "p/a", "p/b", "upstream_timeout", 1, 500.0)
    observation = transition.observation()
    assert (observation.target, observation.outcome, observation.failed_over) == (
        "p/a", Outcome.UPSTREAM_TIMEOUT, True)
    assert transition.event() == {
        "event": "fallback_transition", "group": "g", "from_target": "p/a",
        "to_target": "p/b", "error_class": "upstream_timeout", "attempt": 1,
        "failed_after_ms": 500.0}


def test_a_final_attempt_is_never_a_transition() -> None:
    tracker = AttemptTracker()
    assert tracker.add(attempt("p/a", Outcome.OK)) == []
    assert tracker.add(attempt("p/a", Outcome.SERVER_ERROR, request_id="r2")) == []
    assert tracker.add(attempt("p/a", Outcome.CLIENT_CANCEL, request_id="r3")) == []
    assert tracker.add(attempt("p/x", Outcome.OK, request_id="r4")) == []


def test_attempts_without_a_request_id_are_ignored() -> None:
    tracker = AttemptTracker()
    assert tracker.add(attempt("p/a", Outcome.SERVER_ERROR, request_id="")) == []
    assert len(tracker) == 0


def test_entries_of_other_requests_do_not_pair_up() -> None:
    tracker = AttemptTracker()
    tracker.add(attempt("p/a", Outcome.SERVER_ERROR, request_id="r1"))
    assert tracker.add(attempt("p/b", Outcome.OK, request_id="r2")) == []
    assert tracker.add(attempt("p/b", Outcome.OK, request_id="r1")) != []
    # The requests' own entries (their last attempts were in the log: flagged).
    tracker.ended("r1", "g", 2)
    tracker.ended("r2", "g", 1)
    assert len(tracker) == 0


def test_a_hedges_cancelled_loser_leaves_nothing_waiting_in_either_order() -> None:
    """The loser is logged when the winner's headers arrive, the request's entry when the
    reply ends (usually later, but the streams interleave). The winner is never counted
    (access_log.py leaves it out, flagged or not)."""
    tracker = AttemptTracker()
    tracker.hedged_out("r1", "g")
    assert tracker.answered("r1", "g", "p/b", 2) is None
    assert tracker.answered("r2", "g", "p/b", 2) is None
    tracker.hedged_out("r2", "g")
    assert len(tracker) == 0


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 4),
                          st.sampled_from(list(Outcome))), max_size=500))
def test_pending_failures_stay_bounded(entries: list[tuple[int, int, Outcome]]) -> None:
    tracker = AttemptTracker(max_pending=50)
    for request, _, outcome in entries:
        tracker.add(attempt("p/a", outcome, request_id=str(request)))
        assert len(tracker) <= 50


def test_a_reused_request_id_never_pairs_with_a_stale_or_foreign_failure() -> None:
    now = [0.0]
    tracker = AttemptTracker(max_age_s=60, clock=lambda: now[0])
    tracker.add(attempt("p/a", Outcome.SERVER_ERROR))  # a final failure: nothing follows
    now[0] = 61.0
    assert tracker.add(attempt("p/b", Outcome.OK)) == []  # same id, a minute later
    tracker.ended("r1", "g", 1)
    assert len(tracker) == 0
    tracker.add(attempt("p/a", Outcome.SERVER_ERROR, request_id="r2", group="g"))
    assert tracker.add(attempt("p/x", Outcome.OK, request_id="r2", group="other")) == []


def test_the_requests_own_entry_completes_the_last_failure_in_either_order() -> None:
    """The per-attempt log leaves out the attempt that answered; the request's entry
    (its target, its attempt count) stands for it, whichever stream arrives first."""
    tracker = AttemptTracker()
    tracker.add(attempt("p/a", Outcome.SERVER_ERROR))
    assert tracker.answered("r1", "g", "p/b", 2) == Transition(
        "g", "p/a", "p/b", "server_error", 1, 12.5)
    # The request's entry first, then its two failures: A → B, then B → C.
    assert tracker.answered("r2", "g", "p/c", 3) is None
    assert tracker.add(attempt("p/a", Outcome.SERVER_ERROR, request_id="r2")) == []
    assert tracker.add(attempt("p/b", Outcome.RESET, request_id="r2")) == [
        Transition("g", "p/a", "p/b", "server_error", 1, 12.5),
        Transition("g", "p/b", "p/c", "reset", 2, 12.5)]
    assert len(tracker) == 0
    # Answered at the first attempt, or by a request of another group: nothing pairs.
    assert tracker.answered("r3", "g", "p/a", 1) is None
    tracker.add(attempt("p/a", Outcome.SERVER_ERROR, request_id="r4", group="g"))
    assert tracker.answered("r4", "other", "p/b", 2) is None


@given(failures=st.integers(1, 5), data=st.data())
def test_the_requests_own_entry_may_arrive_between_its_failures(failures: int,
                                                                  data: st.DataObject) -> None:
    """The two log streams interleave freely (a CI run saw the request's entry arrive
    after the first of two failures): the chain comes out whole and in order wherever the
    entry falls."""
    outcomes = [Outcome.SERVER_ERROR, Outcome.RATE_LIMITED, Outcome.RESET,
                Outcome.UPSTREAM_TIMEOUT, Outcome.SERVER_ERROR]
    targets = [f"p/t{n}" for n in range(failures + 1)]
    position = data.draw(st.integers(0, failures))
    tracker = AttemptTracker()
    transitions: list[Transition] = []
    for n in range(failures):
        if n == position:
            transitions += filter(None, [tracker.answered("r1", "g", targets[-1], failures + 1)])
        transitions += tracker.add(attempt(targets[n], outcomes[n]))
    if position == failures:
        transitions += filter(None, [tracker.answered("r1", "g", targets[-1], failures + 1)])
    assert transitions == [Transition("g", targets[n], targets[n + 1], outcomes[n].value,
                                      n + 1, 12.5) for n in range(failures)]
    assert len(tracker) == 0


@given(failures=st.integers(0, 4), last=st.sampled_from(["clean", "failed", "refused"]),
       data=st.data())
def test_every_chain_pairs_whole_and_leaves_nothing_in_any_order(
        failures: int, last: str, data: st.DataObject) -> None:
    """`failures` failed attempts, then a last one that answered cleanly (not in the
    per-attempt log: the request's entry says `answered`), failed, or was refused (a 4xx,
    in the log as no failure; the request's entry says `ended`). The request's entry may
    come anywhere among the per-attempt entries; review found markers and last failures
    left waiting for the whole window when it came early."""
    if failures == 0 and last == "clean":
        return  # one clean attempt: nothing is logged, nothing is paired
    targets = [f"p/t{n}" for n in range(failures + 1)]
    logged = [attempt(targets[n], Outcome.SERVER_ERROR) for n in range(failures)]
    if last != "clean":
        logged.append(attempt(targets[-1], Outcome.SERVER_ERROR if last == "failed"
                              else Outcome.CLIENT_ERROR))
    position = data.draw(st.integers(0, len(logged)))
    tracker = AttemptTracker()
    transitions: list[Transition] = []

    def request_entry() -> None:
        if last == "clean":
            transitions.extend(filter(None, [tracker.answered("r1", "g", targets[-1],
                                                              failures + 1)]))
        else:
            tracker.ended("r1", "g", failures + 1)

    for index, entry in enumerate(logged):
        if index == position:
            request_entry()
        transitions += tracker.add(entry)
    if position == len(logged):
        request_entry()
    assert transitions == [Transition("g", targets[n], targets[n + 1], "server_error",
                                      n + 1, 12.5) for n in range(failures)]
    assert len(tracker) == 0


def test_an_answering_attempt_logged_as_failed_is_never_paired_with_itself() -> None:
    tracker = AttemptTracker()
    tracker.add(attempt("p/a", Outcome.SERVER_ERROR))
    assert tracker.add(attempt("p/b", Outcome.RESET)) == [
        Transition("g", "p/a", "p/b", "server_error", 1, 12.5)]
    assert tracker.answered("r1", "g", "p/b", 2) is None
    assert len(tracker) == 0


def test_answers_waiting_for_their_failures_stay_bounded_and_expire() -> None:
    now = [0.0]
    tracker = AttemptTracker(max_pending=10, max_age_s=60, clock=lambda: now[0])
    for n in range(50):
        tracker.answered(f"r{n}", "g", "p/b", 2)
    assert len(tracker) == 10
    now[0] = 61.0
    tracker.add(attempt("p/a", Outcome.OK, request_id="x"))
    tracker.ended("x", "g", 1)
    assert len(tracker) == 0


def test_a_failure_pairs_the_same_whether_a_hedges_loser_or_the_request_comes_last() -> None:
    """Review: when the loser completed the count, the failure before it was dropped."""
    for request_first in (True, False):
        tracker = AttemptTracker()
        found: list[Transition] = []
        if request_first:
            found += filter(None, [tracker.answered("r1", "g", "p/c", 3)])
        found += tracker.add(attempt("p/a", Outcome.SERVER_ERROR))
        found += filter(None, [tracker.hedged_out("r1", "g")])
        if not request_first:
            found += filter(None, [tracker.answered("r1", "g", "p/c", 3)])
        assert found == [Transition("g", "p/a", "p/c", "server_error", 1, 12.5)]
        assert len(tracker) == 0
