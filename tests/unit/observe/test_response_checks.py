"""Telling a 2xx that is not a completion from one that is, from what Envoy logged (the
content type and the usage readers' metadata), and the length bound on held replies."""

from __future__ import annotations

import re

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from sidecar.envoy_config.upstream_errors import (
    MAX_HELD_REPLY_BYTES,
    digits_at_most,
    held_reply_limit,
)
from sidecar.envoy_contract import USAGE_KEY, USAGE_NAMESPACE
from sidecar.observe.entries import observation_of
from sidecar.observe.records import Outcome
from sidecar.observe.response_checks import (
    ERROR_TYPE_KEY,
    NOT_JSON_KEY,
    SHAPE_KEY,
    USAGE_MISSING_KEY,
    invalid_body,
)

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"


@pytest.mark.parametrize(("content_type", "encoding", "usage", "invalid"), [
    # completions
    (JSON, "", {USAGE_KEY, USAGE_MISSING_KEY, SHAPE_KEY}, False),  # one usage path missing
    (JSON, "", {USAGE_MISSING_KEY, SHAPE_KEY}, False),      # a completion without usage
    ("application/json; charset=utf-8", "", {USAGE_KEY}, False),
    (SSE, "", {SHAPE_KEY}, False),                          # a stream without usage
    (SSE, "", {SHAPE_KEY, USAGE_KEY}, False),
    (JSON, "", set(), False),                               # not read: chunked or too long
    (JSON, "gzip", {NOT_JSON_KEY}, False),                  # compressed: cannot be judged
    ("", "", set(), False),                                 # no content type logged
    # not completions
    (JSON, "", {USAGE_MISSING_KEY}, True),                  # parsed: no usage, no shape
    (JSON, "", {NOT_JSON_KEY}, True),                       # HTML labelled JSON
    (JSON, "", {USAGE_MISSING_KEY, ERROR_TYPE_KEY}, True),  # an error object
    (SSE, "", {SHAPE_KEY, ERROR_TYPE_KEY}, True),           # an error event
    (SSE, "", set(), True),                                 # garbage events
    ("text/html; charset=utf-8", "", set(), True),
    ("text/plain", "identity", set(), True),
    ("text/plain", "gzip", {ERROR_TYPE_KEY}, True),         # the error type was still read
])
def test_invalid_body(content_type: str, encoding: str, usage: set[str],
                      invalid: bool) -> None:
    assert invalid_body(content_type, encoding, usage) is invalid


def entry(status: int = 200, content_type: str | None = JSON, details: str = "",
          **usage: object) -> al.HTTPAccessLogEntry:
    message = al.HTTPAccessLogEntry()
    message.common_properties.upstream_cluster = "target__g__0__p"
    message.response.response_code.value = status
    message.response.response_code_details = details
    if content_type is not None:
        message.response.response_headers["content-type"] = content_type
    if usage:
        fields = struct_pb2.Struct()
        fields.update(usage)
        message.common_properties.metadata.filter_metadata[USAGE_NAMESPACE].CopyFrom(fields)
    return message


TARGETS = {"target__g__0__p": "p/m"}


def test_a_200_with_an_error_object_is_an_invalid_response_and_an_error() -> None:
    observation = observation_of(entry(**{ERROR_TYPE_KEY: "overloaded_error",
                                          USAGE_MISSING_KEY: "true"}), TARGETS)
    assert observation.outcome is Outcome.INVALID_RESPONSE
    assert observation.outcome.is_error


def test_a_completion_keeps_its_usage_and_is_ok() -> None:
    observation = observation_of(entry(**{USAGE_KEY: 12, USAGE_MISSING_KEY: "true"}), TARGETS)
    assert observation.outcome is Outcome.OK and observation.output_tokens == 12


def test_only_2xx_bodies_are_judged() -> None:
    assert observation_of(entry(503, "text/html"), TARGETS).outcome is Outcome.SERVER_ERROR
    assert observation_of(entry(400, JSON, **{ERROR_TYPE_KEY: "invalid_request_error"}),
                          TARGETS).outcome is Outcome.CLIENT_ERROR


def test_a_reply_envoy_itself_failed_to_pass_on_is_not_the_targets_doing() -> None:
    assert observation_of(entry(500, details="response_payload_too_large"), TARGETS) is None


@given(st.integers(min_value=0, max_value=10**10), st.integers(min_value=0, max_value=10**11))
def test_digits_at_most_matches_exactly_the_numbers_up_to_the_limit(limit: int,
                                                                    value: int) -> None:
    pattern = re.compile(digits_at_most(limit))
    assert (pattern.fullmatch(str(value)) is not None) is (value <= limit)
    assert pattern.fullmatch(str(limit)) and not pattern.fullmatch(str(limit + 1))


def test_the_held_reply_limit_never_exceeds_the_request_buffer_limit() -> None:
    assert held_reply_limit(65536) == 65536
    assert held_reply_limit(32 * 1024 * 1024) == MAX_HELD_REPLY_BYTES == 8 * 1024 * 1024
