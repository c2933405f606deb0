"""One price rule for every dialect (sidecar/billing.py, observe/usage_fields.py): the worked
examples of docs/configuration.md, "Pricing", and what each dialect's usage means."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.billing import Rates, Usage, cost_usd, rates
from sidecar.config.models import Pricing
from sidecar.observe.usage_fields import usage_keys, usage_of


def test_the_openai_worked_example_prices_cached_tokens_inside_prompt_tokens() -> None:
    reply = {"usage": {"prompt_tokens": 2000, "completion_tokens": 100,
                       "prompt_tokens_details": {"cached_tokens": 1500}}}
    usage = usage_of(usage_keys(reply))
    assert usage == Usage(2000, 100, 1500, None)
    price = Pricing(input_per_mtok=1.25, cached_input_per_mtok=0.125, output_per_mtok=10)
    assert cost_usd(price.rates, usage) == pytest.approx(0.0018125)


def test_the_anthropic_worked_example_adds_cache_reads_and_writes_to_the_input() -> None:
    reply = {"usage": {"input_tokens": 50, "cache_read_input_tokens": 1800,
                       "cache_creation_input_tokens": 200, "output_tokens": 100}}
    usage = usage_of(usage_keys(reply))
    assert usage == Usage(2050, 100, 1800, 200)
    price = Pricing(input_per_mtok=3, cached_input_per_mtok=0.3, cache_write_per_mtok=3.75,
                    output_per_mtok=15)
    assert cost_usd(price.rates, usage) == pytest.approx(0.00294)


def test_an_anthropic_stream_reports_its_cache_in_message_start() -> None:
    start = {"type": "message_start", "message": {"usage": {
        "input_tokens": 10, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 0,
        "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 42}}
    keys = {**usage_keys(start), **usage_keys(delta)}  # later events win, as in Envoy
    assert usage_of(keys) == Usage(100, 42, 90, 0)


def test_a_responses_reply_counts_cached_tokens_inside_input_tokens() -> None:
    reply = {"object": "response", "usage": {
        "input_tokens": 300, "output_tokens": 20, "input_tokens_details": {"cached_tokens": 200}}}
    assert usage_of(usage_keys(reply)) == Usage(300, 20, 200, None)


def test_a_bridged_chat_answer_keeps_its_cache_writes() -> None:
    """The gateway's Chat translation of an Anthropic answer names its cache writes."""
    from sidecar.bridge.chat_to_messages import chat_usage
    usage = chat_usage({"input_tokens": 5, "cache_read_input_tokens": 80,
                        "cache_creation_input_tokens": 15, "output_tokens": 7})
    assert usage_of(usage_keys({"usage": usage})) == Usage(100, 7, 80, 15)


def test_unset_cache_prices_are_the_input_price_so_old_configurations_cost_the_same() -> None:
    price = Pricing(input_per_mtok=2, output_per_mtok=8)
    assert rates(price) == Rates(2, 8, 2, 2)
    assert cost_usd(price.rates, Usage(1000, 10, 600, 100)) == pytest.approx(
        (1000 * 2 + 10 * 8) / 1e6)


def test_no_reported_tokens_is_no_cost_and_missing_figures_stay_unknown() -> None:
    assert cost_usd(Rates(1, 1, 1, 1), Usage(None, None)) is None
    assert usage_of({}) == Usage(None, None, None, None)
    assert usage_of(usage_keys({"usage": {"completion_tokens": 3}})) == Usage(None, 3, None, None)


counts = st.integers(0, 10**7)


@given(counts, counts, counts, counts, st.tuples(*(st.floats(0, 100),) * 4))
def test_cost_is_never_negative_and_grows_with_every_figure(inp, out, read, written, prices):
    price = Rates(*prices)
    cost = cost_usd(price, Usage(inp, out, read, written))
    assert cost is not None and cost >= 0
    assert cost_usd(price, Usage(inp, out + 1, read, written)) >= cost
    assert cost_usd(price, Usage(inp + 1, out, read, written)) >= cost
