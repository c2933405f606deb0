"""Conditions of `script` rules (docs/strategies.md): a small boolean language over a
request's features, with its own tokenizer and recursive-descent parser (no `eval`).

Compiled once at configuration load; unknown names, type mistakes and syntax errors are
configuration errors naming the column. Grammar::

    condition  := disjunct ("or" disjunct)*
    disjunct   := negation ("and" negation)*
    negation   := "not" negation | comparison
    comparison := operand [("==" | "!=" | "<" | "<=" | ">" | ">=") operand
                           | "in" (list | NAME)]
    operand    := NUMBER | STRING | "true" | "false" | NAME | "(" condition ")"
    list       := "[" [literal ("," literal)*] "]"

Strings are in double or single quotes. `x in [...]` tests membership in a list of
literals; `"debugging" in features` tests membership in a set-valued feature.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Condition = Callable[[Mapping[str, Any]], bool]
# The features a condition may read, and their kinds.
FEATURES: dict[str, str] = {
    "dialect": "str", "stream": "bool", "tools": "str", "images": "bool",
    "reasoning": "bool", "structured_output": "str", "max_tokens_cap": "str",
    "input_size": "str", "complexity": "str", "features": "set", "caller": "str",
    "hour_utc": "num", "weekday": "str", "prompt_chars": "num",
}
_COMPARISONS = {"==", "!=", "<", "<=", ">", ">="}
_TOKEN = re.compile(r"""\s*(?:(?P<number>\d+(?:\.\d+)?)
                          |(?P<string>"[^"]*"|'[^']*')
                          |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
                          |(?P<op>==|!=|<=|>=|[<>()\[\],]))""", re.VERBOSE)
_KEYWORDS = {"and", "or", "not", "in", "true", "false"}


class ConditionError(ValueError):
    pass


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    column: int


@dataclass(frozen=True)
class _Value:
    """A compiled operand: how to read it, and its kind (for checks at load time)."""

    read: Callable[[Mapping[str, Any]], Any]
    kind: str


def _tokens(text: str) -> list[_Token]:
    out, position = [], 0
    while text[position:].strip():
        match = _TOKEN.match(text, position)
        if match is None:
            column = len(text) - len(text[position:].lstrip()) + 1
            raise ConditionError(f"unexpected character at column {column}")
        kind = match.lastgroup or "op"
        out.append(_Token(kind, match.group(kind), match.start(kind) + 1))
        position = match.end()
    out.append(_Token("end", "", len(text) + 1))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.index = 0

    @property
    def current(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def at(self, text: str) -> bool:
        return self.current.kind in ("op", "name") and self.current.text == text

    def error(self, message: str) -> ConditionError:
        found = self.current.text or "end of condition"
        return ConditionError(f"{message} at column {self.current.column} (found '{found}')")

    def condition(self) -> Condition:
        parts = [self.disjunct()]
        while self.at("or"):
            self.take()
            parts.append(self.disjunct())
        if len(parts) == 1:
            return parts[0]
        return lambda f: any(part(f) for part in parts)

    def disjunct(self) -> Condition:
        parts = [self.negation()]
        while self.at("and"):
            self.take()
            parts.append(self.negation())
        if len(parts) == 1:
            return parts[0]
        return lambda f: all(part(f) for part in parts)

    def negation(self) -> Condition:
        if self.at("not"):
            self.take()
            inner = self.negation()
            return lambda f: not inner(f)
        return self.comparison()

    def comparison(self) -> Condition:
        left = self.operand()
        if self.current.kind == "op" and self.current.text in _COMPARISONS:
            op = self.take().text
            right = self.operand()
            return _compare(left, op, right, self)
        if self.at("in"):
            self.take()
            return self.membership(left)
        if left.kind != "bool":
            raise self.error("a comparison, 'in', or a true/false feature is needed")
        return lambda f: bool(left.read(f))

    def membership(self, left: _Value) -> Condition:
        if self.current.kind == "op" and self.current.text == "[":
            self.take()
            items: list[object] = []
            while not (self.current.kind == "op" and self.current.text == "]"):
                literal = self.operand()
                if literal.kind not in ("str", "num"):
                    raise self.error("lists hold strings or numbers")
                items.append(literal.read({}))
                if self.current.kind == "op" and self.current.text == ",":
                    self.take()
                elif not (self.current.kind == "op" and self.current.text == "]"):
                    raise self.error("expected ',' or ']'")
            self.take()
            allowed = frozenset(items)
            return lambda f: left.read(f) in allowed
        name = self.current
        if name.kind != "name" or FEATURES.get(name.text) != "set":
            raise self.error("'in' needs a list or a set feature (features)")
        self.take()
        return lambda f: left.read(f) in f.get(name.text, ())

    def operand(self) -> _Value:
        token = self.current
        if token.kind == "number":
            self.take()
            value = float(token.text)
            return _Value(lambda f: value, "num")
        if token.kind == "string":
            self.take()
            text = token.text[1:-1]
            return _Value(lambda f: text, "str")
        if token.kind == "name":
            if token.text in ("true", "false"):
                self.take()
                truth = token.text == "true"
                return _Value(lambda f: truth, "bool")
            if token.text in _KEYWORDS:
                raise self.error("expected a value")
            if token.text not in FEATURES:
                raise ConditionError(f"unknown name '{token.text}' at column {token.column} "
                                     f"(known: {', '.join(sorted(FEATURES))})")
            self.take()
            name = token.text
            return _Value(lambda f: f.get(name), FEATURES[name])
        if token.kind == "op" and token.text == "(":
            self.take()
            inner = self.condition()
            if not (self.current.kind == "op" and self.current.text == ")"):
                raise self.error("expected ')'")
            self.take()
            return _Value(inner, "bool")
        raise self.error("expected a value")


def _compare(left: _Value, op: str, right: _Value, parser: _Parser) -> Condition:
    if left.kind != right.kind or left.kind == "set":
        raise parser.error(f"cannot compare {left.kind} with {right.kind}")
    if op in ("<", "<=", ">", ">=") and left.kind != "num":
        raise parser.error(f"'{op}' compares numbers")
    a, b = left.read, right.read
    checks: dict[str, Condition] = {
        "==": lambda f: a(f) == b(f), "!=": lambda f: a(f) != b(f),
        "<": lambda f: a(f) < b(f), "<=": lambda f: a(f) <= b(f),
        ">": lambda f: a(f) > b(f), ">=": lambda f: a(f) >= b(f),
    }
    return checks[op]


def compile_condition(text: str) -> Condition:
    parser = _Parser(text)
    if parser.current.kind == "end":
        raise ConditionError("is empty")
    condition = parser.condition()
    if parser.current.kind != "end":
        raise parser.error("unexpected token")
    return condition
