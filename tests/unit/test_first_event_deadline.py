"""The primary's own first-event deadline (issue 40: a slow first token is rescued by
default): several times the target's recent time to first byte plus time to read the
prompt, only with evidence, only on the first attempt, never where the operator decided."""

from __future__ import annotations

from envoy.config.core.v3.base_pb2 import Metadata
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from sidecar.config.fallback_policy import Fallback
from sidecar.envoy_contract import ATTEMPT_MARK_HEADER, ROUTE_NAMESPACE
from sidecar.extproc.messages import attempt_order, order_of
from sidecar.gateway.attempt_orders import AttemptOrder
from sidecar.gateway.first_event_deadline import (
    FLOOR_SECONDS,
    MIN_EVIDENCE,
    primary_deadline_s,
)
from sidecar.gateway.reply_gate import FirstEventGate, Retry
from sidecar.observe.entries import outcome_of
from sidecar.observe.records import Outcome
from sidecar.routing.observations import TargetObservations

WARM = TargetObservations(count=MIN_EVIDENCE, p95_ttfb_ms=300.0)


def test_a_warm_primary_gets_several_times_its_first_byte_time_never_under_the_floor() -> None:
    assert primary_deadline_s(Fallback(), WARM, 0) == FLOOR_SECONDS
    slow = TargetObservations(count=50, p95_ttfb_ms=3_000.0)  # a reasoning model, say
    assert primary_deadline_s(Fallback(), slow, 0) == 12
    # a long prompt gets its reading time: 100k tokens at 2,000 a second
    assert primary_deadline_s(Fallback(), WARM, 100_000) == 55


def test_no_deadline_without_evidence_or_where_the_operator_decided() -> None:
    cold = TargetObservations(count=MIN_EVIDENCE - 1, p95_ttfb_ms=300.0)
    assert primary_deadline_s(Fallback(), cold, 0) is None
    assert primary_deadline_s(Fallback(), TargetObservations(count=50), 0) is None
    assert primary_deadline_s(Fallback(first_token_timeout_seconds=30), WARM, 0) is None
    assert primary_deadline_s(Fallback(commit_at_first_event=False), WARM, 0) is None
    # never at or past the group's own wait, which the router enforces anyway
    assert primary_deadline_s(Fallback(per_try_timeout_seconds=5), WARM, 0) is None
    assert primary_deadline_s(Fallback(per_try_timeout_seconds=6), WARM, 0) == 5


def _order_back(deadline: int) -> AttemptOrder:
    response = ext.ProcessingResponse.FromString(attempt_order(
        AttemptOrder(("a", "b"), 1, 2.0, deadline)))
    metadata = Metadata()
    metadata.filter_metadata[ROUTE_NAMESPACE].CopyFrom(
        response.dynamic_metadata.fields[ROUTE_NAMESPACE].struct_value)
    return order_of(metadata)


def test_the_deadline_travels_with_the_attempt_order() -> None:
    assert _order_back(7) == AttemptOrder(("a", "b"), 1, 2.0, 7.0)
    assert _order_back(0) == AttemptOrder(("a", "b"), 1, 2.0, 0.0)


def test_only_the_first_attempt_has_it_and_overdue_is_a_timeout_for_the_next_target() -> None:
    order = AttemptOrder(("a", "b"), 1, 2.0, 7.0)
    first = FirstEventGate({"content-type": "text/event-stream", ATTEMPT_MARK_HEADER: "1"}, order)
    assert first.deadline_s == 7.0
    later = FirstEventGate({"content-type": "text/event-stream", ATTEMPT_MARK_HEADER: "2"}, order)
    assert later.deadline_s == 0.0
    overdue = first.overdue()
    # retried on the order as it is: a timeout never puts the same target next
    assert overdue == Retry(504, "first_event_timeout")
    # no response flag on it: its status alone makes it a timeout in the observations
    assert outcome_of(al.ResponseFlags(), overdue.status) is Outcome.UPSTREAM_TIMEOUT
