"""`models.<group>.hedge`: hedged first tokens (docs/hedging.md). Opt-in per group: when
the primary has not answered by a deadline taken from its own rolling TTFB p95, Envoy
starts the same request on the decision's next target while the first keeps waiting; the
first to answer is served, the other cancelled."""

from __future__ import annotations

from typing import Annotated

from pydantic import model_validator

from sidecar.config.fields import PositiveFloat, PositiveInt, StrictModel, bounded


class HedgePolicy(StrictModel):
    # Extra upstream requests hedging may add, as a share of the group's requests. A
    # decision hedges only with a token from a bucket that fills by this share of each
    # decision; a request that ended on one attempt gives its token back.
    budget_percent: Annotated[PositiveFloat, bounded(0.1, 100)] = 5.0
    # The most hedging decisions in flight at once (the bucket's size): above the budget's
    # share, at most this many extra requests can start in a burst.
    burst: Annotated[PositiveInt, bounded(1, 10_000)] = 20
    # The deadline is the primary's p95 time to first byte over the group's observation
    # window (`dynamic_score.observation_window_seconds`), within these bounds; with fewer
    # than `dynamic_score.min_observations` it is max_deadline_seconds.
    min_deadline_ms: Annotated[PositiveInt, bounded(1, 3_600_000)] = 200
    # ... and at most this many times its median: a slow tail of about 5 % of requests
    # pulls the p95 into itself, and a deadline inside the tail hedges none of it.
    max_over_median: Annotated[PositiveFloat, bounded(1, 1_000)] = 4.0
    max_deadline_seconds: Annotated[PositiveFloat, bounded(0.001, 3_600)] = 10.0

    @model_validator(mode="after")
    def _bounds_in_order(self) -> HedgePolicy:
        if self.min_deadline_ms > self.max_deadline_seconds * 1000:
            raise ValueError("min_deadline_ms must not exceed max_deadline_seconds")
        return self
