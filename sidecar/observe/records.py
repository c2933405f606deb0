"""One observation: what happened to one request at one target, as safe scalars."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.routing.observations import REFERENCE_OUTPUT_TOKENS


class Outcome(StrEnum):
    """How a request ended at its target (the classification table of docs/observations.md)."""

    OK = "ok"
    RATE_LIMITED = "rate_limited"          # HTTP 429
    SERVER_ERROR = "server_error"          # HTTP 5xx (529 overload included)
    PROVIDER_REJECTED = "provider_rejected"  # 401/403/404 from the provider: our key or
    #                                        model_ref is wrong there, not the caller's request
    CLIENT_ERROR = "client_error"          # other HTTP 4xx: the request, not the target
    CONNECT_FAILURE = "connect_failure"    # no connection / no healthy upstream
    RESET = "reset"                        # upstream reset or terminated the stream
    UPSTREAM_TIMEOUT = "upstream_timeout"  # route or per-try timeout, stream idle timeout
    DECODE_ERROR = "decode_error"          # upstream protocol error
    INVALID_RESPONSE = "invalid_response"  # a 2xx whose body is not what the dialect promises
    #                                        (an error object, HTML, garbage SSE)
    CLIENT_CANCEL = "client_cancel"        # the caller went away first
    CONTEXT_WINDOW = "context_window"      # a 400 refusing the prompt as too long for the
    #                                        target's window; another target may take it
    HEDGED_OUT = "hedged_out"              # cancelled unanswered: the other attempt of a
    #                                        hedged request answered first (docs/hedging.md)

    @property
    def is_error(self) -> bool:
        """Counts against the target's error rate (timeouts have their own rate)."""
        return self in _ERRORS


_ERRORS = frozenset({Outcome.RATE_LIMITED, Outcome.SERVER_ERROR, Outcome.CONNECT_FAILURE,
                     Outcome.RESET, Outcome.DECODE_ERROR, Outcome.PROVIDER_REJECTED,
                     Outcome.INVALID_RESPONSE})


# What ends a request as failed, at the request's level (a canary's guard, its report): an
# error of the target's or a timeout. A caller's hang-up, a refusal of the caller's own
# request and a prompt too long for the window are not the target's failures.
_FAILED_ENDS = frozenset({*(o.value for o in _ERRORS), Outcome.UPSTREAM_TIMEOUT.value})


def request_failed(status: int | None, error_class: str | None) -> bool:
    """Whether a request's end (its final status and outcome class) was a failure. A
    caller's hang-up is not, whatever status Envoy logged (0 before any response)."""
    if error_class == Outcome.CLIENT_CANCEL.value:
        return False
    return (status is None or status <= 0 or status >= 500
            or (error_class is not None and error_class in _FAILED_ENDS))


def attempt_failed(error_class: str) -> bool:
    """Whether a failed attempt (a fallback transition's class) was the target's failure:
    not a prompt too long for its window, nor a refusal of the caller's own request."""
    return error_class in _FAILED_ENDS


@dataclass(frozen=True, slots=True)
class Observation:
    target: str                      # provider/model_ref
    outcome: Outcome
    latency_ms: float | None = None  # request start → last byte to the client
    ttfb_ms: float | None = None     # first byte to the upstream → first byte back from it
    upstream_ms: float | None = None  # first byte to the upstream → last byte from it
    output_tokens: int | None = None  # from the usage the provider reported
    input_tokens: int | None = None   # the whole input (billing.py), and the part of it
    cache_read_tokens: int | None = None  # read from the provider's prompt cache
    failed_over: bool = False        # this attempt failed and another target took over
    #                                  (per-attempt records arrive with pre-commit fallback)
    streamed: bool = False           # an event stream: its first byte is the first event

    @property
    def ms_per_output_token(self) -> float | None:
        """Generation time per output token (after the first byte): the target's speed on
        equal work, whatever the length of this reply."""
        if (self.output_tokens is None or self.output_tokens <= 0 or self.upstream_ms is None
                or self.ttfb_ms is None):
            return None
        return max(0.0, self.upstream_ms - self.ttfb_ms) / self.output_tokens

    @property
    def work_ms(self) -> float | None:
        """This reply's time on equal work: what it would have taken for a reply of
        REFERENCE_OUTPUT_TOKENS (docs/dynamic-score.md, "Latency on equal work").

        A stream's first event comes before its generation: the time to it, plus the
        reference length at this reply's own time per token. A unary reply's generation is
        inside its time to first byte (most providers answer once it is generated), so
        nothing is added to it: its whole time is scaled down to the reference length when
        it is longer, and taken as observed when it is shorter (most of a short reply's
        time is reading the prompt, which does not grow with the reply)."""
        if (self.output_tokens is None or self.output_tokens <= 0 or self.upstream_ms is None
                or self.ttfb_ms is None):
            return None
        if self.streamed:
            generation = max(0.0, self.upstream_ms - self.ttfb_ms)
            return self.ttfb_ms + REFERENCE_OUTPUT_TOKENS * generation / self.output_tokens
        return self.upstream_ms * min(1.0, REFERENCE_OUTPUT_TOKENS / self.output_tokens)

    @property
    def output_tokens_per_s(self) -> float | None:
        if (self.output_tokens is None or self.output_tokens <= 0 or not self.upstream_ms
                or self.upstream_ms / 1000 <= 0):  # a denormal duration divides to 0 s
            return None
        return self.output_tokens / (self.upstream_ms / 1000)
