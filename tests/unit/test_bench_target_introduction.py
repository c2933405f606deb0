"""bench/target_introduction.py on one member, small: the shadow variant's mirror warms the
new target before the reload (no caller request meets it cold), the cold variant's does
not, and both runs carry the same routing core and reload."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from family_workloads import member
from target_introduction import Introduction, measure


def test_the_mirror_warms_the_new_target_before_callers_meet_it() -> None:
    shadow = measure(Introduction(member(0), "shadow", 20, 8.0, sample_percent=50))
    cold = measure(Introduction(member(0), "cold", 20, 8.0, sample_percent=50))
    assert shadow.mirrored >= 20 and shadow.mirror_usd > 0
    assert shadow.cold_serves == 0 < cold.cold_serves
    assert cold.mirrored == 0
    assert shadow.steady_share > 0 and cold.steady_share > 0
