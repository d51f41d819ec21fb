"""Programs that are GEMMs: recognized (``transform.as_gemm``), sent to the spine's GEMM
when large (``strategy.route``), and computed there with the program's own meaning and
signature (``runtime.gemm_program``). The spine is forced at small sizes
(``SPINE_L1_MULTIPLE`` = 0) so that each case compiles quickly."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blacc
from blacc.blacs import _typed
from blacc.errors import BlaccError
from blacc.strategy import route
from blacc.transform.as_gemm import Factor, Others, gemm_program
from test_blac_programs import (
    SENTINEL,
    assert_matches,
    call_args,
    make_values,
    seed_of,
    unplanned,
)

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar


def _decls(dt: str = "f32", m: int = 5, k: int = 6, n: int = 7) -> dict:
    return dict(A=M(m, k, dt), B=M(k, n, dt), C=M(m, n, dt), D=M(m, n, dt), At=M(k, m, dt),
                Bt=M(n, k, dt), alpha=S(dt), beta=S(dt))


def gemm_statement(typed):
    """The program's one step, or None where it is not one GEMM."""
    gemms = gemm_program(typed)
    return gemms.steps[0] if gemms is not None and len(gemms.steps) == 1 else None


def _value(f, scalars: dict) -> float:
    return f.sign * f.literal * float(np.prod([scalars[n] for n in f.names]))


@pytest.mark.parametrize(("source", "a", "b", "alpha", "beta"), [
    ("C = A*B", "A", "B", 1, None),
    ("C = alpha*A*B + beta*C", "A", "B", 2, 3),
    ("C = At'*Bt' - C", "At'", "Bt'", 1, -1),
    ("C = -2*(Bt*At)' + C", "At'", "Bt'", -2, 1),
    ("C = C - alpha*A*B*beta", "A", "B", -6, 1),
    ("C = 2*alpha*A*B + 3*C*beta", "A", "B", 4, 9),
    ("C = (alpha*At)'*(-B)", "At'", "B", -2, None),
    ("C = (2*(alpha*Bt*At))' - beta*C", "At'", "Bt'", 4, -3),
])
def test_one_gemm_statements_are_recognized(source, a, b, alpha, beta):
    stmt = gemm_statement(_typed(source, _decls()))
    assert stmt is not None
    scalars = {"alpha": 2.0, "beta": 3.0}
    ((x,), (y,)) = stmt.a, stmt.b
    assert x.factor == y.factor == Factor()  # a plain operand's factor is in alpha
    assert (stmt.out, x.name + "'" * x.trans, y.name + "'" * y.trans) == ("C", a, b)
    assert _value(stmt.alpha, scalars) == alpha
    assert (None if stmt.beta is None else _value(stmt.beta, scalars)) == beta


def test_other_addends_are_recognized():
    stmt = gemm_statement(_typed("D = A*B - beta*C + 2*(alpha*E)' + D", dict(
        _decls(m=6, n=6, k=6), E=M(6, 6, "f32"))))
    assert stmt is not None and stmt.beta is None
    got = [(x.name, x.trans, _value(x.factor, {"alpha": 2.0, "beta": 3.0}))
           for x in stmt.addends]
    assert got == [("C", False, -3.0), ("E", True, 4.0), ("D", False, 1.0)]


def _step(stmt, scalars=(("alpha", 2.0), ("beta", 3.0))) -> tuple:
    """A step as (out, op(A), op(B), alpha, addends) in source-like text."""
    scalars = dict(scalars)

    def terms(xs):
        return " + ".join(f"{_value(x.factor, scalars):g}*" + x.name + "'" * x.trans
                          for x in xs)

    return stmt.out, terms(stmt.a), terms(stmt.b), _value(stmt.alpha, scalars), \
        terms(stmt.addends)


def test_several_products_are_steps_adding_to_the_output():
    gemms = gemm_program(_typed("C = A*B - beta*D + 2*(At*Bt)' + C", _decls(m=6, n=6, k=6)))
    assert gemms is not None and gemms.temps == ()
    assert [_step(s) for s in gemms.steps] == [
        ("C", "1*A", "1*B", 1, "-3*D + 1*C"),
        ("C", "1*Bt'", "1*At'", 2, "1*C")]


def test_chains_are_multiplied_in_their_cheapest_association():
    decls = dict(A=M(10, 2), B=M(2, 30), C=M(30, 5), E=M(10, 5), alpha=S())
    # (A*B)*C: 600 + 1500 multiplies; A*(B*C): 300 + 100
    gemms = gemm_program(_typed("E = alpha*(A*B*C)'' + E", decls))
    assert gemms.temps == (("$0", (2, 5)),)
    assert [_step(s) for s in gemms.steps] == [
        ("$0", "1*B", "1*C", 1, ""), ("E", "1*A", "1*$0", 2, "1*E")]
    # transposed, scaled inside, a factor that is a sum: (A*(2*B)*(C - C))' is
    # (C' - C')*(2*B')*A', 400 multiplies as ((C' - C')*B')*A', 2100 the other way
    gemms = gemm_program(_typed("F = (A*(2*B)*(C - C))' + E'", dict(decls, F=M(5, 10))))
    assert [_step(s) for s in gemms.steps] == [
        ("$0", "1*C' + -1*C'", "1*B'", 1, ""), ("F", "1*$0", "1*A'", 2, "1*E'")]
    # two statements, the second reading the first's output; one with a chain of four
    decls = dict(A=M(6, 6), B=M(6, 6), C=M(6, 6), D=M(6, 6), E=M(6, 6))
    gemms = gemm_program(_typed("C = A*B\nE = A*B*C*D - E", decls))
    assert [s.out for s in gemms.steps] == ["C", "$0", "$1", "E"]
    assert [name for name, _ in gemms.temps] == ["$0", "$1"]


def test_operands_that_are_sums_are_recognized():
    stmt = gemm_statement(_typed("C = alpha*(At + 2*A')'*(B - beta*Bt')", _decls(m=6, n=6, k=6)))
    assert stmt is not None and stmt.addends == ()
    scalars = {"alpha": 2.0, "beta": 3.0}
    assert _value(stmt.alpha, scalars) == 2  # alpha scales the product
    assert [(x.name, x.trans, _value(x.factor, scalars)) for x in stmt.a] == [
        ("At", True, 1), ("A", False, 2)]
    assert [(x.name, x.trans, _value(x.factor, scalars)) for x in stmt.b] == [
        ("B", False, 1), ("Bt", True, -3)]


@pytest.mark.parametrize("source", [
    "C = alpha*C",            # no product
    "C = A*B; D = C + D",     # a statement without a product
    "C = (A*B + x*y')*D",     # a factor with a product of vectors
    "C = 1e200*(1e200*A)*B",  # literals whose product overflows
])
def test_other_programs_are_not_gemms(source):
    decls = dict(_decls(m=6, n=6, k=6), x=V(6, "f32"), y=V(6, "f32"))
    assert gemm_program(_typed(source, decls)) is None


def test_factors_that_are_gemms_are_computed_first():
    """A factor that is no sum of matrices but GEMMs itself goes into a scratch array
    by steps of its own, scaled and transposed as the product needs it."""
    decls = dict(_decls(m=6, n=6, k=6), E=M(6, 4, "f32"), F=M(4, 6, "f32"))
    gemms = gemm_program(_typed("F = alpha*((A*B - 2*C)*E)' + beta*F", decls))
    assert gemms.temps == (("$0", (6, 6)),)
    assert [_step(s) for s in gemms.steps] == [
        ("$0", "1*A", "1*B", 1, "-2*C"),
        ("F", "1*E'", "1*$0'", 2, "3*F")]
    gemms = gemm_program(_typed("Bt = (At'*(B + C) + D)*(A*B)'*2", decls))
    assert [s.out for s in gemms.steps] == ["$0", "$1", "Bt"]


def test_matrix_vector_products_are_not_gemms():
    decls = dict(A=M(9, 8), x=V(8), y=V(9), X=M(8, 1))
    assert gemm_program(_typed("y = A*x + y", decls)) is None
    assert gemm_program(_typed("y = A*X", decls)) is None


def test_statements_that_are_not_gemms_are_left_between_the_gemms():
    """With ``others``, a statement that is not GEMMs is a step of the small path's,
    consecutive ones one step; a program with no GEMM at all is still None."""
    decls = dict(A=M(8, 8), B=M(8, 8), C=M(8, 8), D=M(8, 8), x=V(8), y=V(8), s=S())
    source = "C = A*B\ny = C*x + y\ns = x'*y\nD = s*C*B + D\nC = C + D'"
    typed = _typed(source, decls)
    assert gemm_program(typed) is None
    gemms = gemm_program(typed, others=True)
    assert [s if isinstance(s, Others) else s.out for s in gemms.steps] == [
        "C", Others((1, 2)), "D", Others((4,))]
    assert [s.out for s in gemms.gemms] == ["C", "D"]
    assert gemm_program(_typed("y = A*x + y\ns = x'*y", decls), others=True) is None


def _spine_kernel(source: str, decls: dict, monkeypatch) -> tuple:
    monkeypatch.setattr(route, "SPINE_L1_MULTIPLE", 0.0)
    monkeypatch.setattr(route, "PASS_MIN_EXTENT", 0)
    kernel = blacc.compile(source, **decls)
    assert "blacc_gemm_" in kernel.source, "not computed by the spine"
    return kernel, unplanned(source, decls)


@pytest.mark.parametrize(("source", "decls"), [
    ("C = A*B", dict(A=M(37, 29, "f32"), B=M(29, 41, "f32"), C=M(37, 41, "f32"))),
    ("C = alpha*A*B + beta*C", dict(A=M(13, 40, "f64"), B=M(40, 17, "f64"),
                                    C=M(13, 17, "f64"), alpha=S("f64"), beta=S("f64"))),
    ("C = A'*B' - C", dict(A=M(9, 31, "f32"), B=M(23, 9, "f32"), C=M(31, 23, "f32"))),
    ("C = 2*alpha*(A*B)' + C", dict(A=M(11, 7, "f64"), B=M(7, 19, "f64"),
                                    C=M(19, 11, "f64", layout="col", ld=23),
                                    alpha=S("f64"))),
    ("C = -A*B*beta + C", dict(A=M(16, 3, "f32", layout="col", ld=20),
                               B=M(3, 33, "f32", ld=40), C=M(16, 33, "f32", ld=35),
                               beta=S("f32"))),
    ("C = A*A'", dict(A=M(2, 5, "f64"), C=M(2, 2, "f64"))),
    ("D = alpha*A*B - beta*C + 2*E' + D", dict(
        A=M(14, 6, "f64"), B=M(6, 9, "f64"), C=M(14, 9, "f64", ld=12),
        E=M(9, 14, "f64", layout="col", ld=10), D=M(14, 9, "f64", layout="col", ld=17),
        alpha=S("f64"), beta=S("f64"))),
    ("D = A'*B + C + C", dict(A=M(6, 10, "f32"), B=M(6, 7, "f32"), C=M(10, 7, "f32"),
                             D=M(10, 7, "f32", ld=8))),
    ("C = alpha*(A0 + A1)'*B + beta*C", dict(
        A0=M(7, 12, "f64"), A1=M(7, 12, "f64", layout="col", ld=9), B=M(7, 5, "f64"),
        C=M(12, 5, "f64", layout="col"), alpha=S("f64"), beta=S("f64"))),
    ("C = (A*(B0 - 2*B1'))' + C", dict(A=M(9, 4, "f32"), B0=M(4, 11, "f32", ld=13),
                                       B1=M(11, 4, "f32"), C=M(11, 9, "f32"))),
])
def test_spine_programs_match_the_reference(source, decls, monkeypatch):
    kernel, p = _spine_kernel(source, decls, monkeypatch)
    dtype = p.typed.dtype
    values = make_values(decls, dtype, np.random.default_rng(seed_of("spine", source)))
    kwargs, outs = call_args(p, values, pass_outputs=True)
    inputs = {n: a.copy() for n, a in kwargs.items()
              if isinstance(a, np.ndarray) and n not in outs}
    ((out, c),) = outs.items()
    got = kernel(**kwargs)
    assert got is c
    for n, a in inputs.items():
        assert np.array_equal(a, kwargs[n]), f"input {n} was written"
    base = c.base if c.base is not None else c
    spec = next(s for s in p.specs if s.name == out)
    outside = np.ones(base.shape, bool)
    outside[: spec.rows, : spec.cols] = False  # the view's corner of its buffer
    assert (base[outside] == SENTINEL).all(), "padding written"
    assert_matches(p.typed, values, {out: c}, source)


def test_spine_keeps_nan_in_c_when_beta_is_zero(monkeypatch):
    decls = dict(A=M(6, 5), B=M(5, 7), C=M(6, 7), beta=S())
    kernel, _ = _spine_kernel("C = A*B + beta*C", decls, monkeypatch)
    rng = np.random.default_rng(1)
    A, B = rng.uniform(-1, 1, (6, 5)), rng.uniform(-1, 1, (5, 7))
    C = rng.uniform(-1, 1, (6, 7))
    C[2, 3], C[4, 0] = np.nan, np.inf
    with np.errstate(invalid="ignore"):
        expected = A @ B + 0.0 * C
    kernel(A=A, B=B, C=C, beta=0.0)
    np.testing.assert_allclose(C, expected, rtol=1e-12, atol=1e-12)
    assert np.isnan(C[2, 3]) and np.isnan(C[4, 0])
    # a statement that does not read C never sees what was in it
    only = blacc.compile("C = A*B", **{n: d for n, d in decls.items() if n != "beta"})
    C[...] = np.nan
    only(A=A, B=B, C=C)
    np.testing.assert_allclose(C, A @ B, rtol=1e-12)


def test_spine_rejects_bad_arguments_and_writes_nothing(monkeypatch):
    decls = dict(A=M(6, 5, "f32"), B=M(5, 7, "f32"), C=M(6, 7, "f32"), alpha=S("f32"))
    kernel, _ = _spine_kernel("C = alpha*A*B + C", decls, monkeypatch)
    A = np.ones((6, 5), np.float32)
    B = np.ones((5, 7), np.float32)
    C = np.full((6, 7), 3.0, np.float32)
    bad = [dict(A=np.ones((5, 6), np.float32)),      # wrong shape
           dict(B=np.ones((5, 7), np.float64)),      # wrong dtype
           dict(alpha="two"),                        # not a number
           dict(C=C[:, ::-1])]                       # wrong strides
    for change in bad:
        args = dict(A=A, B=B, C=C, alpha=2.0) | change
        with pytest.raises((BlaccError, TypeError, ValueError)):
            kernel(**args)
        assert (C == 3.0).all()
    buffer = np.ones(42, np.float32)
    with pytest.raises(BlaccError, match="overlap"):  # C overlaps A
        kernel(A=buffer[:30].reshape(6, 5), B=B, C=buffer.reshape(6, 7), alpha=2.0)
    assert (buffer == 1.0).all()
    kernel(A=A, B=B, C=C, alpha=2.0)
    assert (C == 13.0).all()


def test_large_gemms_go_to_the_spine_and_others_stay():
    f32 = "f32"
    large = blacc.compile("C = A*B + C", A=M(160, 160, f32), B=M(160, 160, f32),
                          C=M(160, 160, f32))
    assert "blacc_gemm_" in large.source
    with pytest.raises(BlaccError, match="search must be one of"):
        blacc.compile("C = A*B + C", search="fastest", A=M(160, 160, f32),
                      B=M(160, 160, f32), C=M(160, 160, f32))
    small = blacc.compile("C = A*B + C", A=M(16, 16, f32), B=M(16, 16, f32),
                          C=M(16, 16, f32))
    assert "blacc_gemm_" not in small.source
    # other addends: only for a long enough k, where the product outweighs their pass
    decls = dict(A=M(256, 16, f32), B=M(16, 256, f32), C=M(256, 256, f32), D=M(256, 256, f32))
    assert "blacc_gemm_" in blacc.compile("C = A*B + C", **decls).source
    assert "blacc_gemm_" not in blacc.compile("D = A*B + C", **decls).source
    # an operand that is a sum: only where the product's other side is long enough
    assert "blacc_gemm_" not in blacc.compile("C = A*(B + B)", A=M(4, 400, f32),
                                              B=M(400, 400, f32), C=M(4, 400, f32)).source
    # a large matrix-vector product is streamed by the small path as fast
    matvec = blacc.compile("y = A*x", A=M(400, 400, f32), x=V(400, f32), y=V(400, f32))
    assert "blacc_gemm_" not in matvec.source
    # another target: the spine in its instructions (plain C for 'generic')
    other = blacc.compile("C = A*B + C", target="generic", A=M(160, 160, f32),
                          B=M(160, 160, f32), C=M(160, 160, f32))
    assert "blacc_gemm_" in other.source and "_mm" not in other.source
    rng = np.random.default_rng(7)
    A, B = (rng.uniform(-1, 1, (160, 160)).astype(np.float32) for _ in range(2))
    C = rng.uniform(-1, 1, (160, 160)).astype(np.float32)
    expected = A.astype(np.float64) @ B + C
    for kernel in (large, other):
        got = C.copy()
        kernel(A=A, B=B, C=got)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_programs_go_to_the_spine_where_its_steps_hold_most_of_the_work():
    no_l1 = types.SimpleNamespace(cache=lambda level: None)  # route.DEFAULT_L1_BYTES

    def to_spine(source: str, **decls) -> bool:
        typed = _typed(source, decls)
        return route.program_to_spine(gemm_program(typed), typed, no_l1)

    def f32(rows: int, cols: int):
        return M(rows, cols, "f32")

    big = {n: f32(160, 160) for n in "ABCE"}
    assert to_spine("E = A*B*C", **big)
    assert not to_spine("E = A*B*C", **{n: f32(20, 20) for n in big})
    # 400 x 400 x k (past L1) and 80^3 (76.8 KB, below 2.5 x 32 KiB): the first's work
    # is 320,000 multiplies for k = 2, 640,000 for k = 4, the second's 512,000
    for k, spine in ((2, False), (4, True)):
        assert to_spine("C = A*B\nF = D*E", A=f32(400, k), B=f32(k, 400),
                        C=f32(400, 400), D=f32(80, 80), E=f32(80, 80),
                        F=f32(80, 80)) == spine


def test_plain_c_keeps_the_small_path_for_a_short_k():
    """Without vectors, gcc vectorizes the small path's rows where k is short, and not
    the spine's micro-kernel: 1000 x 1000 x 16 stays small in plain C only."""
    no_l1 = types.SimpleNamespace(cache=lambda level: None)
    for k, plain in ((16, False), (route.PLAIN_C_MIN_K, True)):
        decls = dict(A=M(1000, k, "f32"), B=M(k, 1000, "f32"), C=M(1000, 1000, "f32"))
        typed = _typed("C = A*B + C", decls)
        assert route.program_to_spine(gemm_program(typed), typed, no_l1)
        assert route.program_to_spine(gemm_program(typed), typed, no_l1,
                                      vectors=False) == plain


@st.composite
def _gemm_programs(draw):
    """A random one-GEMM program: transposes, scalar factors, signs, layouts with padded
    leading dimensions, and addends (the output itself or other matrices)."""
    dt = draw(st.sampled_from(("f32", "f64")))
    m, n, k = (draw(st.integers(2, 19)) for _ in range(3))

    def matrix(rows: int, cols: int):
        layout = draw(st.sampled_from(("row", "col")))
        pad = draw(st.sampled_from((0, 0, 3)))
        natural = cols if layout == "row" else rows
        return M(rows, cols, dt, layout=layout, ld=natural + pad if pad else None)

    def operand(name: str, rows: int, cols: int, decls: dict) -> str:
        if draw(st.booleans()):
            decls[name] = matrix(cols, rows)
            return f"{name}'"
        decls[name] = matrix(rows, cols)
        return name

    def side(name: str, rows: int, cols: int, decls: dict) -> str:
        """An operand of the product, or a sum of two."""
        if draw(st.integers(0, 3)) == 0:
            x, y = operand(f"{name}0", rows, cols, decls), operand(f"{name}1", rows, cols, decls)
            return f"({x} {draw(st.sampled_from(('+', '-')))} {factor()}{y})"
        return operand(name, rows, cols, decls)

    def factor() -> str:
        return draw(st.sampled_from(("", "alpha*", "2*", "-", "0.5*beta*")))

    decls = {"alpha": S(dt), "beta": S(dt), "C": matrix(m, n)}
    a, b = side("A", m, k, decls), side("B", k, n, decls)
    product = f"{factor()}{a}*{b}"
    if draw(st.booleans()):
        product = f"({factor()}({b}')*({a}'))'"
    terms = [product]
    for i in range(draw(st.integers(0, 2))):
        if draw(st.booleans()):
            terms.append(f"{factor()}C")
        else:
            terms.append(f"{factor()}{operand(f'E{i}', m, n, decls)}")
    draw(st.randoms()).shuffle(terms)
    source = "C = " + " + ".join(terms)
    used = {name for name in decls if name in source.replace("'", " ").replace("*", " ")
            .replace("(", " ").replace(")", " ").replace("-", " ").split()}
    return source, {name: d for name, d in decls.items() if name in used}


@settings(max_examples=12, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=_gemm_programs())
def test_random_gemm_programs_on_the_spine_match_the_reference(program, monkeypatch):
    source, decls = program
    kernel, p = _spine_kernel(source, decls, monkeypatch)
    values = make_values(decls, p.typed.dtype, np.random.default_rng(seed_of(source)))
    kwargs, outs = call_args(p, values, pass_outputs=True)
    kernel(**kwargs)
    assert_matches(p.typed, values, outs, f"{source} {decls}")


def _check_spine_program(source: str, decls: dict, monkeypatch, pass_outputs=True) -> None:
    """``source`` forced onto the spine agrees with the reference; inputs unchanged."""
    kernel, p = _spine_kernel(source, decls, monkeypatch)
    values = make_values(decls, p.typed.dtype, np.random.default_rng(seed_of(source)))
    kwargs, outs = call_args(p, values, pass_outputs=pass_outputs)
    inputs = {n: a.copy() for n, a in kwargs.items()
              if isinstance(a, np.ndarray) and n not in outs}
    result = kernel(**kwargs)
    written = [s.name for s in p.specs if s.role != "in"]
    result = result if len(written) > 1 else {written[0]: result}
    for n, a in inputs.items():
        assert np.array_equal(a, kwargs[n]), f"input {n} was written"
    for n, a in outs.items():
        assert result[n] is a, f"{n} not written in place"
    assert_matches(p.typed, values, result, f"{source} {decls}")


@pytest.mark.parametrize(("source", "decls"), [
    ("E = A*B*C", dict(A=M(7, 9, "f64"), B=M(9, 3, "f64", layout="col"),
                       C=M(3, 11, "f64", ld=13), E=M(7, 11, "f64"))),
    ("E = 2*alpha*(A*B*C)' + beta*E", dict(
        A=M(5, 12, "f32"), B=M(12, 12, "f32"), C=M(12, 4, "f32", layout="col", ld=14),
        E=M(4, 5, "f32", layout="col", ld=7), alpha=S("f32"), beta=S("f32"))),
    ("D = A*B + C'*E - D", dict(A=M(9, 5, "f64"), B=M(5, 8, "f64"), C=M(3, 9, "f64"),
                                E=M(3, 8, "f64", layout="col"), D=M(9, 8, "f64", ld=10))),
    ("C = A*B\nD = C'*E*F - D", dict(A=M(6, 4, "f32"), B=M(4, 10, "f32"),
                                     C=M(6, 10, "f32"), E=M(6, 2, "f32"),
                                     F=M(2, 7, "f32"), D=M(10, 7, "f32"))),
    ("F = alpha*(A0 + A1)'*B*C + F", dict(A0=M(8, 6, "f64"), A1=M(8, 6, "f64", layout="col"),
                                          B=M(8, 2, "f64"), C=M(2, 9, "f64"),
                                          F=M(6, 9, "f64"), alpha=S("f64"))),
    ("E = A*B*C*D", dict(A=M(3, 20, "f32"), B=M(20, 20, "f32"), C=M(20, 20, "f32"),
                         D=M(20, 3, "f32"), E=M(3, 3, "f32"))),
    # factors that are GEMMs themselves, computed into scratch arrays first
    ("D = alpha*(A*B - 2*C)'*E + D", dict(
        A=M(7, 5, "f64", layout="col"), B=M(5, 9, "f64"), C=M(7, 9, "f64", ld=11),
        E=M(7, 4, "f64"), D=M(9, 4, "f64", layout="col", ld=10), alpha=S("f64"))),
    ("F = E'*(A*B + C)'*(G*A + H)", dict(
        A=M(6, 5, "f32"), B=M(5, 8, "f32"), C=M(6, 8, "f32"), E=M(8, 3, "f32"),
        G=M(6, 6, "f32", ld=7), H=M(6, 5, "f32", layout="col"), F=M(3, 5, "f32"))),
])
def test_programs_of_several_gemms_on_the_spine(source, decls, monkeypatch):
    _check_spine_program(source, decls, monkeypatch)


@pytest.mark.parametrize(("source", "decls"), [
    # a product with a vector after a GEMM, which reads its output
    ("C = A*B\ny = C*x + y", dict(A=M(9, 7, "f64"), B=M(7, 11, "f64", layout="col"),
                                  C=M(9, 11, "f64", ld=12), x=V(11, "f64"), y=V(9, "f64"))),
    # a scalar the small path computes first, a factor of the GEMM after it
    ("s = x'*x\nC = s*A*B' + C", dict(x=V(5, "f32"), s=S("f32"), A=M(6, 4, "f32"),
                                      B=M(8, 4, "f32"), C=M(6, 8, "f32", layout="col"))),
    # a statement without a product between two GEMMs, updating the first one's output
    ("D = A*B\nD = D - 2*E'\nF = alpha*D*G", dict(
        A=M(5, 9, "f64"), B=M(9, 6, "f64"), D=M(5, 6, "f64"), E=M(6, 5, "f64"),
        G=M(6, 3, "f64", ld=5), F=M(5, 3, "f64"), alpha=S("f64"))),
    # several statements of the small path's, a chain among GEMMs, and a scalar output
    ("y = A*x\nz = A'*y\nE = A*B*C\nt = z'*z\nH = t*E' + H", dict(
        A=M(6, 7, "f32"), x=V(7, "f32"), y=V(6, "f32"), z=V(7, "f32"), B=M(7, 3, "f32"),
        C=M(3, 9, "f32"), E=M(6, 9, "f32"), t=S("f32"), H=M(9, 6, "f32"))),
])
def test_programs_with_other_statements_between_gemms_on_the_spine(source, decls,
                                                                  monkeypatch):
    _check_spine_program(source, decls, monkeypatch)


def test_outputs_the_kernel_allocates_are_computed_before_they_are_read(monkeypatch):
    decls = dict(A=M(6, 4, "f64"), B=M(4, 10, "f64"), C=M(6, 10, "f64"), E=M(6, 2, "f64"),
                 D=M(10, 2, "f64"))
    _check_spine_program("C = A*B\nD = C'*E", decls, monkeypatch, pass_outputs=False)


@st.composite
def _gemm_chains(draw, others: bool = False):
    """A random program of GEMMs: one or two statements, each with one or two products
    of two to four factors (transposed or not, some sums of two, some GEMMs themselves),
    maybe the output added; the second statement may read the first's output. Sizes
    start at 2: a side of 1 makes a product with a vector, no GEMM here. ``others``:
    after a GEMM statement there may be one that is not, reading its output: a product
    with a vector, an update in place, or a scalar (which the next GEMM statement may
    take as a factor)."""
    dt = draw(st.sampled_from(("f32", "f64")))
    decls: dict = {"alpha": S(dt)}
    size = st.integers(2, 13)
    scales = ["", "alpha*", "-2*"]

    def other(s: int, rows: int, cols: int) -> str:
        out = f"Y{s}"
        kind = draw(st.sampled_from(("matvec", "update", "scalar")))
        if kind == "update":
            decls[f"W{s}"] = matrix(cols, rows)
            return f"{out} = {out} - alpha*W{s}'"
        decls[f"x{s}"] = V(cols, dt)
        if kind == "matvec":
            decls[f"v{s}"] = V(rows, dt)
            return f"v{s} = {out}*x{s} + v{s}"
        decls[f"u{s}"], decls[f"t{s}"] = V(rows, dt), S(dt)
        scales.append(f"t{s}*")
        return f"t{s} = u{s}'*{out}*x{s}"

    def matrix(rows: int, cols: int):
        layout = draw(st.sampled_from(("row", "col")))
        natural = cols if layout == "row" else rows
        pad = draw(st.sampled_from((0, 0, 2)))
        return M(rows, cols, dt, layout=layout, ld=natural + pad if pad else None)

    def operand(rows: int, cols: int) -> str:
        name = f"X{len(decls)}"
        if draw(st.booleans()):
            decls[name] = matrix(cols, rows)
            return f"{name}'"
        decls[name] = matrix(rows, cols)
        return name

    def factor(rows: int, cols: int) -> str:
        kind = draw(st.integers(0, 7))
        if kind < 2:
            return f"({operand(rows, cols)} - alpha*{operand(rows, cols)})"
        if kind == 2:  # GEMMs itself, maybe transposed
            inner = draw(size)
            if draw(st.booleans()):
                return (f"({operand(cols, inner)}*{operand(inner, rows)} + "
                        f"{operand(cols, rows)})'")
            return f"({operand(rows, inner)}*{operand(inner, cols)} - {operand(rows, cols)})"
        return operand(rows, cols)

    def product(rows: int, cols: int, lead: tuple[str, int] | None) -> str:
        """A product of rows x cols, whose first factor is ``lead`` (text, columns) if
        given, of ``rows`` rows."""
        inner = [rows, *(draw(size) for _ in range(draw(st.integers(1, 3)))), cols]
        if lead is not None:
            inner[0] = lead[1]
        fs = [factor(inner[i], inner[i + 1]) for i in range(len(inner) - 1)]
        if lead is not None:
            fs.insert(0, lead[0])
        scale = draw(st.sampled_from(scales))
        return scale + "*".join(fs)

    statements, first = [], None
    for s in range(draw(st.integers(1, 2))):
        out, rows, cols = f"Y{s}", draw(size), draw(size)
        lead = None
        if first is not None and draw(st.booleans()):  # read the first statement's output
            flip = draw(st.booleans())
            rows, lead = first[::-1][0] if flip else first[0], (
                ("Y0'", first[0]) if flip else ("Y0", first[1]))
        terms = [product(rows, cols, lead if i == 0 else None)
                 for i in range(draw(st.integers(1, 2)))]
        if draw(st.booleans()):
            terms.append(f"0.5*{out}")
        decls[out] = matrix(rows, cols)
        statements.append(f"{out} = " + " + ".join(terms))
        if others and draw(st.booleans()):
            statements.append(other(s, rows, cols))
        first = first or (rows, cols)
    source = "\n".join(statements)
    if "alpha" not in source:
        del decls["alpha"]
    return source, decls


@settings(max_examples=12, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=_gemm_chains())
def test_random_programs_of_gemms_on_the_spine_match_the_reference(program, monkeypatch):
    source, decls = program
    assert gemm_program(_typed(source, decls)) is not None, source
    _check_spine_program(source, decls, monkeypatch)


@settings(max_examples=10, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=_gemm_chains(others=True))
def test_random_programs_with_other_statements_on_the_spine_match_the_reference(
        program, monkeypatch):
    source, decls = program
    assert gemm_program(_typed(source, decls), others=True) is not None, source
    _check_spine_program(source, decls, monkeypatch)
