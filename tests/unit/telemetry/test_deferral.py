"""The worker's deferral under CPU pressure (sidecar/telemetry/deferral.py): the reading
of Linux's pressure file, and the policy's bounds — never while the CPUs are free, never
longer than `max_defer_s` at a time, and after a deferral that ran out, not again before
the worker has caught up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.telemetry.deferral import CpuPressure, Deferral, DeferralPolicy, psi_total_us

PSI = """some avg10=0.03 avg60=1.18 avg300=3.56 total=2504009973
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"""


def test_the_some_line_gives_the_total_stall_time() -> None:
    assert psi_total_us(PSI) == 2504009973


@pytest.mark.parametrize("text", ["", "full avg10=0.00 total=5\n", "some avg10=0.1\n"])
def test_a_file_without_the_some_total_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        psi_total_us(text)


def test_pressure_is_the_stalled_share_of_the_time_since_the_last_reading() -> None:
    now, total = [100.0], [5_000_000]
    pressure = CpuPressure(lambda: total[0], lambda: now[0])
    now[0], total[0] = 100.5, 5_000_000 + 200_000   # 0.2 s stalled in 0.5 s
    assert pressure.share() == pytest.approx(0.4)
    now[0] = 101.5                                   # a second with no stall
    assert pressure.share() == 0.0
    assert pressure.share() == 0.0                   # no time passed: no share


def test_a_system_without_the_pressure_file_never_defers(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("sidecar.telemetry.deferral.PSI_CPU", tmp_path / "absent")
    assert CpuPressure.from_proc(lambda: 0.0) is None


def test_it_defers_while_contended_and_reads_once_the_cpus_are_free() -> None:
    deferral = Deferral(DeferralPolicy(above=0.3, max_defer_s=5.0))
    assert deferral.defer(0.0, 0.5) and deferral.defer(1.0, 0.3)
    assert not deferral.defer(1.1, 0.29)
    assert deferral.defer(1.2, 0.9)
    assert deferral.deferrals == 2


def test_a_deferral_that_runs_out_waits_for_the_worker_to_catch_up() -> None:
    deferral = Deferral(DeferralPolicy(above=0.3, max_defer_s=5.0))
    assert deferral.defer(0.0, 1.0) and deferral.defer(4.9, 1.0)
    assert not deferral.defer(5.0, 1.0)      # ran out: read
    assert not deferral.defer(60.0, 1.0)     # still contended, still behind: read
    deferral.caught_up()
    assert deferral.defer(60.1, 1.0)         # a new deferral, with a new limit
    assert not deferral.defer(65.2, 1.0)
    assert deferral.deferrals == 2


steps = st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 1.0), st.booleans()),
                 max_size=200)


@given(steps)
def test_no_deferral_outlasts_its_limit_or_happens_on_free_cpus(
        sequence: list[tuple[float, float, bool]]) -> None:
    policy = DeferralPolicy(above=0.3, max_defer_s=5.0)
    deferral = Deferral(policy)
    now, began = 0.0, None
    for step, pressure, caught_up in sequence:
        now += step
        if caught_up:
            deferral.caught_up()
        deferring = deferral.defer(now, pressure)
        if deferring:
            assert pressure >= policy.above
            began = now if began is None else began
            assert now - began < policy.max_defer_s
        else:
            began = None
