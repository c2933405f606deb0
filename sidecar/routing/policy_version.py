"""`policy_version`: a short, stable name for a group's configuration, so a decision says
which policy made it, and replay and shadow comparisons say which policies they compare.

The SHA-256 of the group's configuration as canonical JSON (every key, defaults included,
sorted), first 12 hex digits. The same configuration gives the same version in every
replica and after every restart; any change to the group (a weight, a threshold, a score
term, a target) gives another. Prices are the targets' configuration, so they count too.
Nothing secret is in a group's configuration (keys live in `providers`), and a hash of it
reveals nothing but equality.
"""

from __future__ import annotations

import hashlib
import json

from sidecar.config.models import ModelGroup
from sidecar.config.rollout import Canary

VERSION_DIGITS = 12


def canary_version(canary: Canary) -> str:
    """A canary's identity: what its block changes (strategy, policy, weights, targets),
    not its share or guards, and not the live group it is added to. A withdrawal holds for
    this identity: an edit of the live side, its share or its guards does not bring a
    withdrawn candidate back; an edit of what it changes is a new canary."""
    canonical = json.dumps(canary.model_dump(mode="json", exclude={"share_percent", "guards"}),
                           sort_keys=True, separators=(",", ":"))
    return "c" + hashlib.sha256(canonical.encode()).hexdigest()[:VERSION_DIGITS - 1]


def policy_version(group: ModelGroup) -> str:
    """A `shadow` block is not part of the live policy (it decides nothing live), nor is a
    `rollout` block (its canary has a version of its own: `ModelGroup.canary_group`). Blocks
    added since versions were first given (`hedge`) count only when set, so a group that
    does not use them keeps its version across the upgrade."""
    left_out = ({"shadow", "rollout"} | ({"hedge"} if group.hedge is None else set()))
    canonical = json.dumps(group.model_dump(mode="json", exclude=left_out), sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:VERSION_DIGITS]
