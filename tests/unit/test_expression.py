"""Score-term expressions: our own parser, precedence, division by zero, rejection at load."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.mark.parametrize(("text", "value"), [
    ("1 + 2 * 3", 7.0),
    ("(1 + 2) * 3", 9.0),
    ("8 / 4 / 2", 1.0),            # left-associative
    ("8 - 4 - 2", 2.0),
    ("-2 * 3", -6.0),
    ("- -2", 2.0),
    ("2 * -cost_score", -1.0),
    ("min(cost_score, 0.2) + max(1, 2, 3)", 3.2),
    ("max(0.5 * cost_score, latency_score / 2)", 0.25),
    (".5 + 1.", 1.5),
    ("1e-1 + 2E1", 20.1),
])
def test_precedence_and_functions(text: str, value: float) -> None:
    scores = {"cost_score": 0.5, "latency_score": 0.5}
    assert compile_expression(text)(scores) == pytest.approx(value)


def test_division_by_zero_is_zero_and_missing_scores_are_zero() -> None:
    assert compile_expression("eval_quality_score / cost_score")({"eval_quality_score": 1}) == 0
    assert compile_expression("1 / (cost_score - cost_score)")({"cost_score": 0.3}) == 0
    assert compile_expression("latency_score")({}) == 0


@pytest.mark.parametrize(("text", "message"), [
    ("0.5 * speed_score", "unknown name 'speed_score' at column 7"),
    ("__import__('os')", "unexpected character"),
    ("__import__(cost_score)", "unknown name '__import__'"),
    ("cost_score ** 2", "expected a number, a score name or '(' at column 13"),
    ("cost_score if 1 else 0", "unexpected token at column 12"),
    ("'text'", "unexpected character '''"),
    ("cost_score.real", "unexpected character '.'"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("1 +", "found 'end of expression'"),
    ("(1 + 2", "expected ')'"),
    ("min()", "expected a number"),
    ("abs(cost_score)", "unknown name 'abs'"),
    ("cost_score latency_score", "unexpected token"),
])
def test_anything_else_is_rejected_with_a_position(text: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=None) as caught:
        compile_expression(text)
    assert message in str(caught.value)


@given(st.lists(st.floats(min_value=-100, max_value=100, allow_nan=False), min_size=1,
                max_size=6))
def test_sums_and_products_match_python_arithmetic(numbers: list[float]) -> None:
    text = " + ".join(f"({n!r})" for n in numbers)
    assert compile_expression(text)({}) == pytest.approx(sum(numbers))
    product = " * ".join(f"({n!r})" for n in numbers[:3])
    expected = 1.0
    for n in numbers[:3]:
        expected *= n
    assert compile_expression(product)({}) == pytest.approx(expected)
