"""What a reply costs: one rule for every dialect and every place that prices.

Telemetry rows, the spend quotas, the spend ceilings and `cost_score` all price tokens with
`cost_usd`, so a request costs the same in a report as it did at admission and in a score.

Token meaning is the same for every dialect: `input_tokens` is the request's whole input,
prompt-cache reads and writes included. Providers report it differently (see `Usage` and
docs/configuration.md, "Pricing"): OpenAI counts cached tokens inside `prompt_tokens`;
Anthropic reports `cache_read_input_tokens` and `cache_creation_input_tokens` beside an
`input_tokens` that excludes both. The readers (observe/usage_fields.py) undo that
difference before anything is priced.

Ground floor: imports nothing of the project, so config, routing, quotas and telemetry can
all use it.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class PriceSheet(Protocol):
    """USD per million tokens; a cache price left unset is the input price."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None
    cache_write_per_mtok: float | None


class Rates(NamedTuple):
    """A price sheet with every price resolved (what travels to the telemetry worker)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float
    cache_write_per_mtok: float


def rates(price: PriceSheet) -> Rates:
    cached = price.cached_input_per_mtok
    written = price.cache_write_per_mtok
    return Rates(price.input_per_mtok, price.output_per_mtok,
                 price.input_per_mtok if cached is None else cached,
                 price.input_per_mtok if written is None else written)


class Usage(NamedTuple):
    """Tokens as billed. `input_tokens` includes `cache_read_tokens` and
    `cache_write_tokens`; None means the provider did not say."""

    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


def cost_usd(price: Rates, usage: Usage) -> float | None:
    """`usage` at `price`; None when the provider reported no tokens at all. Cache reads and
    writes that exceed the reported input are priced as reported (a provider's figure is
    never made smaller), the uncached rest never below zero."""
    if usage.input_tokens is None and usage.output_tokens is None:
        return None
    read = usage.cache_read_tokens or 0
    written = usage.cache_write_tokens or 0
    uncached = max(0, (usage.input_tokens or 0) - read - written)
    return (uncached * price.input_per_mtok + read * price.cached_input_per_mtok
            + written * price.cache_write_per_mtok
            + (usage.output_tokens or 0) * price.output_per_mtok) / 1e6
