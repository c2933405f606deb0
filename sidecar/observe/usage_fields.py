"""Where each dialect reports tokens, and what its figures mean.

One table serves both readers of a reply's usage: Envoy's `json_to_metadata` and
`sse_to_metadata` rules (envoy_config/observation_filters.py), and the sidecar's own reader
of replies Envoy cannot read (chunked JSON, in the reply gate). Both leave the figures in
the `sidecar.usage` dynamic metadata under the keys below; `usage_of` turns them into one
meaning (billing.py: the whole input, cache reads and writes included).

The keys say how a figure relates to the input, because the dialects differ:

- OpenAI Chat and Responses count prompt-cache reads *inside* `prompt_tokens` /
  `input_tokens` and name them again in `prompt_tokens_details.cached_tokens` /
  `input_tokens_details.cached_tokens` (platform.openai.com/docs/guides/prompt-caching).
- Anthropic reports `cache_read_input_tokens` and `cache_creation_input_tokens` *beside* an
  `input_tokens` that excludes both (docs.anthropic.com/en/docs/build-with-claude/
  prompt-caching); a stream says so in `message_start`, under `message`.
- The gateway's own Chat answers bridged from Anthropic add
  `prompt_tokens_details.cache_write_tokens` (inside `prompt_tokens`, as Chat counts), so a
  cache write is not lost in translation.
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.billing import Usage
from sidecar.envoy_contract import (
    CACHE_READ_KEY,
    CACHE_WRITE_INCLUDED_KEY,
    CACHE_WRITE_KEY,
    CACHED_TOKENS_KEY,
    INPUT_TOKENS_KEY,
    USAGE_KEY,
)

Path = tuple[str, ...]

# Output tokens: Chat's `usage.completion_tokens`, Anthropic's and Responses'
# `usage.output_tokens` (an Anthropic stream's last `message_delta` carries the final one).
# A Responses stream says it in its `response.completed` event, under `response`.
OUTPUT_PATHS: tuple[Path, ...] = (("usage", "completion_tokens"), ("usage", "output_tokens"),
                                  ("response", "usage", "output_tokens"))

# The other counts, each under the key that says its meaning.
COUNT_PATHS: tuple[tuple[str, Path], ...] = (
    (INPUT_TOKENS_KEY, ("usage", "prompt_tokens")),
    (INPUT_TOKENS_KEY, ("usage", "input_tokens")),
    (INPUT_TOKENS_KEY, ("message", "usage", "input_tokens")),
    (INPUT_TOKENS_KEY, ("response", "usage", "input_tokens")),
    (CACHED_TOKENS_KEY, ("usage", "prompt_tokens_details", "cached_tokens")),
    (CACHED_TOKENS_KEY, ("usage", "input_tokens_details", "cached_tokens")),
    (CACHED_TOKENS_KEY, ("response", "usage", "input_tokens_details", "cached_tokens")),
    (CACHE_READ_KEY, ("usage", "cache_read_input_tokens")),
    (CACHE_READ_KEY, ("message", "usage", "cache_read_input_tokens")),
    (CACHE_WRITE_KEY, ("usage", "cache_creation_input_tokens")),
    (CACHE_WRITE_KEY, ("message", "usage", "cache_creation_input_tokens")),
    (CACHE_WRITE_INCLUDED_KEY, ("usage", "prompt_tokens_details", "cache_write_tokens")),
)


def _count(keys: Mapping[str, object], key: str) -> int | None:
    value = keys.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0, int(value))


def usage_of(keys: Mapping[str, object]) -> Usage:
    """The figures of one reply (metadata key → number) in billing's meaning; a figure the
    reply did not report is None."""
    output = _count(keys, USAGE_KEY)
    reported = _count(keys, INPUT_TOKENS_KEY)
    beside_read = _count(keys, CACHE_READ_KEY)
    beside_write = _count(keys, CACHE_WRITE_KEY)
    total = None
    if reported is not None or beside_read is not None or beside_write is not None:
        total = (reported or 0) + (beside_read or 0) + (beside_write or 0)
    return Usage(total, output, _sum(beside_read, _count(keys, CACHED_TOKENS_KEY)),
                 _sum(beside_write, _count(keys, CACHE_WRITE_INCLUDED_KEY)))


def _sum(first: int | None, second: int | None) -> int | None:
    if first is None and second is None:
        return None
    return (first or 0) + (second or 0)


def read_path(document: object, path: Path) -> object:
    """The value at `path` in a parsed JSON document, or None."""
    for key in path:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def usage_keys(document: object) -> dict[str, float]:
    """What the Envoy rules would leave for this parsed JSON reply (last path wins, as in
    Envoy), for replies the sidecar reads itself."""
    found: dict[str, float] = {}
    for path in OUTPUT_PATHS:
        value = read_path(document, path)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[USAGE_KEY] = float(value)
    for key, path in COUNT_PATHS:
        value = read_path(document, path)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[key] = float(value)
    return found
