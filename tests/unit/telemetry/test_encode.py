"""The worker's encoder (sidecar/telemetry/encode.py) against the row definition
(`rows.request_row`): for random routing decisions — as the worker receives them, through
marshal — and random outcomes, the values written and the counters moved are the same."""

from __future__ import annotations

import marshal
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from sidecar.routing.router import Router
from sidecar.telemetry.encode import RowEncoder
from sidecar.telemetry.results import RequestResult
from sidecar.telemetry.row_counts import count_row
from sidecar.telemetry.rows import (
    DecisionFacts,
    DecisionRecord,
    JoinedRequest,
    Price,
    decision_record,
    request_row,
)
from sidecar.telemetry.store import TelemetryStore
from tests.unit.routing.test_properties import (
    FAST,
    build,
    observations,
    policies,
    requests,
    snapshot_for,
    targets,
)

PRICES = {"p/m0": Price(1.0, 4.0, 0.1, 1.25), "p/m2": Price(0.5, 0.0, 0.5, 0.5)}
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CHECK_TRACE = "00-c4ec1157f3577b34da6a3ce929d0e0e4-00f067aa0ba902b7-01"  # rollout check's

results = st.builds(
    lambda status, target, tokens, latency: RequestResult(
        "r1", status, target, 1 if target else 0, "ok" if status < 400 else "server_error",
        latency, None if latency is None else latency / 3, *tokens),
    st.sampled_from([0, 200, 429, 503]),
    st.sampled_from([None, "p/m0", "p/m1", "p/m2"]),
    st.tuples(*(st.one_of(st.none(), st.integers(0, 10_000)),) * 4),
    st.one_of(st.none(), st.floats(0.1, 60_000)))
callers = st.fixed_dictionaries({
    "traceparent": st.sampled_from(["", TRACE, CHECK_TRACE, "garbage"]),
    "admission": st.sampled_from([None, "requests_per_minute"]),
    "cache": st.sampled_from([None, "miss", "bypass"])})


class _Store(TelemetryStore):
    def __init__(self) -> None:
        super().__init__(db=None, replica="r-1")  # type: ignore[arg-type]


@FAST
@given(targets, policies, requests, observations,
       st.sampled_from(["weighted", "failover", "dynamic_score"]), callers,
       st.one_of(st.none(), results), st.booleans(),
       st.sampled_from(["joined", "decision_only", "log_only", "evicted"]))
def test_the_encoder_writes_and_counts_what_request_row_says(
        tl, policy, req, obs, strategy, caller, result, decided, join) -> None:
    if not decided and result is None:
        result = RequestResult("r1", 200, "p/m0", 1, "ok")
    record = None
    if decided:
        cfg = build(tl, policy, strategy, None)
        outcome = Router(cfg).decide(req, snapshot_for(cfg, obs))
        facts = DecisionFacts("r1", 1_700_000_000.5, "team", "g", outcome, req, **caller)
        record = DecisionRecord(*marshal.loads(marshal.dumps(decision_record(facts))))
    item = JoinedRequest(record, result, join, 1_700_000_001.0)
    reference = request_row(record, result, PRICES, join, item.at)
    expected_counts: Counter = Counter()
    count_row(expected_counts, reference)

    encoder = RowEncoder("r-1", PRICES)
    for _ in range(2):  # the second time from the remembered profile
        counts: Counter = Counter()
        assert encoder.request(item, counts) == _Store().values(reference)[1]
        assert counts == expected_counts
