"""The rest of a request's attempt order, rewritten by what an attempt's reply said
(docs/fallback-and-streaming.md, "The same target, where the group says so").

Envoy's priority-group cluster specifier picks attempt n's cluster as the n-th entry of the
request's `sidecar.route` metadata, read again on every retry. The decision's order never
repeats a target (config/fallback_policy.py); where a reply is held before the router sees
it, the order is rewritten for the next attempts:

- a 5xx, or a 429 whose `retry-after` the group waits out — failures that may not repeat
  — puts the same target next, at most `retry_same_target` times in a row
  (`order_after_failure`, `earns_same_target`); a 429 that names no wait, or a longer
  one, goes to the next target at once (the same target asked not to be called);
- a refusal of the request itself (a context-length refusal of the refusal catalogue)
  drops the refusing target from the rest of the order (`order_after_refusal`).

A timeout, a reset or no connection leaves no reply to hold, so the order goes on as it
was: to the next target. The hold's Lua applies the same two rules
(envoy_config/attempt_order_lua.py; tests/unit/test_attempt_order_after_refusal.py runs
both on the same orders). The order keeps its length: Envoy fixed the number of retries at
the start, and a shorter order would wrap round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttemptOrder:
    """A request's attempt order as Envoy holds it: the clusters, and how many times in a
    row a held 5xx or 429 may repeat a target (the group's `retry_same_target`)."""

    clusters: tuple[str, ...] = ()
    same_target_retries: int = 0
    # The longest `retry-after` of a 429 that still puts the same target next (the
    # group's `wait_for_retry_after_seconds`; Envoy's back-off waits it out).
    same_target_wait_s: float = 0.0
    # Seconds the first attempt's stream may take to its first event (0: the group's wait).
    first_event_deadline_s: float = 0.0


def retry_after_seconds(value: str | None) -> float | None:
    """A `retry-after` in seconds as Envoy's rate-limited back-off reads it (whole
    seconds); None for anything else (an HTTP date, a fraction), which Envoy does not wait
    for either."""
    text = (value or "").strip(" \t")
    if not (text.isascii() and text.isdigit()):
        return None
    return float(text)


def earns_same_target(status: int, retry_after_s: float | None, wait_s: float) -> bool:
    """Whether a failed attempt's reply may put its target next: a 5xx may not repeat; a
    429 only when it names a wait (`retry_after_s`, the `retry-after` Envoy's back-off
    reads) of at most `wait_s`, which Envoy waits out first. A 429 that names none, or a
    longer one, would only be answered 429 again (or wait the caller out): the next target
    is tried at once."""
    if 500 <= status < 600:
        return True
    return status == 429 and retry_after_s is not None and 0 <= retry_after_s <= wait_s


def order_after_refusal(order: Sequence[str], attempt: int) -> tuple[str, ...] | None:
    """The order once the target of attempt `attempt` (1-based) refused the request
    itself: the later entries naming it are dropped and the last remaining one fills the
    order back to its length. None: no other target is left, the refusal is not retried.
    An attempt outside the order leaves it as it is (retried as before)."""
    if not 1 <= attempt <= len(order):
        return tuple(order)
    refused = order[attempt - 1]
    rest = [cluster for cluster in order[attempt:] if cluster != refused]
    if not rest:
        return None
    kept = [*order[:attempt], *rest]
    return tuple(kept + [rest[-1]] * (len(order) - len(kept)))


def order_after_failure(order: Sequence[str], attempt: int,
                        same_target_retries: int) -> tuple[str, ...]:
    """The order once the target of attempt `attempt` failed in a way that may not repeat:
    the same target next, unless it already had `same_target_retries` tries in a row after
    its first, then the order as it was."""
    if not 1 <= attempt <= len(order) or same_target_retries < 1 or attempt == len(order):
        return tuple(order)
    failed = order[attempt - 1]
    run = 0
    for cluster in reversed(order[:attempt]):
        if cluster != failed:
            break
        run += 1
    if run > same_target_retries:
        return tuple(order)
    return tuple([*order[:attempt], failed, *order[attempt:]][:len(order)])
