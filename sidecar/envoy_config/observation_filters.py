"""Envoy pieces that feed observations without putting the sidecar in the response path.

- `json_to_metadata` and `sse_to_metadata` read the provider's usage (the paths of
  observe/usage_fields.py) from JSON bodies and from SSE events into dynamic metadata, in
  Envoy, as the bytes pass. They also leave what the sidecar needs to
  tell a 2xx that is not what its dialect promises (sidecar/observe/response_checks.py): an
  error object's type or code, a JSON body that does not parse, the shape (`object` or
  `type`) of a reply or of a stream's events.
- `json_to_metadata` must hold a JSON reply until its end to parse it, and Envoy answers a
  500 for a held reply above the per-request buffer limit. So it only runs for replies that
  declare a length within `held_reply_limit` (a matcher on `content-length`); longer and
  chunked replies stream through unread, whatever their size.
- The gRPC access logger sends one entry per request, in batches, to the sidecar's
  `AccessLogService` after the response is done: status, response flags, timings, the
  serving cluster, the response's content type and encoding, and that metadata. The
  router's `upstream_log` sends one entry per attempt the same way, so failed attempts before
  a fallback are seen too.

See docs/observations.md for why this beats an observer ext_proc stream.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.accesslog.v3 import (
    AccessLog,
    AccessLogFilter,
    ComparisonFilter,
    ComparisonFilterOp,
    OrFilter,
    ResponseFlagFilter,
    StatusCodeFilter,
)
from envoy_data_plane.envoy.config.core.v3 import (
    ApiVersion,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    RuntimeUInt32,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.extensions.access_loggers.grpc.v3 import (
    CommonGrpcAccessLogConfig,
    HttpGrpcAccessLogConfig,
)
from envoy_data_plane.envoy.extensions.content_parsers.json.v3 import (
    JsonContentParser,
    JsonContentParserRuleConfig,
)
from envoy_data_plane.envoy.extensions.filters.http.json_to_metadata.v3 import (
    JsonToMetadata,
    JsonToMetadataKeyValuePair,
    JsonToMetadataMatchRules,
    JsonToMetadataRule,
    JsonToMetadataSelector,
    JsonToMetadataValueType,
)
from envoy_data_plane.envoy.extensions.filters.http.sse_to_metadata.v3 import (
    SseToMetadata,
    SseToMetadataProcessingRules,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatcher
from envoy_data_plane.google.protobuf import Any, Value

from sidecar.envoy_config.matchers import negated, skipped_when
from sidecar.envoy_config.upstream_errors import held_reply_limit, length_within
from sidecar.envoy_contract import (
    ACCESS_LOG_NAME,
    ATTEMPT_LOG_NAME,
    CONTEXT_RETRY_HEADER,
    EXT_PROC_CLUSTER,
    UNRECOGNISED_HEADER,
    USAGE_KEY,
    USAGE_NAMESPACE,
)
from sidecar.observe.rate_limits import RATE_LIMIT_HEADERS
from sidecar.observe.response_checks import (
    ERROR_TYPE_KEY,
    LOGGED_RESPONSE_HEADERS,
    NOT_JSON,
    NOT_JSON_EVENT_KEY,
    NOT_JSON_KEY,
    SHAPE_KEY,
    USAGE_MISSING,
    USAGE_MISSING_KEY,
)
from sidecar.observe.usage_fields import COUNT_PATHS, OUTPUT_PATHS


def _rule(path: tuple[str, ...], on_present: JsonToMetadataKeyValuePair,
          on_missing: JsonToMetadataKeyValuePair | None = None,
          on_error: JsonToMetadataKeyValuePair | None = None) -> JsonToMetadataRule:
    return JsonToMetadataRule(selectors=[JsonToMetadataSelector(key=key) for key in path],
                              on_present=on_present, on_missing=on_missing, on_error=on_error)


def _extract(key: str, kind: JsonToMetadataValueType) -> JsonToMetadataKeyValuePair:
    return JsonToMetadataKeyValuePair(metadata_namespace=USAGE_NAMESPACE, key=key, type=kind)


def _constant(key: str, value: str) -> JsonToMetadataKeyValuePair:
    return JsonToMetadataKeyValuePair(metadata_namespace=USAGE_NAMESPACE, key=key,
                                      value=Value(string_value=value))


_TOKENS = JsonToMetadataValueType.NUMBER
_TEXT = JsonToMetadataValueType.STRING
# Error objects: Chat's and Anthropic's have `error.type` (OpenAI's body and stream event
# `{"error": {"type": …}}`, Anthropic's `{"type": "error", "error": {"type": …}}`), a
# failed Responses object `error.code`; a completed one's `"error": null` has neither.
_ERROR_PATHS = (("error", "type"), ("error", "code"))
# A completion's shape: Chat's `object` (`chat.completion`, `chat.completion.chunk`),
# Responses' `object` (`response`), Anthropic's `type` (`message`, `message_start` …).
_SHAPE_PATHS = (("object",), ("type",))
_NEVER_PRESENT = "sidecar:never-present"


def _json_rules() -> list[JsonToMetadataRule]:
    """A JSON reply: the usage; proof that the body was parsed (a usage path missing: a
    completion misses one of the two, anything else both) or that it was not JSON; an
    error object; the reply's shape."""
    usage = [_rule(path, _extract(USAGE_KEY, _TOKENS),
                   on_missing=_constant(USAGE_MISSING_KEY, USAGE_MISSING),
                   on_error=_constant(NOT_JSON_KEY, NOT_JSON))
             for path in OUTPUT_PATHS]
    counts = [_rule(path, _extract(key, _TOKENS)) for key, path in COUNT_PATHS]
    errors = [_rule(path, _extract(ERROR_TYPE_KEY, _TEXT)) for path in _ERROR_PATHS]
    shapes = [_rule(path, _extract(SHAPE_KEY, _TEXT)) for path in _SHAPE_PATHS]
    return [*usage, *counts, *errors, *shapes]


def _event_rules() -> list[JsonContentParserRuleConfig]:
    """An SSE event: the usage (the last one wins), an error event, and the shape of the
    stream's events (read once per stream)."""
    usage = [JsonContentParserRuleConfig(rule=_rule(path, _extract(USAGE_KEY, _TOKENS)))
             for path in OUTPUT_PATHS]
    counts = [JsonContentParserRuleConfig(rule=_rule(path, _extract(key, _TOKENS)))
              for key, path in COUNT_PATHS]
    errors = [JsonContentParserRuleConfig(rule=_rule(path, _extract(ERROR_TYPE_KEY, _TEXT)))
              for path in _ERROR_PATHS]
    shapes = [JsonContentParserRuleConfig(rule=_rule(path, _extract(SHAPE_KEY, _TEXT)),
                                          stop_processing_after_matches=1)
              for path in _SHAPE_PATHS]
    # Envoy's JSON parser applies `on_error` at the end of a stream, to rules that never
    # matched, when any event's data did not parse: a rule that never matches is therefore
    # a flag for "some event was not JSON". OpenAI's streams always end with `data: [DONE]`
    # (not JSON), so the flag counts only for Anthropic streams (response_checks.py).
    garbage = JsonContentParserRuleConfig(rule=_rule(
        (_NEVER_PRESENT,), _constant(NOT_JSON_EVENT_KEY, NOT_JSON),
        on_error=_constant(NOT_JSON_EVENT_KEY, NOT_JSON)))
    return [*usage, *counts, *errors, *shapes, garbage]


def usage_filters(max_request_body_bytes: int) -> list[HttpFilter]:
    json_usage = JsonToMetadata(response_rules=JsonToMetadataMatchRules(
        rules=_json_rules(),
        allow_content_types_regex=RegexMatcher(regex=r"application/json(;.*)?")))
    bounded = negated(length_within(held_reply_limit(max_request_body_bytes)))
    parser = JsonContentParser(rules=_event_rules())
    sse_usage = SseToMetadata(response_rules=SseToMetadataProcessingRules(
        content_parser=TypedExtensionConfig(name="envoy.content_parsers.json",
                                            typed_config=Any.pack(parser))))
    return [
        skipped_when(bounded, "sidecar.json_usage", "envoy.filters.http.json_to_metadata",
                     Any.pack(json_usage)),
        HttpFilter(name="envoy.filters.http.sse_to_metadata", typed_config=Any.pack(sse_usage)),
    ]


def access_log(flush_interval_ms: int, log_name: str = ACCESS_LOG_NAME) -> AccessLog:
    """The connection manager's log (one entry per request) by default; with
    `ATTEMPT_LOG_NAME`, the router's per-attempt log, which also carries a provider's
    rate-limit headers (how long it asked not to be called: observe/rate_limits.py)."""
    logged = [*LOGGED_RESPONSE_HEADERS,
              *((*RATE_LIMIT_HEADERS, CONTEXT_RETRY_HEADER, UNRECOGNISED_HEADER)
                if log_name == ATTEMPT_LOG_NAME
                else ())]
    config = HttpGrpcAccessLogConfig(common_config=CommonGrpcAccessLogConfig(
        log_name=log_name,
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER)),
        transport_api_version=ApiVersion.V3,
        buffer_flush_interval=timedelta(milliseconds=flush_interval_ms),
    ), additional_response_headers_to_log=logged)
    return AccessLog(name="envoy.access_loggers.http_grpc", typed_config=Any.pack(config),
                     filter=failed_attempts_only() if log_name == ATTEMPT_LOG_NAME else None)


def _status(op: ComparisonFilterOp, value: int, key: str) -> AccessLogFilter:
    return AccessLogFilter(status_code_filter=StatusCodeFilter(comparison=ComparisonFilter(
        op=op, value=RuntimeUInt32(default_value=value, runtime_key=key))))


def failed_attempts_only() -> AccessLogFilter:
    """The per-attempt log carries only attempts that did not answer cleanly: a status
    of 300 or more, none (a hedge's cancelled loser), or any response flag. An attempt
    that answered is the request's own entry's (which names its target and the attempt
    count: observe/attempts.py pairs the last failure with it). Issue #32: every request's
    second entry cost Envoy and the sidecar ≈ 45 µs."""
    return AccessLogFilter(or_filter=OrFilter(filters=[
        _status(ComparisonFilterOp.GE, 300, "sidecar.attempt_log.min_failed_status"),
        _status(ComparisonFilterOp.LE, 199, "sidecar.attempt_log.max_unanswered_status"),
        AccessLogFilter(response_flag_filter=ResponseFlagFilter()),
    ]))
