"""One JSON line per routing decision on the `sidecar.decision` logger (opt-in:
`--log-decisions`), for operators and for end-to-end tests that check *why* a target won.

Only safe scalars: group and caller names, target labels, bucket names, scores and shares.
Never prompt text, tokens, token hashes or keys.
"""

from __future__ import annotations

import json
import logging

from sidecar.routing.decision import Decision, NoEligibleTarget

log = logging.getLogger("sidecar.decision")


def log_decision(outcome: Decision | NoEligibleTarget, caller: str) -> None:
    record: dict[str, object] = {"event": "decision", "group": outcome.group, "caller": caller}
    if isinstance(outcome, Decision):
        record["primary"] = outcome.primary.label
        record["fallbacks"] = [c.label for c in outcome.fallbacks]
    else:
        record["refused"] = True
    record["trace"] = outcome.trace.to_dict()
    log.info("%s", json.dumps(record, separators=(",", ":")))
