"""Property tests over random groups, requests and observation states (hypothesis)."""

from __future__ import annotations

import marshal
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config import load_config_text
from sidecar.config.loading import load_config_data
from sidecar.dialects.apis import Dialect
from sidecar.routing.contract import contract_violation
from sidecar.routing.decision import Decision
from sidecar.routing.eligibility import PAIRS, Reach
from sidecar.routing.gates import output_budget
from sidecar.routing.observations import ObservationSnapshot, TargetObservations
from sidecar.routing.request import Reasoning, RequestSummary
from sidecar.routing.router import Router
from sidecar.routing.scores import estimated_cost_usd
from sidecar.telemetry.rows import DecisionFacts, DecisionRecord, decision_record

PROVIDERS = {"p": {"base_url": "http://127.0.0.1:9/v1",
                   "dialects": ["openai_chat", "anthropic_messages"]}}
TRI = st.one_of(st.none(), st.booleans())

targets = st.lists(st.fixed_dictionaries({
    "weight": st.integers(0, 100),
    "supports_tools": TRI,
    "supports_reasoning": TRI,
    "honors_max_tokens": st.booleans(),
    "input_modalities": st.one_of(st.none(), st.sampled_from([["text"], ["text", "image"]])),
    "tags": st.lists(st.sampled_from(["validated", "tool_capable", "vision", "cheap"]),
                     max_size=3, unique=True),
    "pricing": st.one_of(st.none(), st.fixed_dictionaries({
        "input_per_mtok": st.floats(0, 20), "output_per_mtok": st.floats(0, 80)})),
    "evaluation": st.one_of(st.none(), st.fixed_dictionaries({
        "quality_score": st.floats(0, 1)})),
    "context_window": st.one_of(st.none(), st.sampled_from([8_000, 128_000])),
}), min_size=1, max_size=5).filter(lambda ts: any(t["weight"] for t in ts))
contracts = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "require_tags": st.sampled_from([["validated"], ["cheap"]]),
    "min_context_window": st.just(32_000),
    "min_eval_quality_score": st.floats(0, 1),
}))

policies = st.fixed_dictionaries({
    "min_observations": st.integers(0, 30),
    "max_score_adjustment_percent": st.integers(0, 100),
    "hard_filters": st.fixed_dictionaries({
        "require_tool_support_when_tools_present": st.booleans(),
        "require_input_modalities": st.booleans(),
        "require_reasoning_support_when_requested": st.booleans()}),
    "thresholds": st.fixed_dictionaries({"max_error_rate": st.floats(0, 1)}),
    "score_terms": st.lists(st.fixed_dictionaries({
        "name": st.sampled_from(["t1", "t2"]),
        "expression": st.sampled_from([
            "cost_score", "latency_score + throughput_score", "0.5 * reliability_score",
            "eval_quality_score - cost_score", "max(cost_score, latency_score)"]),
        "when": st.sampled_from([{}, {"complexity_lte": "standard"},
                                 {"complexity_gte": "complex"}]),
        "require_tags": st.sampled_from([[], ["validated"]])}), max_size=2),
})

requests = st.builds(
    RequestSummary, group=st.just("g"), caller=st.just("c"),
    dialect=st.sampled_from([Dialect.OPENAI_CHAT, Dialect.ANTHROPIC_MESSAGES]),
    has_tools=st.booleans(), has_images=st.booleans(),
    reasoning=st.one_of(st.none(), st.just(Reasoning(effort="high"))),
    max_tokens_cap=st.one_of(st.none(), st.integers(1, 20_000)),
    prompt_chars=st.integers(0, 200_000),
    prompt_sample=st.sampled_from(["hi", "```\ndef f(): pass\n```\ndiff --git a/x b/x"]),
    spend_ceiling_usd=st.one_of(st.none(), st.floats(0.0001, 1.0)))

observations = st.lists(st.builds(
    TargetObservations, count=st.integers(0, 60),
    p95_latency_ms=st.one_of(st.none(), st.floats(1, 20_000)),
    output_tokens_per_s=st.one_of(st.none(), st.floats(1, 500)),
    error_rate=st.floats(0, 0.2), timeout_rate=st.floats(0, 0.1),
    fallback_rate=st.floats(0, 0.1)), min_size=5, max_size=5)


def build(target_list, policy, strategy="dynamic_score", contract=None):
    models = {"g": {"strategy": strategy, "routing_policy": {"dynamic_score": policy},
                    "contract": contract,
                    "targets": [{"provider": "p", "model_ref": f"m{i}", **t}
                                for i, t in enumerate(target_list)]},
              "elsewhere": {"targets": [{"provider": "p", "model_ref": "outsider"}]}}
    return load_config_data({"providers": PROVIDERS, "models": models})


def snapshot_for(cfg, obs):
    return ObservationSnapshot({f"p/m{i}": o for i, o in enumerate(obs)})


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(targets, policies, requests, observations,
       st.sampled_from(["weighted", "failover", "dynamic_score"]), contracts)
def test_chosen_targets_are_in_the_group_and_pass_every_gate(tl, policy, req, obs, strategy,
                                                             contract):
    cfg = build(tl, policy, strategy, contract)
    group = cfg.models["g"]
    outcome = Router(cfg).decide(req, snapshot_for(cfg, obs))
    if not isinstance(outcome, Decision):
        return
    hard = group.dynamic_score.hard_filters if strategy == "dynamic_score" else None
    for choice in outcome.ordered:
        assert group.targets[choice.index] is choice.target   # never outside the group
        dialects = Reach(tuple(cfg.target_dialects(choice.target)))
        for baseline, filter_ in PAIRS:
            assert baseline(req, choice.target, dialects)
            if hard is not None and getattr(hard, filter_.__name__):
                assert filter_(req, choice.target, dialects)
        if group.contract is not None:
            assert contract_violation(group.contract, choice.target) is None
        if req.spend_ceiling_usd is not None:
            cost = estimated_cost_usd(choice.target, req.estimated_input_tokens,
                                      output_budget(req))
            assert cost is None or cost <= req.spend_ceiling_usd


@FAST
@given(targets, policies, requests, observations)
def test_realised_shares_stay_inside_the_capped_band(tl, policy, req, obs):
    cfg = build(tl, policy)
    router = Router(cfg)
    view = snapshot_for(cfg, obs)
    first = router.decide(req, view)
    if not isinstance(first, Decision):
        return
    counts = Counter({first.primary.label: 1})
    for _ in range(999):
        counts[router.decide(req, view).primary.label] += 1
    a = policy["max_score_adjustment_percent"] / 100
    rows = first.trace.candidates
    # Weight shares recomputed from the configuration, not taken from the trace.
    weights = {f"p/m{i}": t["weight"] for i, t in enumerate(tl)}
    total = sum(weights[r.target] for r in rows)
    share = {r.target: (weights[r.target] / total if total else 1 / len(rows)) for r in rows}
    warm_share = sum(share[r.target] for r in rows if r.warm)
    assert sum(counts.values()) == 1000 and set(counts) <= set(share)
    for row in rows:
        realised = counts[row.target]
        if row.warm and first.trace.order == "blended_shares":
            assert (1 - a) * share[row.target] * 1000 - 1.0 <= realised
            assert realised <= ((1 - a) * share[row.target] + a * warm_share) * 1000 + 1.0
        else:  # cold (or nothing to blend): exactly its weight share
            assert abs(realised - share[row.target] * 1000) <= 1.0


@FAST
@given(targets, policies, st.lists(requests, min_size=2, max_size=6), observations)
def test_each_request_class_keeps_its_own_mix_when_classes_interleave(tl, policy, reqs, obs):
    """Different kinds of request (different candidate sets) interleaved: each kind still
    gets its own cold-start mix within one request."""
    cfg = build(tl, policy)
    view = snapshot_for(cfg, obs)
    router = Router(cfg)
    per_class: dict[tuple, Counter] = {}
    firsts: dict[tuple, Decision] = {}
    for _ in range(200):
        for req in reqs:
            outcome = router.decide(req, view)
            if not isinstance(outcome, Decision):
                continue
            key = tuple(sorted(r.target for r in outcome.trace.candidates))
            firsts.setdefault(key, outcome)
            if firsts[key].trace.candidates != outcome.trace.candidates:
                return  # same candidates but different shares (other terms): not one class
            per_class.setdefault(key, Counter())[outcome.primary.label] += 1
    for key, counts in per_class.items():
        n = sum(counts.values())
        for row in firsts[key].trace.candidates:
            assert abs(counts[row.target] - n * row.final_share) <= 1.0 + n * 1e-6


@FAST
@given(targets, policies, st.lists(requests, min_size=1, max_size=20), observations)
def test_same_inputs_same_decision_sequence(tl, policy, reqs, obs):
    cfg = build(tl, policy)
    view = snapshot_for(cfg, obs)
    one, two = Router(cfg), Router(cfg)

    def key(outcome):
        if isinstance(outcome, Decision):
            return [c.index for c in outcome.ordered], outcome.trace.to_dict()
        return outcome.reason

    assert [key(one.decide(r, view)) for r in reqs] == [key(two.decide(r, view)) for r in reqs]


def test_spec_sample_still_routes() -> None:
    from pathlib import Path
    text = (Path(__file__).parent.parent.parent / "fixtures" / "spec_sample.yaml").read_text()
    cfg = load_config_text(text)
    outcome = Router(cfg).decide(RequestSummary("adaptive-agent", "c", Dialect.OPENAI_CHAT))
    assert isinstance(outcome, Decision)


@FAST
@given(targets, policies, requests, observations,
       st.sampled_from(["weighted", "failover", "dynamic_score"]))
def test_the_telemetry_record_of_any_decision_is_plain_and_agrees_with_explain(
        tl, policy, req, obs, strategy):
    """What the sidecar hands the telemetry worker crosses `marshal` (plain values only),
    and the selected target's figures are the ones `sidecar explain` rounds."""
    cfg = build(tl, policy, strategy, None)
    outcome = Router(cfg).decide(req, snapshot_for(cfg, obs))
    sent = decision_record(DecisionFacts("r", 0.0, "c", "g", outcome, req))
    for name, value in zip(DecisionRecord._fields, sent, strict=True):
        assert _plain(value), f"{name} is not plain: {value!r}"
    record = DecisionRecord(*marshal.loads(marshal.dumps(sent)))
    if not isinstance(outcome, Decision):
        assert record.selected is None and record.scores is None
        return
    assert record.selected == outcome.primary.label
    row = outcome.trace.candidate(outcome.primary.label)
    if row is None:  # a strategy without candidate rows (failover)
        assert record.scores is None
        return
    assert {k: round(v, 6) for k, v in record.scores.items()} == row.scores
    assert record.final_share is not None and round(record.final_share, 6) == row.final_share
    assert (record.term_value is None) == (row.term_value is None)
    assert record.observations == row.observations


def _plain(value: object) -> bool:
    if value is None or type(value) in (str, int, float, bool):
        return True
    if type(value) in (tuple, list):
        return all(_plain(v) for v in value)  # type: ignore[union-attr]
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())  # type: ignore[union-attr]
    return False
