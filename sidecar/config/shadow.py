"""`models.<group>.shadow`: a candidate policy computed beside every live decision of the
group and never acted on (docs/policy-evaluation.md §3). It names only what differs from
the group: another strategy, another routing policy, other target weights."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sidecar.config.fields import NonNegativeInt, StrictModel, bounded
from sidecar.config.policy import RoutingPolicy


class ShadowPolicy(StrictModel):
    # Unset: the group's own. `script` and `external` are left out: a shadow must not
    # call an operator's routing service, and rules are a group's own decisions.
    strategy: Literal["weighted", "failover", "dynamic_score"] | None = None
    routing_policy: RoutingPolicy | None = None
    # Target label (`provider/model_ref`) → weight, for the targets whose weight differs.
    weights: dict[str, NonNegativeInt] = Field(default_factory=dict)
    # The share of the group's decisions that are also decided under the shadow (a
    # deterministic one in every 100/n, not a draw); 100: all of them.
    sample_percent: Annotated[float, bounded(0.1, 100)] = 100.0
