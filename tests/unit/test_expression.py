"""Score-term expressions compile to safe evaluators."""

from __future__ import annotations

import pytest

from sidecar.routing.expression import ExpressionError, compile_expression, referenced_scores

SPEC_EXPRESSION = ("0.45 * cost_score + 0.25 * latency_score + 0.20 * throughput_score "
                   "+ 0.10 * reliability_score")


def test_spec_expression_evaluates() -> None:
    evaluate = compile_expression(SPEC_EXPRESSION)
    scores = {"cost_score": 1.0, "latency_score": 0.5, "throughput_score": 0.0,
              "reliability_score": 1.0}
    assert evaluate(scores) == pytest.approx(0.45 + 0.125 + 0.10)
    assert referenced_scores(SPEC_EXPRESSION) == {
        "cost_score", "latency_score", "throughput_score", "reliability_score"}


def test_missing_scores_count_as_zero_and_division_by_zero_is_zero() -> None:
    assert compile_expression("eval_quality_score / cost_score")({}) == 0.0
    assert compile_expression("-(1 - cost_score) * 2")({"cost_score": 0.25}) == -1.5


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')",
    "cost_score ** 2",
    "max(cost_score, 1)",
    "cost_score if 1 else 0",
    "'text'",
    "cost_score.real",
    "",
    "1 +",
])
def test_anything_else_is_rejected(text: str) -> None:
    with pytest.raises(ExpressionError):
        compile_expression(text)
