"""Four rows per vector (``OpSchedule.quads``): where every sum on the lanes is a quarter
of a vector long (rows of 4 f32 on AVX-512), rows i..i+3 of A in one 512-bit load, x in
all four quarters, and sixteen rows' sums stored as one vector (``SumLanes`` of four
vectors); fewer rows (a multiple of four) in one masked store.

* the IR pieces: ``SumLanes`` of n/4 vectors, ``quartered``, and the pass that joins
  quartered rows, padding a short group with zero vectors for a masked store;
* the candidates appear only where they apply, and refused layouts are refused;
* every quads candidate of several programs, over row counts 4-40, through the
  interpreter on buffers with no slack (a read or write outside an operand raises);
* compiled by gcc (``-std=c99 -Wall -Wextra -Werror``) and, on a CPU with AVX-512, run
  on operands that touch guard pages;
* the plan cache keeps the field, and the model takes quads where they pay;
* C = A*B with C n x 4: A[i..i+3, k] splatted in the quarters by one permute of A's
  four rows, which one or two vectors hold (``Permute``).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import interp
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.runtime import plan_cache
from blacc.target.isa import AVX2, AVX512, requested_isa
from blacc.target.machine import detect_machine
from blacc.transform.blac import OpSchedule, build_module, candidates
from blacc.transform.index_notation import forms
from blacc.transform.sum_lanes import batch_row_sums
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import candidate_modules, check_guarded
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector

# ----------------------------------------------------------------------------- IR


def _quarter_rows(acc: k.Var) -> list[k.Expr]:
    return [k.Half(k.Half(acc, h // 2), h % 2) for h in range(4)]


def test_sum_lanes_of_quarters():
    x = k.Load("x", k.Const(0), "f32", 16)
    node = k.SumLanes((x,) * 4)
    assert node.lanes == 16 and node.rows_per_vector == 4
    with pytest.raises(ValueError, match="SumLanes"):
        k.SumLanes((x,) * 3)
    values = np.arange(64, dtype=np.float32) / 8
    xs = tuple(k.Load("x", k.Const(16 * r), "f32", 16) for r in range(4))
    body = (k.Store("out", k.Const(0), k.SumLanes(xs)),)
    params = (k.Param("x", "f32", pointer=True, const=True), k.Param("out", "f32", pointer=True))
    out = np.zeros(16, np.float32)
    interp.run(k.Module((k.Function("f", params, body, exported=True),), "f"),
               {"x": values, "out": out})
    np.testing.assert_allclose(out, values.reshape(16, 4).sum(axis=1))


def test_quartered_load_is_found_only_for_one_load_four_times():
    row = k.Load("x", k.Const(0), "f32", 4)
    assert k.quartered(row).lanes == 16
    assert k.quartered_load(k.quartered(row)) == row
    assert k.quartered_load(k.Halves(row, row)) is None
    other = k.Load("x", k.Const(4), "f32", 4)
    assert k.quartered_load(k.Halves(k.Halves(row, row), k.Halves(other, other))) is None
    masked = k.Load("x", k.Const(0), "f32", 4, k.Const(3))
    assert k.quartered_load(k.quartered(masked)) is None
    assert "_mm512_broadcast_f32x4" in AVX512.op("quad_load", "f32")


def _quad_stores(nrows: int) -> tuple[k.Stmt, ...]:
    """acc_q = x[16q : 16q + 16]; y[r] = hsum(quarter r % 4 of acc_{r // 4})."""
    out: list[k.Stmt] = []
    for q in range(-(-nrows // 4)):
        acc = k.Var(f"acc{q}", "f32", 16)
        out.append(k.Decl(acc, k.Load("x", k.Const(16 * q), "f32", 16)))
        for h, part in enumerate(_quarter_rows(acc)):
            if 4 * q + h < nrows:
                out.append(k.Store("y", k.Const(4 * q + h), k.Reduce(part)))
    return tuple(out)


@pytest.mark.parametrize("nrows", [4, 8, 12, 16, 20, 32])
def test_pass_joins_quartered_rows(nrows):
    body = batch_row_sums(_quad_stores(nrows), AVX512)
    stores = [s for s in body if isinstance(s, k.Store)]
    full, rest = divmod(nrows, 16)
    assert [(int(s.index.value), s.value.lanes, s.count) for s in stores] == (
        [(16 * g, 16, None) for g in range(full)]
        + ([(16 * full, 16, k.Const(rest))] if rest else []))
    assert all(isinstance(s.value, k.SumLanes) and s.value.rows_per_vector == 4
               for s in stores)
    params = (k.Param("x", "f32", pointer=True, const=True), k.Param("y", "f32", pointer=True))
    x = (np.arange(64 * 2, dtype=np.float32) % 11) / 4
    y = np.full(nrows, -1.0, np.float32)
    interp.run(k.Module((k.Function("f", params, body, exported=True),), "f"), {"x": x, "y": y})
    np.testing.assert_allclose(y, x[:4 * nrows].reshape(nrows, 4).sum(axis=1))


def test_pass_joins_whole_quads_and_sums_the_rest_in_part():
    # of 6 rows the first four join (a masked store of a full vector) and the two left
    # are summed in part of a vector of four (rows of four lanes)
    stores = [s for s in batch_row_sums(_quad_stores(6), AVX512) if isinstance(s, k.Store)]
    assert [(s.value.lanes, s.count) for s in stores] == [(16, k.Const(4)), (4, k.Const(2))]
    assert stores[1].value.rows_per_vector == 1


# ----------------------------------------------------------------------------- candidates


def _quads(source: str, isa, **decls) -> list[OpSchedule]:
    p = plan(source, target=isa.name, **decls)
    return [s for op in p.indexed.ops for s in candidates(p.indexed, op, isa) if s.quads]


def test_quads_only_where_they_apply():
    rows4 = dict(A=M(20, 4, "f32"), x=V(4, "f32"), y=V(20, "f32"))
    assert {s.block for s in _quads("y = A*x", AVX512, **rows4)} == {(16, 1), (20, 1)}
    assert not _quads("y = A*x", AVX2, **rows4)  # rows of 4 are half an AVX2 vector
    f64 = dict(A=M(20, 4, "f64"), x=V(4, "f64"), y=V(20, "f64"))
    assert not _quads("y = A*x", AVX512, **f64)  # rows of 4 f64 are half a vector
    rows8 = dict(A=M(20, 8, "f32"), x=V(8, "f32"), y=V(20, "f32"))
    assert not _quads("y = A*x", AVX512, **rows8)
    three = dict(A=M(3, 4, "f32"), x=V(4, "f32"), y=V(3, "f32"))
    assert not _quads("y = A*x", AVX512, **three)  # not four rows
    matrix = dict(A=M(20, 4, "f32"), B=M(4, 2, "f32"), C=M(20, 2, "f32"))
    assert not _quads("C = A*B", AVX512, **matrix)  # the output is not a column


def test_quads_refuse_layouts_they_cannot_take():
    decls = dict(A=M(16, 4, "f32"), x=V(4, "f32"), y=V(16, "f32"))
    p = plan("y = A*x", target="avx512", **decls)
    v = _quads("y = A*x", AVX512, **decls)[0].vector  # the index of the sum
    with pytest.raises(ScheduleError, match="pairs or in quads"):
        build_module(p.indexed, p.specs, (OpSchedule(v, (16, 1), pairs=True, quads=True),),
                     AVX512, "x")
    with pytest.raises(ScheduleError, match="four rows per vector need sums"):
        build_module(p.indexed, p.specs, (OpSchedule(v, (16, 1), quads=True),), AVX2, "x")
    out = plan("C = A*B", target="avx512", A=M(16, 4, "f32"), B=M(4, 16, "f32"),
               C=M(16, 16, "f32"))
    with pytest.raises(ScheduleError, match="four rows per vector need 4 columns"):
        build_module(out.indexed, out.specs, (OpSchedule("j", (4, 1), quads=True),), AVX512,
                     "x")
    # rows of A 8 elements apart (a leading dimension): not one load of four rows
    spaced = tuple(replace(s, ld=8) if s.name == "A" else s for s in p.specs)
    with pytest.raises(ScheduleError, match="one after another"):
        build_module(p.indexed, spaced, (OpSchedule(v, (16, 1), quads=True),), AVX512, "x")
    # x + z fused into the product: computed, not loaded into every quarter
    plus = dict(A=M(16, 4, "f32"), x=V(4, "f32"), z=V(4, "f32"), y=V(16, "f32"))
    q = plan("y = A*(x + z)", target="avx512", **plus)
    fused = next(f for f in forms(q.typed) if len(f.ops) == 1)
    quads = [s for s in candidates(fused, fused.ops[0], AVX512) if s.quads]
    with pytest.raises(ScheduleError, match="only as it is loaded"):
        build_module(fused, q.specs, (quads[0],), AVX512, "x")
    # A'*x: the rows of A' are columns of A, their elements not next to each other
    at = plan("y = A'*x", target="avx512", A=M(4, 16, "f32"), x=V(4, "f32"), y=V(16, "f32"))
    op = at.indexed.ops[0]
    on_sum = next(s.vector for s in candidates(at.indexed, op, AVX512)
                  if s.vector and s.vector not in op.dims)
    with pytest.raises(ScheduleError, match="unit stride"):
        build_module(at.indexed, at.specs, (OpSchedule(on_sum, (16, 1), quads=True),),
                     AVX512, "x")


#: name -> (source, declarations from the row count n): rows of 4 f32.
PROGRAMS = {
    "ax": ("y = A*x", lambda n: dict(A=M(n, 4, "f32"), x=V(4, "f32"), y=V(n, "f32"))),
    "gemv": ("y = alpha*A*x + beta*y", lambda n: dict(
        A=M(n, 4, "f32"), x=V(4, "f32"), y=V(n, "f32"), alpha=S("f32"), beta=S("f32"))),
    "gesummv": ("y = alpha*A*x + beta*B*x", lambda n: dict(
        A=M(n, 4, "f32"), B=M(n, 4, "f32"), x=V(4, "f32"), y=V(n, "f32"), alpha=S("f32"),
        beta=S("f32"))),
    "plus": ("y = A*x + 2*z", lambda n: dict(A=M(n, 4, "f32"), x=V(4, "f32"), z=V(n, "f32"),
                                             y=V(n, "f32"))),
}
ROWS = (4, 5, 8, 12, 16, 17, 20, 23, 28, 32, 36, 40)
INTERP_CASES = [(name, n) for name in PROGRAMS for n in ROWS]


def _quad_modules(p) -> list[tuple[tuple[OpSchedule, ...], k.Module]]:
    """Every quads candidate of ``p`` with its module; each must build."""
    out = candidate_modules(p, AVX512, lambda s: s.quads)
    assert all(module is not None for _, module in out), out
    return out


@pytest.mark.parametrize(("name", "n"), INTERP_CASES, ids=[f"{a}-{n}" for a, n in INTERP_CASES])
def test_every_quads_candidate_in_the_interpreter(name, n):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n)
    p = plan(source, target="avx512", **decls)
    values = make_values(decls, "f32", np.random.default_rng(seed_of("quads", name, n)))
    modules = _quad_modules(p)
    assert modules, "no quads schedule"
    for schedule, module in modules:
        assert nodes_of(module, k.SumLanes) or n % 4, schedule
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{name} {n} {schedule}")


# ----------------------------------------------------------------------------- compiled

COMPILED_CASES = [("ax", 16), ("ax", 23), ("gemv", 36), ("gesummv", 100), ("gesummv", 12)]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "n"), COMPILED_CASES,
                         ids=[f"{a}-{n}" for a, n in COMPILED_CASES])
def test_quads_compiled_against_guard_pages(tmp_path, name, n):
    """Every quads candidate, compiled by gcc (always) and run where the CPU has AVX-512,
    on operands that touch guard pages."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n)
    p = plan(source, target="avx512", **decls)
    fns = []
    for i, (schedule, module) in enumerate(_quad_modules(p)):
        text = c_backend.render(module, AVX512)
        assert "blacc_sum16x4_ps(" in text and "_mm512_broadcast_f32x4(" in text
        fn = _compiled(module, AVX512, tmp_path / f"q{i}")
        fns.append((schedule, "c", fn))
    assert fns
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    values = make_values(decls, "f32", np.random.default_rng(seed_of("qg", name, n)))
    check_guarded(fns, p, values, f"{name} {n}")


# ----------------------------------------------------------------------------- choice


def test_plan_cache_keeps_quads():
    choice = (1, (OpSchedule(None, (1, 1)), OpSchedule("k1", (32, 1), quads=True)))
    assert plan_cache._decode(json.loads(plan_cache._encode(choice))) == choice
    old = json.loads(plan_cache._encode(choice))
    del old["schedules"][1]["quads"]  # an entry from before the field: planned again
    assert plan_cache._decode(old) is None


@pytest.mark.parametrize("n", [64, 100])
def test_the_model_takes_quads_for_two_matrix_vector_products(n):
    """y = alpha*A*x + beta*B*x, A and B n x 4 f32, on AVX-512: four rows per vector, and
    AVX-512 over AVX2 (1.5x as fast on a Xeon at n = 64-100). Zen 4, whose 512-bit
    instructions take its 256-bit pipes twice, is modelled to tie and keeps AVX2 (it ran
    0.90x the AVX-512 kernel there at n = 64: a miss of the model)."""
    source, decls_of = PROGRAMS["gesummv"]
    p = plan(source, target="avx512", **decls_of(n))
    assert p.schedule[-1].quads, p.schedule
    full_width = detect_machine().vector_datapath == 0
    if NATIVE["avx512"] and not requested_isa() and full_width:
        assert plan(source, target="host", **decls_of(n)).isa is AVX512


# ----------------------------------------------------------------------------- A's rows
# in two vectors: C = A*B with C n x 4, A[i..i+3, k] each splatted in its quarter by one
# permute of the four rows (two sources where they take more than one vector)

#: (rows, columns, leading dimension) of A (f32) in C = A*B, B columns x 4
SPREAD_ROWS = ((4, 8, 8), (4, 5, 5), (4, 3, 3), (4, 6, 7), (8, 8, 8), (5, 7, 7), (13, 6, 6))


@pytest.mark.parametrize(("m", "kk", "ld"), SPREAD_ROWS,
                         ids=[f"{m}x{kk}-ld{ld}" for m, kk, ld in SPREAD_ROWS])
def test_quads_read_four_rows_of_a_by_permutes(tmp_path, m, kk, ld):
    """The quads candidates with the lanes along C's rows build, with permutes of A's rows
    (the second vector masked where the rows end inside it), and agree with NumPy in the
    interpreter on buffers with no slack; compiled by gcc, and run against guard pages
    on AVX-512."""
    decls = dict(A=M(m, kk, "f32", ld=ld), B=M(kk, 4, "f32"), C=M(m, 4, "f32"))
    p = plan("C = A*B", target="avx512", **decls)
    values = make_values(decls, "f32", np.random.default_rng(seed_of("rows", m, kk, ld)))
    modules = candidate_modules(p, AVX512, lambda s: s.quads and s.vector == "j")
    assert modules and all(module is not None for _, module in modules), modules
    fns = []
    for i, (schedule, module) in enumerate(modules):
        permutes = nodes_of(module, k.Permute)
        assert permutes and all((e.y is not None) == (3 * ld + kk > 16) for e in permutes)
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{m}x{kk} ld {ld} {schedule}")
        if CC is not None:
            fns.append((schedule, "c", _compiled(module, AVX512, tmp_path / f"r{i}")))
    if fns and NATIVE["avx512"]:
        check_guarded(fns, p, values, f"{m}x{kk} ld {ld}")


def test_quads_refuse_rows_that_two_vectors_do_not_hold():
    """A 4 x 8 with rows 9 apart spans 35 elements: more than two 512-bit vectors."""
    decls = dict(A=M(4, 8, "f32", ld=9), B=M(8, 4, "f32"), C=M(4, 4, "f32"))
    p = plan("C = A*B", target="avx512", **decls)
    with pytest.raises(ScheduleError, match="rows that two vectors hold"):
        build_module(p.indexed, p.specs, (OpSchedule("j", (4, 1), quads=True),), AVX512,
                     "x")


def test_the_model_takes_quads_for_a_4x8x4_product():
    """C = A*B 4 x 8 x 4 f32 on AVX-512: C's rows in the quarters of one vector, eight
    FMAs, A[0..3, k] by one vpermt2ps each, as gcc's loops do (the sums folded into the
    parts of vectors before: 2.63-2.65 ns a call against 2.38-2.40 in a scratch C loop on
    Zen 5; the loops 2.37-2.41)."""
    p = plan("C = A*B", target="avx512", A=M(4, 8, "f32"), B=M(8, 4, "f32"),
             C=M(4, 4, "f32"))
    assert p.schedule[0].quads, p.schedule
    assert p.source.count("_mm512_permutex2var_ps(") == 8
