"""How long a stream's primary may take to its first event before its request moves on
(issue 40: a slow first token is rescued by default; docs/fallback-and-streaming.md,
"Defaults").

A fixed first-token timeout is not a safe default: a long prompt's prefill, a queue behind
an engine's slots or a model's hidden reasoning is a legitimately late first event, and
Envoy's per-try timeout cuts every attempt, the last one included. So the default deadline
is the primary's own: several times the time to first byte it has shown lately, plus time
to read a long prompt, and only where the request has somewhere else to go:

- only the first attempt, and only when a different target follows it (a later attempt,
  the last above all, waits as long as the group's first-token wait);
- only a target with evidence (`MIN_EVIDENCE` replies in the window): a cold target, whose
  normal first-token time is unknown, gets none;
- never where the operator set `first_token_timeout_seconds` (their deadline, on every
  attempt) or turned `commit_at_first_event` off (nothing holds the caller's headers).

The reply gate (extproc/processor.py) answers a stream still without its first event at
the deadline as a retriable failure, so the router moves the request on; the primary's
slow first token is then an observation like any timeout.
"""

from __future__ import annotations

import math

from sidecar.config.fallback_policy import Fallback
from sidecar.routing.observations import TargetObservations

# A reply within this many times the target's recent p95 time to first byte is normal.
P95_FACTOR = 4.0
# ...and never less than this: a first event within it is never moved.
FLOOR_SECONDS = 5.0
# Reading the prompt: at least this many input tokens a second (hosted models and engines
# on accelerators read thousands), so a long prompt's prefill gets its time.
PREFILL_TOKENS_PER_SECOND = 2_000
# Replies in the window before a target's first-byte time counts as known.
MIN_EVIDENCE = 20


def primary_deadline_s(fallback: Fallback, observed: TargetObservations,
                       input_tokens: int) -> int | None:
    """Whole seconds the primary may take to its first event, or None for no deadline of
    its own (the group's first-token wait applies). Whole seconds, rounded up: the value
    travels with the attempt order, whose encodings are kept per distinct value."""
    if not fallback.commit_at_first_event or fallback.first_token_timeout_seconds is not None:
        return None
    if observed.count < MIN_EVIDENCE or observed.p95_ttfb_ms is None:
        return None
    seconds = max(FLOOR_SECONDS, P95_FACTOR * observed.p95_ttfb_ms / 1000)
    seconds += max(0, input_tokens) / PREFILL_TOKENS_PER_SECOND
    deadline = math.ceil(seconds)
    return deadline if deadline < fallback.first_event_wait_seconds else None
