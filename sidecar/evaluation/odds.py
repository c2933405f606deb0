"""A decision's odds as a distribution over targets, and how far two such distributions
are apart: what replay and shadow policies compare (docs/policy-evaluation.md)."""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.routing.decision import Decision

# Reasons a primary was drawn by shares (its odds are the distribution); any other reason
# (a pin, a probe, a declared order, a rule, an external answer) chose it with certainty.
DRAWN = ("blend", "weights")


def decision_odds(decision: Decision) -> dict[str, float]:
    """Each target's probability of being this decision's primary."""
    trace = decision.trace
    if trace.selection is not None and trace.selection[1] in DRAWN and trace.odds:
        return dict(trace.odds)
    return {decision.primary.label: 1.0}


def total_variation(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """The least share of decisions whose primary differs between two policies with these
    odds, whatever the draws (0 for the same odds, 1 for disjoint ones)."""
    return 0.5 * sum(abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in {*a, *b})
