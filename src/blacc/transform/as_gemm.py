"""A program that is one GEMM, raised to the spine's operation.

``C = alpha*A*B + beta*C``, with any transposes (``A'*B``, ``(A*B)'``), scalar factors
that are declared scalars or literals (``2*A*B``, ``-A*B``, ``C - A*B``) and the
``beta*C`` term left out or not, is the spine's contraction ``C = alpha*op(A)*op(B) +
beta*C``; with other matrices added (``D = A*B + beta*C + E'``), their sum goes into the
output first and the product is added to it. Large ones run faster there, cache-blocked
and packed, than as the fused register-tiled loops of the small path
(``strategy.route``). An operand of the product may itself be a sum of such matrices
(``C = alpha*(A0 + A1)'*B + beta*C``), computed once into a scratch array. Anything
else, a product of more than two matrices, a product with a vector, several statements,
is not matched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..frontend import typed as t
from ..frontend.types import Scalar


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
    ``b``."""

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


def _product(e: t.TExpr, decls: t.Decls
             ) -> tuple[Factor, tuple[Addend, ...], tuple[Addend, ...]] | None:
    """(scalar factors, op(A)'s terms, op(B)'s terms) for ``op(A)*op(B)``, however scaled
    and transposed (``(op(A)*op(B))' = op(B)'*op(A)'``); a one-term operand's factor
    moves into the scalar factors."""
    if isinstance(e, t.TTranspose):
        inner = _product(e.x, decls)
        if inner is None:
            return None
        f, a, b = inner
        return f, _flipped(b), _flipped(a)
    if isinstance(e, t.TMul) and e.op == "matmul":
        a, b = _combination(e.a, decls), _combination(e.b, decls)
        if a is None or b is None:
            return None
        factor = Factor()
        if len(a) == 1:
            factor, a = factor.times(a[0].factor), (replace(a[0], factor=Factor()),)
        if len(b) == 1:
            factor, b = factor.times(b[0].factor), (replace(b[0], factor=Factor()),)
        return factor, a, b
    peeled = _peeled(e, decls)
    if peeled is None or peeled[1] is e:
        return None
    inner = _product(peeled[1], decls)
    return None if inner is None else (peeled[0].times(inner[0]), *inner[1:])


def gemm_statement(program: t.TypedProgram) -> GemmStatement | None:
    """The program as one GEMM, or None when it is not one (see the module docstring)."""
    if len(program.statements) != 1:
        return None
    (stmt,) = program.statements
    out, decls = stmt.target, program.decls
    product: tuple[Factor, tuple[Addend, ...], tuple[Addend, ...]] | None = None
    addends: list[Addend] = []
    for sign, term in _terms(stmt.expr):
        if product is None and (found := _product(term, decls)) is not None:
            product = (Factor(sign).times(found[0]), *found[1:])
        elif (found := _combination(term, decls)) is not None and len(found) == 1:
            addends += _scaled(found, Factor(sign))
        else:
            return None
    if product is None:
        return None
    alpha, a, b = product
    if out in {x.name for x in a + b}:  # the output read as a whole while it is written
        return None
    factors = (alpha, *(x.factor for x in (*a, *b, *addends)))
    if not all(math.isfinite(f.literal) for f in factors):
        return None  # literals whose product overflows: left to the small path
    return GemmStatement(out, a, b, alpha, tuple(addends))
