"""A slow first token is rescued by default (issue 40), and only where that is safe: a
primary with evidence of its usual time to first byte that has not sent its first event
within several times it (at least 5 s) is retried on the next target; a cold primary waits
as long as the group allows (the shared stack: conftest.py; the rule:
sidecar/gateway/first_event_deadline.py)."""

from __future__ import annotations

import time

import pytest

from sidecar.devstack.providers import Behaviour
from sidecar.gateway.first_event_deadline import FLOOR_SECONDS, MIN_EVIDENCE
from tests.e2e.fallback.conftest import Stack

pytestmark = pytest.mark.e2e


def stream(stack: Stack, group: str) -> tuple[str, float]:
    """(the model that answered, seconds to the end of the stream)."""
    started = time.monotonic()
    models = {chunk.model for chunk in stack.openai.chat.completions.create(
        model=group, messages=[{"role": "user", "content": "hi"}], stream=True)}
    (model,) = models
    return model, time.monotonic() - started


def test_a_warm_primarys_slow_first_token_goes_to_the_next_target(fresh: Stack) -> None:
    before = fresh.figures("s1/s1-slowstart")
    for _ in range(MIN_EVIDENCE):
        assert stream(fresh, "slow-start")[0] == "s1-slowstart"
    fresh.new_outcomes("s1/s1-slowstart", before, MIN_EVIDENCE)
    before = fresh.figures("s1/s1-slowstart")
    fresh.providers.provider("s1").behaviour = Behaviour(first_event_delay_s=30.0)
    model, seconds = stream(fresh, "slow-start")
    assert model == "s2-slowstart"
    # its deadline is the floor (its first bytes came in milliseconds), not the 300 s
    # per-try timeout
    assert FLOOR_SECONDS <= seconds < FLOOR_SECONDS + 4, seconds
    assert fresh.new_outcomes("s1/s1-slowstart", before, 1) == {"upstream_timeout": 1}


def test_a_cold_primary_is_waited_for(fresh: Stack) -> None:
    """No evidence of its usual first-token time (a reasoning model's may be long): no
    deadline of its own, so a first event later than the floor is still its answer."""
    fresh.providers.provider("s1").behaviour = Behaviour(first_event_delay_s=FLOOR_SECONDS + 1)
    model, seconds = stream(fresh, "slow-start-cold")
    assert model == "s1-cold"
    assert seconds >= FLOOR_SECONDS + 1
