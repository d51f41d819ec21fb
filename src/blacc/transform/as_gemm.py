"""A program that is GEMMs, raised to the spine's operation.

``C = alpha*A*B + beta*C``, with any transposes (``A'*B``, ``(A*B)'``), scalar factors
that are declared scalars or literals (``2*A*B``, ``-A*B``, ``C - A*B``) and the
``beta*C`` term left out or not, is the spine's contraction ``C = alpha*op(A)*op(B) +
beta*C``; with other matrices added (``D = A*B + beta*C + E'``), their sum goes into the
output first and the product is added to it. Large ones run faster there, cache-blocked
and packed, than as the fused register-tiled loops of the small path
(``strategy.route``). An operand of the product may itself be a sum of such matrices
(``C = alpha*(A0 + A1)'*B + beta*C``), computed once into a scratch array.

A program of several such statements is several GEMMs run one after another, and so is
a statement with several products (``D = A*B + C*E``: the second adds its product to the
output) or a product of more than two matrices (``E = A*B*C``), multiplied in the
association with the fewest multiplies (``associate.association``) through scratch
products, and so is a factor that is GEMMs itself (``(A*B + C)'*D``: ``A*B + C`` into a
scratch array first). A product with a vector, a statement without a product, or a
factor that is none of the above (``(A*B + x*y')*D``) is not matched: such a statement
is left to the small path, the whole program (``gemm_program``) or, where ``others`` is
asked for, that statement alone, between the GEMM steps (``Others``: ``C = A*B; y =
C*x`` is a GEMM, then a product with a vector).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..frontend import typed as t
from ..frontend.types import Scalar
from .associate import Association, association


@dataclass(frozen=True)
class Factor:
    """A product of scalars: ``sign * literal * names[0] * names[1] * ...``."""

    sign: int = 1
    literal: float = 1.0
    names: tuple[str, ...] = ()

    def times(self, o: Factor) -> Factor:
        return Factor(self.sign * o.sign, self.literal * o.literal, self.names + o.names)


@dataclass(frozen=True)
class Addend:
    """``factor * op(name)``, a term added to the product; ``trans``: transposed."""

    name: str
    trans: bool
    factor: Factor


@dataclass(frozen=True)
class GemmStatement:
    """``out = alpha * op(A) * op(B) + addends...``, where op(A) is the sum of the terms
    ``a`` (one term of factor 1 for a plain operand, transposed or not) and op(B) that of
    ``b``. Names are the program's operands or scratch products (``GemmProgram.temps``)."""

    out: str
    a: tuple[Addend, ...]
    b: tuple[Addend, ...]
    alpha: Factor
    addends: tuple[Addend, ...] = ()

    def extents(self, shapes: Mapping[str, tuple[int, int]]) -> tuple[int, int, int]:
        """(m, n, k), the operands' shapes given by name: op(A) is m x k, op(B) k x n."""
        m, n = shapes[self.out]
        first = shapes[self.a[0].name]
        return m, n, first[0] if self.a[0].trans else first[1]

    @property
    def beta(self) -> Factor | None:
        """BLAS's beta: the factor of ``out`` where it is the only addend, else None."""
        if len(self.addends) == 1 and self.addends[0].name == self.out:
            return self.addends[0].factor
        return None


@dataclass(frozen=True)
class Others:
    """Statements of the program that are not GEMMs (their indices, consecutive), which
    the small path computes between the GEMM steps."""

    statements: tuple[int, ...]


@dataclass(frozen=True)
class GemmProgram:
    """GEMMs computed one after another, and other statements between them where the
    program has any (``Others``). ``temps``: the scratch arrays steps pass to later ones
    (the products inside chains of more than two matrices, factors that are GEMMs
    themselves), (name, (rows, cols)), row-major; their names (``$0``, ``$1``...) are no
    identifier, so no operand's."""

    steps: tuple[GemmStatement | Others, ...]
    temps: tuple[tuple[str, tuple[int, int]], ...] = ()

    @property
    def gemms(self) -> tuple[GemmStatement, ...]:
        """The steps that are GEMMs."""
        return tuple(s for s in self.steps if isinstance(s, GemmStatement))

    def shapes(self, program: t.TypedProgram) -> dict[str, tuple[int, int]]:
        """The shape of every array the steps name, operands and scratch products."""
        return {name: d.shape for name, d in program.decls.items()} | dict(self.temps)


def _terms(e: t.TExpr, sign: int = 1) -> list[tuple[int, t.TExpr]]:
    """The signed terms of a sum: ``A*B - C`` -> [(1, A*B), (-1, C)]."""
    if isinstance(e, t.TAdd):
        return _terms(e.a, sign) + _terms(e.b, sign)
    if isinstance(e, t.TSub):
        return _terms(e.a, sign) + _terms(e.b, -sign)
    if isinstance(e, t.TNeg):
        return _terms(e.x, -sign)
    return [(sign, e)]


def _scalar(e: t.TExpr, decls: t.Decls) -> Factor | None:
    """``e`` as a product of finite literals and declared scalars, or None."""
    if isinstance(e, t.TNum):
        return Factor(literal=e.value) if math.isfinite(e.value) else None
    if isinstance(e, t.TRef):
        return Factor(names=(e.name,)) if isinstance(decls[e.name], Scalar) else None
    if isinstance(e, t.TNeg):
        inner = _scalar(e.x, decls)
        return None if inner is None else Factor(-1).times(inner)
    if isinstance(e, t.TMul) and e.op == "scale":
        a, b = _scalar(e.a, decls), _scalar(e.b, decls)
        return None if a is None or b is None else a.times(b)
    return None


def _peeled(e: t.TExpr, decls: t.Decls) -> tuple[Factor, t.TExpr] | None:
    """A term's scalar factors and what they scale: ``2*alpha*(A*B)`` -> (2 alpha, A*B)."""
    factor = Factor()
    while True:
        if isinstance(e, t.TNeg):
            factor, e = factor.times(Factor(-1)), e.x
        elif isinstance(e, t.TMul) and e.op == "scale":
            scalar, array = (e.a, e.b) if e.a.shape == (1, 1) else (e.b, e.a)
            s = _scalar(scalar, decls)
            if s is None:
                return None
            factor, e = factor.times(s), array
        else:
            return factor, e


def _combination(e: t.TExpr, decls: t.Decls) -> tuple[Addend, ...] | None:
    """An operand of a product as a sum of scaled, transposed or plain matrices:
    ``alpha*(A0 + A1)'`` -> (alpha A0', alpha A1'); ``(alpha*A)'`` -> (alpha A',)."""
    if isinstance(e, t.TRef):
        return (Addend(e.name, False, Factor()),) if e.kind == "matrix" else None
    if isinstance(e, t.TTranspose):
        inner = _combination(e.x, decls)
        return None if inner is None else _flipped(inner)
    if isinstance(e, (t.TAdd, t.TSub)):
        out: list[Addend] = []
        for sign, term in _terms(e):
            inner = _combination(term, decls)
            if inner is None:
                return None
            out += _scaled(inner, Factor(sign))
        return tuple(out)
    peeled = _peeled(e, decls)
    if peeled is None or peeled[1] is e:
        return None
    inner = _combination(peeled[1], decls)
    return None if inner is None else _scaled(inner, peeled[0])


def _scaled(terms: tuple[Addend, ...], factor: Factor) -> tuple[Addend, ...]:
    return tuple(replace(x, factor=factor.times(x.factor)) for x in terms)


def _flipped(terms: tuple[Addend, ...]) -> tuple[Addend, ...]:
    return tuple(replace(x, trans=not x.trans) for x in terms)


def _chain(e: t.TExpr, decls: t.Decls) -> tuple[Factor, list[t.TExpr]] | None:
    """A term as scalar factors times the factors of a chain of matrix products, left to
    right: ``2*(A*B)'*C`` -> (2, [B', A', C]); a term that is no product is one factor."""
    if isinstance(e, t.TTranspose):
        inner = _chain(e.x, decls)
        if inner is None:
            return None
        return inner[0], [t.TTranspose(f, (f.cols, f.rows)) for f in reversed(inner[1])]
    if isinstance(e, t.TMul) and e.op == "matmul":
        a, b = _chain(e.a, decls), _chain(e.b, decls)
        return None if a is None or b is None else (a[0].times(b[0]), a[1] + b[1])
    peeled = _peeled(e, decls)
    if peeled is None:
        return None
    if peeled[1] is e:
        return Factor(), [e]
    inner = _chain(peeled[1], decls)
    return None if inner is None else (peeled[0].times(inner[0]), inner[1])


def _product(e: t.TExpr, decls: t.Decls, steps: _Steps
             ) -> tuple[Factor, list[tuple[Addend, ...]], list[tuple[int, int]]] | None:
    """(scalar factors, each factor's terms, each factor's shape) for a product of two
    or more matrices, however scaled and transposed (``(A*B)' = B'*A'``); a one-term
    factor's scalars move into the product's. A factor that is no sum of matrices but
    GEMMs itself (``A*B + C`` in ``(A*B + C)*E``) is computed by ``steps`` first."""
    chain = _chain(e, decls)
    if chain is None or len(chain[1]) < 2:
        return None
    factor, combos = chain[0], []
    for f in chain[1]:
        terms = _combination(f, decls) or steps.value(f, decls)
        if terms is None:
            return None
        if len(terms) == 1:
            factor, terms = factor.times(terms[0].factor), (replace(terms[0], factor=Factor()),)
        combos.append(terms)
    return factor, combos, [f.shape for f in chain[1]]


class _Steps:
    """Steps of a program as they are found, and the scratch products between them."""

    def __init__(self) -> None:
        self.steps: list[GemmStatement | Others] = []
        self.temps: list[tuple[str, tuple[int, int]]] = []

    def other(self, index: int) -> None:
        """Statement ``index`` is left to the small path, with any just before it."""
        last = self.steps[-1] if self.steps else None
        if isinstance(last, Others):
            self.steps[-1] = Others((*last.statements, index))
        else:
            self.steps.append(Others((index,)))

    def operands(self, factors: list[tuple[Addend, ...]], shapes: list[tuple[int, int]]
                 ) -> tuple[tuple[Addend, ...], tuple[Addend, ...]]:
        """op(A) and op(B) of the last product of ``factors`` multiplied in their
        cheapest association; the products before it are steps into scratch products."""

        def operand(node: Association) -> tuple[tuple[Addend, ...], tuple[int, int]]:
            if isinstance(node, int):
                return factors[node], shapes[node]
            (a, (rows, _)), (b, (_, cols)) = operand(node[0]), operand(node[1])
            name = f"${len(self.temps)}"
            self.temps.append((name, (rows, cols)))
            self.steps.append(GemmStatement(name, a, b, Factor()))
            return (Addend(name, False, Factor()),), (rows, cols)

        order, _ = association(shapes)
        assert not isinstance(order, int), "a product has two factors or more"
        return operand(order[0])[0], operand(order[1])[0]

    def statement(self, stmt: t.TAssign, decls: t.Decls) -> bool:
        """Add ``stmt``'s steps; False, and none added, where it is not GEMMs."""
        mark = len(self.steps), len(self.temps)
        if self.assign(stmt.target, stmt.expr, decls):
            return True
        del self.steps[mark[0]:], self.temps[mark[1]:]
        return False

    def value(self, e: t.TExpr, decls: t.Decls) -> tuple[Addend, ...] | None:
        """A factor of a product that is GEMMs (``A*B + C``, maybe scaled or transposed)
        as one plain term: steps computing it into a scratch array; None where it is
        not GEMMs (steps it added are the caller's to drop)."""
        if isinstance(e, t.TTranspose):
            inner = self.value(e.x, decls)
            return None if inner is None else _flipped(inner)
        peeled = _peeled(e, decls)
        if peeled is not None and peeled[1] is not e:
            inner = self.value(peeled[1], decls)
            return None if inner is None else _scaled(inner, peeled[0])
        name = f"${len(self.temps)}"
        self.temps.append((name, e.shape))
        return (Addend(name, False, Factor()),) if self.assign(name, e, decls) else None

    def assign(self, out: str, expr: t.TExpr, decls: t.Decls) -> bool:
        """Add the steps of ``out = expr``: the first product with the addends, the others
        added to the output. False where it is not GEMMs."""
        products: list[tuple[Factor, list[tuple[Addend, ...]], list[tuple[int, int]]]] = []
        addends: list[Addend] = []
        for sign, term in _terms(expr):
            if (found := _product(term, decls, self)) is not None:
                products.append((Factor(sign).times(found[0]), *found[1:]))
            elif (found := _combination(term, decls)) is not None and len(found) == 1:
                addends += _scaled(found, Factor(sign))
            else:
                return False
        for _, factors, _ in products:
            if out in {x.name for terms in factors for x in terms}:
                return False  # the output read as a whole while it is written
        for i, (alpha, factors, shapes) in enumerate(products):
            a, b = self.operands(factors, shapes)
            rest = tuple(addends) if i == 0 else (Addend(out, False, Factor()),)
            self.steps.append(GemmStatement(out, a, b, alpha, rest))
        return bool(products)


def gemm_program(program: t.TypedProgram, others: bool = False) -> GemmProgram | None:
    """The program as GEMMs, or None when it is not (see the module docstring).
    ``others``: statements that are not GEMMs become ``Others`` steps, and None means no
    statement is a GEMM."""
    found = _Steps()
    for i, stmt in enumerate(program.statements):
        if not found.statement(stmt, program.decls):
            if not others:
                return None
            found.other(i)
    gemms = GemmProgram(tuple(found.steps), tuple(found.temps))
    factors = [f for s in gemms.gemms
               for f in (s.alpha, *(x.factor for x in (*s.a, *s.b, *s.addends)))]
    if not gemms.gemms or not all(math.isfinite(f.literal) for f in factors):
        return None  # (literals whose product overflows: left to the small path)
    return gemms
