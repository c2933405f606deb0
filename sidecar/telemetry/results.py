"""What Envoy's per-request access log says about a request, and the tokens it is charged
with: the provider's usage where it said it, an estimate where it could not (never 0).

Apart from rows.py because the quota ledger charges with the same rule before any row is
built, and the access-log reader (observe/) builds results without the rows' machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


# Not frozen either (see DecisionFacts): one is made for every access-log entry.
@dataclass(slots=True)
class RequestResult:
    """What Envoy's per-request access log says about the request."""

    request_id: str
    status: int
    serving_target: str | None     # provider/model_ref of the attempt that answered
    attempts: int
    error_class: str               # the observation outcome (`ok`, `server_error`, ...)
    latency_ms: float | None = None
    ttfb_ms: float | None = None
    # Billing's meaning (sidecar/billing.py): the whole input, cache reads and writes in it.
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None      # prompt-cache reads
    cache_write_tokens: int | None = None  # prompt-cache writes (Anthropic)
    # The response body bytes Envoy relayed to the caller, for a stream (None otherwise):
    # what a stream cut before its usage is charged by.
    relayed_stream_bytes: int | None = None
    # A mirrored request's live answer (envoy_config/answer_facts.py): its finish reason
    # and the tools it called, as the provider wrote them (bounded; read by shadow traffic
    # only, never written to a row as they are).
    answer_finish: str | None = None
    answer_tools: str | None = None


REPORTED, ESTIMATED = "reported", "estimated"
# A cut stream's output estimate: its relayed bytes at the input estimate's 4 characters a
# token. The SSE framing (event names, ids, JSON members) is counted as text, so the
# estimate errs high, and it never exceeds the output budget.
STREAM_BYTES_PER_TOKEN = 4


def _estimated_output(result: RequestResult, budget: int) -> int:
    relayed = result.relayed_stream_bytes
    if not relayed:  # not a stream, or nothing reached the caller: only the budget is known
        return budget
    return min(budget, -(-relayed // STREAM_BYTES_PER_TOKEN))


def usage_charged(result: RequestResult,
                  estimate: tuple[int, int] | None) -> tuple[RequestResult, str | None]:
    """The tokens a request is charged with, and where they come from: the provider's usage
    when it reported any; when a served reply's usage could not be read (a compressed
    body, a stream the caller cut before its usage, a provider that ignores
    `stream_options`), the decision's estimate — its input, and as the output what was
    relayed (a stream's body bytes, 4 a token) up to its output budget (the cap, or the
    group's `output_budget_tokens`; the whole budget where nothing was measured) — never
    nothing. `estimate`: (input tokens, output budget). `result` itself is never changed.

    A figure reported alone is kept and the other estimated: an Anthropic stream says its
    input in `message_start` and its output only in the final `message_delta`, so one cut
    between the two (the caller hangs up, the engine dies) has input and no output, and
    is charged by estimate like any served reply without its output (issue 40)."""
    if result.input_tokens is not None and result.output_tokens is not None:
        return result, REPORTED
    served = result.serving_target is not None and (
        200 <= result.status < 300 or result.error_class == "client_cancel")
    if not served or estimate is None:
        reported = result.input_tokens is not None or result.output_tokens is not None
        return result, REPORTED if reported else None
    return replace(result,
                   input_tokens=(estimate[0] if result.input_tokens is None
                                 else result.input_tokens),
                   output_tokens=(_estimated_output(result, estimate[1])
                                  if result.output_tokens is None
                                  else result.output_tokens)), ESTIMATED


def result_record(result: RequestResult) -> tuple:
    """`result` as a plain tuple in its fields' order (`RequestResult(*record)`)."""
    return (result.request_id, result.status, result.serving_target, result.attempts,
            result.error_class, result.latency_ms, result.ttfb_ms, result.input_tokens,
            result.output_tokens, result.cached_tokens, result.cache_write_tokens,
            result.relayed_stream_bytes)
