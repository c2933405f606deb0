"""`sidecar replay`: re-decide every logged request of a window under a candidate
configuration and estimate what it would have done (docs/policy-evaluation.md §2).

Per group, in decision order: the observation state is advanced to the decision's time
(context.py), the candidate's router decides the request as the row describes it, and its
probabilities for every target are paired with the logged primary, its logged probability
and its outcome (estimators.py). The candidate's router keeps its own state over the replay
(rotation, ejections, probes) on the replayed clock. Conversation keys are never logged, so
the candidate's affinity cannot pin; a pinned logged turn is compared with the candidate's
fresh odds, which is what its pin would have been made from (affinity churn)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sidecar.config.models import SidecarConfig
from sidecar.evaluation.context import ReplayClock, ReplayedObservations, summary_of
from sidecar.evaluation.estimators import Estimate, Sample, estimate, target_shares
from sidecar.evaluation.logged import FailedAttempt, LoggedDecision
from sidecar.routing.decision import Decision
from sidecar.routing.policy_version import policy_version
from sidecar.routing.router import Router

FIGURES = ("cost_usd", "latency_ms", "error_rate")
# Why a logged row could not be evaluated.
NO_DECISION = "no_decision"            # answered before routing (a quota, a cache hit)
NO_ODDS = "logged_without_odds"        # logged before decisions carried their odds
NO_GROUP = "group_not_in_candidate"
REFUSED = "candidate_refuses"          # no eligible target under the candidate
NO_OUTCOME = "no_outcome"              # the decision's outcome never reached the log
Progress = Callable[[int, int], None]


@dataclass
class GroupReplay:
    group: str
    rows: int = 0
    evaluated: int = 0
    not_evaluated: Counter[str] = field(default_factory=Counter)
    logged_versions: Counter[str] = field(default_factory=Counter)
    candidate_version: str | None = None
    changed: float = 0.0                 # share of decisions with another primary (_moved)
    pinned: int = 0
    churn: float | None = None           # the same over pinned (affinity hit) turns
    unlogged_mass: float = 0.0           # candidate probability on targets never logged
    estimates: dict[str, Estimate | None] = field(default_factory=dict)
    logged_shares: dict[str, float] = field(default_factory=dict)
    candidate_shares: dict[str, float] = field(default_factory=dict)
    features_never_logged: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "group": self.group, "rows": self.rows, "evaluated": self.evaluated,
            "not_evaluated": dict(sorted(self.not_evaluated.items())),
            "logged_policy_versions": dict(self.logged_versions),
            "candidate_policy_version": self.candidate_version,
            "decisions_changed": self.changed, "pinned_turns": self.pinned,
            "affinity_churn": self.churn, "candidate_mass_on_unlogged_targets":
                self.unlogged_mass,
            "features_never_logged": list(self.features_never_logged),
            "target_shares": {"logged": self.logged_shares,
                              "candidate": self.candidate_shares},
            "estimates": {name: None if e is None else _estimate_dict(e)
                          for name, e in self.estimates.items()},
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
           progress: Progress | None = None) -> list[GroupReplay]:
    """One `GroupReplay` per logged group, by name."""
    by_group: dict[str, list[LoggedDecision]] = defaultdict(list)
    for row in decisions:
        by_group[row.group].append(row)
    failed: dict[str, list[FailedAttempt]] = defaultdict(list)
    for attempt in attempts:
        failed[attempt.group].append(attempt)
    done, total = 0, len(decisions)
    reports = []
    for group in sorted(by_group):
        rows = by_group[group]
        reports.append(_replay_group(candidate, group, rows, failed[group], confidence,
                                     progress, done, total))
        done += len(rows)
    if progress is not None:
        progress(total, total)
    return reports


def _replay_group(candidate: SidecarConfig, group: str, rows: list[LoggedDecision],
                  attempts: list[FailedAttempt], confidence: float,
                  progress: Progress | None, done: int, total: int) -> GroupReplay:
    report = GroupReplay(group, rows=len(rows))
    for row in rows:
        if row.policy_version:
            report.logged_versions[row.policy_version] += 1
    config_group = candidate.models.get(group)
    if config_group is None:
        report.not_evaluated[NO_GROUP] = len(rows)
        return report
    report.candidate_version = policy_version(config_group)
    clock = ReplayClock(rows[0].at if rows else 0.0)
    observed = ReplayedObservations(candidate, clock, rows, attempts)
    router = Router(candidate, clock=clock, wall_clock=clock)
    samples: dict[str, list[Sample]] = {name: [] for name in FIGURES}
    every: list[Sample] = []
    changed = churn = 0.0
    logged_targets = {row.selected for row in rows if row.selected}
    unlogged = 0.0
    scanned = set(config_group.dynamic_score.signals.prompt_features.features)
    for position, row in enumerate(rows):
        if progress is not None and position % 256 == 0:
            progress(done + position, total)
        observed.advance_to(row.at)
        reason = _not_evaluable(row)
        if reason is not None:
            report.not_evaluated[reason] += 1
            continue
        outcome = router.decide(summary_of(row, candidate), observed.store)
        if not isinstance(outcome, Decision):
            report.not_evaluated[REFUSED] += 1
            continue
        odds = _candidate_odds(outcome)
        assert row.selected is not None and row.probability is not None
        moved = _moved(row, odds)
        changed += moved
        if row.affinity == "hit":
            report.pinned += 1
            churn += moved
        unlogged += sum(p for t, p in odds.items() if t not in logged_targets)
        cell = f"{row.complexity or '-'}/{'stream' if row.shape.get('stream') else 'unary'}"
        base = Sample(row.selected, row.probability, 0.0, odds, cell)
        every.append(base)
        for name, value in (("cost_usd", row.cost_usd), ("latency_ms", row.latency_ms),
                            ("error_rate", 1.0 if row.failed else 0.0)):
            if value is not None:
                samples[name].append(Sample(row.selected, row.probability, float(value), odds,
                                            cell))
    report.evaluated = len(every)
    if every:
        report.changed = changed / len(every)
        report.unlogged_mass = unlogged / len(every)
    report.churn = churn / report.pinned if report.pinned else None
    report.estimates = {name: estimate(found, confidence) for name, found in samples.items()}
    report.logged_shares, report.candidate_shares = target_shares(every)
    wanted = {f.value for f in scanned}
    logged_scan = _logged_scan(rows)
    report.features_never_logged = tuple(sorted(wanted - logged_scan)) if logged_scan else ()
    return report


def _moved(row: LoggedDecision, odds: dict[str, float]) -> float:
    """The share of such decisions whose primary would change: the total variation distance
    between the logged odds and the candidate's (the least that must move, whatever the
    draw; 0 for the same policy), or, without logged odds, the candidate's chance of not
    picking the logged primary."""
    logged = row.odds
    if not logged:
        return 1.0 - odds.get(row.selected or "", 0.0)
    return 0.5 * sum(abs(logged.get(t, 0.0) - odds.get(t, 0.0)) for t in {*logged, *odds})


def _not_evaluable(row: LoggedDecision) -> str | None:
    if not row.strategy or row.selected is None:
        return NO_DECISION
    if row.probability is None or row.probability <= 0:
        return NO_ODDS
    if row.status is None:
        return NO_OUTCOME
    return None


def _candidate_odds(decision: Decision) -> dict[str, float]:
    """The candidate's probability of each target being the primary: its odds, or
    certainty where it chose without chance (a probe, a failover order, a rule)."""
    trace = decision.trace
    selection = trace.selection
    if selection is not None and selection[1] in ("blend", "weights", "pin") and trace.odds:
        return dict(trace.odds)
    return {decision.primary.label: 1.0}


def _logged_scan(rows: Sequence[LoggedDecision]) -> set[str]:
    """Features the logging policy could have found (those it ever found): a candidate that
    looks for others cannot be replayed on them. Empty when none was ever found."""
    found: set[str] = set()
    for row in rows:
        found |= row.features
    return found
