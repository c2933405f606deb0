"""`sidecar replay`: re-decide every logged request of a window under a candidate
configuration and estimate what it would have done (docs/policy-evaluation.md §2).

All rows in decision order, every group on one observation state as the live store keeps
it (by target, across groups): the state is advanced to the decision's time (context.py),
with the rows of one retention window before the period fed to it first (so the period's
first decisions are not made on an empty store), the candidate's router decides the
request as the row describes it, and its probabilities for every target are paired with
the logged primary, its logged probability and its outcome (estimators.py). The
candidate's router keeps its own state over the replay (rotation, ejections, probes) on the
replayed clock. Conversation keys are never logged, so the candidate's affinity cannot
pin: a pinned logged turn is weighed by the logged odds of its target at that turn (what
the pin was drawn from), and compared with the candidate's fresh odds, which is what its
own pin would be drawn from (affinity churn)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sidecar.config.models import SidecarConfig
from sidecar.dialects.apis import Dialect
from sidecar.evaluation.context import ReplayClock, ReplayedObservations, summary_of
from sidecar.evaluation.estimators import Estimate, Sample, estimate, target_shares
from sidecar.evaluation.logged import FailedAttempt, LoggedDecision, MirroredAnswer
from sidecar.evaluation.odds import DRAWN, decision_odds, total_variation
from sidecar.routing.decision import Decision
from sidecar.routing.policy_version import policy_version
from sidecar.routing.router import Router

FIGURES = ("cost_usd", "latency_ms", "error_rate")
_DIALECTS = frozenset(d.value for d in Dialect)
# Why a logged row could not be evaluated.
NO_DECISION = "no_decision"            # answered before routing (a quota, a cache hit)
NO_ODDS = "logged_without_odds"        # logged before decisions carried their odds
NO_GROUP = "group_not_in_candidate"
REFUSED = "candidate_refuses"          # no eligible target under the candidate
NO_OUTCOME = "no_outcome"              # the decision's outcome never reached the log
LOGGED_REFUSED = "logged_refused"      # the logging policy found no eligible target
MALFORMED = "malformed_row"            # a row whose values are not what this version writes
Progress = Callable[[int, int], None]


@dataclass
class GroupReplay:
    group: str
    rows: int = 0
    evaluated: int = 0
    not_evaluated: Counter[str] = field(default_factory=Counter)
    logged_versions: Counter[str] = field(default_factory=Counter)
    candidate_version: str | None = None
    changed: float = 0.0                 # share of decisions with another primary (odds.py)
    pinned: int = 0
    churn: float | None = None           # the same over pinned (affinity hit) turns
    unlogged_mass: float = 0.0           # candidate probability on targets never logged
    # Candidate probability on targets the logging policy could not have chosen for that
    # request (logged probability 0): no estimator sees those outcomes in these rows.
    unsupported_mass: float = 0.0
    estimates: dict[str, Estimate | None] = field(default_factory=dict)
    logged_shares: dict[str, float] = field(default_factory=dict)
    candidate_shares: dict[str, float] = field(default_factory=dict)
    features_never_logged: tuple[str, ...] = ()
    # Shadow traffic's evidence (docs/rollout.md §4): candidate probability on targets the
    # logging policy did not send a request to but whose mirror answered it, and over the
    # rows where every target the candidate could pick has an answer (the live one or a
    # mirror's), the candidate's expected figure and the logged one: (n, candidate, logged).
    shadow_supported_mass: float = 0.0
    paired: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "group": self.group, "rows": self.rows, "evaluated": self.evaluated,
            "not_evaluated": dict(sorted(self.not_evaluated.items())),
            "logged_policy_versions": dict(self.logged_versions),
            "candidate_policy_version": self.candidate_version,
            "decisions_changed": self.changed, "pinned_turns": self.pinned,
            "affinity_churn": self.churn, "candidate_mass_on_unlogged_targets":
                self.unlogged_mass,
            "candidate_mass_without_support": self.unsupported_mass,
            "features_never_logged": list(self.features_never_logged),
            "target_shares": {"logged": self.logged_shares,
                              "candidate": self.candidate_shares},
            "estimates": {name: None if e is None else _estimate_dict(e)
                          for name, e in self.estimates.items()},
            "candidate_mass_with_shadow_support": self.shadow_supported_mass,
            "paired_with_shadow_traffic": {
                name: {"n": n, "candidate": candidate, "logged": logged}
                for name, (n, candidate, logged) in self.paired.items()},
        }


def _estimate_dict(e: Estimate) -> dict[str, object]:
    def pair(i):  # type: ignore[no-untyped-def]
        return {"value": _finite(i.value), "low": _finite(i.low), "high": _finite(i.high)}
    return {"n": e.n, "effective_n": e.effective_n, "logged": pair(e.logged),
            "ips": pair(e.ips), "snips": pair(e.snips), "dr": pair(e.dr),
            "delta": pair(e.delta)}


def _finite(value: float) -> float | None:
    """JSON has no infinities: an interval over one row is unbounded, said as null."""
    return value if math.isfinite(value) else None


def replay(candidate: SidecarConfig, decisions: Sequence[LoggedDecision],
           attempts: Sequence[FailedAttempt], confidence: float = 0.95,
           progress: Progress | None = None, since: float | None = None,
           group: str | None = None,
           mirrors: Mapping[str, Sequence[MirroredAnswer]] | None = None
           ) -> list[GroupReplay]:
    """One `GroupReplay` per logged group of the period (`group` only, if given), by name.
    Rows before `since` only feed the observation state. `mirrors`: shadow traffic's
    answers by live request id (logged.read_mirrors), evidence where the log has none."""
    start = since if since is not None else (decisions[0].at if decisions else 0.0)
    clock = ReplayClock(decisions[0].at if decisions else 0.0)
    observed = ReplayedObservations(candidate, clock, decisions, attempts)
    router = Router(candidate, clock=clock, wall_clock=clock)
    groups: dict[str, _GroupState] = {}
    evaluated = [row for row in decisions if row.at >= start
                 and (group is None or row.group == group)]
    total = len(evaluated)
    done = 0
    for row in decisions:
        observed.advance_to(row.at)
        if row.at < start or (group is not None and row.group != group):
            continue
        if progress is not None and done % 256 == 0:
            progress(done, total)
        done += 1
        state = groups.get(row.group)
        if state is None:
            state = groups[row.group] = _GroupState(candidate, row.group)
        state.take(row, router, observed, candidate, (mirrors or {}).get(row.request_id, ()))
    if progress is not None:
        progress(total, total)
    return [groups[name].finish(confidence) for name in sorted(groups)]


class _GroupState:
    """One group's replay as it goes: counts and samples, then its `GroupReplay`."""

    def __init__(self, candidate: SidecarConfig, group: str) -> None:
        self.report = GroupReplay(group)
        config_group = candidate.models.get(group)
        self.present = config_group is not None
        if config_group is not None:
            self.report.candidate_version = policy_version(config_group)
            self.wanted = {f.value for f in
                           config_group.dynamic_score.signals.prompt_features.features}
        self.samples: dict[str, list[Sample]] = {name: [] for name in FIGURES}
        self.every: list[Sample] = []
        self.changed = self.churn = self.unsupported = self.shadow_supported = 0.0
        self.paired: dict[str, list[tuple[float, float]]] = {name: [] for name in FIGURES}
        self.logged_targets: set[str] = set()
        self.unscanned = 0      # rows whose logging policy did not look for features
        self.found: set[str] = set()

    def take(self, row: LoggedDecision, router: Router, observed: ReplayedObservations,
             candidate: SidecarConfig, mirrored: Sequence[MirroredAnswer] = ()) -> None:
        report = self.report
        report.rows += 1
        if row.policy_version:
            report.logged_versions[row.policy_version] += 1
        if not self.present:
            report.not_evaluated[NO_GROUP] += 1
            return
        reason = _not_evaluable(row)
        if reason is not None:
            report.not_evaluated[reason] += 1
            return
        try:
            summary = summary_of(row, candidate)
        except (ValueError, TypeError):
            report.not_evaluated[MALFORMED] += 1
            return
        outcome = router.decide(summary, observed.store)
        if not isinstance(outcome, Decision):
            report.not_evaluated[REFUSED] += 1
            return
        assert row.selected is not None and row.probability is not None
        odds = decision_odds(outcome)
        logged = _logged_odds(row)
        propensity = _propensity(row, logged)
        moved = total_variation(logged, odds)
        self.changed += moved
        if row.affinity == "hit":
            report.pinned += 1
            self.churn += moved
        self.unsupported += sum(p for t, p in odds.items() if logged.get(t, 0.0) <= 0)
        if mirrored:
            self._pair(row, odds, logged, mirrored)
        self.logged_targets.add(row.selected)
        if row.scanned:
            self.found |= row.features
        else:
            self.unscanned += 1
        cell = f"{row.complexity or '-'}/{'stream' if row.shape.get('stream') else 'unary'}"
        self.every.append(Sample(row.selected, propensity, 0.0, odds, cell))
        for name, value in (("cost_usd", row.cost_usd), ("latency_ms", row.latency_ms),
                            ("error_rate", 1.0 if row.failed else 0.0)):
            if isinstance(value, int | float) and math.isfinite(value):
                self.samples[name].append(Sample(row.selected, propensity, float(value),
                                                 odds, cell))

    def _pair(self, row: LoggedDecision, odds: dict[str, float], logged: dict[str, float],
              mirrored: Sequence[MirroredAnswer]) -> None:
        """Shadow traffic's answers to this very request: where they cover every target
        the candidate could pick, its expected figures need no estimator."""
        answers = {m.candidate: (m.cost_usd, m.latency_ms, 1.0 if m.failed else 0.0)
                   for m in mirrored}
        self.shadow_supported += sum(p for t, p in odds.items()
                                     if logged.get(t, 0.0) <= 0 and t in answers)
        served = row.serving or row.selected
        if served is not None:  # what the caller got is the logged figure, mirrored or not
            answers[served] = (row.cost_usd, row.latency_ms, 1.0 if row.failed else 0.0)
        picked = [(t, p) for t, p in odds.items() if p > 0]
        if served is None or not all(t in answers for t, _ in picked):
            return
        own = answers[served]
        for index, name in enumerate(FIGURES):
            values = [answers[t][index] for t, _ in picked]
            if own[index] is None or any(v is None for v in values):
                continue
            expected = sum(p * v for (_, p), v in zip(picked, values, strict=True))
            self.paired[name].append((expected, float(own[index])))  # type: ignore[arg-type]

    def finish(self, confidence: float) -> GroupReplay:
        report = self.report
        n = len(self.every)
        report.evaluated = n
        report.paired = {name: (len(pairs), sum(c for c, _ in pairs) / len(pairs),
                                sum(v for _, v in pairs) / len(pairs))
                         for name, pairs in self.paired.items() if pairs}
        if n:
            report.changed = self.changed / n
            report.unsupported_mass = self.unsupported / n
            report.shadow_supported_mass = self.shadow_supported / n
            report.unlogged_mass = sum(
                p for s in self.every for t, p in s.candidate.items()
                if t not in self.logged_targets) / n
        report.churn = self.churn / report.pinned if report.pinned else None
        report.estimates = {name: estimate(found, confidence)
                            for name, found in self.samples.items()}
        report.logged_shares, report.candidate_shares = target_shares(self.every)
        if self.present:
            if self.unscanned:  # a logging policy that never looked: every wanted feature
                report.features_never_logged = tuple(sorted(self.wanted))
            elif self.found:
                report.features_never_logged = tuple(sorted(self.wanted - self.found))
        return report


def _logged_odds(row: LoggedDecision) -> dict[str, float]:
    """The logging policy's probability of each target for this request: the logged odds,
    or certainty of the logged primary when it chose without chance."""
    if row.reason in (*DRAWN, "pin") and row.odds:  # a pin was drawn from these odds
        return row.odds
    return {row.selected or "": 1.0}


def _propensity(row: LoggedDecision, logged: dict[str, float]) -> float:
    """The logged primary's probability: as logged, except a pinned turn's, which is 1 in
    the row (the pin chose it) but was drawn at the conversation's first turn from odds
    like these (no weight could be formed from 1 otherwise: IPS would be biased on
    multi-turn traffic)."""
    if row.reason == "pin" and row.selected in logged and logged[row.selected] > 0:
        return logged[row.selected]
    return row.probability or 1.0


def _not_evaluable(row: LoggedDecision) -> str | None:
    if not row.strategy:
        return NO_DECISION
    if row.selected is None:
        return LOGGED_REFUSED
    if row.probability is None or row.probability <= 0:
        return NO_ODDS
    if row.shape.get("dialect", "openai_chat") not in _DIALECTS:
        return MALFORMED
    if row.status is None:
        return NO_OUTCOME
    return None
