"""The providers' rate-limit headers as a wait in seconds (observe/rate_limits.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.observe.rate_limits import requested_wait_s

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(("headers", "wait"), [
    ({"retry-after": "2"}, 2.0),
    ({"retry-after": "0.5"}, 0.5),
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
    ({"retry-after": "Thu, 01 Jan 2026 00:00:07 GMT"}, 7.0),
    ({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "6m0s"}, 2.0),
    ({"x-ratelimit-reset-tokens": "1m30.5s"}, 90.5),
    ({"x-ratelimit-reset-requests": "12ms"}, 0.012),
    ({"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03Z",
      "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:30Z"}, 3.0),
    ({"anthropic-ratelimit-tokens-reset": "2025-12-31T23:59:00Z"}, 0.0),  # already past
    ({"retry-after": "soon", "x-ratelimit-reset-requests": "3s"}, 3.0),
    ({}, None),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "-4"}, None),
    ({"anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03"}, None),  # no time zone
])
def test_each_providers_form_gives_the_wait_it_means(headers: dict, wait: float | None) -> None:
    assert requested_wait_s(headers, NOW) == (pytest.approx(wait) if wait is not None else None)


@given(st.dictionaries(st.sampled_from(["retry-after", "retry-after-ms",
                                         "x-ratelimit-reset-requests",
                                         "anthropic-ratelimit-tokens-reset"]),
                       st.text(max_size=40)))
def test_any_header_value_gives_a_wait_of_zero_or_more_or_none(headers: dict) -> None:
    wait = requested_wait_s(headers, NOW)
    assert wait is None or wait >= 0
