"""Tiles transposed in registers: an output whose rows are 2 or 4 elements long and
follow one another (``C(n x 4) = alpha*(A0 + A1)'*B + beta*C``), computed with the lanes
down its columns, its rows read as columns (``Unzip``) and its columns stored as rows
(``Zip``); and matrices with such rows read down their columns (``y = A*x``, A n x 4,
the lanes along n), or with rows of other lengths that fit one vector, each column a
``Permute`` of it (A 3 x 3 f32 on AVX-512).

* the ``Zip``, ``Unzip`` and ``Permute`` nodes in the interpreter and the printer, and
  compiled by gcc (AVX2 and AVX-512 templates) and the LLVM JIT against the interpreter;
* ``zip_rows`` and ``unzip_rows`` against NumPy transposes, and each other's inverse;
* every column-tile candidate of products with such outputs, over sizes that leave
  narrower and masked vectors and single rows, on AVX2 and AVX-512, through the
  interpreter on buffers with no slack (a read or write one element outside an operand
  raises);
* every candidate that reads such a matrix down its columns, the same way;
* the planned kernels compiled and called on operands that touch guard pages;
* layouts the tiles cannot take are refused, and the model takes them where they pay.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.backend import jit
from blacc.backend import llvm as llvm_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import interp, printer
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512
from blacc.target.machine import detect_machine
from blacc.transform.blac import (
    SHORT_ROWS,
    OpSchedule,
    build_module,
    candidates,
    unzip_rows,
    zip_rows,
)
from test_blac_pairs import _argtypes, _llvm_function, check_guarded
from test_blac_programs import NP, assert_matches, make_values, run_interp, seed_of

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector
CC = shutil.which("cc")
MACHINE = detect_machine()
NATIVE = {"avx2": MACHINE.has("avx2", "fma"), "avx512": not AVX512.missing(MACHINE)}
ISAS = {"avx2": AVX2, "avx512": AVX512}


# ----------------------------------------------------------------------------- IR nodes


def _zip_module(dtype: str, lanes: int) -> k.Module:
    """out = zip_lo(a, b) | zip_hi(a, b) | unzip_even(a, b) | unzip_odd(a, b), with a and
    b the first two vectors of x."""
    a = k.Load("x", k.Const(0), dtype, lanes)
    b = k.Load("x", k.Const(lanes), dtype, lanes)
    nodes = [k.Zip(a, b, 0), k.Zip(a, b, 1), k.Unzip(a, b, 0), k.Unzip(a, b, 1)]
    body = tuple(k.Store("out", k.Const(q * lanes), e) for q, e in enumerate(nodes))
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def _zip_expected(x: np.ndarray, lanes: int) -> np.ndarray:
    a, b = x[:lanes], x[lanes:2 * lanes]
    zipped = np.stack([a, b], axis=1).reshape(-1)  # a0 b0 a1 b1 ...
    both = np.concatenate([a, b])
    return np.concatenate([zipped, both[0::2], both[1::2]])


WIDTHS = [("avx2", "f32", 8), ("avx2", "f32", 4), ("avx2", "f64", 4), ("avx2", "f64", 2),
          ("avx512", "f32", 16), ("avx512", "f32", 8), ("avx512", "f64", 8),
          ("avx512", "f64", 4)]


@pytest.mark.parametrize(("dtype", "lanes"), [("f32", 8), ("f64", 2), ("f32", 16)])
def test_zip_nodes_in_the_interpreter_and_printer(dtype, lanes):
    module = _zip_module(dtype, lanes)
    x = np.arange(1, 2 * lanes + 1, dtype=NP[dtype])
    out = np.zeros(4 * lanes, NP[dtype])
    interp.run(module, {"x": x, "out": out})
    np.testing.assert_array_equal(out, _zip_expected(x, lanes))
    text = printer.module(module)
    assert "zip_lo(" in text and "zip_hi(" in text and "unzip_even(" in text
    assert "unzip_odd(" in text


def test_zip_nodes_check_their_operands():
    x8 = k.Load("x", k.Const(0), "f32", 8)
    with pytest.raises(ValueError, match="Zip takes two vectors of one type"):
        k.Zip(x8, k.Load("x", k.Const(0), "f32", 4), 0)
    with pytest.raises(ValueError, match="Unzip takes two vectors"):
        k.Unzip(x8, k.Load("x", k.Const(0), "f64", 8), 1)
    with pytest.raises(ValueError, match="2, 4, 8"):
        k.Zip(k.Load("x", k.Const(0), "f32", 6), k.Load("x", k.Const(0), "f32", 6), 0)
    with pytest.raises(ValueError, match="half must be 0 or 1"):
        k.Zip(x8, x8, 2)
    assert k.zip_lanes(4, 1) == [2, 6, 3, 7] and k.unzip_lanes(4, 1) == [1, 3, 5, 7]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("isa", "dtype", "lanes"), WIDTHS,
                         ids=[f"{i}-{d}x{n}" for i, d, n in WIDTHS])
def test_zip_templates_compiled_by_gcc_and_llvm(tmp_path, isa, dtype, lanes):
    """Every ISA's templates compile without warnings; where this CPU runs them, gcc's
    and LLVM's code agree with the interpreter."""
    module = _zip_module(dtype, lanes)
    src = tmp_path / "z.c"
    src.write_text(c_backend.render(module, ISAS[isa]), encoding="utf-8")
    lib = tmp_path / "z.so"
    cmd = [CC, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", *ISAS[isa].flags, "-fPIC",
           "-shared", str(src), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = llvm_backend.render(module, ISAS[isa])
    assert text.count("shufflevector") == 4
    if not NATIVE[isa]:
        return
    x = np.arange(1, 2 * lanes + 1, dtype=NP[dtype])
    want = _zip_expected(x, lanes)
    c_fn = ctypes.CDLL(str(lib)).f
    jit_lib = jit.JitLibrary(jit.emit_object(text))
    llvm_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        jit_lib.address("f"))
    for fn in (c_fn, llvm_fn):
        out = np.zeros(4 * lanes, NP[dtype])
        fn(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data))
        np.testing.assert_array_equal(out, want)


def _permute_module(dtype: str, lanes: int, widths: tuple[int, ...]) -> k.Module:
    """out = the reversed lanes of a vector of x, then its lanes 3, 0, 5, ... (every
    third, wrapping) at each width of ``widths``, then every third lane of it and the
    vector after it (two sources)."""
    x = k.Load("x", k.Const(0), dtype, lanes)
    orders = [tuple(range(lanes - 1, -1, -1))] + [tuple((3 * i) % lanes for i in range(n))
                                                  for n in widths]
    body, at = [], 0
    for order in orders:
        body.append(k.Store("out", k.Const(at), k.Permute(x, order)))
        at += len(order)
    second = k.Load("x", k.Const(lanes), dtype, lanes)
    body.append(k.Store("out", k.Const(at), k.Permute(x, _thirds(lanes), second)))
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, tuple(body), exported=True),), "f")


def _thirds(lanes: int) -> tuple[int, ...]:
    return tuple((3 * i) % (2 * lanes) for i in range(lanes))


def _permute_expected(x: np.ndarray, lanes: int, widths: tuple[int, ...]) -> np.ndarray:
    one = x[:lanes]
    return np.concatenate([one[::-1]] + [one[[(3 * i) % lanes for i in range(n)]]
                                         for n in widths] + [x[list(_thirds(lanes))]])


PERMUTES = [("f32", 16, (16, 8, 4)), ("f64", 8, (8, 4, 2))]


@pytest.mark.parametrize(("dtype", "lanes", "widths"), PERMUTES, ids=["f32", "f64"])
def test_permute_in_the_interpreter_printer_gcc_and_llvm(tmp_path, dtype, lanes, widths):
    """Any order of a full AVX-512 vector's lanes, kept whole or its first half or quarter:
    the interpreter gives what NumPy indexing does; gcc compiles the templates without
    warnings and, where this CPU runs them, gcc's and LLVM's code agree with it."""
    module = _permute_module(dtype, lanes, widths)
    x = np.arange(1, 2 * lanes + 1, dtype=NP[dtype])
    want = _permute_expected(x, lanes, widths)
    out = np.zeros(want.size, NP[dtype])
    interp.run(module, {"x": x, "out": out})
    np.testing.assert_array_equal(out, want)
    assert f"permute({printer.expr(k.Load('x', k.Const(0), dtype, lanes))}, [" in \
        printer.module(module)
    if CC is None:
        return
    lib = tmp_path / "p.so"
    src = tmp_path / "p.c"
    src.write_text(c_backend.render(module, AVX512), encoding="utf-8")
    proc = subprocess.run([CC, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                           *AVX512.flags, "-fPIC", "-shared", str(src), "-o", str(lib)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = llvm_backend.render(module, AVX512)
    assert text.count("shufflevector") == len(widths) + 2
    if not NATIVE["avx512"]:
        return
    jit_lib = jit.JitLibrary(jit.emit_object(text))
    llvm_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        jit_lib.address("f"))
    for fn in (ctypes.CDLL(str(lib)).f, llvm_fn):
        out = np.zeros(want.size, NP[dtype])
        fn(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data))
        np.testing.assert_array_equal(out, want)


def test_permute_checks_its_lanes():
    x8 = k.Load("x", k.Const(0), "f32", 8)
    assert k.Permute(x8, (7, 0)).lanes == 2 and k.Permute(x8, (7, 0)).dtype == "f32"
    assert k.Permute(x8, (15, 0), x8).lanes == 2
    for bad in [(0,), (0, 1, 2), tuple(range(16)), (0, 8), (-1, 0)]:
        with pytest.raises(ValueError, match="Permute takes 2, 4, 8"):
            k.Permute(x8, bad)
    with pytest.raises(ValueError, match="Permute takes 2, 4, 8"):
        k.Permute(x8, (0, 16), x8)
    with pytest.raises(ValueError, match="two vectors of one type"):
        k.Permute(x8, (0, 9), k.Load("x", k.Const(0), "f64", 8))


@pytest.mark.parametrize(("w", "lanes"), [(2, 2), (2, 8), (4, 4), (4, 8), (8, 8), (4, 16),
                                          (8, 16)])
def test_zip_rows_transposes_a_tile(w, lanes):
    """w columns of ``lanes`` rows -> the tile's rows one after another, and back."""
    tile = np.arange(w * lanes, dtype=np.float64).reshape(lanes, w) + 1
    buf = {"t": tile.T.reshape(-1).copy(), "rows": np.zeros(w * lanes),
           "cols": np.zeros(w * lanes)}
    body: list[k.Stmt] = []

    def emit(e: k.Expr) -> k.Var:
        var = k.Var(f"v{len(body)}", "f64", lanes)
        body.append(k.Decl(var, e))
        return var

    columns = [emit(k.Load("t", k.Const(a * lanes), "f64", lanes)) for a in range(w)]
    rows = zip_rows(columns, emit)
    body += [k.Store("rows", k.Const(q * lanes), r) for q, r in enumerate(rows)]
    back = unzip_rows(rows, emit)
    body += [k.Store("cols", k.Const(a * lanes), c) for a, c in enumerate(back)]
    params = tuple(k.Param(n, "f64", pointer=True) for n in buf)
    interp.run(k.Module((k.Function("f", params, tuple(body), exported=True),), "f"), buf)
    np.testing.assert_array_equal(buf["rows"], tile.reshape(-1))
    np.testing.assert_array_equal(buf["cols"], tile.T.reshape(-1))


# ----------------------------------------------------------------------------- programs

#: name -> (source, declarations from (n, w, dtype)); the output is n x w, row-major.
PROGRAMS = {
    "gemam": ("C = alpha*(A0 + A1)'*B + beta*C", lambda n, w, dt: dict(
        A0=M(w, n, dt), A1=M(w, n, dt), B=M(w, w, dt), C=M(n, w, dt), alpha=S(dt),
        beta=S(dt))),
    "at_b": ("C = A'*B", lambda n, w, dt: dict(A=M(3, n, dt), B=M(3, w, dt), C=M(n, w, dt))),
    "at_b_minus_c": ("C = A'*B - C", lambda n, w, dt: dict(
        A=M(5, n, dt), B=M(5, w, dt), C=M(n, w, dt))),
    "transpose_sum": ("C = (A + B)' + 2*C", lambda n, w, dt: dict(
        A=M(w, n, dt), B=M(w, n, dt), C=M(n, w, dt))),
}


def column_schedules(p, isa) -> list[tuple]:
    """Each operation's candidates with the lanes down the columns of a row-major output
    with more than one column, the others at the planned schedule."""
    out = []
    for n, op in enumerate(p.indexed.ops):
        rows = p.indexed.operand(op.out).rows
        for sched in candidates(p.indexed, op, isa):
            if sched.vector == op.dims[0] and not sched.pairs and rows > 1:
                out.append((*p.schedule[:n], sched, *p.schedule[n + 1:]))
    return out


INTERP_CASES = [(name, n, w, dt, isa) for name in PROGRAMS for dt in ("f32", "f64")
                for isa in ("avx2", "avx512")
                for n, w in ((1, 4), (3, 2), (5, 4), (8, 4), (13, 4), (17, 2), (12, 8),
                             (24, 4), (37, 4), (9, 8))]


@pytest.mark.parametrize(("name", "n", "w", "dtype", "isa"), INTERP_CASES,
                         ids=[f"{a}-{d}-{i}-{n}x{w}" for a, n, w, d, i in INTERP_CASES])
def test_every_column_tile_in_the_interpreter(name, n, w, dtype, isa):
    decls = PROGRAMS[name][1](n, w, dtype)
    p = plan(PROGRAMS[name][0], target=isa, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of(name, n, w, dtype)))
    built = 0
    for schedule in column_schedules(p, ISAS[isa]):
        try:
            module = build_module(p.indexed, p.specs, schedule, ISAS[isa], "cols")
        except ScheduleError:
            continue
        built += 1
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{name} {n}x{w} {dtype} {isa} {schedule}")
    takes = w in SHORT_ROWS and w <= ISAS[isa].lanes(dtype)
    assert built >= (n > 1 and takes), "no column tile was built"
    if not takes:
        assert not built


#: Products that read a matrix with rows of w elements down its columns (the lanes along
#: n): name -> (source, declarations from (n, w, dtype)).
COLUMN_READS = {
    "matvec": ("y = A*x", lambda n, w, dt: dict(A=M(n, w, dt), x=V(w, dt), y=V(n, dt))),
    "gemv": ("y = alpha*A*x + beta*y", lambda n, w, dt: dict(
        A=M(n, w, dt), x=V(w, dt), y=V(n, dt), alpha=S(dt), beta=S(dt))),
    "matmul": ("C = A*B", lambda n, w, dt: dict(A=M(n, w, dt), B=M(w, 3, dt),
                                                C=M(n, 3, dt, layout="col"))),
}
COLUMN_READ_CASES = [(name, n, w, dt, isa) for name in COLUMN_READS for dt in ("f32", "f64")
                     for isa in ("avx2", "avx512")
                     for n, w in ((1, 4), (4, 4), (5, 2), (12, 4), (19, 8), (33, 4))]


@pytest.mark.parametrize(("name", "n", "w", "dtype", "isa"), COLUMN_READ_CASES,
                         ids=[f"{a}-{d}-{i}-{n}x{w}" for a, n, w, d, i in COLUMN_READ_CASES])
def test_columns_read_down_short_rows_in_the_interpreter(name, n, w, dtype, isa):
    """Every candidate with the lanes along n: A's columns come out of ``Unzip``s of its
    rows (what gcc makes of y = A*x, A 4 x 4: transposes, then FMAs by x's elements)."""
    built = 0
    for module in _column_reads_checked(name, n, w, dtype, isa):
        built += 1
        assert nodes_of(module, k.Unzip) or n == 1
    assert built >= (n > 1 and w in SHORT_ROWS)


def _column_reads_checked(name: str, n: int, w: int, dtype: str, isa: str):
    """The modules of every candidate of ``COLUMN_READS[name]`` with the lanes along n
    that builds, each checked through the interpreter on buffers with no slack."""
    decls = COLUMN_READS[name][1](n, w, dtype)
    p = plan(COLUMN_READS[name][0], target=isa, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of(name, n, w, dtype)))
    for sched in candidates(p.indexed, p.indexed.ops[-1], ISAS[isa]):
        if sched.vector != "i" or sched.pairs:
            continue
        try:
            module = build_module(p.indexed, p.specs, (*p.schedule[:-1], sched), ISAS[isa],
                                  "cols")
        except ScheduleError:
            continue
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{name} {n}x{w} {dtype} {isa} {sched}")
        yield module


#: (n, w, dtype) of A n x w whose rows, other than 2 or 4 long, fit one AVX-512 vector
#: (16 f32, 8 f64) at least three at a time, a chunk of rows at a time (7 rows: 4 + 3),
#: and of such matrices with only two rows to a chunk, which are not permuted
ODD_ROWS = ((3, 3, "f32"), (4, 3, "f32"), (7, 3, "f32"), (3, 5, "f32"), (5, 3, "f32"),
            (2, 5, "f32"), (2, 7, "f32"), (2, 3, "f64"), (3, 3, "f64"))
ODD_ROW_CASES = [(name, n, w, dt) for name in COLUMN_READS for n, w, dt in ODD_ROWS]


@pytest.mark.parametrize(("name", "n", "w", "dtype"), ODD_ROW_CASES,
                         ids=[f"{a}-{d}-{n}x{w}" for a, n, w, d in ODD_ROW_CASES])
def test_columns_of_odd_rows_permuted_in_the_interpreter(name, n, w, dtype):
    """With the lanes along n, A's columns are ``Permute``s of one masked load of a
    chunk's rows (AVX-512), on buffers with no slack, where a vector holds three rows or
    more; AVX2, without the template, builds none of these schedules."""
    for isa in ("avx512", "avx2"):
        built = 0
        for module in _column_reads_checked(name, n, w, dtype, isa):
            built += 1
            assert nodes_of(module, k.Permute)
        assert built if isa == "avx512" and n >= 3 and 3 * w < AVX512.lanes(dtype) else not built


@pytest.mark.parametrize(("source", "matrices"), [("y = A*x", "A"),
                                                  ("y = alpha*A*x + beta*B*x", "AB")])
def test_the_model_permutes_columns_of_a_3x3_f32(tmp_path, source, matrices):
    """y = A*x and y = alpha*A*x + beta*B*x with 3 x 3 f32 matrices on AVX-512: the
    lanes down the three rows, each column of A (and B) one permute of a 9-lane load,
    three FMAs by x's elements and one masked store, where the sums along the rows took
    three horizontal sums (1.50 ns a call against 1.16 on Zen 5; the loops 1.21). Compiled
    and run against guard pages where this CPU runs AVX-512."""
    decls = {a: M(3, 3, "f32") for a in matrices} | dict(x=V(3, "f32"), y=V(3, "f32"))
    if len(matrices) > 1:
        decls |= dict(alpha=S("f32"), beta=S("f32"))
    p = plan(source, target="avx512", **decls)
    assert p.schedule[-1].vector == "i", p.schedule
    assert p.source.count("_mm512_permutexvar_ps") == 3 * len(matrices)
    if not NATIVE["avx512"] or CC is None:
        return
    values = make_values(decls, "f32", np.random.default_rng(seed_of("perm", source)))
    fn = _compiled(p.module, AVX512, tmp_path / "perm")
    check_guarded([(p.schedule, "c", fn)], p, values, source)


def test_column_tiles_refuse_layouts_they_cannot_take():
    def build(source: str, block: tuple[int, int] = (4, 1), **decls) -> None:
        p = plan(source, target="avx2", **decls)
        build_module(p.indexed, p.specs, (OpSchedule("i", block),), AVX2, "x")

    with pytest.raises(ScheduleError, match="rows of 2 or 4"):  # rows not contiguous
        build("C = A'*B", A=M(3, 9), B=M(3, 4), C=M(9, 4, ld=6))
    with pytest.raises(ScheduleError, match="rows of 2 or 4"):  # 3 columns
        build("C = A'*B", (3, 1), A=M(3, 9), B=M(3, 3), C=M(9, 3))
    with pytest.raises(ScheduleError, match="takes all 4 columns"):
        build("C = A'*B", (2, 1), A=M(3, 9), B=M(3, 4), C=M(9, 4))
    with pytest.raises(ScheduleError, match="needs unit stride in A"):  # A read across
        build("C = A*B", A=M(9, 3), B=M(3, 4), C=M(9, 4))


@pytest.mark.parametrize(("n", "dtype", "isa"), [(16, "f32", "avx2"), (64, "f32", "avx512"),
                                                 (24, "f64", "avx512")])
def test_the_model_transposes_tiles_of_narrow_outputs(n, dtype, isa):
    """C(n x 4) = alpha*(A0 + A1)'*B + beta*C: the sum down the columns (A0 and A1 run
    along n) and one transpose per tile, where two or four rows per vector would spread
    every element of the sum (at n = 48 on AVX2 the spread rows are taken, and ran 24.2
    ns against 28.5: ``test_blac_spread``)."""
    decls = PROGRAMS["gemam"][1](n, 4, dtype)
    p = plan(PROGRAMS["gemam"][0], target=isa, **decls)
    assert p.schedule[-1].vector == "i", p.schedule
    assert "permute" in p.source


# ----------------------------------------------------------------------------- compiled

COMPILED_CASES = [("gemam", 16, 4, "f32", "avx2"), ("gemam", 13, 4, "f32", "avx2"),
                  ("gemam", 7, 2, "f64", "avx2"), ("at_b_minus_c", 21, 2, "f32", "avx2"),
                  ("transpose_sum", 9, 4, "f64", "avx2"), ("gemam", 29, 4, "f32", "avx512"),
                  ("gemam", 11, 4, "f64", "avx512"), ("at_b_minus_c", 37, 2, "f64", "avx512")]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "n", "w", "dtype", "isa"), COMPILED_CASES,
                         ids=[f"{a}-{d}-{i}-{n}x{w}" for a, n, w, d, i in COMPILED_CASES])
def test_column_tiles_compiled_against_guard_pages(tmp_path, name, n, w, dtype, isa):
    """The column tiles with one and with the most vectors per block, compiled by gcc
    and the LLVM JIT (``blacc.compile``'s builds), on operands that touch guard pages."""
    if not NATIVE[isa]:
        pytest.skip(f"this CPU cannot run {isa}")
    decls = PROGRAMS[name][1](n, w, dtype)
    p = plan(PROGRAMS[name][0], target=isa, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("g", name, n, w)))
    schedules = []
    for schedule in column_schedules(p, ISAS[isa]):
        try:
            build_module(p.indexed, p.specs, schedule, ISAS[isa], "ck")
        except ScheduleError:
            continue
        schedules.append(schedule)
    assert schedules
    fns = []
    for m, schedule in enumerate(dict.fromkeys((schedules[0], schedules[-1]))):
        module = build_module(p.indexed, p.specs, schedule, ISAS[isa], "ck")
        fns.append((schedule, "c", _compiled(module, ISAS[isa], tmp_path / f"ck{m}")))
        if not any(isinstance(x, k.Local) for x in module.function("ck").body):
            fns.append((schedule, "llvm", _llvm_function(module, ISAS[isa])))
    check_guarded(fns, p, values, f"{name} {n}x{w} {dtype} {isa}")


def _compiled(module: k.Module, isa, stem: Path):
    src, lib = stem.with_suffix(".c"), stem.with_suffix(".so")
    src.write_text(c_backend.render(module, isa), encoding="utf-8")
    cmd = [CC, "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", *isa.flags, "-fPIC",
           "-shared", str(src), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    fn = getattr(ctypes.CDLL(str(lib)), module.entry)
    fn.restype, fn.argtypes = ctypes.c_int, _argtypes(module)
    return fn


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_compiled_kernel_with_column_tiles(dtype):
    """blacc.compile end to end for the host, beta*C read and written by rows."""
    if not NATIVE["avx2"]:
        pytest.skip("needs AVX2 and FMA")
    decls = PROGRAMS["gemam"][1](19, 4, dtype)
    kern = blacc.compile(PROGRAMS["gemam"][0], **decls)
    rng = np.random.default_rng(7)
    a0, a1 = (rng.uniform(-1, 1, (4, 19)).astype(NP[dtype]) for _ in range(2))
    b, c = rng.uniform(-1, 1, (4, 4)).astype(NP[dtype]), rng.uniform(-1, 1, (19, 4))
    c = c.astype(NP[dtype])
    want = 1.5 * (a0.astype(np.float64) + a1).T @ b - 0.5 * c
    got = kern(A0=a0, A1=a1, B=b, C=c.copy(), alpha=1.5, beta=-0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
