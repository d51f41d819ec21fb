"""Tokenizer and recursive-descent parser of the expression language. Nothing is evaluated.

Grammar (statements are separated by newlines or ``;``; ``#`` starts a comment)::

    program   := statement (sep statement)*
    statement := NAME '=' sum
    sum       := product (('+' | '-') product)*          left-associative
    product   := unary ('*' unary)*                      left-associative
    unary     := '-' unary | postfix
    postfix   := primary ("'" | '^' 'T')*
    primary   := NUMBER | NAME | '(' sum ')'

so transposition binds tighter than unary minus, which binds tighter than ``*``, which
binds tighter than ``+`` and ``-``: ``-A'*x + y`` is ``((-(A'))*x) + y``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import ParseError
from .ast import Add, Assign, Expr, Mul, Neg, Num, Pos, Program, Ref, Sub, Transpose, locate
from .names import name_problem

#: Deepest expression tree accepted (keeps every recursive pass far from Python's limit).
MAX_DEPTH = 200
#: Most parentheses and unary minuses nested in one another.
MAX_NESTING = 50

_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORDISH = re.compile(r"[A-Za-z0-9_.]*")
_OPERATORS = "+-*'()=^"
_SPACE = " \t\r\f\v"


@dataclass(frozen=True)
class Token:
    """kind is 'num', 'name', 'op' (text is the operator), 'sep' ('\\n' or ';') or 'eof'."""

    kind: str
    text: str
    pos: Pos
    value: float = 0.0

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        if self.text == "\n":
            return "end of line"
        return repr(self.text)


def _error(source: str, pos: Pos, message: str) -> ParseError:
    lines = source.split("\n")
    text = lines[pos.line - 1] if 1 <= pos.line <= len(lines) else ""
    return ParseError(locate(message, pos, text))


def tokenize(source: str) -> list[Token]:
    """The tokens of ``source``, ending with one 'eof' token; ParseError on a bad character."""
    if not isinstance(source, str):
        raise ParseError(f"source must be a str, got {type(source).__name__}")
    tokens: list[Token] = []
    line, start, i = 1, 0, 0  # start: offset of the current line's first character
    while i < len(source):
        ch = source[i]
        pos = Pos(line, i - start + 1)
        if ch in _SPACE:
            i += 1
        elif ch == "#":
            end = source.find("\n", i)
            i = len(source) if end < 0 else end
        elif ch in "\n;":
            tokens.append(Token("sep", ch, pos))
            i += 1
            if ch == "\n":
                line, start = line + 1, i
        elif ch in _OPERATORS:
            tokens.append(Token("op", ch, pos))
            i += 1
        elif ch.isascii() and (ch.isdigit() or (ch == "." and source[i + 1 : i + 2].isdigit())):
            m = _NUMBER.match(source, i)
            assert m is not None
            text, j = m.group(), m.end()
            tail = _WORDISH.match(source, j).group()
            if tail:
                raise _error(source, pos, f"malformed number {text + tail!r}")
            value = float(text)
            if not math.isfinite(value):
                raise _error(source, pos, f"number {text} is too large")
            tokens.append(Token("num", text, pos, value))
            i = j
        elif ch.isascii() and (ch.isalpha() or ch == "_"):
            m = _NAME.match(source, i)
            assert m is not None
            tokens.append(Token("name", m.group(), pos))
            i = m.end()
        else:
            hint = " (write matrix products with *)" if ch == "@" else ""
            raise _error(source, pos, f"unexpected character {ch!r}{hint}")
    tokens.append(Token("eof", "", Pos(line, len(source) - start + 1)))
    return tokens


def parse(source: str) -> Program:
    """Parse the statements in ``source`` into a ``Program``; ParseError says where it fails.

    >>> parse("y = A*x + y")      # doctest: +ELLIPSIS
    Program(statements=(Assign(target='y', expr=Add(a=Mul(a=Ref(name='A'), ...
    """
    return _Parser(source).program()


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = tokenize(source)
        self.source = source
        self.lines = source.split("\n")
        self.i = 0
        self.depth = 0

    # ---------------------------------------------------------------- token helpers

    def peek(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind == "op" and tok.text == text

    def error(self, tok: Token, message: str) -> ParseError:
        if tok.kind in ("sep", "eof") and tok.text != ";":
            message += f", found {tok.describe()}"
        return _error(self.source, tok.pos, message)

    # ---------------------------------------------------------------- grammar

    def program(self) -> Program:
        statements: list[Assign] = []
        while True:
            while self.peek().kind == "sep":
                self.advance()
            if self.peek().kind == "eof":
                break
            statements.append(self.statement())
        if not statements:
            raise ParseError(locate("empty program: expected at least one statement "
                                    "'name = expression'", Pos(1, 1)))
        return Program(tuple(statements), source=self.source)

    def statement(self) -> Assign:
        first = self.advance()
        if first.kind != "name":
            raise self.error(first, "expected an output name at the start of a statement "
                                    f"('name = expression'), found {first.describe()}")
        self.check_name(first)
        if not self.at("="):
            raise self.error(self.peek(), f"expected '=' after {first.text!r}")
        equals = self.advance()
        expr = self.operand(equals, "an expression")
        end = self.peek()
        if end.kind == "op" and end.text == ")":
            raise self.error(end, "unmatched ')'")
        if end.kind not in ("sep", "eof"):
            hint = " (one '=' per statement)" if end.text == "=" else ""
            raise self.error(end, "expected an operator or the end of the statement, "
                                  f"found {end.describe()}{hint}")
        if _depth(expr) > MAX_DEPTH:
            raise _error(self.source, first.pos,
                         f"expression nested too deeply (more than {MAX_DEPTH} levels)")
        last = self.tokens[self.i - 1]
        line = self.lines[first.pos.line - 1]
        text = line[first.pos.column - 1 : last.pos.column - 1 + len(last.text)]
        return Assign(first.text, expr, first.pos, text)

    def starts_operand(self) -> bool:
        tok = self.peek()
        return tok.kind in ("num", "name") or self.at("(") or self.at("-")

    def operand(self, after: Token, what: str = "an operand") -> Expr:
        """Parse a sum that must follow ``after``; a missing one is reported against it."""
        if not self.starts_operand():
            raise self.error(self.peek(), f"expected {what} after {after.text!r}")
        return self.sum()

    def sum(self) -> Expr:
        left = self.product()
        while self.at("+") or self.at("-"):
            op = self.advance()
            if not self.starts_operand():
                raise self.error(self.peek(), f"expected an operand after {op.text!r}")
            left = (Add if op.text == "+" else Sub)(left, self.product(), op.pos)
        return left

    def product(self) -> Expr:
        left = self.unary()
        while self.at("*"):
            op = self.advance()
            if not self.starts_operand():
                raise self.error(self.peek(), "expected an operand after '*'")
            left = Mul(left, self.unary(), op.pos)
        return left

    def unary(self) -> Expr:
        if not self.at("-"):
            return self.postfix()
        minus = self.advance()
        if not self.starts_operand():
            raise self.error(self.peek(), "expected an operand after '-'")
        with self.nested(minus):
            return Neg(self.unary(), minus.pos)

    @contextmanager
    def nested(self, tok: Token) -> Iterator[None]:
        """Count recursion (unary minus, parentheses) so that deep input fails cleanly."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _error(self.source, tok.pos, "parentheses and minus signs nested too deeply "
                                               f"(more than {MAX_NESTING} levels)")
        try:
            yield
        finally:
            self.depth -= 1

    def postfix(self) -> Expr:
        expr = self.primary()
        while self.at("'") or self.at("^"):
            op = self.advance()
            if op.text == "^":
                t = self.peek()
                if t.kind != "name" or t.text != "T":
                    raise self.error(t, "expected 'T' after '^' (transpose is written x^T or x')")
                self.advance()
            expr = Transpose(expr, op.pos)
        return expr

    def primary(self) -> Expr:
        tok = self.advance()
        if tok.kind == "num":
            return Num(tok.value, tok.pos)
        if tok.kind == "name":
            self.check_name(tok)
            return Ref(tok.text, tok.pos)
        if tok.kind == "op" and tok.text == "(":
            with self.nested(tok):
                inner = self.operand(tok, "an expression")
            if not self.at(")"):
                close = self.peek()
                if close.kind in ("sep", "eof"):
                    raise _error(self.source, tok.pos, "'(' is never closed")
                raise self.error(close, f"expected ')' to close the '(' at {tok.pos}, "
                                        f"found {close.describe()}")
            self.advance()
            return inner
        raise _error(self.source, tok.pos, f"expected an operand, found {tok.describe()}")

    def check_name(self, tok: Token) -> None:
        problem = name_problem(tok.text)
        if problem is not None:
            raise _error(self.source, tok.pos, problem)


def _depth(e: Expr) -> int:
    """Height of the tree ``e``, computed without recursion."""
    best, stack = 0, [(e, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        for name in ("x", "a", "b"):
            child = getattr(node, name, None)
            if child is not None:
                stack.append((child, d + 1))
    return best
