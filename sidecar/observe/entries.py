"""Read one Envoy gRPC access-log entry: the observation, the telemetry result or the
attempt it says. Pure functions of the `HTTPAccessLogEntry` (upb messages from xds-protos)
and the cluster maps; access_log.py receives the entries and hands these on.
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.data.accesslog.v3 import accesslog_pb2 as al
from google.protobuf import struct_pb2

from sidecar.envoy_contract import (
    ANSWER_NAMESPACE,
    CONTEXT_RETRY_HEADER,
    HEDGE_CLUSTER_PREFIX,
    USAGE_KEY,
    USAGE_NAMESPACE,
)
from sidecar.observe.attempts import Attempt
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.refusals import token
from sidecar.observe.response_checks import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    SHAPE_KEY,
    invalid_body,
)
from sidecar.observe.usage_fields import usage_of
from sidecar.telemetry.results import RequestResult


def token_pairs(mark: str) -> str:
    """The marker's `type=…;code=…` as a log shows it, re-cut to tokens (the header came
    through Envoy, but it is still a provider's bytes)."""
    pairs = []
    for part in mark.split(";")[:2]:
        name, _, value = part.partition("=")
        if name in ("type", "code"):
            pairs.append(f"{name}={token(value)}")
    return " ".join(pairs)


def _ms(duration) -> float | None:  # google.protobuf.Duration, unset when not reached
    if duration.seconds == 0 and duration.nanos == 0:
        return None
    return duration.seconds * 1000 + duration.nanos / 1e6


def outcome_of(flags: al.ResponseFlags, status: int, answered: bool = False) -> Outcome:
    """The classification table of docs/observations.md, first match wins. `answered`: a
    stream whose final usage event went to the caller (`answered_stream`)."""
    if flags.downstream_connection_termination or flags.downstream_remote_reset:
        # The openai SDK closes its response at `[DONE]`, often before the stream's end
        # has arrived: a caller that hangs up with the whole answer did not cancel.
        return Outcome.OK if answered and 200 <= status < 300 else Outcome.CLIENT_CANCEL
    if (flags.upstream_request_timeout or flags.stream_idle_timeout
            or flags.upstream_max_stream_duration_reached or flags.duration_timeout):
        return Outcome.UPSTREAM_TIMEOUT
    if (flags.upstream_connection_failure or flags.no_healthy_upstream
            or flags.dns_resolution_failure or flags.upstream_overflow):
        return Outcome.CONNECT_FAILURE
    if flags.upstream_protocol_error:
        return Outcome.DECODE_ERROR
    if flags.upstream_remote_reset or flags.upstream_connection_termination or flags.local_reset:
        return Outcome.RESET
    return outcome_of_status(status)


def outcome_of_status(status: int) -> Outcome:
    """The classification by status alone, once no flag said otherwise (also a mirrored
    request's, rollout/shadow_traffic.py)."""
    if status in (408, 504):  # a provider's gateway timeout, or a stream's first event
        # overdue at the reply gate (gateway/first_event_deadline.py)
        return Outcome.UPSTREAM_TIMEOUT
    if status == 429:
        return Outcome.RATE_LIMITED
    if status in (401, 403, 404):
        return Outcome.PROVIDER_REJECTED
    if status >= 500:
        return Outcome.SERVER_ERROR
    if status >= 400:
        return Outcome.CLIENT_ERROR
    return Outcome.OK


def answered_stream(content_type: str, usage_keys: Mapping[str, object]) -> bool:
    """An event stream whose usage was read: every dialect sends its final usage in the
    last event but one (Chat's usage chunk before `[DONE]`, Anthropic's `message_delta`
    before `message_stop`, Responses' `response.completed`), so the caller had the answer."""
    return USAGE_KEY in usage_keys and content_type.startswith("text/event-stream")


def _numbers(fields: Mapping[str, struct_pb2.Value]) -> dict[str, float]:
    """The numeric figures of the usage metadata (it also holds strings: shapes, errors)."""
    return {key: value.number_value for key, value in fields.items()
            if value.WhichOneof("kind") == "number_value"}


def served_by(common: al.AccessLogCommon) -> str:
    """The cluster (or listener) that names the target: a hedging pair cluster holds two
    targets, and its entries name the internal listener of the one that served
    (docs/hedging.md)."""
    address = common.upstream_remote_address
    if address.HasField("envoy_internal_address"):
        return address.envoy_internal_address.server_listener_name
    return common.upstream_cluster


# Statuses whose `retry-after` (or a provider's reset headers) says when to call again.
ASKS_TO_WAIT = frozenset({429, 503, 529})


# Flags of the caller's side of a request: its answering attempt may still be clean.
_CALLER_SIDE_FLAGS = frozenset({"downstream_connection_termination",
                                "downstream_remote_reset"})

def caller_side_only(flags: list) -> bool:
    """`flags` (ResponseFlags.ListFields()) name only the caller's hang-up, if anything."""
    return all(field.name in _CALLER_SIDE_FLAGS for field, _ in flags)


def answered_as_if_clean(entry: al.HTTPAccessLogEntry, outcome: Outcome) -> bool:
    """An answering attempt whose only flag is a hedge's deadline or the caller's hang-up:
    its request's own entry stands for it (`answered`), as for every attempt that answered
    cleanly, so the attempt counts in neither log's pairing twice (attempts.py)."""
    if (outcome not in (Outcome.OK, Outcome.CLIENT_CANCEL)
            or not 200 <= entry.response.response_code.value < 300):
        return False
    common = entry.common_properties
    return (common.upstream_cluster.startswith(HEDGE_CLUSTER_PREFIX)
            or caller_side_only(common.response_flags.ListFields()))


# Envoy's own failures on a reply the provider sent whole: not the target's doing.
_GATEWAY_FAILURES = frozenset({"response_payload_too_large"})


def observation_of(entry: al.HTTPAccessLogEntry,
                   targets: Mapping[str, str]) -> Observation | None:
    """`targets` maps cluster names to ``provider/model_ref``. Entries not served by one of
    them (the sidecar's own replies, cache hits, other routes) are not observations, nor
    replies that Envoy itself failed to pass on."""
    common = entry.common_properties
    target = targets.get(served_by(common))
    if (target is None or common.response_flags.response_from_cache_filter
            or entry.response.response_code_details in _GATEWAY_FAILURES):
        return None
    response = entry.response
    status = response.response_code.value
    headers = response.response_headers
    content_type = headers.get(CONTENT_TYPE, "")
    first_tx = _ms(common.time_to_first_upstream_tx_byte) or 0.0
    first_rx = _ms(common.time_to_first_upstream_rx_byte)
    last_rx = _ms(common.time_to_last_upstream_rx_byte)
    metadata = common.metadata.filter_metadata.get(USAGE_NAMESPACE)
    usage_keys = metadata.fields if metadata is not None else {}
    usage = usage_of(_numbers(usage_keys))
    answered = answered_stream(content_type, usage_keys)
    outcome = outcome_of(common.response_flags, status, answered)
    if outcome is Outcome.OK and 200 <= status < 300:
        shape = usage_keys[SHAPE_KEY].string_value if SHAPE_KEY in usage_keys else ""
        if invalid_body(content_type, headers.get(CONTENT_ENCODING, ""), usage_keys, shape):
            outcome = Outcome.INVALID_RESPONSE
    latency_ms = _ms(common.time_to_last_downstream_tx_byte) or _ms(common.duration)
    if last_rx is not None:
        upstream_ms: float | None = last_rx - first_tx
    elif answered and latency_ms is not None:
        # The caller hung up at the stream's last event (the openai SDK closes at
        # `[DONE]`), before the end of the body reached Envoy: the stream's span ends
        # with the hang-up, right after that event.
        upstream_ms = latency_ms - first_tx
    else:
        upstream_ms = None
    if common.upstream_request_attempt_count > 1:
        # A fallback answered: the request's own span includes the failed attempts, which
        # are the failed targets' time (recorded against them), not this target's.
        latency_ms = upstream_ms
    return Observation(
        target=target,
        outcome=outcome,
        latency_ms=latency_ms,
        ttfb_ms=(first_rx - first_tx) if first_rx is not None else None,
        upstream_ms=upstream_ms,
        output_tokens=usage.output_tokens,
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        streamed=content_type.startswith("text/event-stream"),
    )


def result_of(entry: al.HTTPAccessLogEntry, targets: Mapping[str, str]) -> RequestResult:
    """What the per-request entry says for the telemetry row: every request has one, also
    those no target served (then `serving_target` is None)."""
    common = entry.common_properties
    status = entry.response.response_code.value
    metadata = common.metadata.filter_metadata.get(USAGE_NAMESPACE)
    usage_keys = metadata.fields if metadata is not None else {}
    usage = usage_of(_numbers(usage_keys))
    first_tx = _ms(common.time_to_first_upstream_tx_byte)
    first_rx = _ms(common.time_to_first_upstream_rx_byte)
    content_type = entry.response.response_headers.get(CONTENT_TYPE, "")
    return RequestResult(
        request_id=entry.request.request_id,
        status=status,
        serving_target=targets.get(served_by(common)),
        attempts=common.upstream_request_attempt_count,
        error_class=outcome_of(common.response_flags, status,
                               answered_stream(content_type, usage_keys)).value,
        latency_ms=_ms(common.time_to_last_downstream_tx_byte) or _ms(common.duration),
        ttfb_ms=(first_rx - (first_tx or 0.0)) if first_rx is not None else None,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        relayed_stream_bytes=(entry.response.response_body_bytes
                              if content_type.startswith("text/event-stream") else None),
        **_answer_facts(common),
    )


def _answer_facts(common) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The live answer's finish and tools, when Envoy read them (a mirrored request)."""
    found = common.metadata.filter_metadata.get(ANSWER_NAMESPACE)
    if found is None:
        return {}
    facts = {}
    for key, name in (("finish", "answer_finish"), ("tools", "answer_tools")):
        value = found.fields.get(key)
        if value is not None and value.HasField("string_value"):
            facts[name] = value.string_value[:2048]
    return facts


def attempt_of(entry: al.HTTPAccessLogEntry, targets: Mapping[str, str],
               groups: Mapping[str, str]) -> Attempt | None:
    """One attempt from the router's per-attempt log; None for clusters that are no target."""
    common = entry.common_properties
    key = served_by(common)
    target = targets.get(key)
    if target is None:
        return None
    status = entry.response.response_code.value
    flags = common.response_flags
    hedged = common.upstream_cluster.startswith(HEDGE_CLUSTER_PREFIX)
    if hedged and flags.upstream_request_timeout:
        # In a hedged request the per-try timeout is the hedge's start, not a failure:
        # the attempt keeps running (only the request's deadline ends it).
        flags = al.ResponseFlags()
        flags.CopyFrom(common.response_flags)
        flags.upstream_request_timeout = False
    outcome = outcome_of(flags, status)
    duration_ms = _ms(common.duration)
    if hedged and status == 0 and outcome is Outcome.OK:
        # Cancelled: the other attempt answered first. Only the primary, whose deadline
        # passed (its `UT`), has a lower bound for its time to first byte; the hedge's
        # wait was cut by the primary's answer, which says nothing of the hedge.
        outcome = Outcome.HEDGED_OUT
        if not common.response_flags.upstream_request_timeout:
            duration_ms = None
    if outcome is Outcome.CLIENT_ERROR and (
            CONTEXT_RETRY_HEADER in entry.response.response_headers):
        outcome = Outcome.CONTEXT_WINDOW  # retried on the next target (upstream_errors.py)
    return Attempt(
        request_id=entry.request.request_id,
        group=groups.get(key, ""),
        target=target,
        outcome=outcome,
        duration_ms=duration_ms,
    )
