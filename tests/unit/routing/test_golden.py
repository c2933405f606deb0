"""The strategies decide exactly as recorded (tests/fixtures/golden_decisions.json, made
before the strategy interface of issue #17): orders, refusals and whole traces."""

from __future__ import annotations

import json

from tests.unit.routing.golden import GOLDEN, scenario


def test_every_recorded_decision_is_reproduced() -> None:
    recorded = json.loads(GOLDEN.read_text())
    now = json.loads(json.dumps(scenario(), sort_keys=True, default=str))
    assert len(now) == len(recorded) == 270
    for before, after in zip(recorded, now, strict=True):
        assert after == before, (before["group"], before["round"], before["snapshot"],
                                 before["shape"])
