"""Terms of a sum folded into the parts of vectors (``OpSchedule.folds``): where each
position's vector is a half or a quarter of a full one (a row of 4 f32 of C(4 x 4) =
A(4 x n)*B(n x 4)), two or four terms of the sum at a time, one in each part, the parts
added together at the end.

* every fold candidate of several programs (products with narrow outputs, x'*A*y with A
  n x 4, (A0 + A1)'*B, leading dimensions, a column-major A), over sums that are and are
  not multiples of the parts, long enough to loop, through the interpreter on buffers
  with no slack (a read or write outside an operand raises), on AVX2 and AVX-512;
* the same compiled by gcc (and, without horizontal sums, by the LLVM JIT) and run
  against guard pages where the CPU has the ISA;
* the schedule is refused where nothing folds, or with rows held several to a vector;
* the model takes it for C = A*B, 4 x 32 x 4, and x'*A*y with A 64 x 4.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import OpSchedule, build_module, candidates
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import (
    _llvm_function,
    candidate_modules,
    check_guarded,
    interpret_candidates,
)
from test_blac_programs import make_values, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar

#: name -> (source, declarations for a sum of n terms, an output w wide)
PROGRAMS = {
    "matmul": ("C = A*B", lambda n, w, dt: dict(
        A=M(4, n, dt), B=M(n, w, dt), C=M(4, w, dt))),
    "gemm_ld": ("C = alpha*A*B + beta*C", lambda n, w, dt: dict(
        A=M(3, n, dt, ld=n + 3), B=M(n, w, dt, ld=w + 1), C=M(3, w, dt, ld=w + 2),
        alpha=S(dt), beta=S(dt))),
    "col_a": ("C = A*B + C", lambda n, w, dt: dict(
        A=M(5, n, dt, layout="col", ld=7), B=M(n, w, dt), C=M(5, w, dt))),
    "blinf": ("alpha = x'*A*y", lambda n, w, dt: dict(
        x=V(n, dt), A=M(n, w, dt), y=V(w, dt), alpha=S(dt))),
    "gemam": ("C = alpha*(A0 + A1)'*B + beta*C", lambda n, w, dt: dict(
        A0=M(n, 4, dt), A1=M(n, 4, dt), B=M(n, w, dt), C=M(4, w, dt), alpha=S(dt),
        beta=S(dt))),
}
#: (ISA, dtype, output width): a half or a quarter of a vector
WIDTHS = [(AVX2, "f32", 4), (AVX2, "f64", 2), (AVX512, "f32", 4), (AVX512, "f32", 8),
          (AVX512, "f64", 4), (AVX512, "f64", 2)]
TERMS = (1, 2, 3, 5, 8, 13, 37)
INTERP_CASES = [(name, isa, dt, w, n) for name in PROGRAMS for isa, dt, w in WIDTHS
                for n in TERMS]


def _folds(s: OpSchedule) -> bool:
    return s.folds


@pytest.mark.parametrize(("name", "isa", "dtype", "w", "n"), INTERP_CASES,
                         ids=[f"{a}-{i.name}-{d}-{w}-{n}" for a, i, d, w, n in INTERP_CASES])
def test_every_candidate_in_the_interpreter(name, isa, dtype, w, n):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n, w, dtype)
    p = plan(source, target=isa.name, **decls)
    values = make_values(decls, dtype,
                         np.random.default_rng(seed_of("folds", name, isa.name, w, n, dtype)))
    built = interpret_candidates(p, isa, _folds, values, f"{name} {isa.name} {n} {dtype}")
    # a sum of at least a vector's parts folds, but for (A0 + A1)' where the parts of
    # a row of A0 are neither a group of its rows nor side by side (C 4 x 8 f32, 4 x 2
    # f64 on AVX-512)
    parts = isa.lanes(dtype) // w
    if n >= parts and (name in ("matmul", "blinf") or name == "gemam" and w == 4):
        assert built, "no candidate folds"


def test_folds_in_the_lowered_code():
    """C = A*B, 4 x 13 x 4 f32 on AVX-512: three groups of four terms in 512-bit FMAs
    (rows of B one load, A's elements spread), the thirteenth on 128 bits, and each
    row's quarters added together."""
    p = plan("C = A*B", target="avx512", A=M(4, 13, "f32"), B=M(13, 4, "f32"),
             C=M(4, 4, "f32"))
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (4, 1), folds=True),),
                          AVX512, "k")
    body = module.function("k").body
    spreads = list(nodes_of(body, k.Spread))
    assert len(spreads) == 4 * 3 and all(s.parts == 4 for s in spreads)
    fmas = nodes_of(body, k.Fma) + [e for e in nodes_of(body, k.Bin) if e.op == "*"]
    assert sorted({e.lanes for e in fmas}) == [4, 16]
    assert sum(e.lanes == 16 for e in fmas) == 12
    assert {s.value.lanes for s in nodes_of(body, k.Store)} == {4}


def test_refused_where_nothing_folds():
    wide = plan("C = A*B", target="avx512", A=M(4, 8, "f32"), B=M(8, 16, "f32"),
                C=M(4, 16, "f32"))
    with pytest.raises(ScheduleError, match="no sum of C has terms to fold"):
        build_module(wide.indexed, wide.specs, (OpSchedule("j", (4, 1), folds=True),),
                     AVX512, "k")
    assert not any(module for _, module in candidate_modules(wide, AVX512, _folds))
    narrow = plan("C = A*B", target="avx512", A=M(4, 16, "f32"), B=M(16, 4, "f32"),
                  C=M(4, 4, "f32"))
    with pytest.raises(ScheduleError, match="take the whole vector"):
        build_module(narrow.indexed, narrow.specs,
                     (OpSchedule("j", (4, 1), folds=True, quads=True),), AVX512, "k")
    offered = {(s.block, s.split) for s in
               candidates(narrow.indexed, narrow.indexed.ops[0], AVX512) if s.folds}
    # two partial chains where each has at least two groups of four terms
    assert ((4, 1), 1) in offered and ((1, 1), 2) in offered and ((1, 1), 4) not in offered


COMPILED_CASES = [("matmul", AVX2, "f32", 4, 13), ("matmul", AVX512, "f32", 4, 37),
                  ("matmul", AVX512, "f32", 8, 9), ("blinf", AVX512, "f64", 2, 11),
                  ("matmul", AVX2, "f64", 2, 37), ("matmul", AVX512, "f64", 4, 5),
                  ("gemm_ld", AVX2, "f32", 4, 11), ("gemm_ld", AVX512, "f64", 4, 9),
                  ("col_a", AVX2, "f64", 2, 7), ("blinf", AVX512, "f32", 4, 37),
                  ("blinf", AVX2, "f64", 2, 64), ("gemam", AVX512, "f32", 4, 13),
                  ("gemam", AVX2, "f32", 4, 19)]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "isa", "dtype", "w", "n"), COMPILED_CASES,
                         ids=[f"{a}-{i.name}-{d}-{w}-{n}" for a, i, d, w, n in COMPILED_CASES])
def test_compiled_against_guard_pages(tmp_path, name, isa, dtype, w, n):
    """Each fold candidate compiled by gcc (always) and run, where the CPU has the ISA,
    on operands that touch guard pages."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n, w, dtype)
    p = plan(source, target=isa.name, **decls)
    built = [(schedule, module) for schedule, module in candidate_modules(p, isa, _folds)
             if module is not None]
    fns = [(schedule, "c", _compiled(module, isa, tmp_path / f"f{i}"))
           for i, (schedule, module) in enumerate(built)]
    assert fns
    if not NATIVE[isa.name]:
        pytest.skip(f"compiled only: this CPU cannot run {isa.name}")
    # (the LLVM backend has no horizontal sums and no stack temporaries)
    fns += [(schedule, "llvm", _llvm_function(module, isa)) for schedule, module in built
            if not nodes_of(module, (k.Reduce, k.SumLanes, k.SumRows, k.Local))]
    values = make_values(decls, dtype,
                         np.random.default_rng(seed_of("folds-pg", name, n, dtype)))
    check_guarded(fns, p, values, f"{name} {isa.name} {n} {dtype}")


@pytest.mark.parametrize(("source", "decls"), [
    ("C = A*B", dict(A=M(4, 32, "f32"), B=M(32, 4, "f32"), C=M(4, 4, "f32"))),
    ("alpha = x'*A*y", dict(x=V(64, "f32"), A=M(64, 4, "f32"), y=V(4, "f32"),
                            alpha=S("f32"))),
    *(("C = alpha*(A0 + A1)'*B + beta*C", PROGRAMS["gemam"][1](16, 4, dt))
      for dt in ("f32", "f64")),
], ids=["4x32x4", "blinf-64x4", "gemam-4x16x4-f32", "gemam-4x16x4-f64"])
def test_the_model_folds_long_sums_into_narrow_outputs(source, decls):
    """On AVX-512 a row of 4 f32 is a quarter of a vector and a row of 4 f64 a half:
    four or two terms per FMA, and a quarter or a half of the chain of dependent FMAs.
    Zen 5, the LGen harness: C = A*B 4 x 32 x 4 f32 17.9 ns with rows held two to a
    256-bit vector, 6.7 folded; x'*A*y, A 64 x 4 f32, 15.5 and 4.2; C = alpha*(A0 +
    A1)'*B + beta*C 4 x 16 x 4 f32 10.3 with C's rows four to a vector, A0 and A1 spread
    (``k.Spread``), 5.1 folded."""
    p = plan(source, target="avx512", **decls)
    assert any(s.folds for s in p.schedule), p.schedule


@pytest.mark.parametrize(("source", "decls"), [
    # four rows of A' one after another, each splatted within a quarter of the vector:
    # one vpermilps for f32, no instruction for f64 pairs
    ("C = A*A'", dict(A=M(2, 12, "f32", layout="col"), C=M(2, 2, "f32"))),
    ("C = A*A'", dict(A=M(2, 12, "f64", layout="col"), C=M(2, 2, "f64"))),
    # two rows of M 8 f32 apart (ld 11) joined into one 512-bit vector: no instruction
    # on AVX-512 here (two rows per vector are not offered there for f32)
    ("s = (x'*M)*y + s", dict(x=V(12, "f32"), M=M(12, 8, "f32", ld=11), y=V(8, "f32"),
                             s=S("f32"))),
])
def test_every_candidate_renders_for_avx512(source, decls):
    """Candidates that folded sums built with operations AVX-512 lacks for their dtype
    and failed to render as C, a KeyError where a measuring search compiled them (found
    by tests/fuzz.py and by rendering every candidate of random programs). Every
    candidate renders and agrees with NumPy."""
    from blacc.backend import c as c_backend

    dtype = next(iter(decls.values())).dtype
    p = plan(source, target="avx512", **decls)
    built = [m for _, m in candidate_modules(p, AVX512, lambda s: True) if m is not None]
    assert built
    for module in built:
        c_backend.render(module, AVX512)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("renders", source)))
    interpret_candidates(p, AVX512, lambda s: True, values, source)
