"""Chains of products reassociated to do less work (``transform.associate``).

* the dynamic program finds the fewest multiplies (against every parenthesization) and
  keeps the association as written unless another one at least halves them;
* which chains are reassociated: ``A*B*x`` is, ``x'*A*y`` (4n+4 against 5n) is not;
  chains under transposes, scalings and sums, and chains that meet in a scalar;
* the forms offer the reassociated program and the planner takes it for ``A*B*x``;
* reassociated programs, interpreted under every form and compiled, against the
  float64 reference.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import blacc
from blacc.blacs import _typed, plan
from blacc.frontend import typed as t
from blacc.frontend.typed import format_texpr
from blacc.strategy.small import options
from blacc.target.isa import AVX2
from blacc.transform import associate
from blacc.transform.associate import (
    chain_multiplies,
    cheapest,
    factors,
    reassociated,
    reassociated_program,
)
from blacc.transform.blac import build_module
from blacc.transform.index_notation import arg_specs, forms
from test_blac_programs import assert_matches, call_args, make_values, run_interp, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar


def _expr(source: str, **decls) -> t.TExpr:
    (stmt,) = _typed(source, decls).statements
    return stmt.expr


def _refs(shapes: list[tuple[int, int]]) -> list[t.TExpr]:
    return [t.TRef(f"F{i}", s) for i, s in enumerate(shapes)]


def _leaves(e: t.TExpr) -> list[t.TExpr]:
    """The factors of a reassociated chain, through the scalings it may have made."""
    if isinstance(e, t.TMul):
        return _leaves(e.a) + _leaves(e.b)
    return [e]


def _brute_force(shapes: tuple[tuple[int, int], ...]) -> int:
    """Fewest multiplies over every parenthesization, by enumeration."""

    @cache
    def best(i: int, j: int) -> tuple[int, tuple[int, int]]:
        if i == j:
            return 0, shapes[i]
        out = []
        for s in range(i, j):
            (ca, a), (cb, b) = best(i, s), best(s + 1, j)
            if a == (1, 1) or b == (1, 1):
                cost, shape = a[0] * a[1] * b[0] * b[1], (b if a == (1, 1) else a)
            else:
                cost, shape = a[0] * a[1] * b[1], (a[0], b[1])
            out.append((ca + cb + cost, shape))
        return min(out)

    return best(0, len(shapes) - 1)[0]


# ----------------------------------------------------------------------------- the DP


def test_the_textbook_chain():
    """(10x100)(100x5)(5x50): (AB)C takes 7500 multiplies, A(BC) 75000."""
    best, multiplies = cheapest(_refs([(10, 100), (100, 5), (5, 50)]))
    assert format_texpr(best) == "F0*F1*F2"
    assert multiplies == chain_multiplies(best) == 7500
    best, multiplies = cheapest(_refs([(50, 5), (5, 100), (100, 10)]))
    assert format_texpr(best) == "F0*(F1*F2)"
    assert multiplies == chain_multiplies(best) == 5000 + 2500


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 9), min_size=3, max_size=7))
def test_cheapest_matches_every_parenthesization(dims):
    shapes = [(dims[i], dims[i + 1]) for i in range(len(dims) - 1)]
    assume((1, 1) not in shapes)  # a 1x1 factor scales: it ends a chain
    best, multiplies = cheapest(_refs(shapes))
    assert [f.shape for f in _leaves(best)] == shapes
    assert best.shape == (dims[0], dims[-1])
    assert multiplies == _brute_force(tuple(shapes))


def test_a_product_through_a_scalar_scales():
    """x*y'*z: x*(y'*z) is a dot product and a scaling (2n), not an outer product and a
    matrix-vector product (2n^2)."""
    written = _expr("w = x*y'*z", x=V(9), y=V(9), z=V(9), w=V(9))
    assert chain_multiplies(written) == 81 + 81
    e = reassociated(written)
    assert format_texpr(e) == "x*(y'*z)"
    assert e.op == "scale" and e.b.op == "dot"
    assert cheapest(factors(written))[1] == 9 + 9


# ----------------------------------------------------------------------------- which chains


@pytest.mark.parametrize(("source", "decls", "expected"), [
    ("y = A*B*x", dict(A=M(8, 8), B=M(8, 8), x=V(8), y=V(8)), "A*(B*x)"),
    ("y = A*B*C*x + y", dict(A=M(6, 7), B=M(7, 5), C=M(5, 4), x=V(4), y=V(6)),
     "A*(B*(C*x)) + y"),
    # scalings, transposes and sums are factors of the chain
    ("y = alpha*A'*B*x - y", dict(alpha=S(), A=M(9, 6), B=M(9, 7), x=V(7), y=V(6)),
     "alpha*A'*(B*x) - y"),
    ("D = (A0 + A1)*B*E", dict(A0=M(6, 4), A1=M(6, 4), B=M(4, 17), E=M(17, 3), D=M(6, 3)),
     "(A0 + A1)*(B*E)"),
    # transposed chains: (A*B)' = B'*A'
    ("z = (A*B*x)'", dict(A=M(8, 8), B=M(8, 8), x=V(8), z=M(1, 8)), "x'*B'*A'"),
    ("y = (A*B)'*x", dict(A=M(8, 8), B=M(8, 8), x=V(8), y=V(8)), "B'*(A'*x)"),
    ("y = C*(A*B')'*x", dict(A=M(8, 6), B=M(5, 6), C=M(3, 5), x=V(8), y=V(3)),
     "C*(B*(A'*x))"),
    ("y = ((A*B)' + E)*x", dict(A=M(8, 8), B=M(8, 8), E=M(8, 8), x=V(8), y=V(8)),
     "((A*B)' + E)*x"),
    # as written: already the cheapest, or not cheaper by half
    ("D = A*B*C", dict(A=M(10, 30), B=M(30, 5), C=M(5, 40), D=M(10, 40)), "A*B*C"),
    ("alpha = x'*A*y", dict(x=V(4), A=M(4, 48), y=V(48), alpha=S()), "x'*A*y"),
    ("alpha = x'*A*y", dict(x=V(48), A=M(48, 4), y=V(4), alpha=S()), "x'*A*y"),
    ("C = A*B", dict(A=M(4, 3), B=M(3, 5), C=M(4, 5)), "A*B"),
])
def test_which_chains_are_reassociated(source, decls, expected):
    assert format_texpr(reassociated(_expr(source, **decls))) == expected


def test_reassociated_only_when_the_saving_is_large():
    """x'*A*y with A 4 x n: 5n multiplies as written, 4n + 4 the other way; not enough."""
    e = _expr("alpha = x'*A*y", x=V(4), A=M(4, 48), y=V(48), alpha=S())
    _, other = cheapest(factors(e))
    assert other < chain_multiplies(e)
    assert associate.SAVING * other > chain_multiplies(e)
    assert reassociated(e) == e


def test_forms_offer_the_reassociated_program_and_the_planner_takes_it():
    decls = dict(A=M(40, 40), B=M(40, 40), x=V(40), y=V(40))
    typed = _typed("y = A*B*x", decls)
    assert reassociated_program(typed) != typed
    assert len(forms(typed)) == 2
    p = plan("y = A*B*x", **decls)
    temps = [o for o in p.indexed.operands if o.temporary]
    assert [(o.rows, o.cols) for o in temps] == [(40, 1)], "B*x once, then A times it"


def test_a_program_without_chains_has_the_same_forms():
    typed = _typed("y = alpha*A*x + beta*B*x",
                   dict(alpha=S(), A=M(16, 4), x=V(4), beta=S(), B=M(16, 4), y=V(16)))
    assert reassociated_program(typed) == typed


# ----------------------------------------------------------------------------- numerics

PROGRAMS = [
    ("y = A*B*x", lambda n, dt: dict(A=M(n, n + 2, dt), B=M(n + 2, n, dt), x=V(n, dt),
                                     y=V(n, dt))),
    ("y = A*B*C*x + y", lambda n, dt: dict(A=M(n, 7, dt), B=M(7, n, dt), C=M(n, 5, dt),
                                           x=V(5, dt), y=V(n, dt))),
    ("D = x*y'*A - D", lambda n, dt: dict(x=V(n + 3, dt), y=V(n, dt), A=M(n, 5, dt),
                                          D=M(n + 3, 5, dt))),
    ("alpha = x'*A*B*y", lambda n, dt: dict(x=V(n, dt), A=M(n, n, dt), B=M(n, 3, dt),
                                            y=V(3, dt), alpha=S(dt))),
    ("y = beta*A'*(B*C)*x", lambda n, dt: dict(beta=S(dt), A=M(n, 6, dt), B=M(n, n, dt),
                                               C=M(n, n, dt), x=V(n, dt), y=V(6, dt))),
    ("y = (B*C)'*x - (x'*B)'", lambda n, dt: dict(B=M(n, n, dt), C=M(n, n, dt),
                                                  x=V(n, dt), y=V(n, dt))),
]
SIZES = [1, 2, 5, 9, 13]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("index", range(len(PROGRAMS)))
def test_every_form_interpreted(index, n, dtype):
    source, decls_of = PROGRAMS[index]
    decls = decls_of(n, dtype)
    typed = _typed(source, decls)
    specs = arg_specs(typed)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("a", index, n, dtype)))
    for form in forms(typed):
        schedule = tuple(opts[0][1] for opts in options(form, specs, AVX2))
        module = build_module(form, specs, schedule, AVX2, "k")
        assert_matches(typed, values, run_interp(module, specs, typed, values),
                       f"{source} n={n}")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", [2, 9, 31])
@pytest.mark.parametrize("index", range(len(PROGRAMS)))
def test_compiled(index, n, dtype):
    source, decls_of = PROGRAMS[index]
    decls = decls_of(n, dtype)
    kernel = blacc.compile(source, **decls)
    p = plan(source, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("ac", index, n, dtype)))
    kwargs, outs = call_args(p, values, pass_outputs=False)
    result = kernel(**kwargs)
    written = [s.name for s in p.specs if s.role != "in"]
    if len(written) == 1:
        result = {written[0]: result}
    assert_matches(p.typed, values, result, f"{source} n={n}")


def test_chains_reach_every_association_of_four():
    """The DP is not limited to folding one way: some shapes of a chain of four pick
    each of the five parenthesizations."""
    seen = set()
    for dims in itertools.product([2, 3, 20], repeat=5):
        shapes = [(dims[i], dims[i + 1]) for i in range(4)]
        seen.add(format_texpr(cheapest(_refs(shapes))[0]))
    assert {"F0*F1*F2*F3", "F0*(F1*F2)*F3", "F0*F1*(F2*F3)", "F0*(F1*F2*F3)",
            "F0*(F1*(F2*F3))"} <= seen
