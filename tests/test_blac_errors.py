"""Errors of the expression-language API: each mistake raises a clear exception (its class,
a message naming the problem) and writes nothing to any array.

Compile time: malformed source, bad declarations, undeclared names, shape mismatches,
unsafe in-place updates, bad options. Call time: wrong shapes, dtypes and layouts,
read-only outputs, missing and extra arguments, bad scalars, outputs aliasing inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.errors import (
    AliasingError,
    ArgumentError,
    BlaccError,
    DTypeError,
    ParseError,
    ScheduleError,
    ShapeError,
    TypeCheckError,
)

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
F32 = np.float32
SENTINEL = -7777.0


def gemv_decls():
    return dict(A=M(5, 9, "f32"), x=V(9, "f32"), y=V(5, "f32"), alpha=S("f32"))


# ----------------------------------------------------------------------------- source

PARSE_ERRORS = [
    ("y = A*", "line 1, column 7", "expected an operand after '*'"),
    ("y = (A*x", "column 5", "never closed"),
    ("y A*x", "column 3", "expected '='"),
    ("y = A@x", "column 6", "write matrix products with *"),
    ("y = A*x)", "column 8", "unmatched ')'"),
    ("= A*x", "column 1", "expected an output name"),
    ("", "line 1", "empty program"),
    ("  \n# only a comment\n", "line 1", "empty program"),
    ("y = A^x", "column 7", "expected 'T' after '^'"),
    ("y = 1.2.3*x", "column 5", "malformed number '1.2.3'"),
    ("y = A*x = y", "column 9", "one '=' per statement"),
    ("y = A*x +* y", "column 10", "expected an operand after '+'"),
    ("y = A*x\ny = A*x $ y", "line 2, column 9", "unexpected character '$'"),
    ("y = 1e999*A*x", "column 5", "too large"),
    ("y = " + "(" * 60 + "x" + ")" * 60, "line 1", "nested too deeply"),
    ("int = A*x", "column 1", "C keyword"),
]


@pytest.mark.parametrize(("source", "where", "what"), PARSE_ERRORS,
                         ids=[repr(s[0])[:30] for s in PARSE_ERRORS])
def test_malformed_source(source, where, what):
    with pytest.raises(ParseError) as info:
        plan(source, **gemv_decls())
    message = str(info.value)
    assert where in message and what in message, message
    assert isinstance(info.value, (BlaccError, ValueError))


def test_parse_error_shows_the_line_and_a_caret():
    with pytest.raises(ParseError) as info:
        plan("y = A*x\ny = A*x +* y", **gemv_decls())
    lines = str(info.value).splitlines()
    assert "y = A*x +* y" in lines[1]
    assert lines[2].index("^") == lines[1].index("* y"), lines


TYPE_ERRORS = [
    ("y = A*z", "z is not declared"),
    ("q = A*x", "q is not declared"),
    ("y = A*y", "A is 5x9 but y has length 5"),
    ("y = A + x", "+ needs operands of one shape"),
    ("y = A*x - x", "- needs operands of one shape"),
    ("y = A'*x", "A' is 9x5 but x has length 9"),
    ("y = x'*x", "the result is 1x1 (a scalar) but y is declared"),
    ("alpha = A*x", "alpha is declared as Scalar"),
    ("x = A'*x", "A' is 9x5"),
    ("y = alpha*A*x + y'", "one shape"),
]


@pytest.mark.parametrize(("source", "what"), TYPE_ERRORS, ids=[s for s, _ in TYPE_ERRORS])
def test_shape_and_name_errors(source, what):
    with pytest.raises(TypeCheckError) as info:
        plan(source, **gemv_decls())
    message = str(info.value)
    assert what in message, message
    assert "line 1" in message, message


@pytest.mark.parametrize("source", ["x = B*x", "A = A'", "C = A*C", "C = C'", "x = x'*x*x"])
def test_unsafe_in_place_updates_are_rejected(source):
    decls = dict(A=M(4, 4), B=M(4, 4), C=M(4, 4), x=V(4))
    with pytest.raises(TypeCheckError) as info:
        plan(source, **decls)
    assert "is read at other positions" in str(info.value) or "declared as" in str(info.value)


@pytest.mark.parametrize("source", ["y = A*x + y", "C = A*B + C", "s = x'*x + s",
                                    "C = -C + A", "x = 2*x"])
def test_safe_in_place_updates_are_accepted(source):
    decls = dict(A=M(4, 4), B=M(4, 4), C=M(4, 4), x=V(4), y=V(4), s=S())
    plan(source, **decls)


def test_mixed_dtypes():
    with pytest.raises(TypeCheckError, match="mixed dtypes: A is f32 but x is f64"):
        plan("y = A*x", A=M(5, 9, "f32"), x=V(9), y=V(5))


# ----------------------------------------------------------------------------- declarations

BAD_DECLARATIONS = [
    (lambda: M(0, 3), "Matrix rows must be a positive int, got 0"),
    (lambda: M(3, -2), "Matrix cols must be a positive int"),
    (lambda: M(2.5, 3), "got 2.5 (float)"),
    (lambda: M(True, 3), "positive int"),
    (lambda: M(3, 3, "f16"), "dtype must be 'f32' or 'f64'"),
    (lambda: M(3, 3, np.int32), "dtype must be 'f32' or 'f64'"),
    (lambda: M(3, 3, layout="diag"), "layout must be 'row' or 'col'"),
    (lambda: M(3, 4, ld=2), "needs ld >= 4"),
    (lambda: M(3, 4, layout="col", ld=2), "needs ld >= 3"),
    (lambda: M(3, 4, ld=0), "ld"),
    (lambda: V(-1), "Vector length n must be a positive int"),
    (lambda: V(3, "int32"), "dtype"),
    (lambda: S("complex"), "dtype"),
]


@pytest.mark.parametrize(("make", "what"), BAD_DECLARATIONS,
                         ids=[w for _, w in BAD_DECLARATIONS])
def test_bad_declarations(make, what):
    with pytest.raises(ArgumentError) as info:
        make()
    assert what in str(info.value), str(info.value)


@pytest.mark.parametrize(("operands", "error", "what"), [
    (dict(A=M, x=V(9), y=V(5)), ArgumentError, "is the class Matrix"),
    (dict(A=np.zeros((5, 9)), x=V(9), y=V(5)), ArgumentError, "must be a Matrix, Vector or"),
    (dict(A=(5, 9), x=V(9), y=V(5)), ArgumentError, "must be a Matrix, Vector or Scalar"),
    (dict(A=M(5, 9), x=V(9), y=V(5), blacc_z=S()), ArgumentError, "reserved for blacc"),
    (dict(A=M(5, 9), x=V(9)), TypeCheckError, "y is not declared"),
], ids=["class", "ndarray", "tuple", "reserved-name", "undeclared-output"])
def test_bad_operand_declarations(operands, error, what):
    with pytest.raises(error) as info:
        blacc.compile("y = A*x", **operands)
    assert what in str(info.value), str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "what"), [
    (dict(name="3bad"), ArgumentError, "not a valid C identifier"),
    (dict(name="blacc_k"), ArgumentError, "not a valid C identifier"),
    (dict(search="fastest"), ScheduleError, "search must be one of"),
], ids=["name-digit", "name-reserved", "search"])
def test_bad_options(kwargs, error, what):
    with pytest.raises(error, match=what):
        blacc.compile("y = A*x", **kwargs, A=M(5, 9), x=V(9), y=V(5))


def test_program_of_wrong_type():
    with pytest.raises(ArgumentError, match="a program is source text"):
        blacc.compile(42, A=M(5, 9), x=V(9), y=V(5))


def test_emit_errors_write_no_files(tmp_path):
    out = tmp_path / "k"
    with pytest.raises(ArgumentError, match="unknown target 'neon'"):
        blacc.emit("y = A*x", out, target="neon", A=M(5, 9), x=V(9), y=V(5))
    with pytest.raises(TypeCheckError):
        blacc.emit("y = A*y", out, A=M(5, 9), x=V(9), y=V(5))
    with pytest.raises(ParseError):
        blacc.emit("y = A*", out, A=M(5, 9), x=V(9), y=V(5))
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- call time


@pytest.fixture(scope="module")
def gemv():
    """y = alpha*A*x + y in f32 with a 5x9 A."""
    return blacc.compile("y = alpha*A*x + y", **gemv_decls())


@pytest.fixture(scope="module")
def layouts():
    """A column-major A, a row-major B with ld 8 > 6 columns, an output matrix and an
    output scalar."""
    return blacc.compile("C = A*B; s = x'*x", A=M(4, 3, layout="col"), B=M(3, 6, ld=8),
                         C=M(4, 6), x=V(3), s=S())


def gemv_args(rng):
    return dict(A=rng.uniform(-1, 1, (5, 9)).astype(F32), x=rng.uniform(-1, 1, 9).astype(F32),
                y=np.full(5, SENTINEL, F32), alpha=1.5)


def assert_untouched(arrays: dict, before: dict) -> None:
    for name, a in before.items():
        assert np.array_equal(arrays[name], a, equal_nan=True), f"{name} was written"


def snapshot(arrays) -> dict:
    return {n: np.array(a) for n, a in arrays.items() if isinstance(a, np.ndarray)}


def call_fails(kernel, error, what, **kwargs):
    before = snapshot(kwargs)
    with pytest.raises(error) as info:
        kernel(**kwargs)
    assert what in str(info.value), str(info.value)
    assert_untouched(kwargs, before)
    return info.value


@pytest.mark.parametrize(("change", "error", "what"), [
    (lambda a: {"A": a["A"].T.copy()}, ShapeError, "A: expected shape (5, 9)"),
    (lambda a: {"A": a["A"][None]}, ShapeError, "got (1, 5, 9)"),
    (lambda a: {"x": a["x"][:8]}, ShapeError, "x: expected shape (9, 1) or (9,)"),
    (lambda a: {"x": a["x"].reshape(1, 9)}, ShapeError, "got (1, 9)"),
    (lambda a: {"y": np.full(6, SENTINEL, F32)}, ShapeError, "y: expected shape (5, 1)"),
    (lambda a: {"A": a["A"].astype(np.float64)}, DTypeError, "float32"),
    (lambda a: {"x": a["x"].astype(np.float16)}, DTypeError, "got (9,) float16"),
    (lambda a: {"y": np.full(5, SENTINEL)}, DTypeError, "y: expected shape (5, 1) or (5,) "
                                                         "float32"),
    (lambda a: {"y": np.zeros(5, np.int32)}, DTypeError, "int32"),
    (lambda a: {"A": np.asfortranarray(a["A"])}, ArgumentError, "C-contiguous"),
    (lambda a: {"x": np.repeat(a["x"], 2)[::2]}, ArgumentError, "with strides"),
    (lambda a: {"A": a["A"].tolist()}, TypeError, "A: expected an array"),
    (lambda a: {"alpha": "2"}, TypeError, "alpha: expected a real number, got str"),
    (lambda a: {"alpha": None}, TypeError, "alpha: expected a real number"),
    (lambda a: {"alpha": True}, TypeError, "got bool"),
    (lambda a: {"alpha": np.ones(2)}, TypeError, "alpha: expected a real number"),
    (lambda a: {"alpha": 10**400}, ArgumentError, "alpha: cannot convert int"),
], ids=["A.T", "A-3d", "x-short", "x-row", "y-long", "A-f64", "x-f16", "y-f64", "y-int",
        "A-fortran", "x-strided", "A-list", "alpha-str", "alpha-None", "alpha-bool",
        "alpha-array", "alpha-huge"])
def test_bad_arguments(gemv, rng, change, error, what):
    args = gemv_args(rng)
    args.update(change(args))
    call_fails(gemv, error, what, **args)


def test_read_only_output(gemv, rng):
    args = gemv_args(rng)
    args["y"].flags.writeable = False
    e = call_fails(gemv, ArgumentError, "y: expected a writable array", **args)
    assert "read-only" in str(e)


def test_missing_and_extra_arguments(gemv, rng):
    args = gemv_args(rng)
    before = snapshot(args)
    for missing in ("A", "x", "y", "alpha"):
        partial = {n: v for n, v in args.items() if n != missing}
        with pytest.raises(TypeError, match=f"'{missing}'"):
            gemv(**partial)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        gemv(**args, beta=2.0)
    with pytest.raises(TypeError, match="positional"):
        gemv(args["alpha"], args["A"], args["x"], args["y"])
    with pytest.raises(TypeError, match=r"takes exactly 4 arguments \(alpha, A, x, y\), got 3"):
        gemv.fast(args["alpha"], args["A"], args["x"])
    with pytest.raises(TypeError, match="alpha: expected a real number"):
        gemv.fast(args["A"], args["alpha"], args["x"], args["y"])
    assert_untouched(args, before)


def test_scalar_output_cannot_be_passed(layouts):
    x = np.ones(3)
    with pytest.raises(TypeError, match="unexpected keyword argument 's'"):
        layouts(A=np.ones((4, 3), order="F"), B=np.ones((3, 8))[:, :6], x=x, s=1.0)


def test_output_aliasing_an_input(gemv, rng):
    args = gemv_args(rng)
    # y overlapping x
    args["y"] = args["x"][2:7]
    call_fails(gemv, AliasingError, "y: output overlaps input x", **args)
    # y sharing one element with A's memory
    buf = np.full(50, 0.5, F32)
    args = dict(A=buf[4:49].reshape(5, 9), x=np.ones(9, F32), y=buf[:5], alpha=1.0)
    call_fails(gemv, AliasingError, "y: output overlaps input A", **args)
    # adjacent but disjoint is fine
    args = dict(A=buf[5:50].reshape(5, 9), x=np.ones(9, F32), y=buf[:5].copy(), alpha=1.0)
    gemv(**args)


def test_layout_errors(layouts):
    A = np.asfortranarray(np.arange(12.0).reshape(4, 3))
    B = np.full((3, 8), SENTINEL)[:, :6]
    B[...] = 1.0
    x = np.ones(3)
    C = np.full((4, 6), SENTINEL)
    call_fails(layouts, ArgumentError, "A: expected shape (4, 3) float64 Fortran-contiguous",
               A=np.ascontiguousarray(A), B=B, x=x, C=C)
    call_fails(layouts, ArgumentError, "B: expected shape (3, 6) float64 row-major with "
               "leading dimension 8", A=A, B=np.ones((3, 6)), x=x, C=C)
    call_fails(layouts, ArgumentError, "C: expected shape (4, 6) float64 C-contiguous",
               A=A, B=B, x=x, C=np.asfortranarray(C))
    # the right layouts work, and only C is written
    result = layouts(A=A, B=B, x=x, C=C)
    assert result["C"] is C and result["s"] == 3.0
    np.testing.assert_allclose(C, A @ np.ones((3, 6)))
    assert (B.base[:, 6:] == SENTINEL).all()


def test_output_overlapping_an_inputs_elements(layouts):
    A = np.asfortranarray(np.ones((4, 3)))
    big = np.full(60, SENTINEL)
    B = big[:24].reshape(3, 8)[:, :6]  # spans big[0:22]
    x = np.ones(3)
    call_fails(layouts, AliasingError, "C: output overlaps input B", A=A, B=B, x=x,
               C=big[20:44].reshape(4, 6))
    C = big[22:46].reshape(4, 6)  # right after B's last element: allowed
    B[...] = 2.0
    layouts(A=A, B=B, x=x, C=C)
    np.testing.assert_allclose(C, 6.0)
    assert (big[46:] == SENTINEL).all()


def test_outputs_overlapping_each_other():
    k = blacc.compile("u = A*x; v = 2*x", A=M(3, 3), x=V(3), u=V(3), v=V(3))
    buf = np.full(5, SENTINEL)
    call_fails(k, AliasingError, "outputs overlap", A=np.eye(3), x=np.ones(3),
               u=buf[:3], v=buf[2:5])


def test_python_keyword_operand_names():
    """Names that are valid C but not Python parameters (lambda, self) use the generic
    by-name call: same checks, same messages."""
    k = blacc.compile("self = lam*lambda + self", **{"lambda": V(2), "lam": S(), "self": V(2)})
    out = np.ones(2)
    assert k(**{"lambda": np.array([1.0, 2.0]), "lam": 2.0, "self": out}) is out
    np.testing.assert_array_equal(out, [3.0, 5.0])
    with pytest.raises(TypeError, match="missing 'self'"):
        k(**{"lambda": np.ones(2), "lam": 2.0})
    with pytest.raises(TypeError, match="unexpected 'other'"):
        k(**{"lambda": np.ones(2), "lam": 2.0, "self": out, "other": 1})
    before = out.copy()
    with pytest.raises(ShapeError, match="lambda: expected shape"):
        k(**{"lambda": np.ones(3), "lam": 2.0, "self": out})
    np.testing.assert_array_equal(out, before)
