"""`models.<group>.fallback`: how a request survives a failing target before the caller has a
byte (docs/fallback-and-streaming.md), and the Envoy route settings a group's policy needs
(its route class: the idle timeout and the rate-limited retry back-off, which Envoy takes
from the route, not from a request)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, TypeVar

from pydantic import model_validator

from sidecar.config.fields import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    bounded,
)

T = TypeVar("T")

# Envoy's own default stream idle timeout (5 minutes).
DEFAULT_IDLE_TIMEOUT_S = 300.0
# The longest `retry-after` a 429 may name and still be waited out before the same target
# is tried again, unless a group says otherwise (issue 40, docs/fallback-and-streaming.md,
# "Defaults"): short enough that a target which keeps refusing costs the caller at most
# twice this before the next target, long enough for a provider's one-off burst limit.
DEFAULT_RETRY_AFTER_WAIT_S = 2.0


@dataclass(frozen=True, order=True)
class RouteClass:
    """The route settings a group needs: groups that need the same share one route."""

    idle_timeout_s: float
    rate_limit_wait_s: float


# The route of groups with the default settings (the catch-all route).
DEFAULT_ROUTE_CLASS = RouteClass(DEFAULT_IDLE_TIMEOUT_S, DEFAULT_RETRY_AFTER_WAIT_S)


class Fallback(StrictModel):
    """Pre-commit fallback across the decision's targets (docs/fallback-and-streaming.md).

    A failed attempt (connect failure, reset, 429, 5xx, per-try timeout) moves the request
    to the next target of the decision, but only before the response has started; Envoy
    never retries once a byte went to the caller."""

    # Primary included: 3 means the primary and at most two fallbacks; 1 turns fallback off.
    max_attempts: Annotated[PositiveInt, bounded(1, 10)] = 3
    # Time to the response headers of one attempt. A non-streaming completion sends its
    # headers only when it is done, so this also bounds unary generation time per attempt.
    per_try_timeout_seconds: Annotated[PositiveFloat, bounded(0.001, 86_400)] = 300.0
    # The whole request, streams included; unset means `limits.request_timeout_seconds`.
    deadline_seconds: Annotated[PositiveFloat, bounded(0.001, 86_400)] | None = None
    # Attempts at the same target after a failure that may not repeat (a 5xx, or a 429 whose
    # `retry-after` is within wait_for_retry_after_seconds) before the next target is tried
    # (within max_attempts and the deadline): a one-off 500 on the best target costs a
    # retry, not a dearer or slower answer. A refusal, a timeout, a reset, no connection or
    # a 429 naming no wait or a longer one goes to the next target. Default 1 (issue 40).
    retry_same_target: Annotated[NonNegativeInt, bounded(0, 3)] = 1
    # With retry_same_target: a provider's 429 whose `retry-after` is at most this is waited
    # out before the same target is tried again; a 429 that names no wait or a longer one
    # goes to the next target at once.
    wait_for_retry_after_seconds: Annotated[NonNegativeFloat, bounded(0, 300)] = (
        DEFAULT_RETRY_AFTER_WAIT_S)
    # How long a request may go without a byte either way (a stalled stream is cut then);
    # unset: 300 s, or per_try_timeout_seconds when longer (a non-streaming completion sends
    # nothing until it is done).
    stream_idle_timeout_seconds: Annotated[PositiveFloat, bounded(0.001, 86_400)] | None = None
    # Streams: the caller's response starts only with the target's first complete event, so
    # a target that fails, errors in-band or stays silent before it is not the caller's
    # problem while another target may serve (docs/reply-gate.md). Costs a short gRPC
    # exchange per stream (measured in docs/performance.md); on by default (issue 40).
    commit_at_first_event: bool = True
    # With commit_at_first_event: how long a stream may take to its first event per attempt
    # (unset: per_try_timeout_seconds; no default of its own: a long prompt's prefill or a
    # model's hidden reasoning is a legitimately late first event, and the limit applies to
    # every attempt, the last one included; docs/fallback-and-streaming.md, "Defaults").
    first_token_timeout_seconds: Annotated[PositiveFloat, bounded(0.001, 3_600)] | None = None

    @model_validator(mode="after")
    def _per_try_within_deadline(self) -> Fallback:
        if self.deadline_seconds is not None and (
                self.per_try_timeout_seconds > self.deadline_seconds):
            raise ValueError("per_try_timeout_seconds must not exceed deadline_seconds")
        if self.first_token_timeout_seconds is not None and not self.commit_at_first_event:
            raise ValueError("first_token_timeout_seconds needs commit_at_first_event: true "
                             "(a stream's first event can be waited for only while the "
                             "caller has not been answered)")
        if (self.first_token_timeout_seconds is not None and self.deadline_seconds is not None
                and self.first_token_timeout_seconds > self.deadline_seconds):
            raise ValueError("first_token_timeout_seconds must not exceed deadline_seconds")
        # The wait's default is ignored where retry_same_target is 0; a wait set alongside
        # it is a contradiction.
        if (self.wait_for_retry_after_seconds and not self.retry_same_target
                and "wait_for_retry_after_seconds" in self.model_fields_set):
            raise ValueError("wait_for_retry_after_seconds needs retry_same_target of 1 or "
                             "more (the wait is before trying the same target again)")
        return self

    @property
    def idle_timeout_seconds(self) -> float:
        """`stream_idle_timeout_seconds`, resolved."""
        return self.stream_idle_timeout_seconds or max(DEFAULT_IDLE_TIMEOUT_S,
                                                       self.per_try_timeout_seconds)

    @property
    def route_class(self) -> RouteClass:
        """What the group needs of Envoy's route (the route's retry back-off and idle
        timeout cannot be set per request)."""
        return RouteClass(self.idle_timeout_seconds, self.same_target_wait_seconds)

    @property
    def same_target_wait_seconds(self) -> float:
        """The longest `retry-after` waited out before the same target is tried again (0
        where the group never retries the same target: a wait before another target
        would be wasted)."""
        return self.wait_for_retry_after_seconds if self.retry_same_target else 0.0

    def attempt_order(self, targets: Sequence[T]) -> list[T]:
        """The attempts a decision's order allows, `max_attempts` in all. A decision of
        several targets but fewer attempts than that goes round them again for the
        attempts left, so one target's one-off failure after another's is retried, not
        answered (issue #31: with `max_attempts: 3`, [A, B] is A, B, A). A decision of one
        target gets a second attempt at it (`retries_lone_target`; as many as
        `retry_same_target` allows, if more), on a route that retries only a failure of the
        provider's own (5xx, reset, no connection, timeout): retrying a lone provider that
        just answered 429 would only add load it asked not to get, and its caller's SDK
        waits out the `retry-after` itself.

        `retry_same_target` does not repeat targets here: a repeat is earned by the
        failure, where Envoy holds the reply (issue 40: a refusal or a silent target is
        not worth a second try there). A held 5xx, or a 429 whose `retry-after` is within
        `wait_for_retry_after_seconds`, puts the same target next, at most
        `retry_same_target` times in a row (`same_target_next`,
        envoy_config/attempt_order_lua.py and gateway/reply_gate.py); a refusal, a
        timeout, a reset or no connection goes on to the next target of this order."""
        if self.retries_lone_target(len(targets)):
            return [targets[0]] * min(self.max_attempts, 1 + max(1, self.retry_same_target))
        order = list(targets)
        while order and len(order) < self.max_attempts:
            order += order[:self.max_attempts - len(order)]
        return order[:self.max_attempts]

    def retries_lone_target(self, targets: int) -> bool:
        """A decision of one target, in a group that allows a second attempt: more tries
        at it after a 5xx, a reset, no connection or a timeout, never after a 429 or a
        refusal (issue #31: a quality floor that leaves one target turned its one-off 500s
        into client errors; the SDKs retry those too). Whatever `retry_same_target` says:
        the group's own route would retry a lone target's 429 at once (issue 40)."""
        return targets == 1 and self.max_attempts >= 2

    @property
    def first_event_wait_seconds(self) -> float:
        """How long an attempt's stream may take to its first event."""
        return self.first_token_timeout_seconds or self.per_try_timeout_seconds
