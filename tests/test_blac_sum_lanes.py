"""Rows of horizontal sums stored at once (``SumLanes``, ``transform.sum_lanes``).

* the node in the interpreter and compiled from C for every width AVX2 has, against the
  sums NumPy computes; so is ``SumRows`` (rows wider than the result) on both targets;
* the pass on hand-built statements: which groups it joins, which it must leave alone
  (an output read or written in between, a reassigned accumulator, gaps, rows that
  differ), and wider accumulators halved first; on AVX-512, a vector's worth of rows
  a vector long, or of 4 f64 held in pairs, summed from whole vectors;
* programs through the planner, compiled and called on guarded operands (AVX-512
  ones where the CPU has it), the IR checked for the vector stores.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import interp
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.strategy.small import choose
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import OpSchedule, _sum_pieces, build_module, candidates, chunks
from blacc.transform.index_notation import forms
from blacc.transform.sum_lanes import batch_row_sums, one_sum
from guard import run_isolated
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_leftovers import _call, _padding_untouched
from test_blac_pairs import _c_function, check_guarded, needs_native
from test_blac_programs import NP, assert_matches, make_values, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
#: (dtype, lanes, rows per vector): a row per vector at every width, and rows of half
#: a vector two per 256-bit vector
WIDTHS = [("f32", 4, 1), ("f32", 8, 1), ("f64", 2, 1), ("f64", 4, 1), ("f32", 8, 2),
          ("f64", 4, 2)]


def _node_module(dtype: str, n: int, per: int = 1) -> k.Module:
    """out[0:n] = sumlanes(x[0:n], x[n:2n], ...), ``per`` rows in each of the n / per
    vectors."""
    xs = tuple(k.Load("x", k.Const(r * n), dtype, n) for r in range(n // per))
    body = (k.Store("out", k.Const(0), k.SumLanes(xs)),)
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def _inputs(dtype: str, n: int, per: int = 1) -> tuple[np.ndarray, np.ndarray]:
    size = n * n // per
    x = (np.arange(size) % 7 - 3 + np.arange(size) / 8).astype(NP[dtype])
    return x, x.reshape(n, n // per).sum(axis=1)


def test_sum_lanes_checks_its_operands():
    x4 = k.Load("x", k.Const(0), "f32", 4)
    x2 = k.Load("x", k.Const(0), "f64", 2)
    with pytest.raises(ValueError, match="SumLanes"):
        k.SumLanes((x4,) * 3)
    with pytest.raises(ValueError, match="SumLanes"):
        k.SumLanes((x4,))  # one vector
    with pytest.raises(ValueError, match="SumLanes"):
        k.SumLanes((x4, x2))
    assert k.SumLanes((x4,) * 4).lanes == 4
    assert k.SumLanes((x4, x4)).lanes == 4 and k.SumLanes((x4, x4)).rows_per_vector == 2


@pytest.mark.parametrize(("dtype", "n", "per"), WIDTHS)
def test_sum_lanes_in_the_interpreter(dtype, n, per):
    x, want = _inputs(dtype, n, per)
    out = np.zeros(n, NP[dtype])
    interp.run(_node_module(dtype, n, per), {"x": x, "out": out})
    np.testing.assert_allclose(out, want, rtol=1e-6)


@needs_native
@pytest.mark.parametrize(("dtype", "n", "per"), WIDTHS)
def test_sum_lanes_compiled(tmp_path, dtype, n, per):
    module = _node_module(dtype, n, per)
    op = "sum_lanes" if per == 1 else "sum_halves"
    helper = AVX2.op(op, dtype, n).split("(")[0]  # the target's transpose-and-add
    assert helper in c_backend.render(module, AVX2)
    fn = _c_function(tmp_path, module)
    x, want = _inputs(dtype, n, per)
    out = np.zeros(n + 1, NP[dtype])  # one element more: it must stay untouched
    fn(x.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out[:n], want, rtol=1e-6)
    assert out[n] == 0


# ----------------------------------------------------------------------------- the pass


def _acc(r: int, dtype: str = "f32", lanes: int = 4) -> k.Var:
    return k.Var(f"acc{r}", dtype, lanes)


def _rows(nrows: int, *, dtype: str = "f32", lanes: int = 4, start: int = 0) -> list[k.Stmt]:
    """acc_r = x[r*lanes : ...]; y[start + r] = alpha * hsum(acc_r) + y[start + r]."""
    out: list[k.Stmt] = []
    alpha = k.Var("alpha", dtype)
    for r in range(nrows):
        acc = _acc(r, dtype, lanes)
        out.append(k.Decl(acc, k.Load("x", k.Const(r * lanes), dtype, lanes)))
        y = k.Const(start + r)
        value = k.Fma(alpha, k.Reduce(acc), k.Load("y", y, dtype))
        out.append(k.Store("y", y, value))
    return out


def _stores(body: tuple[k.Stmt, ...]) -> list[tuple[int, int]]:
    """(index, lanes) of the stores in ``body``."""
    return [(int(s.index.value), s.value.lanes) for s in body if isinstance(s, k.Store)]


def _run_rows(body: tuple[k.Stmt, ...], nrows: int, lanes: int = 4) -> np.ndarray:
    """y after ``body`` (``_rows``' statements, joined or not) in the interpreter."""
    params = (k.Param("x", "f32", pointer=True, const=True), k.Param("y", "f32", pointer=True),
              k.Param("alpha", "f32"))
    x = (np.arange(nrows * lanes, dtype=np.float32) % 11) / 4
    y = np.arange(nrows + 2, dtype=np.float32) - 3  # two past the rows: left alone
    interp.run(k.Module((k.Function("f", params, body, exported=True),), "f"),
               {"x": x, "y": y, "alpha": np.float32(1.5)})
    return y


def test_pass_joins_rows_and_keeps_a_lone_row_scalar():
    body = batch_row_sums(tuple(_rows(5)), AVX2)
    assert _stores(body) == [(0, 4), (4, 1)]
    vector = next(s for s in body if isinstance(s, k.Store))
    assert isinstance(vector.value, k.Fma) and isinstance(vector.value.b, k.SumLanes)
    assert vector.value.c == k.Load("y", k.Const(0), "f32", 4)  # y read as one vector
    # it stands after the four accumulators
    assert body.index(vector) == 4


@pytest.mark.parametrize("nrows, stores", [
    (2, [(0, 4, 2)]), (3, [(0, 4, 3)]), (6, [(0, 4, None), (4, 4, 2)]),
    (7, [(0, 4, None), (4, 4, 3)])])
def test_pass_joins_rows_left_over_in_part_of_a_vector(nrows, stores):
    """Rows that fill no vector are summed in one (the first repeated in the lanes past
    them) and stored in part; the values are the rows' own."""
    rows = tuple(_rows(nrows))
    body = batch_row_sums(rows, AVX2)
    got = [s for s in body if isinstance(s, k.Store)]
    assert [(int(s.index.value), s.value.lanes, k.const_value(s.count)) for s in got] == stores
    part = got[-1]
    sums = part.value.b
    assert isinstance(sums, k.SumLanes) and len(sums.xs) == 4
    first = nrows // 4 * 4
    assert sums.xs == tuple(_acc(first + r % (nrows - first)) for r in range(4))
    # y read in part too: only the rows' elements
    assert part.value.c == k.Load("y", k.Const(first), "f32", 4, k.Const(nrows - first))
    np.testing.assert_array_equal(_run_rows(body, nrows), _run_rows(rows, nrows))


def test_pass_transposes_wider_rows_first():
    """Four rows of 8 f32 (AVX2) or 16 (AVX-512) into four lanes: ``SumRows`` of the
    accumulators as they are."""
    for isa, lanes in ((AVX2, 8), (AVX512, 16)):
        body = batch_row_sums(tuple(_rows(4, lanes=lanes)), isa)
        assert _stores(body) == [(0, 4)]
        sums = next(s for s in body if isinstance(s, k.Store)).value.b
        assert sums == k.SumRows(tuple(_acc(r, lanes=lanes) for r in range(4)))


def test_pass_halves_wider_accumulators():
    """Eight rows of 16 f32 into eight lanes (no ``SumRows`` of eight rows): each row's
    halves added, then ``SumLanes``."""
    body = batch_row_sums(tuple(_rows(8, lanes=16)), AVX512)
    assert _stores(body) == [(0, 8)]
    sums = next(s for s in body if isinstance(s, k.Store)).value.b
    assert isinstance(sums, k.SumLanes) and all(x.lanes == 8 for x in sums.xs)
    assert sums.xs[0] == k.Bin("+", k.Half(_acc(0, lanes=16), 0), k.Half(_acc(0, lanes=16), 1))


#: (isa, dtype, rows, lanes of a row) of every ``SumRows`` the targets have
SUM_ROWS = [("avx2", "f32", 4, 8), ("avx2", "f64", 2, 4), ("avx512", "f32", 4, 16),
            ("avx512", "f32", 4, 8), ("avx512", "f64", 4, 8), ("avx512", "f64", 2, 4)]


def _sum_rows_module(dtype: str, rows: int, lanes: int) -> k.Module:
    """out[0:rows] = sumrows(x[0:lanes], x[lanes:2 lanes], ...)."""
    xs = tuple(k.Load("x", k.Const(r * lanes), dtype, lanes) for r in range(rows))
    body = (k.Store("out", k.Const(0), k.SumRows(xs)),)
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def test_sum_rows_checks_its_operands():
    x4 = k.Load("x", k.Const(0), "f32", 4)
    x16 = k.Load("x", k.Const(0), "f32", 16)
    for bad in ((x4,) * 4, (x16,), (x16,) * 3, (x16, x4), (x4,) * 3):
        with pytest.raises(ValueError, match="SumRows"):
            k.SumRows(bad)
    assert k.SumRows((x16,) * 4).lanes == 4 and k.SumRows((x4, x4)).lanes == 2


@pytest.mark.parametrize(("isa", "dtype", "rows", "lanes"), SUM_ROWS)
def test_sum_rows_in_the_interpreter_and_compiled(tmp_path, isa, dtype, rows, lanes):
    """The interpreter, and the target's helper compiled with -Wall -Wextra -Werror and
    run where the CPU has it: each row's sum, nothing written past them."""
    module = _sum_rows_module(dtype, rows, lanes)
    x = (np.arange(rows * lanes) % 7 - 3 + np.arange(rows * lanes) / 8).astype(NP[dtype])
    want = x.reshape(rows, lanes).sum(axis=1)
    out = np.zeros(rows, NP[dtype])
    interp.run(module, {"x": x, "out": out})
    np.testing.assert_allclose(out, want, rtol=1e-6)
    target = {"avx2": AVX2, "avx512": AVX512}[isa]
    helper = target.op(f"sum_rows{rows}", dtype, lanes).split("(")[0]
    assert helper in c_backend.render(module, target)
    if CC is None or not NATIVE[isa]:
        pytest.skip(f"needs a C compiler and a CPU with {isa}")
    fn = _compiled(module, target, tmp_path / "sum_rows")
    out = np.zeros(rows + 1, NP[dtype])  # one element more: it must stay untouched
    fn(x.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out[:rows], want, rtol=1e-6)
    assert out[rows] == 0


def test_pass_uses_full_vectors_for_eight_rows():
    body = batch_row_sums(tuple(_rows(8, lanes=8)), AVX2)
    assert _stores(body) == [(0, 8)]
    assert _stores(batch_row_sums(tuple(_rows(4, dtype="f64", lanes=4)), AVX2)) == [(0, 4)]
    assert _stores(batch_row_sums(tuple(_rows(3, dtype="f64", lanes=2)), AVX2)) == [
        (0, 2), (2, 1)]


def _paired_rows(nrows: int, dtype: str, half: int, *, mixed: bool = False) -> list[k.Stmt]:
    """Two rows per vector: acc_q = x[q*2h : ...]; y[2q + h] = alpha * hsum(half h of
    acc_q) + y[2q + h] (``mixed``: the last high half replaced by another vector's)."""
    out: list[k.Stmt] = []
    alpha = k.Var("alpha", dtype)
    for q in range(nrows // 2):
        out.append(k.Decl(_acc(q, dtype, 2 * half), k.Load("x", k.Const(2 * q * half), dtype,
                                                         2 * half)))
    for r in range(nrows):
        acc = _acc(r // 2, dtype, 2 * half)
        if mixed and r == nrows - 1:
            acc = _acc(0, dtype, 2 * half)
        value = k.Fma(alpha, k.Reduce(k.Half(acc, r % 2)), k.Load("y", k.Const(r), dtype))
        out.append(k.Store("y", k.Const(r), value))
    return out


@pytest.mark.parametrize(("dtype", "half"), [("f32", 4), ("f64", 2)])
def test_pass_sums_rows_held_two_per_vector_at_once(dtype, half):
    rows = _paired_rows(2 * half, dtype, half)
    body = batch_row_sums(tuple(rows), AVX2)
    assert _stores(body) == [(0, 2 * half)]
    sums = next(s for s in body if isinstance(s, k.Store)).value.b
    assert isinstance(sums, k.SumLanes) and sums.rows_per_vector == 2
    assert sums.xs == tuple(_acc(q, dtype, 2 * half) for q in range(half))
    # the same values as the scalar rows, in the interpreter
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("y", dtype, pointer=True),
              k.Param("alpha", dtype))
    n = 2 * half
    x = (np.arange(n * half) % 5 - 2 + np.arange(n * half) / 16).astype(NP[dtype])
    got = []
    for stmts in (tuple(rows), body):
        y = np.arange(n, dtype=NP[dtype])
        module = k.Module((k.Function("f", params, stmts, exported=True),), "f")
        interp.run(module, {"x": x, "y": y, "alpha": 1.5})
        got.append(y)
    np.testing.assert_allclose(got[1], got[0], rtol=1e-6)
    # a high half of another vector: not two rows of one, so no pairwise sum
    mixed = batch_row_sums(tuple(_paired_rows(2 * half, dtype, half, mixed=True)), AVX2)
    assert not any(isinstance(e, k.SumLanes) and e.rows_per_vector == 2
                   for e in nodes_of(mixed, k.SumLanes))


def _module(body: tuple[k.Stmt, ...], dtype: str) -> k.Module:
    """f(x, y, alpha) running ``body``."""
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("y", dtype, pointer=True),
              k.Param("alpha", dtype))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


@pytest.mark.parametrize("nrows", [8, 12, 16, 20])
def test_pass_sums_eight_f64_rows_held_in_pairs_on_avx512(nrows):
    """Rows of 4 f64 two per 512-bit vector: eight at a time from four whole vectors
    (``blacc_sum8x2_pd``), not four at a time from 256-bit halves; a last four from the
    halves."""
    rows = _paired_rows(nrows, "f64", 4)
    body = batch_row_sums(tuple(rows), AVX512)
    eights, four = divmod(nrows, 8)
    assert _stores(body) == [(8 * g, 8) for g in range(eights)] + (
        [(8 * eights, 4)] if four else [])
    sums = [s.value.b for s in body if isinstance(s, k.Store)]
    assert all(x.rows_per_vector == 2 and len(x.xs) == 4 for x in sums[:eights])
    assert sums[:eights] == [k.SumLanes(tuple(_acc(q, "f64", 8) for q in range(4 * g, 4 * g + 4)))
                             for g in range(eights)]
    assert "blacc_sum8x2_pd(" in c_backend.render(_module(body, "f64"), AVX512)
    x = (np.arange(4 * nrows) % 5 - 2 + np.arange(4 * nrows) / 16).astype(np.float64)
    got = []
    for stmts in (tuple(rows), body):
        y = np.arange(nrows, dtype=np.float64)
        interp.run(_module(stmts, "f64"), {"x": x, "y": y, "alpha": 1.5})
        got.append(y)
    np.testing.assert_allclose(got[1], got[0], rtol=1e-12)


AVX512_SUMS = [("f64", 1, "blacc_sum8x8_pd"), ("f64", 2, "blacc_sum8x2_pd"),
               ("f32", 1, "blacc_sum16x16_ps"), ("f32", 4, "blacc_sum16x4_ps")]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("dtype", "per", "helper"), AVX512_SUMS)
def test_sums_of_a_vector_of_rows_compiled_for_avx512(tmp_path, dtype, per, helper):
    """As many rows as a 512-bit vector has lanes, each a whole vector long or held two
    (f64) or four (f32) per vector, summed into one vector, compiled by gcc (always) and run where
    the CPU has AVX-512: out[r] is the sum of row r, and the element after out stays."""
    n = AVX512.lanes(dtype)
    module = _node_module(dtype, n, per)
    assert f"{helper}(" in c_backend.render(module, AVX512)
    fn = _compiled(module, AVX512, tmp_path / helper)
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    x, want = _inputs(dtype, n, per)
    out = np.zeros(n + 1, NP[dtype])
    fn(x.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out[:n], want)
    assert out[n] == 0
    # each row's sum lands in its own lane: rows of one value each
    x = np.repeat(np.arange(n, dtype=NP[dtype]) + 1, n // per)
    fn(x.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out[:n], (np.arange(n) + 1) * (n // per))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_pass_sums_a_vector_of_rows_of_full_vectors_on_avx512(dtype):
    """Rows a 512-bit vector long on AVX-512: a vector's worth at once from whole
    vectors, not half as many from halves; the rest from halves added."""
    n = AVX512.lanes(dtype)
    body = batch_row_sums(tuple(_rows(n, dtype=dtype, lanes=n)), AVX512)
    assert _stores(body) == [(0, n)]
    sums = next(s for s in body if isinstance(s, k.Store)).value.b
    assert sums == k.SumLanes(tuple(_acc(r, dtype, n) for r in range(n)))
    body = batch_row_sums(tuple(_rows(n + n // 2, dtype=dtype, lanes=n)), AVX512)
    assert _stores(body) == [(0, n), (n, n // 2)]


AVX512_PROGRAMS = [("gesummv", 8, 4, "f64", "blacc_sum8x2_pd"),
                   ("gesummv", 13, 4, "f64", "blacc_sum8x2_pd"),
                   ("gesummv", 100, 4, "f64", "blacc_sum8x2_pd"),
                   ("gemv", 24, 4, "f64", "blacc_sum8x2_pd"),
                   ("smv", 19, 4, "f64", "blacc_sum8x2_pd"),
                   ("smv", 9, 8, "f64", "blacc_sum8x8_pd"),
                   ("gesummv", 10, 10, "f64", "blacc_sum8x8_pd"),
                   ("smv", 32, 16, "f32", "blacc_sum16x16_ps"),
                   ("gemv", 19, 16, "f32", "blacc_sum16x16_ps")]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "m", "n", "dtype", "helper"), AVX512_PROGRAMS,
                         ids=[f"{a}-{m}x{n}-{d}" for a, m, n, d, _ in AVX512_PROGRAMS])
def test_rows_summed_a_vector_at_once_against_guard_pages_on_avx512(tmp_path, name, m, n,
                                                                      dtype, helper):
    """y = A*x-shaped programs with A m x n planned for AVX-512 whose rows are summed a
    vector's worth at once (rows of 4 f64 held in pairs, rows of 8 f64 or 16 f32 a
    vector each); compiled (always) and run against guard pages where the CPU has
    AVX-512."""
    source = {"gesummv": "y = alpha*A*x + beta*B*x", "gemv": "y = alpha*A*x + beta*y",
              "smv": "y = A*x"}[name]
    decls = {o: d for o, d in dict(A=M(m, n, dtype), B=M(m, n, dtype), x=V(n, dtype),
                                   y=V(m, dtype), alpha=S(dtype), beta=S(dtype)).items()
             if o in source}
    p = plan(source, target="avx512", **decls)
    module = build_module(p.indexed, p.specs, p.schedule, AVX512, "pk")
    assert f"{helper}(" in c_backend.render(module, AVX512), p.schedule
    fn = _compiled(module, AVX512, tmp_path / "pk")
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("p8", name, m, n)))
    check_guarded([(p.schedule, "c", fn)], p, values, f"{name} {m}x{n} {dtype}")


@pytest.mark.parametrize("breaker", ["reads y", "writes y", "reassigns", "gap", "differs",
                                     "reads a stored element"])
def test_pass_leaves_groups_it_cannot_prove(breaker):
    rows = _rows(4)
    if breaker == "reads y":
        rows.insert(3, k.Decl(k.Var("t", "f32"), k.Load("y", k.Const(0), "f32")))
    elif breaker == "writes y":
        rows.insert(3, k.Store("y", k.Const(9), k.Const(1.0, "f32")))
    elif breaker == "reassigns":  # acc0 is changed after row 0 was stored
        rows.insert(3, k.Assign(_acc(0), k.Load("x", k.Const(0), "f32", 4)))
    elif breaker == "gap":
        rows[3] = k.Store("y", k.Const(5), rows[3].value)
    elif breaker == "differs":
        rows[5] = k.Store("y", k.Const(2), k.Reduce(_acc(2)))
    else:  # y[r+1] = hsum(acc_r) + y[r]: y[r] was written by the row before
        for r in range(4):
            value = k.Bin("+", k.Reduce(_acc(r)), k.Load("y", k.Const(r), "f32"))
            rows[2 * r + 1] = k.Store("y", k.Const(r + 1), value)
    body = batch_row_sums(tuple(rows), AVX2)
    # rows before and after the breaker are not joined: row 0 stays scalar, and rows
    # after it join only in part of a vector
    vectors = [s for s in body if isinstance(s, k.Store) and s.value.lanes > 1]
    assert all(s.index != k.Const(0) and 2 <= k.const_value(s.count) < 4
               for s in vectors), body


def test_pass_reaches_into_loops():
    loop = k.For(k.Var("i"), k.Const(0), k.Const(4), 1, tuple(_rows(4)))
    (out,) = batch_row_sums((loop,), AVX2)
    assert _stores(out.body) == [(0, 4)]


# ----------------------------------------------------------------------------- programs

PROGRAMS = [
    ("y = A*x", lambda m, n, dt: dict(A=M(m, n, dt), x=V(n, dt), y=V(m, dt))),
    ("y = alpha*A*x + beta*y", lambda m, n, dt: dict(
        A=M(m, n, dt, ld=n + 2), x=V(n, dt), y=V(m, dt), alpha=S(dt), beta=S(dt))),
    ("y = alpha*A*x + beta*B*x", lambda m, n, dt: dict(
        A=M(m, n, dt), B=M(m, n, dt), x=V(n, dt), y=V(m, dt), alpha=S(dt), beta=S(dt))),
]
SHAPES = [(m, n, dt) for dt in ("f32", "f64") for m, n in ((4, 4), (8, 4), (13, 4), (7, 9),
                                                          (16, 8), (5, 16), (3, 6))]


def _sum_lanes_in(module: k.Module) -> int:
    return len(nodes_of(module, (k.SumLanes, k.SumRows)))


@needs_native
@pytest.mark.parametrize(("program", "m", "n", "dtype"),
                         [(p, *s) for p in range(len(PROGRAMS)) for s in SHAPES])
def test_programs_against_guard_pages(tmp_path, program, m, n, dtype):
    source, decls_of = PROGRAMS[program]
    decls = decls_of(m, n, dtype)
    p = plan(source, target="avx2", **decls)
    # the planned schedule, and dot-product ones with blocks of rows (the sum on the lanes)
    modules = [build_module(p.indexed, p.specs, p.schedule, AVX2, "pk")]
    for n_op, op in enumerate(p.indexed.ops):
        for sched in candidates(p.indexed, op, AVX2):
            if sched.vector not in op.dims and sched.vector is not None and \
                    sched.block[1] == 1 and sched.block[0] in (2, 4, 8) and not sched.pairs:
                schedule = (*p.schedule[:n_op], sched, *p.schedule[n_op + 1:])
                try:
                    modules.append(build_module(p.indexed, p.specs, schedule, AVX2, "pk"))
                except ScheduleError:
                    continue
    if m >= 4 and n % 4 == 0:  # (a scalar tail in the rows keeps them scalar)
        assert any(_sum_lanes_in(mod) for mod in modules), source
    fns = [_c_function(tmp_path, mod) for mod in modules]
    values = make_values(decls, dtype, np.random.default_rng(seed_of("sl", source, m, n)))

    def body() -> None:
        for fn in fns:
            for side in ("after", "before"):
                where = f"{source} {m}x{n} {dtype} {side}"
                got, arrays = _call(fn, p, values, side)
                assert_matches(p.typed, values, got, where)
                for a in arrays.values():
                    assert _padding_untouched(a), where

    run_isolated(body)


def test_planner_stores_rows_of_matrix_vector_products_at_once():
    """y = A*x with A n x 4: every row a dot product of 4; the planned kernels store
    the rows a vector at a time."""
    for dt in ("f32", "f64"):
        decls = dict(A=M(16, 4, dt), x=V(4, dt), y=V(16, dt))
        p = plan("y = A*x", target="avx2", **decls)
        module = build_module(p.indexed, p.specs, p.schedule, AVX2, "pk")
        assert _sum_lanes_in(module) >= 2, (dt, p.schedule)
        y = blacc.compile("y = A*x", **decls)
        a = np.arange(64, dtype=NP[dt]).reshape(16, 4) / 7
        x = np.array([1, -2, 3, 0.5], NP[dt])
        np.testing.assert_allclose(y(A=a, x=x).ravel(), a @ x, rtol=1e-5)


# ----------------------------------------------------------------------------- one sum


def _vec(name: str, lanes: int = 4) -> k.Var:
    return k.Var(name, "f32", lanes)


def _sc(name: str) -> k.Var:
    return k.Var(name, "f32")


HS = k.Reduce
MERGED = {
    "fma": k.Fma(_sc("beta"), HS(_vec("b")), k.Bin("*", _sc("alpha"), HS(_vec("a")))),
    "plain": k.Bin("+", HS(_vec("a")), HS(_vec("b"))),
    "scaled left": k.Bin("+", k.Bin("*", HS(_vec("a")), _sc("alpha")), HS(_vec("b"))),
    "scaled both": k.Bin("+", k.Bin("*", _sc("alpha"), HS(_vec("a"))),
                         k.Bin("*", HS(_vec("b")), _sc("beta"))),
    "three": k.Bin("+", k.Bin("+", HS(_vec("a")), HS(_vec("b"))),
                   k.Bin("*", _sc("beta"), HS(_vec("c")))),
    # the wider sum is folded (its halves added) to the narrower one's width
    "widths differ": k.Bin("+", HS(_vec("a")), HS(_vec("w", 8))),
    "widths differ, scaled": k.Bin("+", k.Bin("*", _sc("alpha"), HS(_vec("w", 8))),
                                   k.Bin("*", HS(_vec("b")), _sc("beta"))),
}
KEPT = {
    "scale is a sum": k.Bin("+", k.Bin("*", HS(_vec("c")), HS(_vec("a"))), HS(_vec("b"))),
    "fma of sums": k.Fma(HS(_vec("c")), HS(_vec("b")), HS(_vec("a"))),
    "one sum": k.Bin("+", HS(_vec("a")), _sc("beta")),
    "two lanes": k.Bin("+", HS(_vec("a", 2)), HS(_vec("b", 2))),
}


def _evaluate(e: k.Expr) -> float:
    """``e`` run by the interpreter with a, b, c (4 lanes), w (8) and scalars set."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, 20).astype(np.float32)
    body = [k.Decl(_vec(n), k.Load("x", k.Const(4 * i), "f32", 4))
            for i, n in enumerate("abc")]
    body += [k.Decl(_vec("w", 8), k.Load("x", k.Const(12), "f32", 8)),
             k.Decl(_sc("alpha"), k.Const(0.75, "f32")),
             k.Decl(_sc("beta"), k.Const(-1.5, "f32")),
             k.Store("out", k.Const(0), e)]
    params = (k.Param("x", "f32", pointer=True, const=True), k.Param("out", "f32", pointer=True))
    out = np.zeros(1, np.float32)
    interp.run(k.Module((k.Function("f", params, tuple(body), exported=True),), "f"),
               {"x": x, "out": out})
    return float(out[0])


@pytest.mark.parametrize("name", list(MERGED))
def test_one_sum_adds_before_the_horizontal_sum(name):
    e = MERGED[name]
    merged = one_sum(e)
    assert len(nodes_of(merged, k.Reduce)) == 1, merged
    assert _evaluate(merged) == pytest.approx(_evaluate(e), rel=1e-5)


@pytest.mark.parametrize("name", list(KEPT))
def test_one_sum_leaves_what_is_not_a_sum_of_sums(name):
    assert one_sum(KEPT[name]) == KEPT[name]


def test_rows_of_mixed_widths_are_summed_in_pairs():
    """y = A*x with A 7 x 7 f64: each row is a vector of 4 and one of 2 (with the last
    element in one of its lanes); their sums join (the 4 folded to 2) and two rows are
    summed and stored at once, Eigen's way; the seventh row alone."""
    p = plan("y = A*x", target="avx2", A=blacc.Matrix(7, 7, "f64"), x=blacc.Vector(7, "f64"),
             y=blacc.Vector(7, "f64"))
    module = build_module(p.indexed, p.specs, (OpSchedule("k1", (1, 1)),), AVX2, "pk")
    stores_of_y = [s for s in nodes_of(module, k.Store) if s.buf == "y"]
    assert [s.value.lanes for s in stores_of_y] == [2, 2, 2, 1]
    assert len(nodes_of(module, k.SumLanes)) == 3
    rng = np.random.default_rng(3)
    A, x = rng.uniform(-1, 1, (7, 7)), rng.uniform(-1, 1, 7)
    y = np.zeros(7)
    interp.run(module, {"A": A.ravel(), "x": x, "y": y})
    np.testing.assert_allclose(y, A @ x, rtol=1e-12)


@pytest.mark.parametrize("n, dtype, lanes", [(5, "f32", 4), (7, "f64", 2), (9, "f32", 8),
                                             (6, "f64", 4)])
def test_a_last_element_joins_the_narrowest_vectors(n, dtype, lanes):
    """y = A*x with rows of 5 f32 (4 + 1), 7 f64 (4 + 2 + 1), 9 f32 (8 + 1) or 6 f64
    (4 + 2): the last piece is lanes of the narrowest vector the row already uses, so the
    row ends in one horizontal sum and rows are summed ``lanes`` at a time."""
    p = plan("y = A*x", target="avx2", A=blacc.Matrix(n, n, dtype), x=blacc.Vector(n, dtype),
             y=blacc.Vector(n, dtype))
    module = build_module(p.indexed, p.specs, (OpSchedule("k1", (1, 1)),), AVX2, "pk")
    scalar_products = [e for e in nodes_of(module, k.Bin)
                       if e.op == "*" and e.lanes == 1 and isinstance(e.a, k.Load)]
    assert bool(scalar_products) == (lanes == 1)
    if lanes > 1:
        assert {s.value.lanes for s in nodes_of(module, k.Store) if s.buf == "y"} >= {lanes}
    rng = np.random.default_rng(n)
    A, x = rng.uniform(-1, 1, (n, n)), rng.uniform(-1, 1, n)
    y = np.zeros(n, NP[dtype])
    interp.run(module, {"A": A.ravel().astype(NP[dtype]), "x": x.astype(NP[dtype]), "y": y})
    np.testing.assert_allclose(y, A @ x, rtol=1e-5 if dtype == "f32" else 1e-12)


def test_a_sum_ends_in_accumulators_it_has():
    """The pieces of a sum on lanes: with mask registers the rest after the widest vectors
    is one masked vector of theirs; without, the last piece joins the narrowest vector
    before it."""
    def pieces(n: int, isa) -> list[tuple[int, int, int]]:
        got = _sum_pieces(chunks(n, isa.widths("f32")), isa.mask_registers)
        assert sum(c.count for c in got) == n and all(0 < c.count <= c.width for c in got)
        return [(c.start, c.width, c.count) for c in got]

    assert pieces(13, AVX512) == [(0, 8, 8), (8, 8, 5)]
    assert pieces(100, AVX512) == [(16 * i, 16, 16) for i in range(6)] + [(96, 16, 4)]
    assert pieces(3, AVX512) == [(0, 4, 3)]
    # the rest already one masked vector of the widest width: nothing after it (there
    # was a third piece of -1 lanes at 8, a masked load of nothing past the row)
    assert pieces(7, AVX512) == [(0, 4, 4), (4, 4, 3)]
    assert pieces(6, AVX512) == [(0, 4, 4), (4, 4, 2)]
    for isa in (AVX512, AVX2):
        for n in range(1, 70):
            pieces(n, isa)
    assert pieces(13, AVX2) == [(0, 8, 8), (8, 4, 4), (12, 4, 1)]
    assert pieces(10, AVX2) == [(0, 8, 8), (8, 8, 2)]
    assert pieces(16, AVX2) == [(0, 8, 8), (8, 8, 8)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_planner_sums_each_gesummv_row_once(dtype):
    """y = alpha*A*x + beta*B*x, 16 x 4: one transpose-and-add per vector of rows stored,
    not two, in every index form (fused: one_sum joins the two sums; x scaled once: one
    merged sum; the scalars on x in place: one_sum joins them)."""
    decls = PROGRAMS[2][1](16, 4, dtype)
    p = plan(PROGRAMS[2][0], target="avx2", **decls)
    all_forms = forms(p.typed)
    assert len(all_forms) == 3 and p.indexed in all_forms
    for form in all_forms:
        module = build_module(form, p.specs, choose(form, p.specs, AVX2), AVX2, "pk")
        stores_of_y = [s for s in nodes_of(module, k.Store) if s.buf == "y"]
        sums = nodes_of(module, k.SumLanes)
        assert len(sums) == len(stores_of_y) and sum(e.lanes for e in sums) == 16
