"""The expression language parser: every construct, precedence, positions, and error messages
that point at the problem."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blacc.errors import ParseError
from blacc.frontend import parse
from blacc.frontend.ast import (
    Add,
    Assign,
    Mul,
    Neg,
    Num,
    Pos,
    Program,
    Ref,
    Sub,
    Transpose,
    format_expr,
    format_program,
    refs,
)
from blacc.frontend.names import C_KEYWORDS
from blacc.frontend.parser import MAX_DEPTH, MAX_NESTING, tokenize

A, B, x, y, z = Ref("A"), Ref("B"), Ref("x"), Ref("y"), Ref("z")
alpha, beta = Ref("alpha"), Ref("beta")


def expr(text: str):
    """The expression of the single statement ``out = text``."""
    program = parse(f"out = {text}")
    assert len(program.statements) == 1
    return program.statements[0].expr


# ------------------------------------------------------------------------ constructs


@pytest.mark.parametrize("text, tree", [
    ("A", A),
    ("A*x", Mul(A, x)),
    ("A*x + y", Add(Mul(A, x), y)),
    ("A*x - y", Sub(Mul(A, x), y)),
    ("-x", Neg(x)),
    ("A'", Transpose(A)),
    ("x^T", Transpose(x)),
    ("x ^ T", Transpose(x)),
    ("A''", Transpose(Transpose(A))),
    ("A^T'", Transpose(Transpose(A))),
    ("(A*x)'", Transpose(Mul(A, x))),
    ("(A*x)^T*z", Mul(Transpose(Mul(A, x)), z)),
    ("2", Num(2.0)),
    ("2*x", Mul(Num(2.0), x)),
    ("x*0.5", Mul(x, Num(0.5))),
    ("alpha*A*x + beta*y", Add(Mul(Mul(alpha, A), x), Mul(beta, y))),
    ("(A*x + alpha*y)'*z + beta",
     Add(Mul(Transpose(Add(Mul(A, x), Mul(alpha, y))), z), beta)),
    ("((A))", A),
    ("A*-x", Mul(A, Neg(x))),
    ("x - -y", Sub(x, Neg(y))),
    ("--x", Neg(Neg(x))),
    ("T*x", Mul(Ref("T"), x)),  # T is an ordinary name, except right after '^'
    ("x^T*T", Mul(Transpose(x), Ref("T"))),
    ("_a1 + B_2", Add(Ref("_a1"), Ref("B_2"))),
])
def test_constructs(text, tree):
    assert expr(text) == tree


@pytest.mark.parametrize("text, tree", [
    # postfix transpose > unary minus > * > + -
    ("-A'", Neg(Transpose(A))),
    ("-A*B", Mul(Neg(A), B)),
    ("-A'*x", Mul(Neg(Transpose(A)), x)),
    ("A*B'", Mul(A, Transpose(B))),
    ("A + B*x", Add(A, Mul(B, x))),
    ("A*B + x", Add(Mul(A, B), x)),
    ("-A + B", Add(Neg(A), B)),
    # left-associative
    ("A*B*x", Mul(Mul(A, B), x)),
    ("x - y - z", Sub(Sub(x, y), z)),
    ("x - y + z", Add(Sub(x, y), z)),
    ("x + y - z", Sub(Add(x, y), z)),
    # parentheses override
    ("A*(B*x)", Mul(A, Mul(B, x))),
    ("x - (y - z)", Sub(x, Sub(y, z))),
    ("(-A)'", Transpose(Neg(A))),
    ("-(A*B)", Neg(Mul(A, B))),
])
def test_precedence_and_associativity(text, tree):
    assert expr(text) == tree


@pytest.mark.parametrize("text, value", [
    ("0", 0.0), ("7", 7.0), ("12345678901234567890", 12345678901234567890.0),
    ("1.5", 1.5), ("5.", 5.0), (".25", 0.25), ("1e-3", 1e-3), ("1E3", 1000.0),
    ("2.5e+4", 25000.0), ("0.125e1", 1.25), ("007", 7.0),
])
def test_numbers(text, value):
    assert expr(text) == Num(value)


def test_statements_separators_and_comments():
    source = """# a BLAC with two statements
    y = A*x + y   # matrix-vector
    ; ;
    alpha = x'*y; beta = 2*alpha;

    """
    program = parse(source)
    assert [s.target for s in program.statements] == ["y", "alpha", "beta"]
    assert program.statements[1] == Assign("alpha", Mul(Transpose(x), y))
    assert [s.text for s in program.statements] == ["y = A*x + y", "alpha = x'*y",
                                                    "beta = 2*alpha"]
    assert program.source == source
    assert parse("y = x\r\nz = y\r\n").statements == (Assign("y", x), Assign("z", y))


def test_positions():
    program = parse("y = A*x + y\n  z = -(B'*x)^T")
    s1, s2 = program.statements
    assert s1.pos == Pos(1, 1) and s2.pos == Pos(2, 3)
    assert s1.expr.pos == Pos(1, 9)                   # the '+'
    assert s1.expr.a.pos == Pos(1, 6)                 # the '*'
    assert s1.expr.a.a.pos == Pos(1, 5)               # A
    assert s2.expr.pos == Pos(2, 7)                   # the unary '-'
    assert s2.expr.x.pos == Pos(2, 14)                # the '^'
    assert s2.expr.x.x.pos == Pos(2, 11)              # the '*'
    assert s2.expr.x.x.a.pos == Pos(2, 10)            # the "'"
    assert s2.expr.x.x.a.x.pos == Pos(2, 9)           # B
    assert program.line_text(2) == "  z = -(B'*x)^T"
    assert str(s1.expr.pos) == "line 1, column 9"


def test_positions_do_not_affect_equality_or_hash():
    a, b = parse("y = A*x"), parse("\n\n  y   =   A  *  x  ")
    assert a == b and hash(a) == hash(b)
    assert a == Program((Assign("y", Mul(A, x)),))


def test_tokens():
    kinds = [(t.kind, t.text) for t in tokenize("y = x' # c\n")]
    assert kinds == [("name", "y"), ("op", "="), ("name", "x"), ("op", "'"), ("sep", "\n"),
                     ("eof", "")]


def test_num_nodes_are_non_negative_and_finite():
    for bad in (-1.0, -0.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            Num(bad)
    with pytest.raises(TypeError):
        Num(True)


def test_format():
    assert format_expr(expr("(alpha*A)*x + (beta*(y))")) == "alpha*A*x + beta*y"
    assert format_expr(expr("x - (y - z)")) == "x - (y - z)"
    assert format_expr(expr("-(A*B)' + 2.5*x")) == "-(A*B)' + 2.5*x"
    assert format_expr(expr("A*(B*x)")) == "A*(B*x)"
    assert format_expr(expr("1e-3*x")) == "0.001*x"
    assert format_program(parse("y = A*x; z = y")) == "y = A*x\nz = y"


# ------------------------------------------------------------- round-trip property

_NAMES = st.sampled_from(["A", "x", "alpha", "B_2", "_t", "T", "y0"])
_VALUES = st.one_of(st.integers(0, 10**6).map(float),
                    st.floats(0.0, 1e300, allow_nan=False, allow_infinity=False))
_LEAVES = st.one_of(_NAMES.map(Ref),
                    _VALUES.filter(lambda v: math.copysign(1.0, v) > 0).map(Num))
_TREES = st.recursive(
    _LEAVES,
    lambda kids: st.one_of(
        kids.map(Neg), kids.map(Transpose),
        st.builds(Add, kids, kids), st.builds(Sub, kids, kids), st.builds(Mul, kids, kids)),
    max_leaves=15)


def _full(e, caret: bool) -> str:
    """``e`` with every operation in parentheses."""
    if isinstance(e, Num):
        return repr(e.value)
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, Neg):
        return f"(-{_full(e.x, caret)})"
    if isinstance(e, Transpose):
        return f"({_full(e.x, caret)}){'^T' if caret else chr(39)}"
    op = {Add: "+", Sub: "-", Mul: "*"}[type(e)]
    return f"({_full(e.a, caret)} {op} {_full(e.b, caret)})"


@settings(max_examples=100, deadline=None)
@given(tree=_TREES, caret=st.booleans())
def test_fully_parenthesized_trees_reparse(tree, caret):
    assert expr(_full(tree, caret)) == tree


@settings(max_examples=100, deadline=None)
@given(trees=st.lists(_TREES, min_size=1, max_size=3))
def test_minimal_printing_reparses_and_positions_point_at_names(trees):
    program = Program(tuple(Assign(f"out{i}", t) for i, t in enumerate(trees)))
    parsed = parse(format_program(program))
    assert parsed == program
    for s in parsed.statements:
        for r in refs(s.expr):
            line = parsed.line_text(r.pos.line)
            assert line[r.pos.column - 1:].startswith(r.name)


# --------------------------------------------------------------------------- errors


def test_error_message_quotes_the_line_and_points_at_the_column():
    with pytest.raises(ParseError) as info:
        parse("y = A * + x")
    assert str(info.value) == ("line 1, column 9: expected an operand after '*'\n"
                               "  y = A * + x\n"
                               "          ^")


def _caret_column(message: str) -> int:
    """The 1-based column the caret line points at."""
    quoted, caret = message.split("\n")[1:3]
    assert quoted.startswith("  ") and caret.startswith("  ")
    return caret.index("^") - 1


@pytest.mark.parametrize("source, line, column, fragment", [
    # bad tokens
    ("y = A $ x", 1, 7, "unexpected character '$'"),
    ("y = A@x", 1, 6, "unexpected character '@' (write matrix products with *)"),
    ("y = A\nz = x ! y", 2, 7, "unexpected character '!'"),
    ("y = a.b", 1, 6, "unexpected character '.'"),
    ("y = Ä", 1, 5, "unexpected character 'Ä'"),
    ("y = 1e", 1, 5, "malformed number '1e'"),
    ("y = 2x", 1, 5, "malformed number '2x'"),
    ("y = 1.5.3", 1, 5, "malformed number '1.5.3'"),
    ("y = 1e999", 1, 5, "too large"),
    ("y = x^Q", 1, 7, "expected 'T' after '^'"),
    ("y = x^", 1, 7, "expected 'T' after '^'"),
    ('y = "x"', 1, 5, "unexpected character"),
    # missing operands
    ("y = A * + x", 1, 9, "expected an operand after '*'"),
    ("y = A *", 1, 8, "expected an operand after '*', found end of input"),
    ("y = A +\nz = x", 1, 8, "expected an operand after '+', found end of line"),
    ("y = A - ; z = x", 1, 9, "expected an operand after '-'"),
    ("y = -", 1, 6, "expected an operand after '-'"),
    ("y = - * x", 1, 7, "expected an operand after '-'"),
    ("y = ", 1, 5, "expected an expression after '='"),
    ("y = * x", 1, 5, "expected an expression after '='"),
    ("y = + x", 1, 5, "expected an expression after '='"),
    ("y = ()", 1, 6, "expected an expression after '('"),
    ("y = 'x", 1, 5, "expected an expression after '='"),
    # unbalanced parentheses
    ("y = (A*x", 1, 5, "'(' is never closed"),
    ("y = ((A*x)", 1, 5, "'(' is never closed"),
    ("y = (A*x\nz = x", 1, 5, "'(' is never closed"),
    ("y = (A x)", 1, 8, "expected ')' to close the '(' at line 1, column 5, found 'x'"),
    ("y = A*x)", 1, 8, "unmatched ')'"),
    ("y = (A*x))", 1, 10, "unmatched ')'"),
    # trailing garbage and malformed statements
    ("y = A x", 1, 7, "expected an operator or the end of the statement, found 'x'"),
    ("y = A*x 2", 1, 9, "found '2'"),
    ("y = x = z", 1, 7, "one '=' per statement"),
    ("y = x'x", 1, 7, "found 'x'"),
    ("y A*x", 1, 3, "expected '=' after 'y'"),
    ("y", 1, 2, "expected '=' after 'y', found end of input"),
    ("= x", 1, 1, "expected an output name at the start of a statement"),
    ("2 = x", 1, 1, "expected an output name"),
    ("(y) = x", 1, 1, "expected an output name"),
    ("y = x\n  A*x", 2, 4, "expected '=' after 'A'"),
    # reserved words
    ("int = x", 1, 1, "'int' is a C keyword and cannot name an operand"),
    ("y = A*for", 1, 7, "'for' is a C keyword"),
    ("y = blacc_tmp", 1, 5, "'blacc_tmp' is reserved for blacc"),
    ("y = BLACC_X", 1, 5, "reserved for blacc"),
    ("__x = y", 1, 1, "reserved in C"),
    ("y = _Tmp", 1, 5, "reserved in C"),
    ("y = size_t", 1, 5, "a name generated C code uses"),
])
def test_errors_point_at_the_problem(source, line, column, fragment):
    with pytest.raises(ParseError) as info:
        parse(source)
    message = str(info.value)
    assert message.startswith(f"line {line}, column {column}: "), message
    assert fragment in message, message
    assert _caret_column(message) == column
    assert message.split("\n")[1] == "  " + source.split("\n")[line - 1]


@pytest.mark.parametrize("source", ["", "   ", "# only a comment\n\n", ";;\n;"])
def test_empty_program(source):
    with pytest.raises(ParseError, match=r"^line 1, column 1: empty program"):
        parse(source)


@pytest.mark.parametrize("word", sorted(C_KEYWORDS)
                         + ["restrict", "float", "double", "return", "static", "const"])
def test_every_c_keyword_is_rejected_as_operand_and_target(word):
    with pytest.raises(ParseError, match=re.escape(f"{word!r} is a C keyword")):
        parse(f"y = A*{word}")
    with pytest.raises(ParseError, match=re.escape(f"{word!r} is a C keyword")):
        parse(f"{word} = y")


def test_caret_follows_tabs():
    with pytest.raises(ParseError) as info:
        parse("\ty =\tA *\t+ x")
    quoted, caret = str(info.value).split("\n")[1:]
    assert caret == "  \t   \t   \t^" and quoted == "  \ty =\tA *\t+ x"


@pytest.mark.parametrize("source", [
    "y = __import__('os').system('true')",
    "y = exec('1')",
    "y = [x for x in A]",
    "y = lambda: 0",
    "y = x.__class__",
    "y = {}",
    "y = x if z else y",
])
def test_python_is_not_evaluated(source):
    with pytest.raises(ParseError):
        parse(source)


def test_not_a_string():
    with pytest.raises(ParseError, match="must be a str"):
        parse(b"y = x")  # type: ignore[arg-type]


def test_deep_input_fails_cleanly():
    parse("y = " + "(" * MAX_NESTING + "x" + ")" * MAX_NESTING)
    parse("y = " + "-" * MAX_NESTING + "x")
    with pytest.raises(ParseError, match="nested too deeply"):
        parse("y = " + "(" * 5000 + "x" + ")" * 5000)
    with pytest.raises(ParseError, match="nested too deeply"):
        parse("y = " + "-" * 5000 + "x")
    with pytest.raises(ParseError, match="nested too deeply"):
        parse("y = " + " + ".join(["x"] * (MAX_DEPTH + 5)))
    with pytest.raises(ParseError, match="nested too deeply"):
        parse("y = x" + "'" * (MAX_DEPTH + 5))
    assert expr(" + ".join(["x"] * (MAX_DEPTH - 5))).b == x
