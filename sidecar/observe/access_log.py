"""Turn Envoy gRPC access-log entries into observations, and receive them.

This is the Envoy adapter of the observe package: it knows `HTTPAccessLogEntry` (upb
messages from xds-protos); the store behind it does not. Entries arrive after the response
is finished, in batches (`observations.flush_interval_ms`), on the sidecar's gRPC port.

Two logs arrive: one entry per request (the connection manager's, against the target that
answered) and one per attempt (the router's `upstream_log`). The second feeds the failed
earlier attempts of a fallback chain (attempts.py) and the `fallback_transition` events.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.accesslog.v3 import als_pb2
from google.protobuf.message import DecodeError

from sidecar.envoy_contract import (
    ACCESS_LOG_NAME,
    ATTEMPT_LOG_NAME,
    HEDGE_CLUSTER_PREFIX,
    SHADOW_LOG_NAME,
    UNRECOGNISED_HEADER,
)
from sidecar.grpcwire.call import Call, UndecodableMessage
from sidecar.grpcwire.ratelimit import LogLimiter
from sidecar.observe.attempts import AttemptTracker, Transition
from sidecar.observe.entries import (
    ASKS_TO_WAIT,
    answered_as_if_clean,
    attempt_of,
    caller_side_only,
    observation_of,
    result_of,
    served_by,
    token_pairs,
)
from sidecar.observe.rate_limits import requested_wait_s
from sidecar.observe.records import Observation, Outcome
from sidecar.observe.store import ObservationStore
from sidecar.telemetry.results import RequestResult

log = logging.getLogger("sidecar.observe")
# At most 10 such lines a minute, whatever the entries (grpcwire/ratelimit.py).
_limited = LogLimiter(log, burst=10, interval=60.0)
fallback_log = logging.getLogger("sidecar.fallback")


class TelemetrySink(Protocol):
    def wants(self, request_id: str) -> bool:
        """Whether `finished` is to be called for this request (building the result costs
        about as much as the observation: the quota ledger wants only its callers')."""
        ...

    def finished(self, result: RequestResult) -> None: ...

    def fallback(self, transition: Transition) -> None: ...


class MirrorFeeds(Protocol):
    def feeds(self, group: str) -> bool: ...


class HedgeSink(Protocol):
    def ended(self, cluster: str, attempts: int, served_by: str | None) -> None: ...


class FanOut:
    """Several sinks of the access log's results (telemetry's join, the quota ledger)."""

    def __init__(self, sinks: list[TelemetrySink]) -> None:
        self._sinks = sinks

    def wants(self, request_id: str) -> bool:
        return any(sink.wants(request_id) for sink in self._sinks)

    def finished(self, result: RequestResult) -> None:
        for sink in self._sinks:  # one sink's bug must not cost the others their result
            try:
                sink.finished(result)
            except Exception:
                _limited.exception("access_log_sink", "an access-log sink failed a result")

    def fallback(self, transition: Transition) -> None:
        for sink in self._sinks:
            try:
                sink.fallback(transition)
            except Exception:
                _limited.exception("access_log_sink", "an access-log sink failed a result")


class AccessLogReceiver:
    SERVICE = "envoy.service.accesslog.v3.AccessLogService"
    METHOD = "StreamAccessLogs"

    def __init__(self, store: ObservationStore, targets: Mapping[str, str],
                 groups: Mapping[str, str] | None = None,
                 attempt_window_s: float = 3600.0, telemetry: TelemetrySink | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 hedges: Callable[[], HedgeSink] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`targets` and `groups` map Envoy cluster names to ``provider/model_ref`` and to
        the model group; `attempt_window_s` is the longest a request's attempts can span;
        `telemetry` receives every request's result and every fallback transition;
        `wall_clock` reads the rate-limit headers that name a moment; `hedges` gives the
        current hedge budgets the end of each hedged request (gateway/hedging.py); `clock`
        ages the entries waiting for their other half."""
        self._store = store
        self._wall_clock = wall_clock
        self._targets = targets
        self._groups = groups or {}
        self._attempts = AttemptTracker(max_age_s=attempt_window_s, clock=clock)
        self._telemetry = telemetry
        self._hedges = hedges
        # Entries received per log (`/metrics`): the per-attempt log carries only failed
        # and later attempts (envoy_config/observation_filters.py, failed_attempts_only).
        self.entries = {"request": 0, "attempt": 0}
        # Groups' shadow traffic (rollout/shadow_traffic.py): whether a candidate's entries
        # feed its observations. Set by the assembly.
        self.mirror: MirrorFeeds | None = None
        # Refusals no entry of the refusal catalogue knows, by provider (`/metrics`): the
        # labels are the configured providers, whatever the replies say.
        self.unrecognised_refusals: dict[str, int] = {}

    def stream(self) -> AccessLogStream:
        return AccessLogStream(self)

    def remap(self, targets: Mapping[str, str], groups: Mapping[str, str],
              attempt_window_s: float) -> None:
        """A reload's cluster names, added to the ones before: requests that started under
        the previous configuration are still logged under its clusters. The window is
        the longest a request can now take (operations/reload.py: it only grows)."""
        self._targets = {**self._targets, **targets}
        self._groups = {**self._groups, **groups}
        self._attempts.max_age_s = attempt_window_s

    @property
    def attempt_window_s(self) -> float:
        return self._attempts.max_age_s

    @property
    def attempts_waiting(self) -> int:
        """Per-attempt entries and request entries waiting for their other half."""
        return len(self._attempts)

    def receive(self, message: als_pb2.StreamAccessLogsMessage, per_attempt: bool) -> None:
        entries = message.http_logs.log_entry
        self.entries["attempt" if per_attempt else "request"] += len(entries)
        for entry in entries:
            try:
                if per_attempt:
                    self._attempt(entry)
                else:
                    self._request(entry)
            except Exception:  # one odd entry must not end the stream
                _limited.exception("access_log_entry", "unreadable access-log entry skipped")

    def mirrored(self, message: als_pb2.StreamAccessLogsMessage) -> None:
        """Entries of the shadow listener's log (rollout/shadow_traffic.py): observations of
        the candidate where its group's mirror feeds them, and nothing else — no telemetry
        row, no attempt pairing, no fallback: a mirrored request is no caller's."""
        entries = message.http_logs.log_entry
        self.entries["shadow"] = self.entries.get("shadow", 0) + len(entries)
        mirror = self.mirror
        for entry in entries:
            try:
                observation = observation_of(entry, self._targets)
                group = self._groups.get(served_by(entry.common_properties), "")
                if observation is not None and mirror is not None and mirror.feeds(group):
                    self._store.record(observation)
            except Exception:  # one odd entry must not end the stream
                _limited.exception("access_log_entry", "unreadable access-log entry skipped")

    def _request(self, entry: al.HTTPAccessLogEntry) -> None:
        observation = observation_of(entry, self._targets)
        if observation is not None:
            self._store.record(observation)
            common = entry.common_properties
            attempts = common.upstream_request_attempt_count
            status = entry.response.response_code.value
            flags = common.response_flags.ListFields()
            if attempts > 1 or not 200 <= status < 300 or (
                    flags and not caller_side_only(flags)):
                self._pair_attempts(entry, attempts, status, flags, observation.target)
        cluster = entry.common_properties.upstream_cluster
        hedged = self._hedges is not None and cluster.startswith(HEDGE_CLUSTER_PREFIX)
        telemetry = self._telemetry
        if telemetry is not None and not telemetry.wants(entry.request.request_id):
            telemetry = None
        if telemetry is None and not hedged:
            return
        result = result_of(entry, self._targets)
        if telemetry is not None:
            telemetry.finished(result)
        if hedged:
            self._hedges().ended(cluster, result.attempts, result.serving_target)

    def _pair_attempts(self, entry: al.HTTPAccessLogEntry, attempts: int, status: int,
                  flags: list, target: str) -> None:
        """A request with entries in the per-attempt log (several attempts, or one that
        failed). The attempt after its last failure is not in that log when it answered
        cleanly: a caller's hang-up (a flag of the caller's side: the openai SDK closes at
        `[DONE]`) leaves the attempt clean; any other flag, or a failure, puts the last
        attempt in the per-attempt log itself."""
        request_id = entry.request.request_id
        group = self._groups.get(served_by(entry.common_properties), "")
        if 200 <= status < 300 and caller_side_only(flags):
            transition = self._attempts.answered(request_id, group, target, attempts)
            if transition is not None:
                self._transition(transition)
        else:
            self._attempts.ended(request_id, group, attempts)

    def _attempt(self, entry: al.HTTPAccessLogEntry) -> None:
        attempt = attempt_of(entry, self._targets, self._groups)
        if attempt is None:
            return
        mark = entry.response.response_headers.get(UNRECOGNISED_HEADER)
        if mark is not None:
            self._unrecognised(attempt.target, entry.response.response_code.value, mark)
        if attempt.outcome is Outcome.HEDGED_OUT:
            if attempt.duration_ms is not None:
                self._store.record(Observation(attempt.target, Outcome.HEDGED_OUT,
                                               ttfb_ms=attempt.duration_ms))
            transition = self._attempts.hedged_out(attempt.request_id, attempt.group)
            if transition is not None:
                self._transition(transition)
            return
        if answered_as_if_clean(entry, attempt.outcome):
            return
        if entry.response.response_code.value in ASKS_TO_WAIT:
            wait = requested_wait_s(entry.response.response_headers, self._wall_clock())
            if wait is not None:
                self._store.rate_limited(attempt.target, wait)
        for transition in self._attempts.add(attempt):
            self._transition(transition)

    def _unrecognised(self, target: str, status: int, mark: str) -> None:
        """A provider's refusal (a held 400, 413 or 422) that the catalogue does not know
        (envoy_config/upstream_errors.py, gateway/reply_gate.py marked it): counted by
        provider, and named in a rate-limited line — its status and its error's type and
        code (tokens the marker cut to at most 48 of [A-Za-z0-9_.-]), never the message or
        the body, which may echo the prompt."""
        provider = target.split("/", 1)[0]
        self.unrecognised_refusals[provider] = self.unrecognised_refusals.get(provider, 0) + 1
        _limited.warning("unrecognised_refusal", "unrecognised refusal: provider=%s "
                         "status=%d %s (passed through; see docs/operations.md)",
                         provider, status, token_pairs(mark))

    def _transition(self, transition: Transition) -> None:
        self._store.record(transition.observation())
        fallback_log.info("%s", json.dumps(transition.event(), separators=(",", ":")))
        if self._telemetry is not None:
            self._telemetry.fallback(transition)


class AccessLogStream:
    """One StreamAccessLogs call. Envoy names the log on a stream's first message only, so
    the stream remembers which of the two logs it carries."""

    def __init__(self, receiver: AccessLogReceiver) -> None:
        self._receiver = receiver
        self._log = ACCESS_LOG_NAME

    def on_message(self, call: Call, payload: bytes | memoryview) -> None:
        try:
            message = als_pb2.StreamAccessLogsMessage.FromString(payload)
        except DecodeError as error:  # the peer's fault: INVALID_ARGUMENT, no traceback
            raise UndecodableMessage(str(error)) from None
        if message.HasField("identifier"):
            self._log = message.identifier.log_name
        if self._log == SHADOW_LOG_NAME:
            self._receiver.mirrored(message)
        else:
            self._receiver.receive(message, self._log == ATTEMPT_LOG_NAME)

    def on_half_close(self, call: Call) -> None:
        call.send(_EMPTY_RESPONSE)
        call.finish()

    def on_cancel(self) -> None:
        pass


_EMPTY_RESPONSE = als_pb2.StreamAccessLogsResponse().SerializeToString()
