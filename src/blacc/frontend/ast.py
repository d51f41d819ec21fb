"""The untyped syntax tree of the expression language (LGen's "LL").

Nodes are frozen, hashable dataclasses. Each has a ``pos`` (1-based line and column of
the token that made it: the operand, the operator, the ``'`` of a transpose) that is left
out of ``==``, ``hash`` and ``repr``, so trees built by hand, parsed, or built with the
Python builder compare equal when they mean the same computation::

    parse("y = A*x + y").statements[0]
    == Assign("y", Add(Mul(Ref("A"), Ref("x")), Ref("y")))

``format_expr`` / ``format_program`` print a tree back as source with the fewest
parentheses; the text re-parses to an equal tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pos:
    """A 1-based source position; line 0 means "unknown" (a tree built by hand)."""

    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}"


NOWHERE = Pos()


def locate(message: str, pos: Pos, line_text: str = "") -> str:
    """``message`` prefixed with ``pos``, then the source line with a caret under ``pos``::

        line 1, column 9: expected an operand after '*'
          y = A * + x
                  ^
    """
    if pos.line <= 0:
        return message
    head = f"{pos}: {message}"
    if not line_text.strip():
        return head
    pad = "".join("\t" if ch == "\t" else " " for ch in line_text[: pos.column - 1])
    return f"{head}\n  {line_text}\n  {pad}^"


def _pos() -> Pos:
    return field(default=NOWHERE, compare=False, repr=False)


@dataclass(frozen=True)
class Num:
    """A numeric literal: finite and non-negative (``-2`` is ``Neg(Num(2.0))``)."""

    value: float
    pos: Pos = _pos()

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"Num value must be a float, got {v!r}")
        if not math.isfinite(v) or v < 0 or math.copysign(1.0, v) < 0:
            raise ValueError(f"Num value must be finite and non-negative, got {v!r}")
        object.__setattr__(self, "value", float(v))


@dataclass(frozen=True)
class Ref:
    """A declared operand, by name."""

    name: str
    pos: Pos = _pos()


@dataclass(frozen=True)
class Neg:
    """Unary minus: ``-x``."""

    x: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Transpose:
    """Transposition: ``x'`` or ``x^T``."""

    x: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Add:
    """``a + b``."""

    a: Expr
    b: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Sub:
    """``a - b``."""

    a: Expr
    b: Expr
    pos: Pos = _pos()


@dataclass(frozen=True)
class Mul:
    """``a * b``: a scalar product or a matrix product; the type checker tells which."""

    a: Expr
    b: Expr
    pos: Pos = _pos()


Expr = Num | Ref | Neg | Transpose | Add | Sub | Mul


@dataclass(frozen=True)
class Assign:
    """One statement ``target = expr``; ``text`` is its source text (for messages)."""

    target: str
    expr: Expr
    pos: Pos = _pos()
    text: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True)
class Program:
    """Statements in order; ``source`` is the text they were parsed from ("" if built)."""

    statements: tuple[Assign, ...]
    source: str = field(default="", compare=False, repr=False)

    def line_text(self, line: int) -> str:
        """Source line ``line`` (1-based), or "" when unknown."""
        lines = self.source.splitlines()
        return lines[line - 1] if 1 <= line <= len(lines) else ""

    def __str__(self) -> str:
        return format_program(self)


# ------------------------------------------------------------------------------ printing

_SUM, _PRODUCT, _UNARY, _POSTFIX = 1, 2, 3, 4


def _level(e: Expr) -> int:
    if isinstance(e, (Add, Sub)):
        return _SUM
    if isinstance(e, Mul):
        return _PRODUCT
    if isinstance(e, Neg):
        return _UNARY
    return _POSTFIX


def format_number(value: float) -> str:
    """``2.0`` prints as ``2``; other values as ``repr`` (which round-trips)."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def format_expr(e: Expr) -> str:
    """Source text of ``e`` with the fewest parentheses: ``alpha*A*x + beta*y``."""

    def wrap(sub: Expr, at_least: int) -> str:
        text = format_expr(sub)
        return text if _level(sub) >= at_least else f"({text})"

    if isinstance(e, Num):
        return format_number(e.value)
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, Neg):
        return "-" + wrap(e.x, _UNARY)
    if isinstance(e, Transpose):
        return wrap(e.x, _POSTFIX) + "'"
    if isinstance(e, Mul):
        return f"{wrap(e.a, _PRODUCT)}*{wrap(e.b, _UNARY)}"
    if isinstance(e, (Add, Sub)):
        op = "+" if isinstance(e, Add) else "-"
        return f"{wrap(e.a, _SUM)} {op} {wrap(e.b, _PRODUCT)}"
    raise TypeError(f"not an expression node: {e!r}")


def format_statement(s: Assign) -> str:
    return f"{s.target} = {format_expr(s.expr)}"


def format_program(p: Program) -> str:
    """One statement a line."""
    return "\n".join(format_statement(s) for s in p.statements)


def children(e: Expr) -> tuple[Expr, ...]:
    """The operands of ``e`` (none for leaves)."""
    if isinstance(e, (Neg, Transpose)):
        return (e.x,)
    if isinstance(e, (Add, Sub, Mul)):
        return (e.a, e.b)
    return ()


def refs(e: Expr) -> list[Ref]:
    """Every ``Ref`` in ``e``, left to right."""
    if isinstance(e, Ref):
        return [e]
    return [r for c in children(e) for r in refs(c)]
