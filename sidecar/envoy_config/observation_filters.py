"""Envoy pieces that feed observations without putting the sidecar in the response path.

- `json_to_metadata` and `sse_to_metadata` read the provider's usage (`usage.completion_tokens`
  for OpenAI, `usage.output_tokens` for Anthropic) from JSON bodies and from SSE events into
  dynamic metadata, in Envoy, as the bytes pass.
- The gRPC access logger sends one entry per request, in batches, to the sidecar's
  `AccessLogService` after the response is done: status, response flags, timings, the
  serving cluster and that metadata. The router's `upstream_log` sends one entry per
  attempt the same way, so failed attempts before a fallback are seen too.

See docs/observations.md for why this beats an observer ext_proc stream.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLog
from envoy_data_plane.envoy.config.core.v3 import (
    ApiVersion,
    GrpcService,
    GrpcServiceEnvoyGrpc,
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
from envoy_data_plane.google.protobuf import Any

from sidecar.envoy_contract import ACCESS_LOG_NAME, EXT_PROC_CLUSTER, USAGE_KEY, USAGE_NAMESPACE

# Where each dialect reports output tokens (JSON bodies and final SSE events alike).
_USAGE_PATHS = (("usage", "completion_tokens"), ("usage", "output_tokens"))


def _usage_rules() -> list[JsonToMetadataRule]:
    return [
        JsonToMetadataRule(
            selectors=[JsonToMetadataSelector(key=key) for key in path],
            on_present=JsonToMetadataKeyValuePair(
                metadata_namespace=USAGE_NAMESPACE, key=USAGE_KEY,
                type=JsonToMetadataValueType.NUMBER),
        )
        for path in _USAGE_PATHS
    ]


def usage_filters() -> list[HttpFilter]:
    json_usage = JsonToMetadata(response_rules=JsonToMetadataMatchRules(
        rules=_usage_rules(),
        allow_content_types_regex=RegexMatcher(regex=r"application/json(;.*)?")))
    parser = JsonContentParser(rules=[JsonContentParserRuleConfig(rule=rule)
                                      for rule in _usage_rules()])
    sse_usage = SseToMetadata(response_rules=SseToMetadataProcessingRules(
        content_parser=TypedExtensionConfig(name="envoy.content_parsers.json",
                                            typed_config=Any.pack(parser))))
    return [
        HttpFilter(name="envoy.filters.http.json_to_metadata", typed_config=Any.pack(json_usage)),
        HttpFilter(name="envoy.filters.http.sse_to_metadata", typed_config=Any.pack(sse_usage)),
    ]


def access_log(flush_interval_ms: int, log_name: str = ACCESS_LOG_NAME) -> AccessLog:
    """The connection manager's log (one entry per request) by default; with
    `ATTEMPT_LOG_NAME`, the router's per-attempt log."""
    config = HttpGrpcAccessLogConfig(common_config=CommonGrpcAccessLogConfig(
        log_name=log_name,
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER)),
        transport_api_version=ApiVersion.V3,
        buffer_flush_interval=timedelta(milliseconds=flush_interval_ms),
    ))
    return AccessLog(name="envoy.access_loggers.http_grpc", typed_config=Any.pack(config))
