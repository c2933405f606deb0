"""The ext_proc adapter, driven with real (upb) Envoy protobuf messages but no Envoy:
what it answers for each phase and how the answer is encoded."""

from __future__ import annotations

import hashlib
import json

import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import json_format
from google.protobuf.internal import api_implementation

from sidecar.config import load_config_text
from sidecar.extproc import messages
from sidecar.extproc.processor import ExternalProcessor
from sidecar.gateway import Gateway, Runtime
from sidecar.gateway.attempt_orders import AttemptOrder

TOKEN = "tok"
CONFIG = load_config_text(f"""
providers:
  local: {{base_url: "http://127.0.0.1:9/v1", credential: {{env: K}}}}
  other: {{base_url: "http://127.0.0.1:9/other/v1",
          credential: {{env: K2, header: x-other-key}}}}
callers: [{{name: a, token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]
models:
  g:
    strategy: failover
    fallback: {{per_try_timeout_seconds: 20, deadline_seconds: 90}}
    targets: [{{provider: local, model_ref: real}}, {{provider: other, model_ref: second}}]
""")


def headers_message(path: str, end_of_stream: bool = False, **extra: str) -> ext.ProcessingRequest:
    values = {":path": path, ":method": "POST", "authorization": f"Bearer {TOKEN}", **extra}
    return ext.ProcessingRequest(request_headers=ext.HttpHeaders(
        headers=HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode())
                                   for k, v in values.items()]),
        end_of_stream=end_of_stream,
    ))


def body_message(body: bytes) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=body, end_of_stream=True))


def attempt_headers(cluster: str, path: str) -> ext.ProcessingRequest:
    """What the per-attempt hook on a target cluster sends for a retry."""
    message = headers_message(path, authorization="Bearer provider-key")
    message.attributes["envoy.filters.http.ext_proc"].fields[
        "xds.cluster_name"].string_value = cluster
    return message


def run(*requests: ext.ProcessingRequest) -> list[ext.ProcessingResponse]:
    """Drive one ext_proc stream; each request is serialized and parsed as on the wire."""
    processor = ExternalProcessor(Gateway(Runtime(CONFIG, {"K": "provider-key",
                                                           "K2": "other-key"})))
    stream = processor.stream()
    responses = []
    for request in requests:
        response, done = stream.step(ext.ProcessingRequest.FromString(
            request.SerializeToString()))
        if response is not None:
            responses.append(ext.ProcessingResponse.FromString(response.SerializeToString()))
        if done:
            break
    return responses


def test_messages_are_upb_backed() -> None:
    assert api_implementation.Type() == "upb"


def test_routed_request_sets_the_attempt_order_with_raw_values_and_clears_route_cache() -> None:
    first, second = run(headers_message("/v1/chat/completions",
                                        **{"x-envoy-max-retries": "9", "x-route-cluster": "x"}),
                        body_message(b'{"model":"g","messages":[]}'))
    # Everything not on the allowlist goes, the caller's token and Envoy controls included.
    assert sorted(first.request_headers.response.header_mutation.remove_headers) == [
        "authorization", "x-envoy-max-retries", "x-route-cluster"]
    common = second.request_body.response
    assert common.clear_route_cache is True
    order = json_format.MessageToDict(second.dynamic_metadata)["sidecar.route"]
    assert order == {"priority_groups": [
        {"name": "attempt1", "clusters": [{"cluster_name": "target__g__0__local", "weight": 1}]},
        {"name": "attempt2", "clusters": [{"cluster_name": "target__g__1__other", "weight": 1}]},
        # Two targets, three attempts: round them again (fallback_policy.attempt_order).
        {"name": "attempt3", "clusters": [{"cluster_name": "target__g__0__local", "weight": 1}]},
    ],
        # The default retry_same_target (1) and its wait for a 429's retry-after (2 s)
        # travel with the order to the hold's Lua and the reply gate (issue 40).
        "same_target_retries": 1.0, "same_target_wait_s": 2.0}
    sets = {h.header.key: h.header for h in common.header_mutation.set_headers}
    assert sets[":path"].raw_value == b"/v1/chat/completions"
    assert sets[":path"].value == ""  # `value` is ignored by Envoy for mutations
    assert "authorization" not in sets  # Envoy injects the provider's key itself
    assert sets["x-envoy-max-retries"].raw_value == b"2"
    assert sets["x-envoy-upstream-rq-per-try-timeout-ms"].raw_value == b"20000"
    assert sets["x-envoy-upstream-rq-timeout-ms"].raw_value == b"90000"
    assert all(h.append_action == HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
               for h in common.header_mutation.set_headers)
    assert json.loads(common.body_mutation.body) == {"model": "real", "messages": []}
    assert sets["content-length"].raw_value == str(len(common.body_mutation.body)).encode()


def test_error_is_an_immediate_json_response() -> None:
    (response,) = run(headers_message("/v1/chat/completions", authorization="Bearer bad"))
    immediate = response.immediate_response
    assert immediate.status.code == 401
    assert json.loads(immediate.body)["error"]["code"] == "invalid_api_key"
    content_type = immediate.headers.set_headers[0].header
    assert (content_type.key, content_type.raw_value) == ("content-type", b"application/json")


def test_models_list_needs_no_body_phase() -> None:
    message = headers_message("/v1/models", end_of_stream=True, **{":method": "GET"})
    (response,) = run(message)
    assert response.immediate_response.status.code == 200
    assert json.loads(response.immediate_response.body)["data"][0]["id"] == "g"


def test_unexpected_phase_never_stalls_and_bad_input_never_crashes() -> None:
    assert run(ext.ProcessingRequest(response_trailers=ext.HttpTrailers())) == []
    (response,) = run(body_message(b"{}"))
    assert response.immediate_response.status.code == 500
    _, reply = run(headers_message("/v1/chat/completions"), body_message(b"\x00" * 64))
    assert reply.immediate_response.status.code == 400


def test_a_retry_is_rewritten_for_its_own_target_and_carries_no_key() -> None:
    """Regression (issue 13, finding 1): a peer that named a target cluster in the
    attributes got that provider's key back. No answer carries any key now."""
    first, second = run(attempt_headers("target__g__1__other", "/v1/chat/completions"),
                        body_message(b'{"model":"real","messages":[]}'))
    assert first.HasField("request_headers")
    common = second.request_body.response
    sets = {h.header.key: h.header.raw_value for h in common.header_mutation.set_headers}
    assert sets[":path"] == b"/other/v1/chat/completions"
    assert b"other-key" not in second.SerializeToString()
    assert b"provider-key" not in second.SerializeToString()
    assert set(sets) == {":path", "content-length"}
    assert not common.header_mutation.remove_headers
    assert json.loads(common.body_mutation.body) == {"model": "second", "messages": []}
    assert sets["content-length"] == str(len(common.body_mutation.body)).encode()
    assert not common.clear_route_cache  # the attempt's cluster is already chosen


def test_a_retry_that_cannot_be_rewritten_is_refused_not_sent_with_the_old_key() -> None:
    (unknown,) = run(attempt_headers("target__nope__0__x", "/v1/chat/completions"))
    assert unknown.immediate_response.status.code == 502
    (wrong_dialect,) = run(attempt_headers("target__g__1__other", "/v1/messages"))
    assert wrong_dialect.immediate_response.status.code == 502
    assert json.loads(wrong_dialect.immediate_response.body)["type"] == "error"  # Anthropic
    _, unreadable = run(attempt_headers("target__g__1__other", "/v1/chat/completions"),
                        body_message(b"not json"))
    assert unreadable.immediate_response.status.code == 502


def test_a_body_answer_on_the_wire_is_the_message_with_the_body_inside() -> None:
    """The body leaves as its own field encoding after the rest of the message; a protobuf
    parser merges the two into exactly the answer built the ordinary way."""
    body = b'{"messages": [{"content": "' + b"x" * 300_000 + b'"}], "model": "g"}'
    gateway = Gateway(Runtime(CONFIG, {"K": "provider-key", "K2": "other-key"}))
    pending = gateway.on_headers(
        messages.header_map(headers_message("/v1/chat/completions").request_headers), False)
    outcome = gateway.on_body(pending, body)
    answer = messages.forward(outcome)
    assert isinstance(answer, messages.BodyAnswer)
    assert any(isinstance(part, memoryview) for part in answer.wire_parts())  # not joined
    small = gateway.on_body(pending, b'{"model": "g"}')
    message, order = messages.forward(small).wire_parts()  # body inside, then the order
    assert b'"g"' not in message and order == messages.attempt_order(
        AttemptOrder(small.attempts, small.same_target_retries, small.same_target_wait_s))
    ordinary = ext.ProcessingResponse()
    ordinary.CopyFrom(answer.response)
    ordinary.dynamic_metadata.update({"sidecar.route": {"priority_groups": [
        {"name": f"attempt{n}", "clusters": [{"cluster_name": cluster, "weight": 1}]}
        for n, cluster in enumerate(outcome.attempts, 1)],
        "same_target_retries": outcome.same_target_retries,
        "same_target_wait_s": outcome.same_target_wait_s}})
    ordinary.request_body.response.body_mutation.body = outcome.body
    parsed = ext.ProcessingResponse.FromString(answer.SerializeToString())
    assert parsed == ordinary
    assert parsed.request_body.response.body_mutation.body == body.replace(b'"g"', b'"real"')


def test_unexpected_messages_are_logged_at_a_bounded_rate(caplog) -> None:
    """Issue 13, finding 6: whatever a peer sends, the log grows by a few lines a minute."""
    import logging

    processor = ExternalProcessor(Gateway(Runtime(CONFIG, {})))
    odd = ext.ProcessingRequest(response_trailers=ext.HttpTrailers())
    with caplog.at_level(logging.WARNING, logger="sidecar.extproc"):
        for _ in range(50):
            response, done = processor.stream().step(odd)
            assert response is None and done  # never stalls the request
    lines = [r for r in caplog.records if "unexpected ext_proc message" in r.getMessage()]
    assert 1 <= len(lines) <= 10


# --- the reply gate (docs/reply-gate.md) ----------------------------------------------------

def response_headers(end_of_stream: bool = False, **headers: str) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode())
                                   for k, v in headers.items()]),
        end_of_stream=end_of_stream))


def response_body(body: bytes, end_of_stream: bool = False) -> ext.ProcessingRequest:
    return ext.ProcessingRequest(response_body=ext.HttpBody(body=body,
                                                             end_of_stream=end_of_stream))


def steps(*requests: ext.ProcessingRequest) -> list[tuple[ext.ProcessingResponse | None, bool]]:
    """Each request's (answer, stream done), as the gRPC server sees them."""
    stream = ExternalProcessor(Gateway(Runtime(CONFIG, {}))).stream()
    results = []
    for request in requests:
        response, done = stream.step(request)
        results.append((response, done))
        if done:
            break
    return results


def test_a_chunked_reply_is_answered_and_read_for_its_usage() -> None:
    reply = json.dumps({"object": "chat.completion", "choices": [],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7}}).encode()
    (headers, headers_done), (body, body_done) = steps(
        response_headers(**{"content-type": "application/json"}),
        response_body(reply, end_of_stream=True))
    assert headers.HasField("response_headers") and not headers_done
    assert body_done and body.HasField("response_body")
    usage = json_format.MessageToDict(body.dynamic_metadata)["sidecar.usage"]
    assert usage["output_tokens"] == 7 and usage["input_tokens"] == 11
    assert usage["shape"] == "chat.completion"
    assert not body.response_body.response.HasField("header_mutation")  # passed unchanged


def test_a_partial_body_beyond_the_buffer_is_released_unread() -> None:
    (_, _), (body, done) = steps(response_headers(), response_body(b'{"choices": [', False))
    assert done and not body.HasField("dynamic_metadata")


def test_a_stream_is_held_unanswered_until_its_first_event_then_released_by_ending() -> None:
    start = response_headers(**{"content-type": "text/event-stream"})
    held = steps(start, response_body(b": keep-alive\n\n"),
                 response_body(b"event: ping\ndata: {\"type\": \"ping\"}\n\n"),
                 response_body(b'data: {"object": "chat.completion.chunk"'),
                 response_body(b'}\n\n'))
    assert [answer for answer, _ in held] == [None] * 5  # nothing answered: Envoy waits
    assert [done for _, done in held] == [False, False, False, False, True]


@pytest.mark.parametrize(("event", "status"), [
    (b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n', 529),
    (b'data: {"error": {"message": "x", "type": "server_error"}}\n\n', 500),
    (b'event: error\ndata: {"type": "error", "error": {"type": "rate_limit_error"}}\n\n', 429),
    (b'data: {"error": {"message": "?"}}\n\n', 502),
])
def test_an_in_band_error_first_becomes_a_status_the_router_retries(event: bytes,
                                                                    status: int) -> None:
    _, (answer, done) = steps(response_headers(**{"content-type": "text/event-stream"}),
                              response_body(event))
    assert done
    (set_status,) = answer.response_headers.response.header_mutation.set_headers
    assert (set_status.header.key, set_status.header.raw_value) == (":status",
                                                                    str(status).encode())


def test_a_request_error_in_band_and_text_that_mentions_error_are_released() -> None:
    for event in (b'event: error\ndata: {"type": "error", "error": '
                  b'{"type": "invalid_request_error"}}\n\n',
                  b'data: {"choices": [{"delta": {"content": "\\"error\\" is a word"}}]}\n\n'):
        _, (answer, done) = steps(response_headers(**{"content-type": "text/event-stream"}),
                                  response_body(event))
        assert (answer, done) == (None, True)


def test_a_stream_without_a_complete_event_is_released_at_the_bound() -> None:
    from sidecar.gateway.reply_gate import MAX_HELD_EVENT_BYTES
    piece = b"data: " + b"x" * 1000
    results = steps(response_headers(**{"content-type": "text/event-stream"}),
                    *[response_body(piece) for _ in range(MAX_HELD_EVENT_BYTES // 1000 + 2)])
    assert results[-1] == (None, True)
    assert len(results) <= MAX_HELD_EVENT_BYTES // 1000 + 2
