"""Score-term expressions: a tiny, safe arithmetic language over the named scores.

`score_terms[].expression` is operator-written text such as
``0.45 * cost_score + 0.25 * latency_score``. It is parsed once at configuration load with
Python's `ast` into a closure, never evaluated with `eval`, and may use only numbers, the
score names below, `+ - * /`, unary minus and parentheses. Division by zero yields 0 so a
term can never raise on the hot path.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping

SCORE_NAMES: tuple[str, ...] = (
    "cost_score",
    "latency_score",
    "throughput_score",
    "reliability_score",
    "complexity_score",
    "eval_quality_score",
)

Evaluator = Callable[[Mapping[str, float]], float]


class ExpressionError(ValueError):
    """Raised at configuration load when a score expression is not in the allowed language."""


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: lambda a, b: a / b if b else 0.0,
}


def compile_expression(text: str) -> Evaluator:
    """Parse `text` into an evaluator of a score mapping; raise ExpressionError if invalid."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"is not a valid expression ({exc.msg})") from None
    return _build(tree.body)


def referenced_scores(text: str) -> set[str]:
    """Score names the expression reads (it must already be valid)."""
    return {node.id for node in ast.walk(ast.parse(text.strip(), mode="eval"))
            if isinstance(node, ast.Name)}


def _build(node: ast.expr) -> Evaluator:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = float(node.value)
        return lambda scores: value
    if isinstance(node, ast.Name):
        if node.id not in SCORE_NAMES:
            raise ExpressionError(
                f"unknown score '{node.id}' (known: {', '.join(SCORE_NAMES)})"
            )
        name = node.id
        return lambda scores: scores.get(name, 0.0)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        apply = _BINARY[type(node.op)]
        left, right = _build(node.left), _build(node.right)
        return lambda scores: apply(left(scores), right(scores))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _build(node.operand)
        return lambda scores: -inner(scores)
    raise ExpressionError(
        "may only use numbers, score names, + - * / and parentheses"
    )
