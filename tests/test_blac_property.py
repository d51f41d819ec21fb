"""Property tests: random well-typed programs of the expression language against the
frontend's float64 reference.

Hypothesis builds an expression for a wanted shape top-down (sizes 1..12): sums,
differences, negation, scalings by scalar operands and literals, products of every kind
(dot, matvec, vecmat, outer, matmul) through a random inner size, and transposes, over a
small pool of declared operands that grows as leaves are needed. Programs have one or two
statements (the second may read the first's output) and may update an output in place.

Most examples are planned with ``blacc.blacs.plan`` and run by the kernel IR interpreter
(no C compiler); a few are compiled end to end with ``blacc.compile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blacc
from blacc.blacs import plan
from blacc.frontend import check, evaluate, parse
from test_blac_programs import NP, assert_matches, call_args, make_values, run_interp

MAX_SIZE = 12
MAX_OPERANDS = 5
LITERALS = ("0.5", "2", "1.5", "3", "0.25", "1")


@dataclass
class Pool:
    """Operands declared so far: name -> declaration."""

    dtype: str
    decls: dict = field(default_factory=dict)

    def usable(self, shape: tuple[int, int]) -> list[str]:
        """Source texts of existing operands (possibly transposed) with ``shape``."""
        out = []
        for name, d in self.decls.items():
            if d.shape == shape:
                out.append(name)
            if d.shape == (shape[1], shape[0]) and shape[0] != shape[1]:
                out.append(f"{name}'")
        return out

    def declare(self, shape: tuple[int, int], style: int) -> str:
        """A new operand of ``shape``. ``style`` varies the declaration: a row or column
        is a Vector (transposed for a row) or a 1-row / 1-column Matrix; a matrix is
        row- or column-major, packed or with a padded leading dimension."""
        rows, cols = shape
        n, dt = len(self.decls), self.dtype
        if shape == (1, 1):
            name, decl, text = f"s{n}", blacc.Scalar(dt), f"s{n}"
        elif (rows == 1 or cols == 1) and style % 2 == 0:
            name, decl = f"v{n}", blacc.Vector(rows * cols, dt)
            text = name if cols == 1 else f"{name}'"
        else:
            layout = "col" if style in (1, 2) else "row"
            natural = rows if layout == "col" else cols
            ld = natural + 3 if style >= 2 and rows > 1 and cols > 1 else None
            name = f"M{n}"
            decl, text = blacc.Matrix(rows, cols, dt, layout=layout, ld=ld), name
        self.decls[name] = decl
        return text


sizes = st.integers(1, MAX_SIZE)


@st.composite
def leaf(draw, pool: Pool, shape):
    existing = pool.usable(shape)
    full = len(pool.decls) >= MAX_OPERANDS
    if shape == (1, 1) and draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(LITERALS))
    if existing and (full or draw(st.booleans())):
        return draw(st.sampled_from(existing))
    return pool.declare(shape, draw(st.integers(0, 3)))


@st.composite
def expression(draw, pool: Pool, shape, depth: int):
    """Source text of an expression of ``shape``, fully parenthesised."""
    if depth <= 0:
        return draw(leaf(pool, shape))
    kind = draw(st.sampled_from(["leaf", "add", "sub", "neg", "scale", "literal_scale",
                                 "product", "product", "transpose"]))
    rows, cols = shape
    sub = depth - 1
    if kind == "leaf":
        return draw(leaf(pool, shape))
    if kind in ("add", "sub"):
        a = draw(expression(pool, shape, sub))
        b = draw(expression(pool, shape, sub))
        return f"({a} {'+' if kind == 'add' else '-'} {b})"
    if kind == "neg":
        return f"(-{draw(expression(pool, shape, sub))})"
    if kind == "scale":
        s = draw(expression(pool, (1, 1), min(sub, 1)))
        return f"({s} * {draw(expression(pool, shape, sub))})"
    if kind == "literal_scale":
        return f"({draw(st.sampled_from(LITERALS))} * {draw(expression(pool, shape, sub))})"
    if kind == "product":
        inner = draw(sizes)
        a = draw(expression(pool, (rows, inner), sub))
        b = draw(expression(pool, (inner, cols), sub))
        return f"({a} * {b})"
    assert kind == "transpose"
    return f"({draw(expression(pool, (cols, rows), sub))})'"


@st.composite
def programs(draw, max_depth: int = 3):
    """(source, declarations, dtype) of a random well-typed program."""
    dtype = draw(st.sampled_from(["f32", "f64"]))
    pool = Pool(dtype)
    statements = []
    for n in range(draw(st.integers(1, 2))):
        target = f"out{n}"
        shape = draw(st.sampled_from(["scalar", "vector", "matrix"]))
        rows = 1 if shape == "scalar" else draw(sizes)
        cols = draw(sizes) if shape == "matrix" else 1
        expr = draw(expression(pool, (rows, cols), draw(st.integers(1, max_depth))))
        inplace = draw(st.booleans())
        decl = (blacc.Scalar(dtype) if shape == "scalar" else
                blacc.Vector(rows, dtype) if shape == "vector" else
                blacc.Matrix(rows, cols, dtype))
        pool.decls[target] = decl
        statements.append(f"{target} = {expr}" + (f" + {target}" if inplace else ""))
    return "\n".join(statements), dict(pool.decls), dtype


def _check_interpreted(source: str, decls: dict, dtype: str, seed: int, target: str, *,
                       slack: int = 3, render: bool = False) -> None:
    """Plan ``source`` for ``target`` and interpret it against the reference (``slack``:
    sentinel elements after each buffer; ``render``: also render the plan as C)."""
    p = plan(source, target=target, **decls)
    if render:
        p.source  # noqa: B018 - raises where the target lacks an operation
    values = make_values(decls, dtype, np.random.default_rng(seed))
    got = run_interp(p.module, p.specs, p.typed, values, slack=slack)
    assert_matches(p.typed, values, got, f"{source!r} {decls} {p.schedule}")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(), st.integers(0, 2**32 - 1), st.sampled_from(["avx2", "avx2", "generic"]))
def test_random_program_interpreted(program, seed, target):
    source, decls, dtype = program
    _check_interpreted(source, decls, dtype, seed, target)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(max_depth=2), st.integers(0, 2**32 - 1))
def test_random_program_compiled(program, seed):
    source, decls, dtype = program
    kernel = blacc.compile(source, **decls)
    p = plan(source, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed))
    kwargs, outs = call_args(p, values, pass_outputs=False)
    inputs = {n: np.array(a) for n, a in kwargs.items()
              if isinstance(a, np.ndarray) and n not in outs}
    result = kernel(**kwargs)
    written = [s.name for s in p.specs if s.role != "in"]
    if len(written) == 1:
        result = {written[0]: result}
    for n, a in inputs.items():
        assert np.array_equal(a, kwargs[n]), f"input {n} was written"
    for n, a in outs.items():
        assert result[n] is a, f"{n} not updated in place"
    for v in result.values():
        if isinstance(v, np.ndarray):
            assert v.dtype == NP[dtype]
    assert_matches(p.typed, values, result, repr(source))


def test_generator_produces_every_product_kind():
    """The strategy must reach dot, matvec, vecmat, outer, matmul and scale products,
    transposes, negation, differences and literals (on a fixed, derandomized sample)."""
    from blacc.frontend.typed import TMul, walk

    seen: set[str] = set()

    @settings(max_examples=150, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs())
    def collect(program):
        source, decls, _ = program
        typed = check(parse(source), decls)  # and every generated program type checks
        for s in typed.statements:
            seen.add("inplace" if s.reads_output else "fresh")
            for node in walk(s.expr):
                seen.add(node.op if isinstance(node, TMul) else type(node).__name__)

    collect()
    wanted = {"dot", "matvec", "vecmat", "outer", "matmul", "scale", "TTranspose", "TNum",
              "TNeg", "TSub", "TAdd", "TRef", "inplace", "fresh"}
    assert wanted <= seen, wanted - seen


def test_reference_agrees_with_numpy_on_a_fixed_program():
    """Sanity of the oracle the properties rely on."""
    decls = dict(A=blacc.Matrix(3, 4), x=blacc.Vector(4), y=blacc.Vector(3),
                 a=blacc.Scalar())
    typed = check(parse("y = a*A*x - (2*y)"), decls)
    rng = np.random.default_rng(0)
    A, x, y = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(3)
    got = evaluate(typed, {"A": A, "x": x, "y": y, "a": 1.5})["y"]
    np.testing.assert_allclose(got, 1.5 * A @ x - 2 * y, rtol=1e-14)


# Programs hypothesis once found: nested sums renamed by depth must not capture each
# other's index (an inner sum renamed to the outer one's old name, or the reverse).
NESTED_SUM_REGRESSIONS = [
    ("out0 = (-((M0 * v1) + v2)) + out0\nout1 = (0.5 + (v4' * (M5 * v6))) + out1",
     dict(M0=blacc.Matrix(11, 8, "f32"), v1=blacc.Vector(8, "f32"),
          v2=blacc.Vector(11, "f32"), out0=blacc.Vector(11, "f32"),
          v4=blacc.Vector(3, "f32"), M5=blacc.Matrix(3, 9, "f32"),
          v6=blacc.Vector(9, "f32"), out1=blacc.Scalar("f32"))),
    ("out0 = (v0 + (M1 * v2))\nout1 = (v4' * (v4 + (M5 * v2)))",
     dict(v0=blacc.Vector(4, "f32"), M1=blacc.Matrix(4, 2, "f32"), v2=blacc.Vector(2, "f32"),
          out0=blacc.Vector(4, "f32"), v4=blacc.Vector(3, "f32"),
          M5=blacc.Matrix(3, 2, "f32"), out1=blacc.Scalar("f32"))),
]


@pytest.mark.parametrize("source, decls", NESTED_SUM_REGRESSIONS)
@pytest.mark.parametrize("target", ["avx2", "generic"])
def test_nested_sums_found_by_hypothesis(source, decls, target):
    _check_interpreted(source, decls, "f32", 297, target)
