"""Chains of products in the association with the fewest multiplies (the matrix chain
problem).

``y = A*B*x`` parses as ``(A*B)*x``: for n x n matrices that is n^3 multiplies, fused or
not, where ``A*(B*x)`` needs 2n^2. Matrix products are associative, so any
parenthesization of a chain computes the same value (up to rounding); the classic
dynamic program over the chain's shapes finds the one with the fewest scalar
multiplies. A chain is a tree of products that are not scalings (``TMul.op !=
'scale'``), transposed or not (``(A*B)'*x`` is ``B'*A'*x``); its factors are whatever
sits below it (an operand, a transposed operand, a sum, a scaled array...), and chains
inside factors are reassociated too. A chain is
reassociated only where that saves much of its arithmetic (``SAVING``); otherwise the
association as written is kept.

``index_notation.forms`` offers the reassociated program next to the written one, and
the cost model picks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cache

from ..frontend import typed as t
from ..frontend.typecheck import classify_product

Shape = tuple[int, int]

#: A chain is reassociated only when that divides its multiplies by at least this much.
#: Where two associations do about the same work, their kernels differ in shape rather
#: than in arithmetic, which the cost model ranks less well: ``x'*A*y`` with A 4 x n
#: (5n multiplies as written, 4n + 4 as ``x'*(A*y)``) was modelled faster reassociated
#: and measured 0.59-0.98x (horizontal sums per row, y loaded once per row).
SAVING = 2


def _in_chain(e: t.TExpr) -> bool:
    """A product of a chain, or a transposed chain: ``(A*B)' = B'*A'``."""
    if isinstance(e, t.TTranspose):
        return _in_chain(e.x)
    return isinstance(e, t.TMul) and e.op != "scale"


def _transposed(e: t.TExpr) -> t.TExpr:
    if isinstance(e, t.TTranspose):
        return e.x
    return t.TTranspose(e, (e.cols, e.rows))


def factors(e: t.TExpr) -> list[t.TExpr]:
    """The factors of the chain rooted at ``e``, left to right (``[e]`` when ``e`` is
    not one); a transposed chain gives its factors transposed, in reverse order."""
    if isinstance(e, t.TTranspose) and _in_chain(e):
        return [_transposed(f) for f in reversed(factors(e.x))]
    if _in_chain(e):
        return factors(e.a) + factors(e.b)
    return [e]


def chain_multiplies(e: t.TExpr) -> int:
    """Scalar multiplies of the products of the chain rooted at ``e`` as written (the
    factors' own work not counted). A chain as written holds no 1x1 value but maybe at
    its root: a product with a 1x1 side is a scaling, a factor of the chain."""
    if isinstance(e, t.TTranspose) and _in_chain(e):
        return chain_multiplies(e.x)
    if not _in_chain(e):
        return 0
    return (chain_multiplies(e.a) + chain_multiplies(e.b)
            + _product_multiplies(e.a.shape, e.b.shape))


def _product_multiplies(a: Shape, b: Shape) -> int:
    """(r x k) times (k x c): r*k*c; a 1x1 side scales the other, one multiply each."""
    if a == (1, 1) or b == (1, 1):
        return a[0] * a[1] * b[0] * b[1]
    return a[0] * a[1] * b[1]


def _product_shape(a: Shape, b: Shape) -> Shape:
    """The shape of a product: a 1x1 side scales the other."""
    return b if a == (1, 1) else a if b == (1, 1) else (a[0], b[1])


def _product(a: t.TExpr, b: t.TExpr) -> t.TMul:
    op = classify_product(a.shape, b.shape)
    assert op is not None, "a chain's factors fit by construction"
    return t.TMul(a, b, op, _product_shape(a.shape, b.shape))


#: An association of a chain: a factor's index, or the two associations multiplied.
Association = int | tuple["Association", "Association"]


def association(shapes: Sequence[Shape]) -> tuple[Association, int]:
    """The association of factors of ``shapes`` with the fewest multiplies, and that
    count (the first split point on a tie, so a left-to-right chain stays so when
    nothing is saved)."""

    @cache
    def best(i: int, j: int) -> tuple[int, int, Shape]:
        """(multiplies, split, shape) for factors i..j inclusive."""
        if i == j:
            return 0, i, shapes[i]
        options = []
        for s in range(i, j):
            left, right = best(i, s), best(s + 1, j)
            a, b = left[2], right[2]
            options.append((left[0] + right[0] + _product_multiplies(a, b), s,
                            _product_shape(a, b)))
        return min(options, key=lambda o: o[0])

    def tree(i: int, j: int) -> Association:
        if i == j:
            return i
        s = best(i, j)[1]
        return tree(i, s), tree(s + 1, j)

    return tree(0, len(shapes) - 1), best(0, len(shapes) - 1)[0]


def cheapest(fs: list[t.TExpr]) -> tuple[t.TExpr, int]:
    """The factors multiplied in an association with the fewest multiplies
    (``association``), and that count. Products that meet in a 1x1 value become
    scalings: ``x*(y'*z)``."""
    order, multiplies = association(tuple(f.shape for f in fs))

    def build(node: Association) -> t.TExpr:
        if isinstance(node, int):
            return fs[node]
        return _product(build(node[0]), build(node[1]))

    return build(order), multiplies


def reassociated(e: t.TExpr) -> t.TExpr:
    """``e`` with every chain of products that some association computes with at most
    half the multiplies in that association (see ``SAVING``); other chains as written."""
    if _in_chain(e):
        written = _factors_reassociated(e)  # its factors are no chains: they stay factors
        best, multiplies = cheapest(factors(written))
        return best if SAVING * multiplies <= chain_multiplies(written) else written
    if isinstance(e, (t.TNeg, t.TTranspose)):
        return dataclasses.replace(e, x=reassociated(e.x))
    if isinstance(e, (t.TAdd, t.TSub, t.TMul)):
        return dataclasses.replace(e, a=reassociated(e.a), b=reassociated(e.b))
    return e


def _factors_reassociated(e: t.TExpr) -> t.TExpr:
    """The chain rooted at ``e`` as written, each of its factors reassociated."""
    if isinstance(e, t.TTranspose) and _in_chain(e):
        return dataclasses.replace(e, x=_factors_reassociated(e.x))
    if _in_chain(e):
        return dataclasses.replace(e, a=_factors_reassociated(e.a),
                                   b=_factors_reassociated(e.b))
    return reassociated(e)


def reassociated_program(program: t.TypedProgram) -> t.TypedProgram:
    """``program`` with every statement's chains reassociated (``reassociated``)."""
    statements = tuple(dataclasses.replace(s, expr=reassociated(s.expr))
                       for s in program.statements)
    return dataclasses.replace(program, statements=statements)
