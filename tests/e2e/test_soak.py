"""The soak, short (issue 40, "long runs as a test"): the real sidecar and the real Envoy
(`sidecar up`) under mixed traffic from the official OpenAI and Anthropic SDKs for about
two and a half minutes, through devstack/soak.py, the driver bench/soak.py runs for 30.

Traffic: 19 kinds in rotation by 6 callers: unary and streams in both dialects, callers
hanging up mid-stream, 512 KiB prompts, and provider faults: a 500 in two, a 529 in two, 429s
with `retry-after`, connection resets and a slow first event, each rescued by fallback to a
healthy target; and targets that always fail, whose callers get the error as their
dialect's JSON. A poller asks `GET /ready` on the client listener every 20 ms, and an
operator console stays open, every page fetched every second.

Time is scaled, not waited for: `SIDECAR_TEST_TIME_SCALE=10` (grpcwire/time_scale.py, a
hidden test knob) runs Envoy's health checks of the sidecar every 100 ms instead of every
second and divides the gRPC server's durations by 10; counts, sizes and the flood budgets'
refill rate stay the production ones. So in this run (figures of a run on the 2-core
machine, ~150 s of stack time; the test checks each crossing itself):

- Envoy's health checks: ~1,500 on one connection, 15 times `max_unauthenticated_calls`
  (100): before issue 40's fix each 100 closed the connection (`flood_closed`) and
  `/ready` answered 503: this test fails on that code (checked: 25 non-200 answers and
  `flood_closed` 6 in a 20 s traffic run), where production shows it every ~101 s.
- `idle_timeout` (300 s scaled to 30; Envoy's own, 0.8 of it, 24 s): crossed once by a
  36 s quiet phase between two traffic phases, by every connection; none is closed,
  because each of Envoy's connections keeps its access-log stream open (`idle_closed`
  and Envoy's `upstream_cx_idle_timeout` stay 0), and the traffic after the quiet phase
  is answered as before.
- `log_interval` (60 s scaled to 6 s): ~25 windows of the log limiter.
- `handshake_timeout` (0.5 s) and `open_method_timeout` (0.2 s): every connection Envoy
  opens and every health call (~1,500) meet them.
- `connection_window` (64 MiB): every request body reaches the sidecar; with the 512 KiB
  prompts Envoy sends it several hundred MiB over its 2 worker connections, the window's
  credit coming back many times over.
- `flood_burst` (50 frames) and `flood_rate` (10 a second): Envoy's resets of thousands of
  finished ext_proc streams and its ~1,500 health calls (10 a second, ten times the
  production rate, against the unscaled refill) never empty a bucket.

Not crossed by design, because Envoy never gets near them: the sizes (`max_message_bytes`,
`stream_window` per call, the buffer and output caps: tests/unit/grpcwire covers them),
`max_concurrent_calls`, `max_connections`, `max_unauthenticated_connections` and
`max_open_method_calls` (Envoy makes one health call at a time, on one connection).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.devstack.soak import LIMIT_COUNTERS, SoakPlan, SoakReport, run_soak

pytestmark = pytest.mark.e2e

PLAN = SoakPlan(seconds=100, time_scale=10, workers=6, sample_every_s=5, ready_every_s=0.02)
# RSS growth from the first sample (the stack up, before any traffic) to the last. A 1.7 min
# run at this scale grew the sidecar by ~0 MB (peak +3.4) and Envoy by 16.5 MB (warm-up:
# buffers for the 512 KiB prompts, connection pools); the 30 min run at production speed
# grew them 4.3 and 21.4 MB. The bounds are 4x or more of that. With the console open
# (issue 43) the sidecar grew 9.4 MB in 2.3 min: its decision ring filled (2,000 traces,
# 1.3-3 KB each) and the telemetry pages read a growing store.
SIDECAR_RSS_GROWTH_MB = 20.0
ENVOY_RSS_GROWTH_MB = 70.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> SoakReport:
    workdir = Path(tmp_path_factory.mktemp("soak"))
    report = run_soak(workdir, PLAN)
    # beside the stack's log (up.log), for whoever reads a failure
    (workdir / "soak-report.json").write_text(json.dumps(report.as_dict(), default=str))
    return report


def test_the_run_crosses_the_limits_it_claims_to(report: SoakReport) -> None:
    """The floors are a quarter or less of what a run on the 2-core machine reaches."""
    limits = PLAN.limits
    assert report.health_checks >= 3 * limits.max_unauthenticated_calls
    assert PLAN.quiet_s > limits.idle_timeout
    assert report.wall_s >= 10 * limits.log_interval
    assert report.envoy_grew("upstream_cx_tx_bytes_total") >= limits.connection_window
    assert report.tally.total() >= 300


def test_ready_always_answers_200(report: SoakReport) -> None:
    assert report.ready_polls >= 1500
    assert not report.ready_failures, report.ready_first_failures


def test_an_open_console_answers_every_page_throughout(report: SoakReport) -> None:
    """Issue 43: the console refreshing every page every second while the decision ring
    wraps many times and the store grows (the memory test below covers it too)."""
    assert report.console_pages >= 300
    assert not report.console_failures
    assert report.tally.total() > 2_000  # the ring (2,000 decisions) wrapped


def test_no_connection_of_envoys_is_closed_by_the_sidecar(report: SoakReport) -> None:
    grew = {name: report.grew(name) for name in (*LIMIT_COUNTERS, "idle_closed")}
    assert grew == dict.fromkeys(grew, 0.0)
    closed = {name: report.envoy_grew(name) for name in (
        "upstream_cx_destroy_remote", "upstream_cx_destroy_remote_with_active_rq",
        "upstream_cx_protocol_error", "upstream_cx_idle_timeout", "health_check.failure",
        "health_check.network_failure")}
    assert closed == dict.fromkeys(closed, 0)
    # every check answered but the one in flight when the counters were read (a check
    # counts as an attempt when sent; failures are 0 above)
    assert report.health_checks - 1 <= report.envoy_grew("health_check.success") <= (
        report.health_checks)
    # nor backed up: the watermark whose crossing crashed Envoy 1.40 under this traffic
    # (tests/e2e/test_large_prompts_at_once.py)
    assert report.envoy_grew("upstream_flow_control_backed_up_total") == 0


def test_every_request_is_answered_as_its_kind_requires(report: SoakReport) -> None:
    tally = report.tally
    assert tally.total("unexpected") == 0, dict(tally.reasons)
    outcomes = {kind: outcome for kind, outcome in tally.outcomes}
    assert len(outcomes) == 21  # every kind ran
    assert {kind for kind, outcome in outcomes.items() if outcome == "error_as_expected"} == {
        "chat-broken unary", "chat-broken stream", "claude-broken unary",
        "claude-broken stream"}
    assert {kind for kind, outcome in outcomes.items() if outcome == "cancelled"} == {
        "chat-drip hang-up", "claude-drip hang-up"}


def test_memory_stays_bounded(report: SoakReport) -> None:
    first, last = report.samples[0], report.samples[-1]
    assert last.sidecar_rss_mb - first.sidecar_rss_mb <= SIDECAR_RSS_GROWTH_MB, report.samples
    assert last.envoy_rss_mb - first.envoy_rss_mb <= ENVOY_RSS_GROWTH_MB, report.samples


def test_no_unexplained_warning_in_the_logs(report: SoakReport) -> None:
    assert report.unexplained == []
