"""`strategy: external` in the routing core (docs/external.md): the service's answer is the
attempt order when it names eligible targets only; anything else hands the decision to the
fallback strategy with the reason in the trace. Config errors name their YAML path. The
question sent carries safe features only, unless the group opts into prompt text."""

from __future__ import annotations

import pytest

from sidecar.config import ConfigError
from sidecar.external.query import QueryBuilder
from sidecar.routing.router import Router
from sidecar.routing.strategies import ExternalAnswer
from tests.unit.routing.helpers import config, request, snapshot, warm

GROUP = """
  g:
    strategy: external
    targets:
      - {provider: p, model_ref: a, weight: 1, input_modalities: [text, image]}
      - {provider: p, model_ref: b, weight: 3, input_modalities: [text, image]}
      - {provider: q, model_ref: c, weight: 1, input_modalities: [text]}
    external: {url: 'grpc://127.0.0.1:9', fallback_strategy: failover}
"""


def labels(outcome) -> list[str]:
    return [c.label for c in outcome.ordered]


def test_an_answer_naming_eligible_targets_is_the_attempt_order() -> None:
    router = Router(config(GROUP))
    decision = router.decide(request(), external=ExternalAnswer(("q/c", "p/a", "q/c")))
    assert labels(decision) == ["q/c", "p/a"]  # duplicates once, omitted ones not attempted
    assert decision.trace.external == "answered" and decision.trace.order == "external"
    assert decision.trace.to_dict()["external"] == "answered"


@pytest.mark.parametrize(("answer", "reason"), [
    (None, "not_asked"),
    (ExternalAnswer(failure="timeout"), "timeout"),
    (ExternalAnswer(failure="error"), "error"),
    (ExternalAnswer(failure="busy"), "busy"),
    (ExternalAnswer(()), "empty"),
    (ExternalAnswer(("p/a", "x/elsewhere")), "unknown_target"),
])
def test_no_usable_answer_means_the_fallback_strategy(answer, reason) -> None:
    decision = Router(config(GROUP)).decide(request(), external=answer)
    assert labels(decision) == ["p/a", "p/b", "q/c"]  # failover: declared order
    assert decision.trace.external == reason
    assert decision.trace.order == f"external fallback ({reason}): declared"


def test_a_target_the_filter_stage_removed_cannot_be_named() -> None:
    router = Router(config(GROUP))
    images = request(has_images=True)
    assert [c.label for c in router.external_candidates(images)] == ["p/a", "p/b"]
    decision = router.decide(images, external=ExternalAnswer(("q/c",)))
    assert decision.trace.external == "ineligible_target"
    assert labels(decision) == ["p/a", "p/b"]


def test_a_weighted_fallback_keeps_its_rotation() -> None:
    router = Router(config(GROUP.replace("fallback_strategy: failover",
                                         "fallback_strategy: weighted")))
    firsts = [labels(router.decide(request(), external=ExternalAnswer(failure="timeout")))[0]
              for _ in range(5)]
    assert firsts.count("p/b") == 3


def test_other_strategies_traces_have_no_external_key() -> None:
    weighted = Router(config(GROUP.replace("strategy: external", "strategy: weighted")))
    assert "external" not in weighted.decide(request()).trace.to_dict()


@pytest.mark.parametrize(("change", "words"), [
    (("    external: {url: 'grpc://127.0.0.1:9', fallback_strategy: failover}\n", ""),
     "models.g.external: strategy: external needs an 'external' block"),
    (("grpc://127.0.0.1:9", "ftp://host/x"), "models.g.external.url"),
    (("grpc://127.0.0.1:9", "grpc://127.0.0.1"), "grpc:// url is host:port only"),
    (("grpc://127.0.0.1:9", "http://user:pw@127.0.0.1/rank"), "must not carry credentials"),
    (("fallback_strategy: failover", "fallback_strategy: script"),
     "models.g.external.fallback_strategy"),
    (("fallback_strategy: failover", "timeout_ms: 1950"),
     "models.g.external.timeout_ms: must be at least 100 ms below "
     "limits.sidecar_message_timeout_ms (2000)"),
])
def test_config_errors_name_their_path(change, words) -> None:
    with pytest.raises(ConfigError) as raised:
        config(GROUP.replace(*change))
    assert words in str(raised.value)


def test_the_question_carries_features_not_text_unless_opted_in() -> None:
    cfg = config(GROUP)
    router = Router(cfg)
    secret = "Traceback (most recent call last): secret-canary"
    summary = request(prompt_chars=len(secret), prompt_sample=secret, max_tokens_cap=64)
    candidates = router.external_candidates(summary)
    observed = snapshot(**{"p/b": warm(count=40, p95_latency_ms=900.0, error_rate=0.25)})
    query = QueryBuilder(cfg.models["g"])(summary, candidates, observed)
    assert secret not in str(query) and query.prompt_text == ""
    assert "stack_trace" in query.prompt_features
    assert (query.group, query.caller, query.max_output_tokens) == ("g", "c", 64)
    by_label = {c.label: c for c in query.candidates}
    assert by_label["p/b"].observations.count == 40
    assert by_label["p/b"].observations.p95_latency_ms == 900.0
    assert not by_label["p/a"].observations.HasField("p95_latency_ms")
    opted = config(GROUP.replace("fallback_strategy: failover",
                                 "fallback_strategy: failover, send_prompt_text: true"))
    assert QueryBuilder(opted.models["g"])(summary, candidates, observed).prompt_text == secret
