"""Cloud Logging's query language, as far as the fakes need it: a filter parsed into a test on one entry.

Understood, with the service's precedence (``NOT``, then ``OR``, then ``AND``; two terms side by side
are joined by ``AND``; parentheses group): comparisons ``field op "value"`` with ``=``, ``!=``, ``>``,
``>=``, ``<`` and ``<=`` on an entry's fields by dotted path (``resource.labels.job_id``, ``timestamp``),
and ``field=("a" OR "b")`` for any of several values. Values are compared as strings, which orders
timestamps correctly as long as both are written in RFC 3339 with the same number of digits, as the
launcher and the fake both write them. Anything else is a ``ValueError``, the fake's 400 answer.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable, Dict, List

Test = Callable[[Dict[str, Any]], bool]

TOKEN = re.compile(r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<op>>=|<=|!=|=|>|<)|(?P<paren>[()])|(?P<word>[\w.]+))')
COMPARE = {"=": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge, "<": operator.lt,
           "<=": operator.le}


def parse(text: str) -> Test:
    """The test a filter makes; an empty filter takes every entry."""
    tokens = _tokens(text)
    if not tokens:
        return lambda entry: True
    parser = _Parser(tokens)
    test = parser.conjunction()
    if parser.position != len(tokens):
        raise ValueError(f"unexpected {tokens[parser.position]!r} in filter {text!r}")
    return test


def _tokens(text: str) -> List[str]:
    tokens, position = [], 0
    while text[position:].strip():
        match = TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"cannot read filter {text!r} at {text[position:]!r}")
        tokens.append(match.group(match.lastgroup or ""))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: List[str]) -> None:
        self.tokens = tokens
        self.position = 0

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def take(self, expected: str = "") -> str:
        token = self.peek()
        if not token or (expected and token != expected):
            raise ValueError(f"expected {expected or 'more'} in filter, found {token!r}")
        self.position += 1
        return token

    def conjunction(self) -> Test:
        tests = [self.disjunction()]
        while self.peek() not in ("", ")"):
            if self.peek() == "AND":
                self.take()
            tests.append(self.disjunction())
        return lambda entry: all(test(entry) for test in tests)

    def disjunction(self) -> Test:
        tests = [self.term()]
        while self.peek() == "OR":
            self.take()
            tests.append(self.term())
        return lambda entry: any(test(entry) for test in tests)

    def term(self) -> Test:
        if self.peek() == "NOT":
            self.take()
            inner = self.term()
            return lambda entry: not inner(entry)
        if self.peek() == "(":
            self.take()
            inner = self.conjunction()
            self.take(")")
            return inner
        return self.comparison()

    def comparison(self) -> Test:
        path, op = self.take(), self.take()
        if op not in COMPARE:
            raise ValueError(f"expected a comparison after {path!r}, found {op!r}")
        values = self.values()
        compare = COMPARE[op]
        return lambda entry: any(compare(_field(entry, path), value) for value in values)

    def values(self) -> List[str]:
        if self.peek() != "(":
            return [_string(self.take())]
        self.take()
        values = [_string(self.take())]
        while self.peek() == "OR":
            self.take()
            values.append(_string(self.take()))
        self.take(")")
        return values


def _string(token: str) -> str:
    return token[1:-1].replace('\\"', '"') if token.startswith('"') else token


def _field(entry: Dict[str, Any], path: str) -> str:
    value: Any = entry
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)
