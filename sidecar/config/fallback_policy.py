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


@dataclass(frozen=True, order=True)
class RouteClass:
    """The route settings a group needs: groups that need the same share one route."""

    idle_timeout_s: float
    rate_limit_wait_s: float


DEFAULT_ROUTE_CLASS = RouteClass(DEFAULT_IDLE_TIMEOUT_S, 0.0)


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
    # Attempts at the same target after a failure that may not repeat (a 5xx or a 429 the
    # provider answered) before the next target is tried (within max_attempts and the
    # deadline): a one-off 500 on the best target costs a retry, not a dearer or slower
    # answer. A refusal, a timeout, a reset or no connection goes to the next target.
    retry_same_target: Annotated[NonNegativeInt, bounded(0, 3)] = 0
    # With retry_same_target: a provider's 429 whose `retry-after` is at most this is waited
    # out before the same target is tried again (0: retry after Envoy's short back-off).
    wait_for_retry_after_seconds: Annotated[NonNegativeFloat, bounded(0, 300)] = 0.0
    # How long a request may go without a byte either way (a stalled stream is cut then);
    # unset: 300 s, or per_try_timeout_seconds when longer (a non-streaming completion sends
    # nothing until it is done).
    stream_idle_timeout_seconds: Annotated[PositiveFloat, bounded(0.001, 86_400)] | None = None
    # Streams: the caller's response starts only with the target's first complete event, so
    # a target that fails, errors in-band or stays silent before it hands over
    # (docs/reply-gate.md). Costs a short gRPC exchange per stream, hence opt-in.
    commit_at_first_event: bool = False
    # With commit_at_first_event: how long a stream may take to its first event per attempt
    # (unset: per_try_timeout_seconds).
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
        if self.wait_for_retry_after_seconds and not self.retry_same_target:
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
        return RouteClass(self.idle_timeout_seconds, self.wait_for_retry_after_seconds)

    def attempt_order(self, targets: Sequence[T]) -> list[T]:
        """The attempts a decision's order allows, `max_attempts` in all. A decision of
        several targets but fewer attempts than that goes round them again for the
        attempts left, so one target's one-off failure after another's is retried, not
        answered (issue #31: with `max_attempts: 3`, [A, B] is A, B, A). A decision of one
        target gets a second attempt at it (`retries_lone_target`), on a route that
        retries only a failure of the provider's own (5xx, reset, no connection): retrying
        a lone provider that just answered 429 would only add load it asked not to get.

        `retry_same_target` does not repeat targets here: a repeat is earned by the
        failure, where Envoy holds the reply (issue 40: a refusal or a silent target is
        not worth a second try there). A held 5xx or 429 puts the same target next, at
        most `retry_same_target` times in a row (`same_target_next`,
        envoy_config/attempt_order_lua.py and gateway/reply_gate.py); a refusal, a
        timeout, a reset or no connection goes on to the next target of this order."""
        if self.retries_lone_target(len(targets)):
            return [targets[0], targets[0]]
        if len(targets) < 2:
            repeated = [target for target in targets for _ in range(self.retry_same_target + 1)]
            return repeated[:self.max_attempts]
        order = list(targets)
        while len(order) < self.max_attempts:
            order += order[:self.max_attempts - len(order)]
        return order[:self.max_attempts]

    def retries_lone_target(self, targets: int) -> bool:
        """A decision of one target, in a group that allows a second attempt and does not
        say how to retry the same target itself: one more try at it after a 5xx, a reset
        or no connection (issue #31: a quality floor that leaves one target turned its
        one-off 500s into client errors; the SDKs retry those too)."""
        return targets == 1 and self.retry_same_target == 0 and self.max_attempts >= 2

    @property
    def first_event_wait_seconds(self) -> float:
        """How long an attempt's stream may take to its first event."""
        return self.first_token_timeout_seconds or self.per_try_timeout_seconds
