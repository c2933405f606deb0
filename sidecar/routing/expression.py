"""Score-term expressions: a tiny arithmetic language over the named scores, with its own
tokenizer and recursive-descent parser (no Python `eval`, no `ast`).

`score_terms[].expression` is operator-written text such as
``0.45 * cost_score + 0.25 * latency_score``. It is compiled once at configuration load into
a closure; unknown names and syntax errors are configuration errors. Grammar::

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/") unary)*
    unary      := ("-" | "+") unary | primary
    primary    := NUMBER | SCORE_NAME | ("min" | "max") "(" expression ("," expression)* ")"
                | "(" expression ")"

Usual precedence: `*` and `/` bind tighter than `+` and `-`; operators of equal precedence
associate to the left. Division by zero yields 0 (defined, never raises on the hot path).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

SCORE_NAMES: tuple[str, ...] = (
    "cost_score",
    "latency_score",
    "throughput_score",
    "reliability_score",
    "complexity_score",
    "eval_quality_score",
    "budget_pressure",
)
FUNCTIONS: dict[str, Callable[..., float]] = {"min": min, "max": max}

Evaluator = Callable[[Mapping[str, float]], float]
MAX_LITERAL = 1e6


class ExpressionError(ValueError):
    """Raised at configuration load when a score expression is not in the language."""


_TOKEN = re.compile(r"\s*(?:(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>[-+*/(),]))")


@dataclass(frozen=True)
class _Token:
    kind: str  # "number", "name", "op" or "end"
    text: str
    position: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None:
            offending = text[position:].lstrip()[:1]
            column = len(text) - len(text[position:].lstrip()) + 1
            raise ExpressionError(f"unexpected character '{offending}' at column {column}")
        kind = match.lastgroup or "op"
        tokens.append(_Token(kind, match.group(kind), match.start(kind) + 1))
        position = match.end()
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0
        self.names: set[str] = set()

    @property
    def current(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.current
        self.index += 1
        return token

    def expect(self, text: str) -> None:
        if self.current.text != text or self.current.kind != "op":
            raise self.error(f"expected '{text}'")
        self.take()

    def error(self, message: str) -> ExpressionError:
        found = self.current.text or "end of expression"
        return ExpressionError(f"{message} at column {self.current.position} (found '{found}')")

    def parse(self) -> Evaluator:
        if self.current.kind == "end":
            raise ExpressionError("is empty")
        evaluator = self.expression()
        if self.current.kind != "end":
            raise self.error("unexpected token")
        return evaluator

    def expression(self) -> Evaluator:
        result = self.term()
        while self.current.kind == "op" and self.current.text in "+-":
            op = self.take().text
            result = _combine(result, self.term(), op)
        return result

    def term(self) -> Evaluator:
        result = self.unary()
        while self.current.kind == "op" and self.current.text in "*/":
            op = self.take().text
            result = _combine(result, self.unary(), op)
        return result

    def unary(self) -> Evaluator:
        if self.current.kind == "op" and self.current.text in "+-":
            negate = self.take().text == "-"
            inner = self.unary()
            return (lambda scores: -inner(scores)) if negate else inner
        return self.primary()

    def primary(self) -> Evaluator:
        token = self.current
        if token.kind == "number":
            self.take()
            value = float(token.text)
            if not abs(value) <= MAX_LITERAL:
                raise ExpressionError(
                    f"number {token.text} at column {token.position} is out of range "
                    f"(at most {MAX_LITERAL:g} in size)")
            return lambda scores: value
        if token.kind == "name":
            self.take()
            if token.text in FUNCTIONS:
                return self.call(token.text)
            if token.text not in SCORE_NAMES:
                raise ExpressionError(
                    f"unknown name '{token.text}' at column {token.position} "
                    f"(known: {', '.join(SCORE_NAMES)}, min, max)"
                )
            self.names.add(token.text)
            name = token.text
            return lambda scores: scores.get(name, 0.0)
        if token.kind == "op" and token.text == "(":
            self.take()
            inner = self.expression()
            self.expect(")")
            return inner
        raise self.error("expected a number, a score name or '('")

    def call(self, function: str) -> Evaluator:
        self.expect("(")
        arguments = [self.expression()]
        while self.current.kind == "op" and self.current.text == ",":
            self.take()
            arguments.append(self.expression())
        self.expect(")")
        apply = FUNCTIONS[function]
        return lambda scores: apply(argument(scores) for argument in arguments)


def _combine(left: Evaluator, right: Evaluator, op: str) -> Evaluator:
    if op == "+":
        return lambda scores: left(scores) + right(scores)
    if op == "-":
        return lambda scores: left(scores) - right(scores)
    if op == "*":
        return lambda scores: left(scores) * right(scores)

    def divide(scores: Mapping[str, float]) -> float:
        denominator = right(scores)
        return left(scores) / denominator if denominator else 0.0

    return divide


def compile_expression(text: str) -> Evaluator:
    """Compile `text` into an evaluator of a score mapping; raise ExpressionError if invalid."""
    return _Parser(text).parse()


def referenced_scores(text: str) -> set[str]:
    """Score names the expression reads."""
    parser = _Parser(text)
    parser.parse()
    return parser.names
