"""How long a provider asked not to be called again, from its response headers.

Read from the per-attempt access log of a 429 (or a 503 that names a time), so later
decisions leave the target out for that long (routing/router.py, `provider_retry_after`).
The headers, as the providers document them:

- `retry-after` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date; Anthropic sends seconds
  on every 429 (docs.anthropic.com/en/api/rate-limits); `retry-after-ms` (Azure OpenAI, and
  what the OpenAI SDKs read first): milliseconds.
- OpenAI's `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`: when the request or
  token window is full again, as a duration (`1s`, `6m0s`, `12ms`;
  platform.openai.com/docs/guides/rate-limits).
- Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset`: the
  moment the limit is replenished, in RFC 3339.

`retry-after-ms`, then `retry-after`, say what the provider wants of *this* caller; without
them the earliest of the reset times is taken (the limit that was hit is not named, and a
second 429 after an early return only starts a new wait). Values that do not parse are
ignored; none of these values ever reaches a log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime

RETRY_AFTER = "retry-after"
RETRY_AFTER_MS = "retry-after-ms"
RESET_HEADERS = ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
                 "anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset",
                 "anthropic-ratelimit-input-tokens-reset",
                 "anthropic-ratelimit-output-tokens-reset")
# What the access log must carry for this (envoy_config/observation_filters.py).
RATE_LIMIT_HEADERS = (RETRY_AFTER, RETRY_AFTER_MS, *RESET_HEADERS)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _seconds(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _duration(value: str) -> float | None:
    """A Go-style duration (`6m0s`, `1.5s`, `12ms`) in seconds."""
    text = value.strip()
    if not text or _DURATION.sub("", text):
        return _seconds(text)  # a plain number of seconds, as some providers send
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION.findall(text))


def _moment(value: str, now: float) -> float | None:
    """An RFC 3339 time or an HTTP-date, as seconds from `now` (wall clock)."""
    text = value.strip()
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def requested_wait_s(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the provider asked to wait (None: it did not say). `now`: wall-clock seconds,
    for the headers that name a moment."""
    if headers.get(RETRY_AFTER_MS):
        milliseconds = _seconds(headers[RETRY_AFTER_MS])
        if milliseconds is not None:
            return milliseconds / 1000
    if headers.get(RETRY_AFTER):
        value = headers[RETRY_AFTER]
        seconds = _seconds(value)
        if seconds is None:
            seconds = _moment(value, now)
        if seconds is not None:
            return seconds
    waits = []
    for name in RESET_HEADERS:
        value = headers.get(name)
        if value:
            wait = _duration(value) if name.startswith("x-") else _moment(value, now)
            if wait is not None:
                waits.append(wait)
    return min(waits) if waits else None
