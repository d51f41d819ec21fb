"""Declarations, the type checker (shapes, products, dtypes, outputs, in-place rules) and the
NumPy reference interpreter on the LGen examples."""

from __future__ import annotations

import dataclasses
import pickle
import re

import numpy as np
import pytest

from blacc.errors import ArgumentError, ShapeError, TypeCheckError
from blacc.frontend import Matrix, Scalar, TypedProgram, Vector, check, evaluate, parse
from blacc.frontend.ast import Assign, Mul, Program, Ref
from blacc.frontend.typed import TAdd, TMul, TRef, TTranspose, kind_of, walk


def decl(spec, dtype="f64"):
    """'s' -> Scalar, n -> Vector(n), (m, n) -> Matrix(m, n)."""
    if spec == "s":
        return Scalar(dtype)
    if isinstance(spec, int):
        return Vector(spec, dtype)
    return Matrix(*spec, dtype)


def decls(dtype="f64", **specs):
    return {name: decl(spec, dtype) for name, spec in specs.items()}


#: A 5x9, B 9x4, C 5x4, x 9, y 5, z 5, scalars alpha, beta; square S, T 6x6, u, v 6.
D = decls(A=(5, 9), B=(9, 4), C=(5, 4), x=9, y=5, z=5, alpha="s", beta="s",
          S=(6, 6), T=(6, 6), u=6, v=6, r=(1, 6))


def typed(source, table=None):
    return check(parse(source), D if table is None else table)


def type_error(source, table=None) -> str:
    with pytest.raises(TypeCheckError) as info:
        typed(source, table)
    return str(info.value)


def mentions_shape(message: str, shape) -> bool:
    r, c = shape
    return re.search(rf"(?<!\d){r}\s*x\s*{c}(?!\d)", message) is not None


# ---------------------------------------------------------------------- declarations


def test_declarations():
    A = Matrix(5, 9)
    assert (A.rows, A.cols, A.shape, A.dtype, A.layout, A.ld, A.kind) == \
        (5, 9, (5, 9), "f64", "row", 9, "matrix")
    F = Matrix(5, 9, "f32", layout="col")
    assert (F.dtype, F.layout, F.ld) == ("f32", "col", 5)
    assert Matrix(5, 9, ld=16).ld == 16 and Matrix(5, 9, layout="col", ld=5).ld == 5
    x = Vector(4)
    assert (x.n, x.shape, x.kind, x.dtype) == (4, (4, 1), "vector", "f64")
    s = Scalar("f32")
    assert (s.shape, s.kind, s.dtype) == ((1, 1), "scalar", "f32")
    assert Matrix(np.int64(3), 2).rows == 3 and type(Matrix(np.int64(3), 2).rows) is int


def test_declaration_reprs():
    assert repr(Matrix(5, 9)) == "Matrix(5, 9)"
    assert repr(Matrix(5, 9, "f32", layout="col")) == "Matrix(5, 9, 'f32', layout='col')"
    assert repr(Matrix(5, 9, ld=16)) == "Matrix(5, 9, ld=16)"
    assert repr(Vector(3, np.float32)) == "Vector(3, 'f32')"
    assert repr(Scalar()) == "Scalar()" and repr(Scalar("float32")) == "Scalar('f32')"


def test_declarations_are_frozen_values():
    assert Matrix(5, 9) == Matrix(5, 9, "float64", ld=9)
    assert Matrix(5, 9) != Matrix(5, 9, "f32") and Matrix(5, 9) != Matrix(5, 9, ld=10)
    assert len({Matrix(2, 3), Matrix(2, 3), Vector(2), Scalar()}) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        Matrix(5, 9).rows = 3
    with pytest.raises(TypeError):
        Matrix(5, 9, "f64", "col")  # layout and ld are keyword-only


@pytest.mark.parametrize("dtype", ["f64", "float64", np.float64, np.dtype("float64"), float])
def test_f64_spellings(dtype):
    assert Vector(3, dtype).dtype == "f64"


@pytest.mark.parametrize("dtype", ["f32", "float32", np.float32, np.dtype("f4")])
def test_f32_spellings(dtype):
    assert Matrix(2, 3, dtype).dtype == "f32"


@pytest.mark.parametrize("dtype", ["int32", "f16", np.float16, np.complex128, "double!", 3,
                                   None])
def test_bad_dtypes(dtype):
    with pytest.raises(ArgumentError, match="dtype must be 'f32' or 'f64'"):
        Scalar(dtype)


@pytest.mark.parametrize("make, fragment", [
    (lambda: Matrix(0, 3), "Matrix rows must be a positive int, got 0"),
    (lambda: Matrix(3, -2), "Matrix cols must be a positive int, got -2"),
    (lambda: Matrix(True, 3), "Matrix rows must be a positive int, got True (bool)"),
    (lambda: Matrix(3.0, 3), "got 3.0 (float)"),
    (lambda: Matrix("3", 3), "got '3' (str)"),
    (lambda: Matrix(None, 3), "got None"),
    (lambda: Vector(0), "Vector length n must be a positive int, got 0"),
    (lambda: Vector(np.bool_(True)), "Vector length n must be a positive int"),
    (lambda: Vector(2.5), "got 2.5 (float)"),
    (lambda: Matrix(3, 4, layout="C"), "layout must be 'row' or 'col', got 'C'"),
    (lambda: Matrix(3, 4, ld=3), "needs ld >= 4 (its number of columns), got ld=3"),
    (lambda: Matrix(3, 4, layout="col", ld=2), "needs ld >= 3 (its number of rows), got ld=2"),
    (lambda: Matrix(3, 4, ld=0), "ld (leading dimension) must be a positive int, got 0"),
    (lambda: Matrix(3, 4, ld=True), "ld (leading dimension) must be a positive int"),
])
def test_bad_declarations(make, fragment):
    with pytest.raises(ArgumentError) as info:
        make()
    assert fragment in str(info.value)


# ------------------------------------------------------------------------ shapes


def test_every_node_has_a_shape_and_kind():
    t = typed("beta = (A*x + alpha*y)'*z + beta")
    root = t.statements[0].expr
    assert isinstance(root, TAdd) and root.shape == (1, 1) and root.kind == "scalar"
    dot = root.a
    assert isinstance(dot, TMul) and dot.op == "dot" and dot.shape == (1, 1)
    assert isinstance(dot.a, TTranspose) and dot.a.shape == (1, 5) and dot.a.kind == "row"
    matvec = dot.a.x.a
    assert (matvec.op, matvec.shape, matvec.kind) == ("matvec", (5, 1), "vector")
    assert dot.a.x.b.op == "scale"
    assert [n.name for n in walk(root) if isinstance(n, TRef)] == ["A", "x", "alpha", "y",
                                                                     "z", "beta"]
    assert all(n.kind == kind_of(n.shape) for n in walk(root))


@pytest.mark.parametrize("expression, op, shape", [
    ("y'*z", "dot", (1, 1)),
    ("A*x", "matvec", (5, 1)),
    ("y'*A", "vecmat", (1, 9)),
    ("y*x'", "outer", (5, 9)),
    ("A*B", "matmul", (5, 4)),
    ("A'*y", "matvec", (9, 1)),
    ("B'*A'", "matmul", (4, 5)),
    ("alpha*A", "scale", (5, 9)),
    ("A*alpha", "scale", (5, 9)),
    ("2*x", "scale", (9, 1)),
    ("x'*0.5", "scale", (1, 9)),
    ("alpha*beta", "scale", (1, 1)),
    ("(y'*z)*A", "scale", (5, 9)),     # a 1x1 result scales
    ("A*(y'*z)", "scale", (5, 9)),
    ("r*u", "dot", (1, 1)),            # a 1x6 Matrix is a row
])
def test_product_classification(expression, op, shape):
    out = {(1, 1): "s", (5, 1): 5, (9, 1): 9}.get(shape, shape)
    t = typed(f"out = {expression}", dict(D, out=decl(out)))
    e = t.statements[0].expr
    assert (e.op, e.shape) == (op, shape)


def test_inner_dimension_error_names_both_shapes():
    message = type_error("y = A*x", decls(A=(5, 9), x=4, y=5))
    assert message == ("line 1, column 6: A*x: A is 5x9 but x has length 4\n"
                       "  y = A*x\n"
                       "       ^")


@pytest.mark.parametrize("source, shapes, fragment", [
    ("C = A*C", [(5, 9), (5, 4)], "A*C: A is 5x9 but C is 5x4"),
    ("C = (A + A)*(B*x)", [(9, 4)], "B*x: B is 9x4 but x has length 9"),
    ("y = x'*A", [(1, 9), (5, 9)], "x' is a row of length 9 (1x9) but A is 5x9"),
    ("y = A*x + z'", [(1, 5)], "A*x has length 5 but z' is a row of length 5 (1x5)"),
    ("C = A - B", [(5, 9), (9, 4)], "A - B: A is 5x9 but B is 9x4; - needs operands"),
    ("y = y + alpha", [], "y + alpha: y has length 5 but alpha is a scalar"),
    ("y = A*y", [(5, 9)], "(transposing A would fit)"),
])
def test_shape_errors(source, shapes, fragment):
    message = type_error(source)
    assert fragment in message, message
    assert all(mentions_shape(message, s) for s in shapes), message
    assert re.match(r"line 1, column \d+: ", message)


def test_undeclared_names_list_the_declared_ones():
    table = decls(A=(5, 9), x=9, alpha="s", t=5)
    assert type_error("t = A*x\nt = alpha*y", table).startswith(
        "line 2, column 11: y is not declared (declared: A, x, alpha, t)")
    assert "w is not declared" in type_error("w = A*x", table)
    assert "(declared: nothing)" in type_error("w = A*x", {})


def test_mixed_dtypes_name_both():
    table = {"A": Matrix(5, 9), "x": Vector(9, "f32"), "y": Vector(5)}
    message = type_error("y = A*x", table)
    assert message.startswith("line 1, column 7: mixed dtypes: A is f64 but x is f32")
    message = type_error("y = 2*x", table)
    assert "x is f32 but y is f64" in message
    assert typed("y = A*x", decls("f32", A=(5, 9), x=9, y=5)).dtype == "f32"


@pytest.mark.parametrize("source, result, target", [
    ("alpha = A*x", "5x1", "Scalar()"),
    ("y = x'*x", "1x1", "Vector(5)"),
    ("x = A*x", "5x1", "Vector(9)"),
    ("A = A'", "9x5", "Matrix(5, 9)"),
    ("C = A*B'", None, None),
])
def test_output_must_have_the_result_shape(source, result, target):
    message = type_error(source)
    if result is not None:
        assert f"the result is {result}" in message and f"declared as {target}" in message
        assert message.startswith("line 1, column 1: ")


# ---------------------------------------------------------------------- in place


@pytest.mark.parametrize("source", [
    "y = A*x + y", "beta = x'*A'*y + beta", "C = alpha*A*B + beta*C", "y = -y",
    "y = alpha*y", "y = y*alpha", "alpha = alpha*alpha", "S = S + u*v'", "S = (S')'",
    "S = S + S", "r = (r')' + u'*T", "u = u - (v'*v)*u", "beta = beta",
    "beta = x'*x*beta + beta", "y = y + (x'*x)*z",
])
def test_in_place_reads_are_accepted(source):
    t = typed(source)
    assert t.statements[0].reads_output


@pytest.mark.parametrize("source, column", [
    ("u = S*u", 7), ("S = S'", 5), ("S = S*T", 5), ("S = T*S", 7), ("u = u + S*u", 11),
    ("S = S + S'", 9), ("u = (u'*u)*u", 6), ("S = u*(S*v)'", 8), ("r = r*S", 5),
    ("y = y + (y'*y)*z", 10),
])
def test_reads_of_other_output_elements_are_rejected(source, column):
    message = type_error(source)
    assert message.startswith(f"line 1, column {column}: {source}: the output {source[0]} "
                              "is read at other positions than the one being computed"), message
    assert "write the result to a new output" in message


def test_statements_read_earlier_outputs_freely():
    t = typed("y = A*x\nz = 2*y; u = S*v; v = T*u")  # v = T*u reads u, not v: fine
    assert t.inputs == ("A", "x", "S", "v", "T")
    assert t.outputs == ("y", "z", "u", "v")
    assert not any(s.reads_output for s in t.statements)


# ---------------------------------------------------------------- typed program


def test_inputs_outputs_and_decls():
    t = typed("y = A*x + y; y = y + z")
    assert t.inputs == ("A", "x", "y", "z") and t.outputs == ("y",)
    assert dict(t.decls) == {"A": D["A"], "x": D["x"], "y": D["y"], "z": D["z"]}
    assert t.operands == ("A", "x", "y", "z") and t.dtype == "f64"
    with pytest.raises(TypeError):
        t.decls["q"] = Scalar()  # type: ignore[index]
    t2 = typed("z = A*x; beta = z'*y")
    assert t2.inputs == ("A", "x", "y") and t2.outputs == ("z", "beta")
    assert t2.operands == ("A", "x", "y", "z", "beta")


def test_typed_programs_are_values():
    a, b = typed("y = A*x + y"), typed("y   =  A * x+y  # same")
    assert a == b and hash(a) == hash(b)
    assert a != typed("y = A*x + y", dict(D, A=Matrix(5, 9, layout="col")))
    assert {a: 1}[b] == 1
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.dtype = "f32"  # type: ignore[misc]


def test_pretty_printing():
    text = str(typed("y = alpha*A*x + y"))
    assert text.splitlines() == [
        "program (f64)",
        "  inputs:  alpha: Scalar(), A: Matrix(5, 9), x: Vector(9), y: Vector(5)",
        "  outputs: y: Vector(5)",
        "  y = alpha*A*x + y   (reads its output in place)",
        "    add: 5x1 vector",
        "      matvec: 5x1 vector",
        "        scale: 5x9 matrix",
        "          alpha: 1x1 scalar",
        "          A: 5x9 matrix",
        "        x: 9x1 vector",
        "      y: 5x1 vector",
    ]


@pytest.mark.parametrize("table, fragment", [
    ({"alpha": Scalar}, "decls['alpha'] is the class Scalar; declare an instance"),
    ({"x": 5}, "decls['x'] must be a Matrix, Vector or Scalar, got 5"),
    ({"x": np.zeros(3)}, "decls['x'] must be a Matrix, Vector or Scalar"),
    ({"for": Scalar()}, "'for' is a C keyword"),
    ({"a b": Scalar()}, "'a b' is not a valid name"),
    ({3: Scalar()}, "operand names must be strings"),
    ([("x", Scalar())], "decls must be a dict"),
])
def test_bad_decl_tables(table, fragment):
    with pytest.raises(ArgumentError) as info:
        check(parse("x = 1"), table)
    assert fragment in str(info.value)


def test_check_needs_a_program():
    with pytest.raises(ArgumentError, match="check takes a Program"):
        check("y = x", D)  # type: ignore[arg-type]


def test_hand_built_trees_get_messages_without_positions():
    program = Program((Assign("y", Mul(Ref("A"), Ref("z"))),))
    with pytest.raises(TypeCheckError, match=r"^in 'y = A\*z': A\*z: A is 5x9 but z has "):
        check(program, D)


# ------------------------------------------------------------ reference interpreter

#: LGen's examples: source, operand shapes ('s' scalar, n vector, (m, n) matrix), NumPy.
LGEN_EXAMPLES = [
    ("y = A*x", dict(A=(5, 9), x=9, y=5), lambda v: v["A"] @ v["x"]),
    ("C = A*B", dict(A=(5, 9), B=(9, 4), C=(5, 4)), lambda v: v["A"] @ v["B"]),
    ("y = alpha*x + y", dict(alpha="s", x=7, y=7), lambda v: v["alpha"] * v["x"] + v["y"]),
    ("y = alpha*A*x + beta*y", dict(alpha="s", beta="s", A=(5, 9), x=9, y=5),
     lambda v: v["alpha"] * (v["A"] @ v["x"]) + v["beta"] * v["y"]),
    ("C = alpha*A*B + beta*C", dict(alpha="s", beta="s", A=(5, 9), B=(9, 4), C=(5, 4)),
     lambda v: v["alpha"] * (v["A"] @ v["B"]) + v["beta"] * v["C"]),
    ("y = alpha*A*x + beta*B*x", dict(alpha="s", beta="s", A=(5, 9), B=(5, 9), x=9, y=5),
     lambda v: v["alpha"] * (v["A"] @ v["x"]) + v["beta"] * (v["B"] @ v["x"])),
    ("alpha = x'*A*y", dict(alpha="s", x=5, A=(5, 9), y=9),
     lambda v: float(v["x"] @ v["A"] @ v["y"])),
    ("C = alpha*(A0 + A1)'*B + beta*C",
     dict(alpha="s", beta="s", A0=(9, 5), A1=(9, 5), B=(9, 4), C=(5, 4)),
     lambda v: v["alpha"] * ((v["A0"] + v["A1"]).T @ v["B"]) + v["beta"] * v["C"]),
    ("beta = (A*x + alpha*y)'*z + beta", dict(alpha="s", beta="s", A=(5, 9), x=9, y=5, z=5),
     lambda v: float((v["A"] @ v["x"] + v["alpha"] * v["y"]) @ v["z"] + v["beta"])),
]


def random_values(shapes, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in shapes.items():
        if spec == "s":
            out[name] = float(rng.uniform(-2, 2))
        else:
            out[name] = rng.uniform(-1, 1, size=spec)
    return out


@pytest.mark.parametrize("dtype", ["f64", "f32"])
@pytest.mark.parametrize("source, shapes, numpy_fn", LGEN_EXAMPLES,
                         ids=[e[0] for e in LGEN_EXAMPLES])
def test_evaluate_matches_numpy_on_the_lgen_examples(source, shapes, numpy_fn, dtype):
    t = check(parse(source), decls(dtype, **shapes))
    values = random_values(shapes)
    before = {k: np.copy(v) for k, v in values.items()}
    result = evaluate(t, values)
    (target,) = t.outputs
    expected = numpy_fn(values)
    assert set(result) == {target}
    if shapes[target] == "s":
        assert isinstance(result[target], float)
    else:
        assert result[target].shape == np.shape(expected)
        assert result[target].dtype == np.float64
    np.testing.assert_allclose(result[target], expected, rtol=1e-12, atol=1e-12)
    for k, v in values.items():
        np.testing.assert_array_equal(v, before[k])  # inputs are not written


def test_evaluate_runs_statements_in_order():
    shapes = dict(A=(5, 9), x=9, B=(4, 5), t=5, u=4, v=4, beta="s")
    t = check(parse("t = A*x\nu = B*t + u\nbeta = u'*v; u = beta*u"), decls(**shapes))
    values = random_values(shapes, seed=1)
    result = evaluate(t, values)
    u1 = values["B"] @ (values["A"] @ values["x"]) + values["u"]
    beta = float(u1 @ values["v"])
    assert set(result) == {"t", "u", "beta"}
    np.testing.assert_allclose(result["beta"], beta)
    np.testing.assert_allclose(result["u"], beta * u1)
    np.testing.assert_allclose(result["t"], values["A"] @ values["x"])


def test_evaluate_negation_transpose_and_literals():
    shapes = dict(S=(3, 3), T=(3, 3), R=(3, 3))
    t = check(parse("R = -S' - 2.5*T + 1e-3*(S*T)'"), decls(**shapes))
    v = random_values(shapes, seed=2)
    np.testing.assert_allclose(evaluate(t, v)["R"],
                               -v["S"].T - 2.5 * v["T"] + 1e-3 * (v["S"] @ v["T"]).T)


def test_evaluate_accepts_equivalent_input_forms():
    t = check(parse("y = alpha*x + y"), decls(alpha="s", x=3, y=3))
    x = np.array([1.0, 2.0, 3.0])
    y = np.ones((3, 1), dtype=np.float32)
    for alpha in (2.0, 2, np.float32(2.0), np.array(2.0), np.array([[2.0]]), np.array([2.0])):
        out = evaluate(t, {"alpha": alpha, "x": x, "y": y, "unused": "ignored"})
        np.testing.assert_array_equal(out["y"], [3.0, 5.0, 7.0])


def test_evaluate_errors():
    t = check(parse("y = A*x + y"), decls(A=(2, 3), x=3, y=2))
    with pytest.raises(ArgumentError, match="missing values for the inputs x, y"):
        evaluate(t, {"A": np.zeros((2, 3))})
    with pytest.raises(ShapeError, match=r"A is declared Matrix\(2, 3\) but its value has "
                                         r"shape \(3, 2\)"):
        evaluate(t, {"A": np.zeros((3, 2)), "x": np.zeros(3), "y": np.zeros(2)})
    with pytest.raises(ShapeError, match="x is declared Vector"):
        evaluate(t, {"A": np.zeros((2, 3)), "x": np.zeros((1, 3)), "y": np.zeros(2)})
    with pytest.raises(ArgumentError, match="A: expected numbers"):
        evaluate(t, {"A": "abc", "x": np.zeros(3), "y": np.zeros(2)})
    with pytest.raises(ArgumentError, match="evaluate takes a TypedProgram"):
        evaluate(parse("y = x"), {})  # type: ignore[arg-type]
    assert isinstance(t, TypedProgram)


def test_a_part_of_a_program_is_checked_on_its_own():
    """``part``: some statements, with the inputs, outputs and declarations they use (a
    name the part reads before it writes it is an input, whatever came before)."""
    from blacc.frontend.typecheck import part

    decls = {"A": Matrix(3, 4), "B": Matrix(4, 5), "C": Matrix(3, 5), "x": Vector(5),
             "y": Vector(3), "z": Vector(3), "s": Scalar()}
    typed = check(parse("C = A*B\ny = C*x + y\ns = z'*y"), decls)
    rest = part(typed, (1, 2))
    assert [str(s.target) for s in rest.statements] == ["y", "s"]
    assert rest.statements == typed.statements[1:]
    assert rest.inputs == ("C", "x", "y", "z") and rest.outputs == ("y", "s")
    assert list(rest.decls) == ["C", "x", "y", "z", "s"]
