"""Build programs with Python operators on declarations, then name them with ``to_program``.

    A, x, y, alpha = Matrix(5, 9), Vector(9), Vector(5), Scalar()
    program, decls = to_program({"y": A @ x + alpha * y},
                                names={"A": A, "x": x, "y": y, "alpha": alpha})
    # program == parse("y = A*x + alpha*y"); check(program, decls) types it

``@`` is the matrix product, ``*`` the scalar product (one side a scalar, a number or a
1x1 result), ``+``, ``-``, unary ``-`` and ``.T`` as usual. Shapes are checked as the
expression is built (``TypeCheckError``); the full check runs in ``check``. Leaves are the
declaration objects themselves, matched to names by identity.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from ..errors import ArgumentError, ParseError, TypeCheckError
from .ast import (
    Add,
    Assign,
    Expr,
    Mul,
    Neg,
    Num,
    Program,
    Ref,
    Sub,
    Transpose,
    format_number,
    format_statement,
)
from .names import name_problem
from .parser import MAX_DEPTH, parse

if TYPE_CHECKING:
    from .types import Decl

Shape = tuple[int, int]


class Operand:
    """Mixin giving declarations and expressions their Python operators."""

    __slots__ = ()
    __array_ufunc__ = None  # NumPy scalars defer to our reflected operators
    shape: Shape

    def __matmul__(self, other: object) -> Expression:
        return _product(self, other, "@")

    def __rmatmul__(self, other: object) -> Expression:
        return _product(other, self, "@")

    def __mul__(self, other: object) -> Expression:
        return _product(self, other, "*")

    def __rmul__(self, other: object) -> Expression:
        return _product(other, self, "*")

    def __add__(self, other: object) -> Expression:
        return _sum(self, other, "+")

    def __radd__(self, other: object) -> Expression:
        return _sum(other, self, "+")

    def __sub__(self, other: object) -> Expression:
        return _sum(self, other, "-")

    def __rsub__(self, other: object) -> Expression:
        return _sum(other, self, "-")

    def __neg__(self) -> Expression:
        return Expression("neg", (self,), self.shape)

    @property
    def T(self) -> Expression:  # noqa: N802  (NumPy's name)
        """The transpose."""
        return Expression("T", (self,), (self.shape[1], self.shape[0]))


@dataclass(frozen=True, eq=False, repr=False)
class Const(Operand):
    """A number in an expression (a scalar)."""

    value: float
    shape: Shape = (1, 1)

    def __repr__(self) -> str:
        return format_number(self.value)


@dataclass(frozen=True, eq=False, repr=False)
class Expression(Operand):
    """An operation on operands: op is 'neg', 'T', '+', '-', '*' (scaling) or '@'."""

    op: str
    args: tuple[Node, ...]
    shape: Shape
    depth: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        depth = 1 + max(getattr(a, "depth", 0) for a in self.args)
        if depth > MAX_DEPTH:
            raise TypeCheckError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
        object.__setattr__(self, "depth", depth)

    def __repr__(self) -> str:
        return f"<{self.shape[0]}x{self.shape[1]} expression>"


Node = Union["Decl", Const, Expression]


def _coerce(x: object) -> Node | None:
    """``x`` as an expression leaf or node; None for what is not an operand."""
    if isinstance(x, Operand):
        return x  # type: ignore[return-value]
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        value = float(x)
        if not math.isfinite(value):
            raise ArgumentError(f"constants must be finite, got {x!r}")
        return Const(value)
    return None


def _is_scalar(x: Node) -> bool:
    return x.shape == (1, 1)


def _dims(x: Node) -> str:
    return f"{x.shape[0]}x{x.shape[1]}"


def _product(a: object, b: object, op: str) -> Expression:
    left, right = _coerce(a), _coerce(b)
    if left is None or right is None:
        return NotImplemented
    if op == "@":
        for side in (left, right):
            if isinstance(side, Const) or getattr(side, "kind", "") == "scalar":
                raise TypeCheckError(f"{left!r} @ {right!r}: @ is the matrix product; "
                                     f"scale by {side!r} with * instead")
        if left.shape[1] != right.shape[0]:
            raise TypeCheckError(
                f"{left!r} @ {right!r}: the left operand is {_dims(left)} but the right one is "
                f"{_dims(right)}; the columns of the left must match the rows of the right")
        return Expression("@", (left, right), (left.shape[0], right.shape[1]))
    if not (_is_scalar(left) or _is_scalar(right)):
        raise TypeCheckError(f"{left!r} * {right!r}: * is the scalar product (a scalar or a "
                             f"number times an expression); use @ for the matrix product of "
                             f"{_dims(left)} and {_dims(right)} operands")
    shape = right.shape if _is_scalar(left) else left.shape
    return Expression("*", (left, right), shape)


def _sum(a: object, b: object, op: str) -> Expression:
    left, right = _coerce(a), _coerce(b)
    if left is None or right is None:
        return NotImplemented
    if left.shape != right.shape:
        raise TypeCheckError(f"{left!r} {op} {right!r}: the operands are {_dims(left)} and "
                             f"{_dims(right)}; {op} needs equal shapes")
    return Expression(op, (left, right), left.shape)


_BINARY = {"+": Add, "-": Sub, "*": Mul, "@": Mul}


def _to_ast(x: Node, names: dict[int, str], target: str) -> Expr:
    if isinstance(x, Const):
        magnitude = Num(abs(x.value))
        return Neg(magnitude) if math.copysign(1.0, x.value) < 0 else magnitude
    if isinstance(x, Expression):
        args = [_to_ast(a, names, target) for a in x.args]
        if x.op == "neg":
            return Neg(args[0])
        if x.op == "T":
            return Transpose(args[0])
        return _BINARY[x.op](args[0], args[1])
    name = names.get(id(x))
    if name is None:
        raise TypeCheckError(f"the expression for {target!r} uses {x!r}, which is not in names; "
                             "pass every operand by name, e.g. names={'A': A, 'x': x, ...}")
    return Ref(name)


def to_program(outputs: Mapping[str, object],
               names: Mapping[str, Decl]) -> tuple[Program, dict[str, Decl]]:
    """The ``Program`` computing ``outputs`` (name -> expression, in order), and its decls.

    ``names`` maps every name to its declaration object; leaves are found by identity. The
    program is printed and re-parsed, so its nodes carry positions in that text and type
    errors quote it.
    """
    from .types import Decl  # types imports this module

    if not isinstance(names, Mapping) or not isinstance(outputs, Mapping):
        raise ArgumentError("to_program takes two dicts: outputs {name: expression} and "
                            "names {name: declaration}")
    by_id: dict[int, str] = {}
    for name, decl in names.items():
        problem = name_problem(name)
        if problem is not None:
            raise ArgumentError(problem)
        if not isinstance(decl, Decl):
            raise ArgumentError(f"names[{name!r}] must be a Matrix, Vector or Scalar "
                                f"declaration, got {decl!r}")
        if id(decl) in by_id:
            raise ArgumentError(f"{decl!r} is passed twice, as {by_id[id(decl)]!r} and "
                                f"{name!r}; declare each operand separately")
        by_id[id(decl)] = name
    if not outputs:
        raise ArgumentError("to_program needs at least one output")
    statements = []
    for target, value in outputs.items():
        problem = name_problem(target)
        if problem is not None:
            raise ArgumentError(problem)
        node = _coerce(value)
        if node is None:
            raise ArgumentError(f"outputs[{target!r}] must be an expression, a declaration "
                                f"or a number, got {value!r}")
        statements.append(Assign(target, _to_ast(node, by_id, target)))
    program = Program(tuple(statements))
    text = "\n".join(format_statement(s) for s in statements)
    try:
        parsed = parse(text)
    except ParseError:  # absurdly nested input: keep the tree without positions
        return program, dict(names)
    assert parsed == program, (parsed, program)
    return parsed, dict(names)
