"""The typed tree that ``check`` produces: every node knows its shape.

Nodes mirror the syntax tree (``ast``) with a ``shape`` (rows, cols) added; ``pos`` is
kept for messages but left out of ``==``, ``hash`` and ``repr``. ``kind`` follows from
the shape: 'scalar' (1x1), 'vector' (n x 1 column), 'row' (1 x n) or 'matrix'. A
``TMul`` also says which product it is (``op``):

=========  =====================================  ===========
op         operands                               result
=========  =====================================  ===========
'scale'    at least one side is 1x1 (a scalar)    other side
'dot'      row (1xk) * vector (kx1)               1x1 scalar
'matvec'   matrix (mxk) * vector (kx1)            m x 1
'vecmat'   row (1xk) * matrix (kxn)               1 x n
'outer'    vector (mx1) * row (1xn)               m x n
'matmul'   matrix (mxk) * matrix (kxn)            m x n
=========  =====================================  ===========

The element type is the program's (``TypedProgram.dtype``): one for all operands.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .ast import (
    NOWHERE,
    Add,
    Expr,
    Mul,
    Neg,
    Num,
    Pos,
    Ref,
    Sub,
    Transpose,
    format_expr,
    format_number,
)
from .types import Decl

Shape = tuple[int, int]

#: The values of ``TMul.op``.
MUL_OPS = ("scale", "dot", "matvec", "vecmat", "outer", "matmul")


def kind_of(shape: Shape) -> str:
    """'scalar', 'vector' (n x 1), 'row' (1 x n) or 'matrix'."""
    rows, cols = shape
    if rows == 1 and cols == 1:
        return "scalar"
    if cols == 1:
        return "vector"
    if rows == 1:
        return "row"
    return "matrix"


def _pos() -> Pos:
    return field(default=NOWHERE, compare=False, repr=False)


class _Typed:
    """Properties shared by typed expression nodes."""

    __slots__ = ()
    shape: Shape

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def kind(self) -> str:
        return kind_of(self.shape)


@dataclass(frozen=True)
class TNum(_Typed):
    """A literal (a scalar of the program's dtype); ``value`` >= 0."""

    value: float
    shape: Shape = (1, 1)
    pos: Pos = _pos()


@dataclass(frozen=True)
class TRef(_Typed):
    """A declared operand; its declaration is ``TypedProgram.decls[name]``."""

    name: str
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True)
class TNeg(_Typed):
    """``-x``; same shape as x."""

    x: TExpr
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True)
class TTranspose(_Typed):
    """``x'``; shape of x swapped."""

    x: TExpr
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True)
class TAdd(_Typed):
    """``a + b``; a, b and the result have one shape."""

    a: TExpr
    b: TExpr
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True)
class TSub(_Typed):
    """``a - b``; a, b and the result have one shape."""

    a: TExpr
    b: TExpr
    shape: Shape
    pos: Pos = _pos()


@dataclass(frozen=True)
class TMul(_Typed):
    """``a * b``; ``op`` is one of MUL_OPS (see the module docstring)."""

    a: TExpr
    b: TExpr
    op: str
    shape: Shape
    pos: Pos = _pos()


TExpr = TNum | TRef | TNeg | TTranspose | TAdd | TSub | TMul


@dataclass(frozen=True)
class TAssign:
    """``target = expr``; ``expr.shape`` is the target's declared shape. ``reads_output``:
    the expression reads the target, only element (i, j) while computing element (i, j)."""

    target: str
    expr: TExpr
    reads_output: bool
    pos: Pos = _pos()
    text: str = field(default="", compare=False, repr=False)

    @property
    def shape(self) -> Shape:
        return self.expr.shape


def texpr_children(e: TExpr) -> tuple[TExpr, ...]:
    """The operands of a typed node (none for leaves)."""
    if isinstance(e, (TNeg, TTranspose)):
        return (e.x,)
    if isinstance(e, (TAdd, TSub, TMul)):
        return (e.a, e.b)
    return ()


def walk(e: TExpr) -> Iterator[TExpr]:
    """Every node of ``e``, parents before children, left to right."""
    yield e
    for c in texpr_children(e):
        yield from walk(c)


class Decls(Mapping[str, Decl]):
    """A read-only, hashable, picklable name -> declaration mapping (insertion order)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Decl] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, name: str) -> Decl:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __reduce__(self) -> tuple[type, tuple[dict[str, Decl]]]:
        return (Decls, (self._items,))

    def __repr__(self) -> str:
        return f"Decls({self._items!r})"


@dataclass(frozen=True)
class TypedProgram:
    """A checked program. ``inputs``: names read before being written (in order of first
    read); ``outputs``: assigned names (in order of first assignment; a name can be both);
    ``decls``: the declaration of every name used, read-only; ``dtype``: 'f32' or 'f64'."""

    statements: tuple[TAssign, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dtype: str
    decls: Decls
    source: str = field(default="", compare=False, repr=False)

    @property
    def operands(self) -> tuple[str, ...]:
        """Inputs, then the outputs that are not inputs: every array a kernel takes."""
        return self.inputs + tuple(n for n in self.outputs if n not in self.inputs)

    def __str__(self) -> str:
        def names(ns: tuple[str, ...]) -> str:
            return ", ".join(f"{n}: {self.decls[n]!r}" for n in ns) or "-"

        lines = [f"program ({self.dtype})", f"  inputs:  {names(self.inputs)}",
                 f"  outputs: {names(self.outputs)}"]
        for s in self.statements:
            note = "   (reads its output in place)" if s.reads_output else ""
            lines.append(f"  {s.target} = {format_texpr(s.expr)}{note}")
            lines += _tree(s.expr, "    ")
        return "\n".join(lines)


def _label(e: TExpr) -> str:
    if isinstance(e, TNum):
        return format_number(e.value)
    if isinstance(e, TRef):
        return e.name
    if isinstance(e, TMul):
        return e.op
    return {TNeg: "neg", TTranspose: "transpose", TAdd: "add", TSub: "sub"}[type(e)]


def _tree(e: TExpr, indent: str) -> list[str]:
    lines = [f"{indent}{_label(e)}: {e.rows}x{e.cols} {e.kind}"]
    for c in texpr_children(e):
        lines += _tree(c, indent + "  ")
    return lines


def format_texpr(e: TExpr) -> str:
    """Source text of a typed expression (as ``ast.format_expr``)."""
    return format_expr(to_ast(e))


def to_ast(e: TExpr) -> Expr:
    """The syntax tree of a typed expression (types dropped, positions kept)."""
    if isinstance(e, TNum):
        return Num(e.value, e.pos)
    if isinstance(e, TRef):
        return Ref(e.name, e.pos)
    if isinstance(e, TNeg):
        return Neg(to_ast(e.x), e.pos)
    if isinstance(e, TTranspose):
        return Transpose(to_ast(e.x), e.pos)
    cls = {TAdd: Add, TSub: Sub, TMul: Mul}[type(e)]
    return cls(to_ast(e.a), to_ast(e.b), e.pos)
