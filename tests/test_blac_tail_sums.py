"""Columns after the exact vectors as sums on lanes (``OpSchedule.tail_sums``): C = A*B
9 x 9 x 9 f64 on AVX-512 computes columns 0-7 as one 512-bit vector per row and the
ninth as a dot product per row, A's row against B's ninth column, gathered once
(``BuildVector``) for every row of a block.

* the node itself: checked, printed, interpreted, rendered as ``setr`` in C;
* the schedule is a candidate only where a scalar or masked piece is left after exact
  vectors and every sum (over one index) is at least a vector long;
* the layouts it cannot take (an operand read at a stride that depends on the row) and
  the combinations it is not (with one masked tail, or with nothing left) are refused;
* every tail-sums candidate of several programs, over sizes with and without loops over
  rows and over the sum, through the interpreter on buffers with no slack;
* compiled by gcc (``-std=c99 -Wall -Wextra -Werror``) and, on a CPU with AVX-512, run
  with it and the LLVM JIT on operands that touch guard pages;
* its choice survives the plan cache, and the model takes it for 9 x 9 x 9 f64.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import interp
from blacc.ir import kernel as k
from blacc.ir.printer import expr as print_expr
from blacc.ir.walk import nodes_of
from blacc.runtime import plan_cache
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import OpSchedule, build_module, candidates
from test_blac_columns import CC
from test_blac_one_tail import first_and_last_compiled
from test_blac_pairs import candidate_modules, check_guarded
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, S = blacc.Matrix, blacc.Scalar


# ----------------------------------------------------------------------------- the node


def _column(buf: str, start: int, stride: int, count: int, lanes: int, dtype="f64"):
    return k.BuildVector(tuple(k.Load(buf, k.Const(start + i * stride), dtype)
                               if i < count else k.Const(0.0, dtype)
                               for i in range(lanes)))


def test_build_vector_is_checked_printed_and_interpreted():
    v = _column("B", 8, 9, 3, 4)
    assert (v.lanes, v.dtype) == (4, "f64")
    assert print_expr(v) == "vector(B[8], B[17], B[26], 0.0)"
    env = interp._Env(k.Module((), entry=""), {"B": np.arange(40, dtype=np.float64)})
    np.testing.assert_array_equal(interp.evaluate(v, env), [8.0, 17.0, 26.0, 0.0])
    with pytest.raises(ValueError, match="2, 4, 8"):
        k.BuildVector((k.Const(1.0, "f64"),) * 3)
    with pytest.raises(ValueError, match="scalars of one type"):
        k.BuildVector((k.Const(1.0, "f64"), k.Const(1.0, "f32")))


@pytest.mark.parametrize(("isa", "dtype", "lanes", "intrinsic"), [
    (AVX512, "f64", 8, "_mm512_setr_pd"), (AVX512, "f32", 16, "_mm512_setr_ps"),
    (AVX512, "f64", 2, "_mm_setr_pd"), (AVX2, "f32", 8, "_mm256_setr_ps"),
    (AVX2, "f64", 4, "_mm256_setr_pd"), (AVX2, "f32", 4, "_mm_setr_ps")])
def test_build_vector_renders_as_setr(isa, dtype, lanes, intrinsic):
    got = c_backend._Renderer(isa).expr(_column("B", 1, 5, 1, lanes, dtype))
    assert got.startswith(f"{intrinsic}(B[1], 0.0"), got


# ----------------------------------------------------------------------------- candidates


def _sums(source: str, isa, **decls) -> list[OpSchedule]:
    """The tail-sums candidates with the lanes along C's rows."""
    p = plan(source, target=isa.name, **decls)
    return [s for op in p.indexed.ops for s in candidates(p.indexed, op, isa)
            if s.tail_sums and s.vector == op.dims[1]]


def test_tail_sums_candidates_only_where_they_apply():
    def mm(m, kk, n, dt="f64"):
        return dict(A=M(m, kk, dt), B=M(kk, n, dt), C=M(m, n, dt))

    assert _sums("C = A*B", AVX512, **mm(9, 9, 9))  # 8 + 1 columns, k 9
    assert _sums("C = A*B", AVX2, **mm(3, 4, 5))  # 4 + 1, k a vector
    assert _sums("C = A*B", AVX512, **mm(3, 16, 10, "f32"))  # 8 + 2 of 4
    assert not _sums("C = A*B", AVX512, **mm(9, 8, 8))  # no columns left
    assert not _sums("C = A*B", AVX512, **mm(9, 9, 12))  # 8 + 4: exact vectors
    assert not _sums("C = A*B", AVX512, **mm(9, 7, 9))  # k shorter than a vector
    assert not _sums("C = A*B", AVX512, **mm(5, 15, 9, "f32"))


def test_tail_sums_refuse_what_they_cannot_take():
    p = plan("C = A*B", target="avx512", A=M(9, 9), B=M(9, 8), C=M(9, 8))
    with pytest.raises(ScheduleError, match="no columns of C after exact vectors"):
        build_module(p.indexed, p.specs, (OpSchedule("j", (9, 1), tail_sums=True),),
                     AVX512, "x")
    p = plan("C = A*B", target="avx512", A=M(9, 9), B=M(9, 9), C=M(9, 9))
    with pytest.raises(ScheduleError, match="no other to mask"):
        build_module(p.indexed, p.specs,
                     (OpSchedule("j", (9, 1), one_tail=True, tail_sums=True),), AVX512, "x")
    with pytest.raises(ScheduleError, match="columns summed on lanes needs C contiguous"):
        build_module(p.indexed, p.specs, (OpSchedule(p.indexed.ops[0].dims[0], (9, 1),
                                                     tail_sums=True),), AVX512, "x")
    # A' read down its columns for each row of C: a stride that changes with the row
    p = plan("C = A'*B", target="avx512", A=M(9, 9), B=M(9, 9), C=M(9, 9))
    op = p.indexed.ops[0]
    v = op.dims[1]
    with pytest.raises(ScheduleError, match="needs unit stride in A"):
        build_module(p.indexed, p.specs, (OpSchedule(v, (9, 1), tail_sums=True),),
                     AVX512, "x")


# ----------------------------------------------------------------------------- interpreter

#: name -> (source, declarations from (m, k, n, dtype))
PROGRAMS = {
    "matmul": ("C = A*B", lambda m, kk, n, dt: dict(A=M(m, kk, dt), B=M(kk, n, dt),
                                                    C=M(m, n, dt))),
    "gemm": ("C = alpha*A*B + beta*C", lambda m, kk, n, dt: dict(
        A=M(m, kk, dt), B=M(kk, n, dt), C=M(m, n, dt), alpha=S(dt), beta=S(dt))),
    "padded": ("C = A*B", lambda m, kk, n, dt: dict(
        A=M(m, kk, dt, ld=kk + 3), B=M(kk, n, dt, ld=n + 2), C=M(m, n, dt, ld=n + 1))),
    "minus": ("C = A*B - D", lambda m, kk, n, dt: dict(
        A=M(m, kk, dt), B=M(kk, n, dt), D=M(m, n, dt), C=M(m, n, dt))),
    "two_sums": ("C = A*B + D*E", lambda m, kk, n, dt: dict(  # sums of k and 2k terms
        A=M(m, kk, dt), B=M(kk, n, dt), D=M(m, 2 * kk, dt), E=M(2 * kk, n, dt),
        C=M(m, n, dt))),
    "two_statements": ("T = A*B; C = T + 2*D", lambda m, kk, n, dt: dict(
        A=M(m, kk, dt), B=M(kk, n, dt), D=M(m, n, dt), T=M(m, n, dt), C=M(m, n, dt))),
}
#: (m, k, n): one row, rows in a loop (40 > the unroll), a sum looped over (k 40),
#: masked last pieces of the sum, one or several columns left
SHAPES = {"f64": ((9, 9, 9), (1, 8, 9), (40, 11, 5), (7, 40, 17), (3, 17, 11)),
          "f32": ((9, 17, 17), (1, 16, 9), (40, 20, 9), (5, 40, 26), (3, 33, 13))}
INTERP_CASES = [(name, shape, dt) for name in PROGRAMS for dt in ("f32", "f64")
                for shape in SHAPES[dt]]


@pytest.mark.parametrize(("name", "shape", "dtype"), INTERP_CASES,
                         ids=[f"{a}-{d}-{'x'.join(map(str, s))}" for a, s, d in INTERP_CASES])
def test_every_tail_sums_candidate_in_the_interpreter(name, shape, dtype):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(*shape, dtype)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("sums", name, shape)))
    built = 0
    for isa in (AVX512, AVX2):
        p = plan(source, target=isa.name, **decls)
        for schedule, module in candidate_modules(p, isa, lambda s: s.tail_sums):
            if module is None:
                continue
            built += 1
            # the columns end in sums (rows of them summed at once where they join)
            assert nodes_of(module, (k.Reduce, k.SumLanes, k.SumRows)), schedule
            got = run_interp(module, p.specs, p.typed, values, slack=0)
            assert_matches(p.typed, values, got, f"{name} {shape} {dtype} {schedule}")
    assert built, "no tail-sums schedule built"


# ----------------------------------------------------------------------------- compiled

COMPILED_CASES = [("matmul", (9, 9, 9), "f64"), ("gemm", (40, 20, 9), "f32"),
                  ("padded", (7, 40, 17), "f64")]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "shape", "dtype"), COMPILED_CASES,
                         ids=[f"{a}-{d}-{'x'.join(map(str, s))}" for a, s, d in COMPILED_CASES])
def test_tail_sums_compiled_against_guard_pages(tmp_path, name, shape, dtype):
    """The first and last tail-sums candidate, compiled by gcc (always) and run with it
    and the LLVM JIT where the CPU has AVX-512, on operands that touch guard pages."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(*shape, dtype)
    p = plan(source, target="avx512", **decls)
    fns = first_and_last_compiled(p, lambda s: s.tail_sums,
                                  lambda module: nodes_of(module, k.BuildVector),
                                  tmp_path / "ts")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("tsg", name, shape)))
    check_guarded(fns, p, values, f"{name} {shape} {dtype}")


# ----------------------------------------------------------------------------- choice


def test_plan_cache_keeps_tail_sums():
    choice = (0, (OpSchedule("j", (9, 1), tail_sums=True),))
    assert plan_cache._decode(json.loads(plan_cache._encode(choice))) == choice
    old = json.loads(plan_cache._encode(choice))
    del old["schedules"][0]["tail_sums"]  # an entry from before the field: planned again
    assert plan_cache._decode(old) is None


def test_the_model_sums_the_ninth_column_of_9x9x9_f64():
    """C = A*B 9 x 9 x 9 f64 on AVX-512: B's ninth column gathered once, each row of A
    against it on 512-bit vectors; no scalar multiply left."""
    decls = dict(A=M(9, 9, "f64"), B=M(9, 9, "f64"), C=M(9, 9, "f64"))
    p = plan("C = A*B", target="avx512", **decls)
    assert p.schedule[0].tail_sums, p.schedule
    gathered = nodes_of(p.module, k.BuildVector)
    assert {(g.lanes, sum(isinstance(x, k.Load) for x in g.xs)) for g in gathered} == {
        (8, 8), (8, 1)}  # B[0:8, 8] and B[8, 8] with zeros
    scalar = [e for e in nodes_of(p.module, (k.Fma, k.Bin))
              if e.lanes == 1 and e.dtype == "f64"]
    assert not scalar
