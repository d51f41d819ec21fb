"""Programs built with Python operators on declarations are the programs the parser gives."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blacc.errors import ArgumentError, TypeCheckError
from blacc.frontend import Matrix, Scalar, Vector, check, evaluate, parse, to_program
from blacc.frontend.ast import Mul, Neg, Num, Pos, Ref
from blacc.frontend.parser import MAX_DEPTH

A, B, C = Matrix(5, 9), Matrix(9, 4), Matrix(5, 4)
A0, A1 = Matrix(9, 5), Matrix(9, 5)
Bx = Matrix(5, 9)
x, x5, y, y9, z = Vector(9), Vector(5), Vector(5), Vector(9), Vector(5)
alpha, beta = Scalar(), Scalar()
S, T = Matrix(6, 6), Matrix(6, 6)
x6, y6 = Vector(6), Vector(6)

#: LGen's examples: source, names, the same computation built in Python.
EXAMPLES = [
    ("y = A*x", dict(A=A, x=x, y=y), lambda: A @ x),
    ("C = A*B", dict(A=A, B=B, C=C), lambda: A @ B),
    ("y = alpha*x + y", dict(alpha=alpha, x=x5, y=y), lambda: alpha * x5 + y),
    ("y = alpha*A*x + beta*y", dict(alpha=alpha, beta=beta, A=A, x=x, y=y),
     lambda: alpha * A @ x + beta * y),
    ("C = alpha*A*B + beta*C", dict(alpha=alpha, beta=beta, A=A, B=B, C=C),
     lambda: alpha * A @ B + beta * C),
    ("y = alpha*A*x + beta*B*x", dict(alpha=alpha, beta=beta, A=A, B=Bx, x=x, y=y),
     lambda: alpha * A @ x + beta * Bx @ x),
    ("alpha = x'*A*y", dict(alpha=alpha, x=x5, A=A, y=y9), lambda: x5.T @ A @ y9),
    ("C = alpha*(A0 + A1)'*B + beta*C",
     dict(alpha=alpha, beta=beta, A0=A0, A1=A1, B=B, C=C),
     lambda: alpha * (A0 + A1).T @ B + beta * C),
    ("beta = (A*x + alpha*y)'*z + beta", dict(alpha=alpha, beta=beta, A=A, x=x, y=y, z=z),
     lambda: (A @ x + alpha * y).T @ z + beta),
]


def _values(names, seed=0):
    rng = np.random.default_rng(seed)
    return {n: (float(rng.uniform(-2, 2)) if d.kind == "scalar" else rng.uniform(-1, 1, d.shape))
            for n, d in names.items()}


@pytest.mark.parametrize("source, names, build", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_builder_gives_the_parsed_program(source, names, build):
    target = source.split(" = ")[0]
    program, decls = to_program({target: build()}, names)
    assert program == parse(source)
    assert decls == names and decls is not names
    typed = check(program, decls)
    assert typed == check(parse(source), names)
    assert typed.statements[0].expr.shape == names[target].shape
    values = _values(names)
    expected = evaluate(check(parse(source), names), values)[target]
    np.testing.assert_array_equal(evaluate(typed, values)[target], expected)


def test_the_brief_example():
    program, decls = to_program({"y": A @ x + alpha * y}, {"A": A, "x": x, "alpha": alpha, "y": y})
    assert check(program, decls) == check(parse("y = A*x + alpha*y"), decls)
    assert program.source == "y = A*x + alpha*y"
    assert program.statements[0].pos == Pos(1, 1) and program.statements[0].text == program.source


@pytest.mark.parametrize("build, source", [
    (lambda: 2 * x6, "y = 2*x"),
    (lambda: x6 * 0.5, "y = x*0.5"),
    (lambda: -1.5 * x6, "y = -1.5*x"),
    (lambda: np.float32(2.0) * x6, "y = 2*x"),
    (lambda: np.int64(3) * x6, "y = 3*x"),
    (lambda: 1e-300 * x6, "y = 1e-300*x"),
    (lambda: -x6, "y = -x"),
    (lambda: -(S @ x6), "y = -(S*x)"),
    (lambda: x6 - 2 * x6, "y = x - 2*x"),
    (lambda: (S.T @ x6).T.T, "y = (S'*x)''"),
    (lambda: S @ (S @ x6), "y = S*(S*x)"),
    (lambda: (S + T) @ x6, "y = (S + T)*x"),
    (lambda: alpha * (x6.T @ x6) * x6, "y = alpha*(x'*x)*x"),
    (lambda: (x6.T @ x6) * x6, "y = x'*x*x"),
    (lambda: x6 * (x6.T @ x6), "y = x*(x'*x)"),
])
def test_constants_and_operators(build, source):
    names = {"x": x6, "y": y6, "S": S, "T": T, "alpha": alpha}
    program, _ = to_program({"y": build()}, names)
    assert program == parse(source)


def test_scalar_arithmetic_and_copies():
    program, _ = to_program({"alpha": 1 - alpha + 2, "beta": alpha, "u": 3.0},
                            {"alpha": alpha, "beta": beta, "u": Scalar()})
    assert program == parse("alpha = 1 - alpha + 2\nbeta = alpha\nu = 3")
    typed = check(program, {"alpha": alpha, "beta": beta, "u": Scalar()})
    assert typed.outputs == ("alpha", "beta", "u") and typed.inputs == ("alpha",)
    assert evaluate(typed, {"alpha": 5.0}) == {"alpha": -2.0, "beta": -2.0, "u": 3.0}


def test_negative_constants_become_negations():
    program, _ = to_program({"y": -2 * x6 + -0.0 * x6}, {"x": x6, "y": y6})
    e = program.statements[0].expr
    assert e.a == Mul(Neg(Num(2.0)), Ref("x")) and e.b == Mul(Neg(Num(0.0)), Ref("x"))


@settings(max_examples=60, deadline=None)
@given(c=st.floats(-1e300, 1e300, allow_nan=False))
def test_any_finite_constant_round_trips(c):
    names = {"x": x6, "y": y6}
    program, decls = to_program({"y": c * x6}, names)
    values = {"x": np.arange(1.0, 7.0)}
    out = evaluate(check(program, decls), values)["y"]
    np.testing.assert_array_equal(out, c * values["x"])


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("build, fragments", [
    (lambda: A * x, ["Matrix(5, 9) * Vector(9)", "use @ for the matrix product", "5x9", "9x1"]),
    (lambda: x.T * x, ["use @", "1x9", "9x1"]),
    (lambda: A @ y, ["Matrix(5, 9) @ Vector(5)", "5x9", "5x1", "columns of the left"]),
    (lambda: alpha @ A, ["@ is the matrix product; scale by Scalar() with * instead"]),
    (lambda: A @ alpha, ["scale by Scalar() with *"]),
    (lambda: 2 @ A, ["2 @ Matrix(5, 9)", "scale by 2 with *"]),
    (lambda: A + B, ["Matrix(5, 9) + Matrix(9, 4)", "5x9 and 9x4", "+ needs equal shapes"]),
    (lambda: x - x.T, ["<1x9 expression>", "9x1 and 1x9", "- needs equal shapes"]),
    (lambda: A @ x + 1, ["5x1 and 1x1"]),
])
def test_build_errors(build, fragments):
    with pytest.raises(TypeCheckError) as info:
        build()
    message = str(info.value)
    assert all(f in message for f in fragments), message


@pytest.mark.parametrize("build", [
    lambda: True * x, lambda: "2" * x, lambda: x @ np.ones(9), lambda: np.ones((5, 9)) @ x,
    lambda: x / 2, lambda: 1j * x, lambda: [1] + x,
])
def test_non_operands_are_python_type_errors(build):
    with pytest.raises(TypeError):
        build()


def test_non_finite_constants():
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ArgumentError, match="constants must be finite"):
            bad * x


@pytest.mark.parametrize("outputs, names, error, fragment", [
    ({"y": A @ x}, {"A": A, "y": y}, TypeCheckError,
     "the expression for 'y' uses Vector(9), which is not in names"),
    ({"y": A @ Vector(9)}, {"A": A, "x": x, "y": y}, TypeCheckError, "not in names"),
    ({"y": A @ x}, {"A": A, "x": x, "xx": x, "y": y}, ArgumentError,
     "Vector(9) is passed twice, as 'x' and 'xx'"),
    ({"y": x}, {"int": x, "y": y}, ArgumentError, "'int' is a C keyword"),
    ({"y": x}, {"x": x, "y": np.zeros(5)}, ArgumentError, "names['y'] must be a Matrix"),
    ({"y": x}, {"x": x, "y": Vector}, ArgumentError, "names['y'] must be a Matrix"),
    ({}, {"x": x}, ArgumentError, "needs at least one output"),
    ({"y": "x"}, {"x": x, "y": y}, ArgumentError, "outputs['y'] must be an expression"),
    ({"1y": x}, {"x": x}, ArgumentError, "'1y' is not a valid name"),
    ({"blacc_y": x}, {"x": x}, ArgumentError, "reserved for blacc"),
    ([("y", x)], {"x": x}, ArgumentError, "two dicts"),
])
def test_to_program_errors(outputs, names, error, fragment):
    with pytest.raises(error) as info:
        to_program(outputs, names)
    assert fragment in str(info.value)


def test_type_errors_of_built_programs_quote_the_printed_statement():
    names = {"A": A, "x": x, "S": S, "T": T, "u": x6}
    program, decls = to_program({"x": A @ x}, names)
    with pytest.raises(TypeCheckError) as info:
        check(program, decls)
    assert str(info.value) == (
        "line 1, column 1: x = A*x: the result is 5x1 (a vector of length 5) but x is declared "
        "as Vector(9), which is 9x1 (a vector of length 9)\n  x = A*x\n  ^")
    program, decls = to_program({"u": S @ x6, "S": S @ T}, names)
    with pytest.raises(TypeCheckError, match=r"line 1, column 7: u = S\*u: the output u is read "):
        check(program, decls)
    program, decls = to_program({"y": alpha * x}, {"x": x, "alpha": alpha})
    with pytest.raises(TypeCheckError, match=r"line 1, column 1: y is not declared "
                                             r"\(declared: x, alpha\)"):
        check(program, decls)


def test_mixed_dtypes_in_built_programs():
    xf = Vector(9, "f32")
    program, decls = to_program({"y": A @ xf}, {"A": A, "x": xf, "y": y})
    with pytest.raises(TypeCheckError, match="mixed dtypes: A is f64 but x is f32"):
        check(program, decls)


def test_deep_expressions_fail_cleanly():
    e = x6
    with pytest.raises(TypeCheckError, match="nested too deeply"):
        for _ in range(MAX_DEPTH + 5):
            e = e + x6
    e = x6
    for _ in range(60):  # deeper than the parser's nesting limit for minus signs
        e = -e
    program, decls = to_program({"y": e}, {"x": x6, "y": y6})
    assert program.source == "" and check(program, decls).outputs == ("y",)
    np.testing.assert_array_equal(evaluate(check(program, decls), {"x": np.ones(6)})["y"],
                                  np.ones(6))
