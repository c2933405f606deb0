"""Which side of a group's canary decides a request (config/rollout.py, docs/rollout.md).

Pure and deterministic, so a decision stays reproducible from configuration, state and
request. A request with a conversation goes by its opening's digest: every turn of the
conversation, on every replica, lands on the same side, so a conversation pinned by the
canary's candidate keeps its pin for as long as the canary serves. A request without one
(no messages to key on, or an explicit stateful session) takes one in every 100/n.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.routing.request import RequestSummary

# The trace's and rows' names for the side (DecisionTrace.canary).
CANARY, LIVE, WITHDRAWN = "canary", "live", "withdrawn"
_SPAN = 1 << 64


@dataclass(slots=True)
class CanarySplit:
    """`share`: the fraction (0–0.5) of requests the candidate decides; `version`: the
    canary's identity (policy_version.canary_version), what a withdrawal holds for;
    `policy_version`: the candidate group's, what its decisions say decided them.
    `withdrawn`: set once, by the guard (rollout/canary_guard.py); never cleared — a
    withdrawn canary comes back only as another canary (another identity)."""

    share: float
    version: str
    policy_version: str = ""
    withdrawn: bool = False
    _credit: int = field(default=0, repr=False)

    def side(self, request: RequestSummary) -> str:
        """CANARY, LIVE, or WITHDRAWN for a request the candidate would have decided."""
        key = request.conversation_key
        if key is not None:
            taken = int.from_bytes(key[:8], "big") < self.share * _SPAN
        else:
            self._credit += round(self.share * 100_000)  # exact: in 1/1000 %
            taken = self._credit >= 100_000
            if taken:
                self._credit -= 100_000
        if not taken:
            return LIVE
        return WITHDRAWN if self.withdrawn else CANARY
