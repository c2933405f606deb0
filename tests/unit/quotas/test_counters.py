"""Quota admission (docs/quotas.md) with an injected clock: each limit at its boundary,
`retry-after` to the window's end, per-group limits, the slice a replica keeps within
while its counters are shared, and the ledger that counts tokens and spend."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError
from sidecar.quotas.admission import refusal_error
from sidecar.quotas.counters import QuotaCounters, Refusal
from sidecar.quotas.ledger import QuotaLedger
from sidecar.telemetry.results import RequestResult
from tests.clock import ManualClock
from tests.unit.routing.helpers import config

MIDNIGHT = 1_767_225_600.0  # 2026-01-01T00:00:00Z
CALLERS = """
callers:
  - name: team
    token_sha256: "%s"
    quotas:
      requests_per_minute: 3
      tokens_per_day: 1000
      spend_per_day_usd: 0.5
      per_group:
        premium: {requests_per_minute: 1}
  - {name: free, token_sha256: "%s"}
""" % ("a" * 64, "b" * 64)
GROUPS = """
  basic:
    targets: [{provider: p, model_ref: cheap, pricing: {input_per_mtok: 100, output_per_mtok: 400}}]
  premium:
    targets: [{provider: p, model_ref: best}]
"""


def counters(at: float = MIDNIGHT + 30) -> tuple[QuotaCounters, ManualClock]:
    clock = ManualClock(at)
    return QuotaCounters(config(GROUPS + CALLERS), clock), clock


def test_requests_per_minute_at_its_boundary_with_retry_after() -> None:
    quotas, clock = counters(MIDNIGHT + 45.2)
    assert [quotas.admit("team", "basic") for _ in range(3)] == [None, None, None]
    assert quotas.admit("team", "basic") == Refusal("caller_requests_per_minute", 15)
    clock.now = MIDNIGHT + 60  # the next minute
    assert quotas.admit("team", "basic") is None
    assert quotas.admit("free", "basic") is None  # no quotas: never refused


def test_a_per_group_limit_names_the_group_scope() -> None:
    quotas, _ = counters()
    assert quotas.admit("team", "premium") is None
    assert quotas.admit("team", "premium") == Refusal("group_requests_per_minute", 30)
    assert quotas.admit("team", "basic") is None  # the caller-wide limit still has room
    # A refused request was not counted against the caller-wide limit either.
    assert quotas.admit("team", "basic") is None
    assert quotas.admit("team", "basic").reason == "caller_requests_per_minute"


def test_tokens_and_spend_per_day_count_when_used() -> None:
    quotas, clock = counters(MIDNIGHT + 3600)
    quotas.used("team", "basic", 999, 0.0, MIDNIGHT + 3600)
    assert quotas.admit("team", "basic") is None  # 999 < 1000
    quotas.used("team", "basic", 1, 0.0, MIDNIGHT + 3600)
    refusal = quotas.admit("team", "basic")
    assert refusal == Refusal("caller_tokens_per_day", 86_400 - 3600)
    clock.now = MIDNIGHT + 86_400
    assert quotas.admit("team", "basic") is None
    quotas.used("team", "basic", 0, 0.5, clock.now)
    assert quotas.admit("team", "basic").reason == "caller_spend_per_day_usd"


def test_a_shared_replica_admits_from_its_lease_and_one_request_on_credit() -> None:
    cfg = config(GROUPS + CALLERS.replace("requests_per_minute: 3", "requests_per_minute: 40"))
    quotas = QuotaCounters(cfg, ManualClock(MIDNIGHT))
    quotas.sliced = True  # Redis answered
    counter = quotas._counter(("team", "*", "requests_per_minute", int(MIDNIGHT // 60)))
    # No lease yet: one request on credit (a caller's first request is never refused) ...
    assert quotas.admit("team", "basic") is None and counter.unsynced == 1
    # ... then, under the limit, its own reason, never the over-limit one (issue #30.3).
    waiting = quotas.admit("team", "basic")
    assert waiting == Refusal("caller_requests_per_minute_lease_pending", 1)
    error = refusal_error(waiting)
    assert error.status == 429 and "under its limit" in error.message
    assert "under its limit" not in refusal_error(
        Refusal("caller_requests_per_minute", 30)).message
    counter.lease, counter.credit = 3.0, 1.0  # a round granted a lease
    assert [quotas.admit("team", "basic") for _ in range(3)] == [None] * 3
    assert counter.lease == 0 and counter.admitted == 4
    assert quotas.lease_size(40, counter) == 4  # 4 × 4 + 4, but at most 10 % of 40
    counter.known = 40.0  # the fleet reserved everything, but used only 10 of it:
    counter.used_known = 10.0  # reserved units may come back; the caller is under its limit
    assert quotas.admit("team", "basic").reason == "caller_requests_per_minute_lease_pending"
    counter.used_known = 40.0  # used it all: the real over-limit reason
    assert quotas.admit("team", "basic").reason == "caller_requests_per_minute"
    quotas.sliced = False  # Redis down: local limits only
    counter.known = 0.0
    assert quotas.admit("team", "basic") is None


def test_the_ledger_counts_tokens_and_cost_of_admitted_requests() -> None:
    cfg = config(GROUPS + CALLERS)
    quotas = QuotaCounters(cfg, ManualClock(MIDNIGHT))
    ledger = QuotaLedger(cfg, quotas, max_age_s=60, max_pending=2, clock=ManualClock(0.0),
                         wall_clock=ManualClock(MIDNIGHT))
    ledger.admitted("r1", "team", "basic")
    ledger.finished(RequestResult("r1", 200, "p/cheap", 1, "ok", 10.0, 5.0, 1000, 250, None))
    ledger.finished(RequestResult("r1", 200, "p/cheap", 1, "ok", 10.0, 5.0, 1000, 250, None))
    ledger.finished(RequestResult("other", 200, "p/cheap", 1, "ok", 10.0, 5.0, 9, 9, None))
    day = int(MIDNIGHT // 86_400)
    assert quotas.counters[("team", "*", "tokens_per_day", day)].unsynced == 1250  # once
    spend = quotas.counters[("team", "*", "spend_per_day_usd", day)].unsynced
    assert spend == pytest.approx((1000 * 100 + 250 * 400) / 1e6)
    for request_id in ("a", "b", "c"):
        ledger.admitted(request_id, "team", "basic")
    assert len(ledger) == 2 and ledger.unclaimed == 1  # bounded: the oldest went


def test_a_reload_that_lengthens_a_deadline_still_charges_requests_within_it() -> None:
    """The ledger forgets a request after the longest deadline; a reload that raises a
    deadline raises that too (operations/reload.py), or a long stream would go uncharged."""
    cfg = config(GROUPS + CALLERS)
    quotas = QuotaCounters(cfg, ManualClock(MIDNIGHT))
    clock = ManualClock(0.0)
    ledger = QuotaLedger(cfg, quotas, max_age_s=31.5, clock=clock,
                         wall_clock=ManualClock(MIDNIGHT))
    ledger.configure(cfg, 901.5)
    ledger.admitted("r1", "team", "basic")
    clock.now = 600.0
    ledger.admitted("r2", "team", "basic")  # ages the older entries out, if too old
    ledger.finished(RequestResult("r1", 200, "p/cheap", 1, "ok", 10.0, 5.0, 1000, 250, None))
    day = int(MIDNIGHT // 86_400)
    assert quotas.counters[("team", "*", "tokens_per_day", day)].unsynced == 1250


def test_quota_config_errors_name_their_path() -> None:
    with pytest.raises(ConfigError, match=r"callers\[0\].quotas.per_group: unknown model "
                                          "group 'nope'"):
        config(GROUPS + CALLERS.replace("premium: {", "nope: {"))
    with pytest.raises(ConfigError, match=r"need observations\.enabled"):
        config(GROUPS + CALLERS + "observations: {enabled: false}\n")


def test_a_served_reply_without_usage_is_charged_the_decisions_estimate() -> None:
    """Issue #28: a reply whose usage could not be read used to cost the quota nothing."""
    cfg = config(GROUPS + CALLERS)
    quotas = QuotaCounters(cfg, ManualClock(MIDNIGHT))
    ledger = QuotaLedger(cfg, quotas, max_age_s=60, clock=ManualClock(0.0),
                         wall_clock=ManualClock(MIDNIGHT))
    ledger.admitted("r1", "team", "basic")
    ledger.expect("r1", (300, 100))
    ledger.finished(RequestResult("r1", 200, "p/cheap", 1, "ok"))  # no usage read
    ledger.admitted("r2", "team", "basic")
    ledger.expect("r2", (300, 100))
    ledger.finished(RequestResult("r2", 503, "p/cheap", 1, "server_error"))  # not served
    ledger.expect("never-admitted", (1, 1))  # only admitted requests are remembered
    day = int(MIDNIGHT // 86_400)
    assert quotas.counters[("team", "*", "tokens_per_day", day)].unsynced == 400
    spend = quotas.counters[("team", "*", "spend_per_day_usd", day)].unsynced
    assert spend == pytest.approx((300 * 100 + 100 * 400) / 1e6)


def test_usage_charged_is_the_providers_when_it_said_and_an_estimate_when_served_silent():
    from sidecar.telemetry.results import usage_charged

    reported = RequestResult("r", 200, "p/m", 1, "ok", input_tokens=40, output_tokens=7)
    assert usage_charged(reported, (300, 100)) == (reported, "reported")
    # Issue 40: an Anthropic stream cut after `message_start` (input) and before its final
    # `message_delta` (output): the input stays as reported, the output is estimated.
    cut = RequestResult("r", 200, "p/m", 1, "reset", input_tokens=40)
    charged, source = usage_charged(cut, (300, 100))
    assert (charged.input_tokens, charged.output_tokens, source) == (40, 100, "estimated")
    hung_up = RequestResult("r", 200, "p/m", 1, "client_cancel", input_tokens=40)
    assert usage_charged(hung_up, (300, 100))[0].output_tokens == 100
    output_only = RequestResult("r", 200, "p/m", 1, "ok", output_tokens=7)
    charged, source = usage_charged(output_only, (300, 100))
    assert (charged.input_tokens, charged.output_tokens, source) == (300, 7, "estimated")
    refused = RequestResult("r", 400, "p/m", 1, "client_error", input_tokens=40)
    assert usage_charged(refused, (300, 100)) == (refused, "reported")
    silent = RequestResult("r", 200, "p/m", 1, "ok")
    charged, source = usage_charged(silent, (300, 100))
    assert (charged.input_tokens, charged.output_tokens, source) == (300, 100, "estimated")
    assert silent.input_tokens is None  # never changed
    cancelled = RequestResult("r", 0, "p/m", 1, "client_cancel")
    assert usage_charged(cancelled, (300, 100))[1] == "estimated"
    for unserved in (RequestResult("r", 503, "p/m", 1, "server_error"),
                     RequestResult("r", 401, None, 0, "ok")):
        assert usage_charged(unserved, (300, 100)) == (unserved, None)
    assert usage_charged(silent, None) == (silent, None)


def test_the_console_shows_each_open_window_against_its_limit() -> None:
    """console/usage_page.py's quota rows: counted against the limit, budget pressure."""
    from sidecar.console.usage_page import quota_rows

    quotas, _ = counters()
    quotas.admit("team", "basic")
    quotas.used("team", "basic", 400, 0.25, MIDNIGHT + 30)
    rows = {(r.scope, r.limit_name): r for r in quota_rows(quotas, ["basic", "premium"])}
    spend = rows[("*", "spend_per_day_usd")]
    assert (spend.caller, spend.counted, spend.limit, spend.pressure) == ("team", 0.25, 0.5,
                                                                          0.5)
    assert (rows[("*", "tokens_per_day")].counted, rows[("*", "tokens_per_day")].limit) == (
        400, 1000)
    assert rows[("*", "requests_per_minute")].limit == 3
