"""`-k PATTERN`: choose scenarios the way pytest's `-k` chooses tests.

A term matches when it is a case-insensitive substring of the scenario id, its
title or one of its tags; terms combine with `and`, `or`, `not` and
parentheses: `-k "c05 or gate and not naive"`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vault.errors import BadInput

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")

Matcher = Callable[[str], bool]


def compile_pattern(pattern: str) -> Callable[[list[str]], bool]:
    """A predicate over the texts of one scenario (id, title, tags)."""
    tokens: list[str] = _TOKEN.findall(pattern)  # one group: each match is a str
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        return tok

    def expr() -> Callable[[list[str]], bool]:
        left = conj()
        while peek() == "or":
            take()
            right = conj()
            left = (lambda a, b: lambda t: a(t) or b(t))(left, right)
        return left

    def conj() -> Callable[[list[str]], bool]:
        left = unary()
        while peek() == "and":
            take()
            right = unary()
            left = (lambda a, b: lambda t: a(t) and b(t))(left, right)
        return left

    def unary() -> Callable[[list[str]], bool]:
        tok = peek()
        if tok is None:
            raise BadInput(f"-k {pattern!r}: expression ends too early")
        if tok == "not":
            take()
            inner = unary()
            return lambda t: not inner(t)
        if tok == "(":
            take()
            inner = expr()
            if peek() != ")":
                raise BadInput(f"-k {pattern!r}: missing ')'")
            take()
            return inner
        if tok in ("and", "or", ")"):
            raise BadInput(f"-k {pattern!r}: unexpected {tok!r}")
        word = take().lower()
        return lambda texts: any(word in text.lower() for text in texts)

    if not tokens:
        return lambda texts: True
    matcher = expr()
    if peek() is not None:
        raise BadInput(f"-k {pattern!r}: unexpected {peek()!r}")
    return matcher
