"""Type checking: shapes, one dtype, declared outputs, and in-place safety.

``check(program, decls)`` gives every node a shape and classifies every product (see
``typed``). It raises ``TypeCheckError`` with the line, column, the source line with a
caret, and the shapes involved::

    line 1, column 6: A*x: A is 5x9 but x has length 4
      y = A*x + y
           ^

In place: a statement may read its own output only where the output element being
computed is the element read -- element (i, j) only while computing element (i, j).
``y = A*x + y`` and ``beta = x'*y + beta`` are fine; ``x = A*x``, ``A = A'`` are not.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from ..errors import ArgumentError, TypeCheckError
from .ast import (
    Add,
    Assign,
    Expr,
    Mul,
    Neg,
    Num,
    Pos,
    Program,
    Ref,
    Sub,
    Transpose,
    format_expr,
    format_statement,
    locate,
    refs,
)
from .names import name_problem
from .typed import (
    Decls,
    Shape,
    TAdd,
    TAssign,
    TExpr,
    TMul,
    TNeg,
    TNum,
    TRef,
    TSub,
    TTranspose,
    TypedProgram,
    kind_of,
    texpr_children,
    to_ast,
)
from .types import Decl

__all__ = ["check", "part", "TypedProgram"]


def check(program: Program, decls: Mapping[str, Decl]) -> TypedProgram:
    """Type ``program`` given the declaration of every name it uses.

    >>> from blacc.frontend import parse, Matrix, Vector
    >>> t = check(parse("y = A*x + y"), {"A": Matrix(5, 9), "x": Vector(9), "y": Vector(5)})
    >>> t.inputs, t.outputs, t.statements[0].expr.a.op
    (('A', 'x', 'y'), ('y',), 'matvec')
    """
    if not isinstance(program, Program):
        raise ArgumentError(f"check takes a Program (from parse or to_program), got "
                            f"{type(program).__name__}")
    return _Checker(program, _declarations(decls)).run()


def part(program: TypedProgram, statements: tuple[int, ...]) -> TypedProgram:
    """The program of some of ``program``'s statements (indices, in order), checked again
    on their own: its inputs, outputs and declarations are those the statements use."""
    chosen = [program.statements[i] for i in statements]
    ast = Program(tuple(Assign(s.target, to_ast(s.expr), s.pos, s.text) for s in chosen))
    return check(ast, program.decls)


def _declarations(decls: Mapping[str, Decl]) -> dict[str, Decl]:
    if not isinstance(decls, Mapping):
        raise ArgumentError(f"decls must be a dict of name -> declaration, got "
                            f"{type(decls).__name__}")
    for name, decl in decls.items():
        problem = name_problem(name)
        if problem is not None:
            raise ArgumentError(problem)
        if isinstance(decl, type) and issubclass(decl, Decl):
            raise ArgumentError(f"decls[{name!r}] is the class {decl.__name__}; declare an "
                                f"instance such as {decl.__name__}(...)")
        if not isinstance(decl, Decl):
            raise ArgumentError(f"decls[{name!r}] must be a Matrix, Vector or Scalar, "
                                f"got {decl!r}")
    return dict(decls)


def describe(shape: Shape) -> str:
    """'is 5x9', 'has length 4', 'is a row of length 4', 'is a scalar'."""
    rows, cols = shape
    return {"scalar": "is a scalar", "vector": f"has length {rows}",
            "row": f"is a row of length {cols} (1x{cols})",
            "matrix": f"is {rows}x{cols}"}[kind_of(shape)]


def shape_words(shape: Shape) -> str:
    """'5x1 (a vector of length 5)', '1x1 (a scalar)', ..."""
    rows, cols = shape
    return f"{rows}x{cols} " + {"scalar": "(a scalar)", "vector": f"(a vector of length {rows})",
                                "row": f"(a row of length {cols})",
                                "matrix": "(a matrix)"}[kind_of(shape)]


def classify_product(a: Shape, b: Shape) -> str | None:
    """The ``TMul.op`` of a product of shapes a and b, or None if they do not fit."""
    if a == (1, 1) or b == (1, 1):
        return "scale"
    if a[1] != b[0]:
        return None
    kinds = (kind_of(a), kind_of(b))
    return {("row", "vector"): "dot", ("matrix", "vector"): "matvec",
            ("row", "matrix"): "vecmat", ("vector", "row"): "outer"}.get(kinds, "matmul")


class _Checker:
    def __init__(self, program: Program, decls: dict[str, Decl]) -> None:
        self.program = program
        self.decls = decls
        self.first: tuple[str, str] | None = None  # (name, dtype) of the first operand seen
        self.statement: Assign | None = None

    def fail(self, pos: Pos, message: str) -> TypeCheckError:
        if pos.line > 0:
            return TypeCheckError(locate(message, pos, self.program.line_text(pos.line)))
        assert self.statement is not None
        return TypeCheckError(f"in {self.text(self.statement)!r}: {message}")

    def text(self, st: Assign) -> str:
        """The statement as written, or as printed when built without source."""
        return st.text or format_statement(st)

    def run(self) -> TypedProgram:
        statements = []
        inputs: list[str] = []
        outputs: list[str] = []
        for st in self.program.statements:
            self.statement = st
            for r in refs(st.expr):
                if r.name not in outputs and r.name not in inputs:
                    inputs.append(r.name)
            statements.append(self.assign(st))
            if st.target not in outputs:
                outputs.append(st.target)
        assert self.first is not None
        used = {n: self.decls[n] for n in inputs + outputs}
        return TypedProgram(tuple(statements), tuple(inputs), tuple(outputs), self.first[1],
                            Decls(used), self.program.source)

    def lookup(self, name: str, pos: Pos) -> Decl:
        decl = self.decls.get(name)
        if decl is None:
            declared = ", ".join(self.decls) or "nothing"
            raise self.fail(pos, f"{name} is not declared (declared: {declared})")
        if self.first is None:
            self.first = (name, decl.dtype)
        elif decl.dtype != self.first[1]:
            first, dtype = self.first
            raise self.fail(pos, f"mixed dtypes: {first} is {dtype} but {name} is "
                                 f"{decl.dtype}; all operands of a program share one dtype")
        return decl

    def assign(self, st: Assign) -> TAssign:
        expr = self.expr(st.expr)
        decl = self.lookup(st.target, st.pos)
        if decl.shape != expr.shape:
            raise self.fail(st.pos, f"{self.text(st)}: the result is "
                                    f"{shape_words(expr.shape)} but {st.target} is declared "
                                    f"as {decl!r}, which is {shape_words(decl.shape)}")
        reads = _target_reads(expr, st.target)
        for ref, inplace in reads:
            if not inplace:
                raise self.fail(ref.pos, (
                    f"{self.text(st)}: the output {st.target} is read at other positions "
                    f"than the one being computed; element (i, j) of an output may be read only "
                    f"while computing element (i, j); write the result to a new output instead"))
        return TAssign(st.target, expr, bool(reads), st.pos, st.text)

    def expr(self, e: Expr) -> TExpr:
        if isinstance(e, Num):
            return TNum(e.value, (1, 1), e.pos)
        if isinstance(e, Ref):
            return TRef(e.name, self.lookup(e.name, e.pos).shape, e.pos)
        if isinstance(e, Neg):
            x = self.expr(e.x)
            return TNeg(x, x.shape, e.pos)
        if isinstance(e, Transpose):
            x = self.expr(e.x)
            return TTranspose(x, (x.shape[1], x.shape[0]), e.pos)
        if isinstance(e, (Add, Sub)):
            a, b = self.expr(e.a), self.expr(e.b)
            if a.shape != b.shape:
                op = "+" if isinstance(e, Add) else "-"
                raise self.fail(e.pos, f"{format_expr(e)}: {self.mismatch(e.a, a, e.b, b)}; "
                                       f"{op} needs operands of one shape")
            return (TAdd if isinstance(e, Add) else TSub)(a, b, a.shape, e.pos)
        if isinstance(e, Mul):
            a, b = self.expr(e.a), self.expr(e.b)
            op = classify_product(a.shape, b.shape)
            if op is None:
                hint = ""
                if a.rows == b.rows:
                    hint = f" (transposing {format_expr(e.a)} would fit)"
                elif a.cols == b.cols:
                    hint = f" (transposing {format_expr(e.b)} would fit)"
                raise self.fail(e.pos, f"{format_expr(e)}: {self.mismatch(e.a, a, e.b, b)}"
                                       f"{hint}")
            if op == "scale":
                shape = b.shape if a.shape == (1, 1) else a.shape
            else:
                shape = (a.rows, b.cols)
            return TMul(a, b, op, shape, e.pos)
        raise ArgumentError(f"not an expression node: {e!r}")

    @staticmethod
    def mismatch(ea: Expr, a: TExpr, eb: Expr, b: TExpr) -> str:
        left = format_expr(ea)
        right = format_expr(eb)
        return f"{left} {describe(a.shape)} but {right} {describe(b.shape)}"


# ------------------------------------------------------------------------- in place


def _target_reads(e: TExpr, target: str) -> list[tuple[TRef, bool]]:
    """Each read of ``target`` in ``e``, and whether it reads exactly the element computed.

    Index maps are followed symbolically from the output element (i, j) down to each
    leaf: sums and negation keep (r, c), a transpose swaps them, a scalar operand of a
    scaling is read at (0, 0), and a product's operands are read at (r, k) and (k, c) with
    a fresh reduction index k. An index over a dimension of size 1 is 0.
    """
    fresh = itertools.count()

    def index(symbol: str, size: int) -> str:
        return symbol if size > 1 else "0"

    root = (index("i", e.rows), index("j", e.cols))
    found: list[tuple[TRef, bool]] = []

    def visit(node: TExpr, at: tuple[str, str]) -> None:
        if isinstance(node, TRef):
            if node.name == target:
                found.append((node, at == root))
        elif isinstance(node, TTranspose):
            visit(node.x, (at[1], at[0]))
        elif isinstance(node, TMul) and node.op == "scale":
            for side in (node.a, node.b):
                visit(side, ("0", "0") if side.shape == (1, 1) else at)
        elif isinstance(node, TMul):
            k = index(f"k{next(fresh)}", node.a.cols)
            visit(node.a, (at[0], k))
            visit(node.b, (k, at[1]))
        else:
            for child in texpr_children(node):
                visit(child, at)

    visit(e, root)
    return found
