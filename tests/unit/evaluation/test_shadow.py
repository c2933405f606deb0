"""Shadow policies (issue #31): every sampled live decision of a group with a `shadow:`
block is decided again under the candidate, off the decision path, and compared; the
tallies say how often they agree and what the shadow's choices would have cost."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError
from sidecar.evaluation.shadow import ShadowDecider, shadow_decider
from sidecar.routing.decision import Decision
from sidecar.routing.policy_version import policy_version
from sidecar.routing.router import Router
from tests.unit.routing.helpers import config, request, snapshot, warm

GROUPS = """
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: dear, weight: 3,
         pricing: {input_per_mtok: 10, output_per_mtok: 40}}
      - {provider: p, model_ref: cheap, weight: 1,
         pricing: {input_per_mtok: 1, output_per_mtok: 4}}
    shadow: {weights: {p/dear: 1, p/cheap: 3}%s}
  plain:
    targets: [{provider: p, model_ref: dear}]
"""
VIEW = snapshot(p__dear=warm(p95_latency_ms=500, error_rate=0.0),
                p__cheap=warm(p95_latency_ms=1_500, error_rate=0.02))


def run(extra: str = "", n: int = 400, **decider) -> ShadowDecider:
    cfg = config(GROUPS % extra)
    live = Router(cfg)
    shadows = ShadowDecider(cfg, VIEW, **decider)
    for _ in range(n):
        summary = request(prompt_chars=4_000)
        decision = live.decide(summary, VIEW)
        assert isinstance(decision, Decision)
        shadows.offer(summary, decision)
    while shadows.drain():
        pass
    return shadows


def test_agreement_and_estimated_differences_of_a_cheaper_shadow() -> None:
    tally = run().totals["g"]
    # Live 3:1 dear, shadow 1:3: their odds share half their mass (1 − total variation).
    assert tally.decisions == 400
    assert tally.agreements / tally.decisions == pytest.approx(0.5)
    # The shadow's expected figures minus the live one's: half a request moves from dear
    # to cheap (4,000 characters: 1,000 input tokens, 1,024 output).
    dear, cheap = (1_000 * 10 + 1_024 * 40) / 1e6, (1_000 * 1 + 1_024 * 4) / 1e6
    assert tally.cost_delta_usd / 400 == pytest.approx(0.5 * (cheap - dear))
    assert tally.latency_delta_ms / 400 == pytest.approx(0.5 * (1_500 - 500))
    assert tally.error_rate_delta / 400 == pytest.approx(0.5 * 0.02)
    assert tally.policy_version != tally.shadow_version
    cfg = config(GROUPS % "")
    assert tally.policy_version == policy_version(cfg.models["g"])


def test_the_live_policy_version_ignores_the_shadow_block() -> None:
    with_shadow = config(GROUPS % "")
    without = config((GROUPS % "").replace("    shadow: {weights: {p/dear: 1, p/cheap: 3}}\n",
                                           ""))
    assert policy_version(with_shadow.models["g"]) == policy_version(without.models["g"])


def test_sampling_and_a_full_queue_drop_offers_and_count_them() -> None:
    sampled = run(", sample_percent: 25")
    assert 80 <= sampled.totals["g"].decisions <= 120
    # An identical shadow agrees fully, sampled or not.
    identical = config((GROUPS % ", sample_percent: 25").replace(
        "weights: {p/dear: 1, p/cheap: 3}", "weights: {p/dear: 3, p/cheap: 1}"))
    shadows, live = ShadowDecider(identical, VIEW), Router(identical)
    for _ in range(200):
        shadows.offer(request(), live.decide(request(), VIEW))
    shadows.drain()
    same = shadows.totals["g"]
    assert same.decisions and same.agreements == pytest.approx(same.decisions)
    bounded = ShadowDecider(config(GROUPS % ""), VIEW, max_pending=10)
    live = Router(config(GROUPS % ""))
    for _ in range(50):
        bounded.offer(request(), live.decide(request(), VIEW))
    assert bounded.pending == 10 and bounded.totals["g"].dropped == 40
    taken = bounded.take()
    assert taken["g"].dropped == 40 and bounded.take() == {}  # reset after each take


def test_a_configuration_without_shadows_has_no_decider() -> None:
    assert shadow_decider(config("""
  plain:
    targets: [{provider: p, model_ref: a}]
"""), VIEW) is None


def test_shadow_weights_must_name_the_groups_targets() -> None:
    with pytest.raises(ConfigError, match=r"shadow\.weights names no target"):
        config("""
  g:
    targets: [{provider: p, model_ref: a}]
    shadow: {weights: {p/b: 1}}
""")


def test_a_dynamic_score_shadow_of_a_weighted_group() -> None:
    cfg = config("""
  g:
    strategy: weighted
    targets:
      - {provider: p, model_ref: dear, weight: 3,
         pricing: {input_per_mtok: 10, output_per_mtok: 40}}
      - {provider: p, model_ref: cheap, weight: 1,
         pricing: {input_per_mtok: 1, output_per_mtok: 4}}
    shadow:
      strategy: dynamic_score
      routing_policy:
        dynamic_score:
          min_observations: 5
          score_terms: [{name: cheapest, expression: "cost_score"}]
""")
    shadows = ShadowDecider(cfg, VIEW)
    live = Router(cfg)
    for _ in range(100):
        summary = request(prompt_chars=4_000)
        shadows.offer(summary, live.decide(summary, VIEW))
    shadows.drain()
    tally = shadows.totals["g"]
    assert tally.decisions == 100 and tally.cost_delta_usd < 0


def test_a_shadow_decision_that_fails_is_skipped_and_the_loop_stops_cleanly() -> None:
    """A request decided under the old configuration, offered to a decider whose group no
    longer has its primary (a reload), must not kill the loop or the shutdown."""
    import asyncio

    from sidecar.evaluation.shadow import ShadowLoop

    shadows = ShadowDecider(config(GROUPS % ""), VIEW)
    gone = config("""
  g:
    strategy: weighted
    targets: [{provider: p, model_ref: gone, weight: 1}]
""")
    summary = request()
    shadows.offer(summary, Router(gone).decide(summary, VIEW))
    rows = []

    async def go() -> None:
        loop = ShadowLoop(lambda: shadows, rows.append, drain_s=0.01)
        loop.start()
        await asyncio.sleep(0.05)
        await loop.stop()

    asyncio.run(go())
    assert shadows.pending == 0
