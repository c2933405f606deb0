"""Classifying Envoy access-log entries (real upb messages) into observations."""

from __future__ import annotations

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from google.protobuf import struct_pb2

from sidecar.envoy_contract import USAGE_KEY, USAGE_NAMESPACE
from sidecar.observe.entries import observation_of, outcome_of, result_of
from sidecar.observe.records import Outcome

TARGETS = {"target__g__0__p": "p/m"}


def entry(status: int = 200, cluster: str = "target__g__0__p", tokens: float | None = None,
          attempts: int = 1, **flags: bool) -> al.HTTPAccessLogEntry:
    message = al.HTTPAccessLogEntry()
    common = message.common_properties
    common.upstream_cluster = cluster
    common.upstream_request_attempt_count = attempts
    common.time_to_first_upstream_tx_byte.FromMilliseconds(5)
    common.time_to_first_upstream_rx_byte.FromMilliseconds(105)
    common.time_to_last_upstream_rx_byte.FromMilliseconds(505)
    common.time_to_last_downstream_tx_byte.FromMilliseconds(507)
    for name, value in flags.items():
        setattr(common.response_flags, name, value)
    if tokens is not None:
        usage = struct_pb2.Struct()
        usage.update({USAGE_KEY: tokens})
        common.metadata.filter_metadata[USAGE_NAMESPACE].CopyFrom(usage)
    message.response.response_code.value = status
    return message


def test_timings_and_usage() -> None:
    observation = observation_of(entry(tokens=50), TARGETS)
    assert observation.target == "p/m" and observation.outcome is Outcome.OK
    assert observation.ttfb_ms == pytest.approx(100)       # upstream: first tx → first rx
    assert observation.upstream_ms == pytest.approx(500)
    assert observation.latency_ms == pytest.approx(507)
    assert observation.output_tokens == 50
    assert observation.output_tokens_per_s == pytest.approx(100)


@pytest.mark.parametrize(("status", "flags", "outcome"), [
    (200, {}, Outcome.OK),
    (429, {}, Outcome.RATE_LIMITED),
    (503, {}, Outcome.SERVER_ERROR),
    (529, {}, Outcome.SERVER_ERROR),
    (400, {}, Outcome.CLIENT_ERROR),
    (422, {}, Outcome.CLIENT_ERROR),
    (401, {}, Outcome.PROVIDER_REJECTED),
    (403, {}, Outcome.PROVIDER_REJECTED),
    (404, {}, Outcome.PROVIDER_REJECTED),
    (408, {}, Outcome.UPSTREAM_TIMEOUT),
    (504, {}, Outcome.UPSTREAM_TIMEOUT),  # a gateway timeout, or a first event overdue
    (503, {"upstream_connection_failure": True}, Outcome.CONNECT_FAILURE),
    (503, {"no_healthy_upstream": True}, Outcome.CONNECT_FAILURE),
    (504, {"upstream_request_timeout": True}, Outcome.UPSTREAM_TIMEOUT),
    (200, {"stream_idle_timeout": True}, Outcome.UPSTREAM_TIMEOUT),
    (503, {"upstream_remote_reset": True}, Outcome.RESET),
    (200, {"upstream_connection_termination": True}, Outcome.RESET),
    (502, {"upstream_protocol_error": True}, Outcome.DECODE_ERROR),
    (200, {"downstream_connection_termination": True}, Outcome.CLIENT_CANCEL),
    (0, {"downstream_remote_reset": True, "upstream_remote_reset": True}, Outcome.CLIENT_CANCEL),
])
def test_classification_table(status: int, flags: dict, outcome: Outcome) -> None:
    assert outcome_of(entry(status, **flags).common_properties.response_flags, status) is outcome
    assert observation_of(entry(status, **flags), TARGETS).outcome is outcome


@pytest.mark.parametrize(("content_type", "tokens", "outcome"), [
    ("text/event-stream", 7, Outcome.OK),            # the final usage event went out
    ("text/event-stream", None, Outcome.CLIENT_CANCEL),  # hung up before it
    ("application/json", 7, Outcome.CLIENT_CANCEL),   # a JSON reply is whole or not at all
])
def test_a_caller_hanging_up_after_the_final_usage_event_is_not_a_cancel(
        content_type: str, tokens: float | None, outcome: Outcome) -> None:
    message = entry(tokens=tokens, downstream_connection_termination=True)
    message.response.response_headers["content-type"] = content_type
    assert observation_of(message, TARGETS).outcome is outcome
    assert result_of(message, TARGETS).error_class == outcome.value


def test_a_stream_whose_caller_hung_up_at_its_last_event_still_has_a_duration() -> None:
    """The end of the body never reached Envoy (the caller had gone): the span ends with
    the hang-up, so the stream still counts in its target's throughput. A stream cut
    before its usage event has no such span."""
    message = entry(tokens=7, downstream_connection_termination=True)
    message.response.response_headers["content-type"] = "text/event-stream"
    message.common_properties.ClearField("time_to_last_upstream_rx_byte")
    message.common_properties.ClearField("time_to_last_downstream_tx_byte")
    message.common_properties.duration.FromMilliseconds(405)
    assert observation_of(message, TARGETS).upstream_ms == pytest.approx(400.0)
    message.common_properties.metadata.ClearField("filter_metadata")
    assert observation_of(message, TARGETS).upstream_ms is None


def test_not_served_by_a_target_is_not_an_observation() -> None:
    assert observation_of(entry(cluster=""), TARGETS) is None              # sidecar's own reply
    assert observation_of(entry(cluster="elsewhere"), TARGETS) is None
    assert observation_of(entry(response_from_cache_filter=True), TARGETS) is None


def test_the_serving_target_is_not_blamed_for_rescuing_a_request() -> None:
    assert observation_of(entry(attempts=2), TARGETS).failed_over is False


class _Call:
    """What AccessLogStream sees of its gRPC call."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.status: int | None = None

    def send(self, message: bytes) -> None:
        self.sent.append(message)

    def finish(self, status: int = 0, message: str = "") -> None:
        self.status = status


def _message(*entries: al.HTTPAccessLogEntry, log_name: str | None = None) -> bytes:
    from envoy.service.accesslog.v3 import als_pb2
    message = als_pb2.StreamAccessLogsMessage()
    if log_name is not None:
        message.identifier.log_name = log_name
    message.http_logs.log_entry.extend(entries)
    return message.SerializeToString()


def test_a_stream_remembers_which_log_it_carries_and_survives_odd_entries() -> None:
    """Envoy names the log on a stream's first message only; later messages of the request
    log still become observations, and an unreadable entry is skipped, not fatal."""
    from sidecar.envoy_contract import ATTEMPT_LOG_NAME
    from sidecar.observe.access_log import AccessLogReceiver
    from sidecar.observe.store import ObservationStore

    store = ObservationStore(retention_seconds=600, slice_seconds=10, refresh_seconds=0)
    receiver = AccessLogReceiver(store, TARGETS, {"target__g__0__p": "g"})
    requests, attempts, call = receiver.stream(), receiver.stream(), _Call()
    requests.on_message(call, _message(entry(), log_name="sidecar_observations"))
    odd = entry(tokens=float("nan"))  # usage that is no number: this entry cannot be read
    requests.on_message(call, _message(entry(), odd, entry(status=503)))
    # an attempt is held until the next attempt of its request shows it was failed over
    attempts.on_message(call, _message(entry(status=503), log_name=ATTEMPT_LOG_NAME))
    attempts.on_message(call, _message(entry(status=503)))  # still the attempt log
    summary = store.summary("p/m", 600)
    assert summary.figures.count == 3
    assert summary.outcomes == {"ok": 2, "server_error": 1}
    requests.on_half_close(call)
    assert call.status == 0 and call.sent == [b""]


def test_a_429_that_names_a_wait_keeps_its_target_out_for_that_long_and_no_longer() -> None:
    """Issue #27, observation 3: the per-attempt log's `retry-after` (or a provider's reset
    headers) reaches the store; a 200 with reset headers (every OpenAI reply has them) does
    not; the wait is capped at observations.max_retry_after_seconds."""
    from envoy.service.accesslog.v3 import als_pb2

    from sidecar.envoy_contract import ATTEMPT_LOG_NAME
    from sidecar.observe.access_log import AccessLogReceiver
    from sidecar.observe.store import ObservationStore

    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    store = ObservationStore(clock=clock, max_retry_after_s=30.0)
    receiver = AccessLogReceiver(store, TARGETS, {"target__g__0__p": "g"},
                                 wall_clock=lambda: 1_767_225_600.0)

    def attempt(status: int, **headers: str) -> None:
        message = als_pb2.StreamAccessLogsMessage()
        message.identifier.log_name = ATTEMPT_LOG_NAME
        logged = entry(status)
        logged.request.request_id = f"r{status}{len(headers)}"
        for name, value in headers.items():
            logged.response.response_headers[name] = value
        message.http_logs.log_entry.append(logged)
        receiver.receive(message, per_attempt=True)

    attempt(200, **{"x-ratelimit-reset-requests": "5s"})
    assert store.retry_after_s("p/m") == 0.0
    attempt(429, **{"retry-after": "2"})
    assert store.retry_after_s("p/m") == pytest.approx(2.0)
    clock.now += 1.5
    assert store.retry_after_s("p/m") == pytest.approx(0.5)
    assert store.get("p/m", 600).retry_after_s == pytest.approx(0.5)  # the admin view
    clock.now += 0.5
    assert store.retry_after_s("p/m") == 0.0
    attempt(429, **{"anthropic-ratelimit-tokens-reset": "2026-01-01T01:00:00Z"})
    assert store.retry_after_s("p/m") == pytest.approx(30.0)  # an hour, capped
    attempt(429)  # no wait named: nothing changes
    assert store.retry_after_s("p/m") == pytest.approx(30.0)


def test_results_are_built_only_for_requests_a_sink_wants() -> None:
    """Issue #32: a request row costs about as much as the observation, so it is built
    only when some sink asks for it — the quota ledger for its own callers' requests,
    telemetry for every request."""
    from envoy.service.accesslog.v3 import als_pb2

    from sidecar.observe.access_log import AccessLogReceiver, FanOut
    from sidecar.observe.store import ObservationStore

    class Sink:
        def __init__(self, wanted: set[str]) -> None:
            self.wanted, self.finished_ids = wanted, []

        def wants(self, request_id: str) -> bool:
            return request_id in self.wanted

        def finished(self, result) -> None:
            self.finished_ids.append(result.request_id)

        def fallback(self, transition) -> None:
            pass

    quota_like, telemetry_like = Sink({"r-quota"}), Sink(set())
    store = ObservationStore(retention_seconds=600, slice_seconds=10, refresh_seconds=0)
    receiver = AccessLogReceiver(store, TARGETS, {"target__g__0__p": "g"},
                                 telemetry=FanOut([quota_like, telemetry_like]))
    message = als_pb2.StreamAccessLogsMessage()
    for request_id in ("r-quota", "r-other"):
        logged = entry()
        logged.request.request_id = request_id
        message.http_logs.log_entry.append(logged)
    receiver.receive(message, per_attempt=False)
    assert quota_like.finished_ids == telemetry_like.finished_ids == ["r-quota"]
    assert store.summary("p/m", 600).figures.count == 2  # observations whatever the sinks


def _fallback_receiver(**options):
    """A receiver of a two-target group, with a sink that keeps its transitions."""
    from sidecar.observe.access_log import AccessLogReceiver
    from sidecar.observe.store import ObservationStore

    class Sink:
        def __init__(self) -> None:
            self.transitions: list = []

        def wants(self, request_id: str) -> bool:
            return False

        def finished(self, result) -> None:
            pass

        def fallback(self, transition) -> None:
            self.transitions.append((transition.from_target, transition.to_target))

    sink = Sink()
    store = ObservationStore(retention_seconds=600, slice_seconds=10, refresh_seconds=0)
    targets = {"target__g__0__a": "a/m", "target__g__1__b": "b/m"}
    receiver = AccessLogReceiver(store, targets, dict.fromkeys(targets, "g"), telemetry=sink,
                                 **options)
    return receiver, sink


def _feed(receiver, logged: al.HTTPAccessLogEntry, per_attempt: bool,
          request_id: str = "r1") -> None:
    from envoy.service.accesslog.v3 import als_pb2
    logged.request.request_id = request_id
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.append(logged)
    receiver.receive(message, per_attempt=per_attempt)


@pytest.mark.parametrize("hang_up", ["downstream_connection_termination",
                                     "downstream_remote_reset"])
def test_a_fallback_answered_to_a_caller_that_hung_up_at_done_keeps_its_transition(
        hang_up: str) -> None:
    """The openai SDK closes at `[DONE]`: the request's entry has a flag of the caller's
    side, the answering attempt none (so it is not in the per-attempt log)."""
    receiver, sink = _fallback_receiver()
    _feed(receiver, entry(503, cluster="target__g__0__a"), per_attempt=True)
    done = entry(200, cluster="target__g__1__b", tokens=7, attempts=2, **{hang_up: True})
    done.response.response_headers["content-type"] = "text/event-stream"
    _feed(receiver, done, per_attempt=False)
    assert sink.transitions == [("a/m", "b/m")]
    assert receiver.attempts_waiting == 0


def test_a_request_whose_answer_was_in_the_attempt_log_leaves_nothing_waiting() -> None:
    """A request not answered cleanly has every attempt in the per-attempt log: its entry
    (here a 504 after the second attempt timed out too) ends the wait, in either order."""
    for request_first in (False, True):
        receiver, sink = _fallback_receiver()
        request = entry(504, cluster="target__g__1__b", attempts=2,
                        upstream_request_timeout=True)
        if request_first:
            _feed(receiver, request, per_attempt=False)
        _feed(receiver, entry(503, cluster="target__g__0__a"), per_attempt=True)
        _feed(receiver, entry(504, cluster="target__g__1__b", upstream_request_timeout=True),
              per_attempt=True)
        if not request_first:
            _feed(receiver, request, per_attempt=False)
        assert sink.transitions == [("a/m", "b/m")]
        assert receiver.attempts_waiting == 0


def test_a_reload_lengthens_the_wait_for_a_requests_attempts() -> None:
    """A failure waits for the attempt after it as long as the longest deadline, which a
    reload may have raised: a request within it still pairs."""
    now = [0.0]
    receiver, sink = _fallback_receiver(attempt_window_s=31.5, clock=lambda: now[0])
    receiver.remap({}, {}, 901.5)
    _feed(receiver, entry(503, cluster="target__g__0__a"), per_attempt=True)
    now[0] = 600.0
    _feed(receiver, entry(200, cluster="target__g__1__b", attempts=2), per_attempt=False)
    assert sink.transitions == [("a/m", "b/m")]


def test_a_last_attempt_that_failed_waits_no_longer_than_the_requests_entry() -> None:
    """Nothing can follow a request's last attempt: once the request's entry is in, a
    failure that was its last attempt is dropped (one arriving after the request's entry
    waits out the window: which attempt is last cannot be told from it alone)."""
    receiver, sink = _fallback_receiver()
    _feed(receiver, entry(503, cluster="target__g__0__a"), per_attempt=True)
    _feed(receiver, entry(503, cluster="target__g__0__a"), per_attempt=False)
    assert receiver.attempts_waiting == 0
    _feed(receiver, entry(503, cluster="target__g__0__a"), per_attempt=True, request_id="r2")
    _feed(receiver, entry(429, cluster="target__g__1__b"), per_attempt=True, request_id="r2")
    _feed(receiver, entry(429, cluster="target__g__1__b", attempts=2), per_attempt=False,
          request_id="r2")
    assert sink.transitions == [("a/m", "b/m")]
    assert receiver.attempts_waiting == 0
    # A stream that broke after its headers: a 200 with a flag, its attempt logged.
    _feed(receiver, entry(200, cluster="target__g__0__a", upstream_remote_reset=True),
          per_attempt=True, request_id="r3")
    _feed(receiver, entry(200, cluster="target__g__0__a", upstream_remote_reset=True),
          per_attempt=False, request_id="r3")
    assert receiver.attempts_waiting == 0


def test_a_cancelled_hedged_attempt_counts_and_only_a_hedges_answer_is_left_out() -> None:
    """Review: a hedged attempt the caller cancelled (status 0, a caller-side flag) is in
    the per-attempt log and its request expects it; only an answer (2xx) stands in the
    request's own entry."""
    from sidecar.envoy_contract import HEDGE_CLUSTER_PREFIX
    from sidecar.observe.entries import answered_as_if_clean

    hedged = entry(0, cluster=f"{HEDGE_CLUSTER_PREFIX}g__0__a__1__b",
                   downstream_remote_reset=True)
    assert not answered_as_if_clean(hedged, Outcome.CLIENT_CANCEL)
    hedged.response.response_code.value = 200
    assert answered_as_if_clean(hedged, Outcome.CLIENT_CANCEL)


def test_an_unrecognised_refusal_is_counted_by_provider_and_logged_without_its_body(
        caplog: pytest.LogCaptureFixture) -> None:
    """The hold marks a 400 no catalogue entry knows (`type=…;code=…`); the attempt log
    brings the mark: one more for the provider, one rate-limited line naming provider,
    status, type and code, and nothing else of the reply."""
    from sidecar.envoy_contract import UNRECOGNISED_HEADER
    receiver, _ = _fallback_receiver()
    for number in range(15):
        refused = entry(400, cluster="target__g__0__a")
        refused.response.response_headers[UNRECOGNISED_HEADER] = (
            "type=brand_new_error;code=x 1\n<script>")
        with caplog.at_level("WARNING", logger="sidecar.observe"):
            _feed(receiver, refused, per_attempt=True, request_id=f"r{number}")
    plain = entry(400, cluster="target__g__1__b")
    _feed(receiver, plain, per_attempt=True, request_id="known")
    assert receiver.unrecognised_refusals == {"a": 15}
    lines = [r.getMessage() for r in caplog.records if "unrecognised refusal" in r.getMessage()]
    assert len(lines) == 10  # the burst; the rest are held back (grpcwire/ratelimit.py)
    assert lines[0].startswith("unrecognised refusal: provider=a status=400 "
                               "type=brand_new_error code=x1script ")
