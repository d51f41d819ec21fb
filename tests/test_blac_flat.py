"""Small matrix outputs held as one flat vector (``OpSchedule.flat``, ``transform.flat``):
where the candidate is offered, what it builds (broadcasts, plain loads, permutes of
operands held once, sums of operands read alike permuted once), and that every flat
candidate agrees with NumPy, interpreted on buffers with no slack and compiled against
guard pages."""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import OpSchedule, build_module, candidates
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import candidate_modules, check_guarded, interpret_candidates
from test_blac_programs import make_values, seed_of

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector


def _flat_offered(source: str, isa, **decls) -> bool:
    p = plan(source, target="avx512", **decls)
    return any(s.flat for op in p.indexed.ops for s in candidates(p.indexed, op, isa))


def test_offered_for_small_updates_in_place_with_permutes():
    three = dict(A=M(3, 3, "f32"), B=M(3, 3, "f32"), C=M(3, 3, "f32"))
    assert _flat_offered("C = A*B + C", AVX512, **three)
    assert not _flat_offered("C = A*B", AVX512, **three)  # C only written
    assert not _flat_offered("C = A*B + C", AVX2, **three)  # no permutes
    assert not _flat_offered("y = A*x + y", AVX512, A=M(3, 3, "f32"), x=V(3, "f32"),
                             y=V(3, "f32"))  # a vector: already one row of lanes
    six = dict(A=M(6, 6, "f32"), B=M(6, 6, "f32"), C=M(6, 6, "f32"))
    assert not _flat_offered("C = A*B + C", AVX512, **six)  # 36 elements: three vectors
    assert _flat_offered("C = A*B + C", AVX512, A=M(4, 5, "f64"), B=M(5, 4, "f64"),
                         C=M(4, 4, "f64"))


def test_an_output_with_gaps_is_refused():
    decls = dict(A=M(3, 3, "f32"), B=M(3, 3, "f32"), C=M(3, 3, "f32", ld=4))
    p = plan("C = A*B + C", target="avx512", **decls)
    with pytest.raises(ScheduleError, match="contiguous"):
        build_module(p.indexed, p.specs, (OpSchedule("j", flat=True),), AVX512, "k")
    with pytest.raises(ScheduleError, match="flat output"):
        build_module(p.indexed, p.specs, (OpSchedule("j", (2, 1), flat=True),), AVX512, "k")


def test_the_update_of_a_3x3_sum_is_six_permutes():
    """C = alpha*(A0 + A1)'*B + beta*C, 3 x 3 f32: A0 + A1 added where both are held
    (one masked load each) and permuted once per term, B permuted once per term, C's
    first eight lanes one vector and the ninth a scalar; the model takes it."""
    decls = dict(alpha=S("f32"), A0=M(3, 3, "f32"), A1=M(3, 3, "f32"), B=M(3, 3, "f32"),
                 beta=S("f32"), C=M(3, 3, "f32"))
    p = plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx512", **decls)
    assert [s.flat for s in p.schedule] == [True]
    permutes = nodes_of(p.module, k.Permute)
    assert len(set(permutes)) == 6 and all(x.lanes == 8 and x.y is None for x in permutes)
    held = [s for s in nodes_of(p.module, k.Decl) if s.var.name.startswith("s0_flat")]
    assert len(held) == 2 and isinstance(held[0].value, k.Bin)
    stores = nodes_of(p.module, k.Store)
    assert sorted((s.index.value, s.value.lanes) for s in stores) == [(0, 8), (8, 1)]


@pytest.mark.parametrize(("dtype", "loads"), [("f32", "quad_load"), ("f64", "dup_load")])
def test_rows_repeated_in_parts_of_the_vector_are_loaded_into_them(dtype, loads):
    """C = alpha*(A0 + A1)'*B + beta*C 4 x 4 x 4 flat on AVX-512: B[k, j] over C's rows
    of 4 is B's row k in every quarter (f32) or half (f64) of a vector, one broadcast
    load each (vbroadcastf32x4, vbroadcastf64x4), not a permute of B held in a
    register; A0 + A1, column k spread over the rows, is still permuted once per term."""
    decls = dict(alpha=S(dtype), A0=M(4, 4, dtype), A1=M(4, 4, dtype), B=M(4, 4, dtype),
                 beta=S(dtype), C=M(4, 4, dtype))
    p = plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx512", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("j", flat=True),), AVX512, "k")
    permuted = {x.x for x in nodes_of(module, k.Permute)}
    held = {s.var: s.value for s in nodes_of(module, k.Decl)}
    assert all(isinstance(held[v], k.Bin) for v in permuted)  # A0 + A1 alone
    halves = nodes_of(module, k.Halves)
    quarters = ({q for h in halves if (q := k.quartered_load(h)) is not None}
                if loads == "quad_load" else
                {h.lo for h in halves if h.lo == h.hi and isinstance(h.lo, k.Load)})
    assert {(q.buf, q.index.value, q.lanes) for q in quarters} == {
        ("B", 4 * row, 4) for row in range(4)}
    assert f"_mm512_broadcast_{'f32x4' if dtype == 'f32' else 'f64x4'}" in c_backend.render(
        module, AVX512)


PROGRAMS = {
    "accumulate": ("C = A*B + C", lambda m, n, kk, dt: dict(A=M(m, kk, dt), B=M(kk, n, dt),
                                                            C=M(m, n, dt))),
    "update": ("C = alpha*A*B + beta*C", lambda m, n, kk, dt: dict(
        alpha=S(dt), A=M(m, kk, dt), B=M(kk, n, dt), beta=S(dt), C=M(m, n, dt))),
    "sum_transposed": ("C = alpha*(A0 + A1)'*B + beta*C", lambda m, n, kk, dt: dict(
        alpha=S(dt), A0=M(kk, m, dt), A1=M(kk, m, dt), B=M(kk, n, dt), beta=S(dt),
        C=M(m, n, dt))),
    "both_transposed": ("C = -(A'*B') + 2*C", lambda m, n, kk, dt: dict(
        A=M(kk, m, dt), B=M(n, kk, dt), C=M(m, n, dt))),
    "column_major": ("C = A*B + C", lambda m, n, kk, dt: dict(
        A=M(m, kk, dt, layout="col"), B=M(kk, n, dt, ld=n + 1),
        C=M(m, n, dt, layout="col"))),
    # two sums side by side, over kk + 1 and kk, whose indices may share a name: x and y
    # held for their own sum's terms only (they were loaded over both, past their end)
    "dot_scaled": ("C = (x'*y)*(A*B) + C", lambda m, n, kk, dt: dict(
        x=V(kk + 1, dt), y=V(kk + 1, dt), A=M(m, kk, dt), B=M(kk, n, dt, layout="col"),
        C=M(m, n, dt))),
}
SHAPES = [(2, 2, 2, "f32"), (3, 3, 3, "f32"), (3, 5, 4, "f32"), (5, 5, 5, "f32"),
          (4, 4, 6, "f32"), (4, 4, 4, "f32"), (2, 4, 3, "f32"), (2, 2, 3, "f64"),
          (3, 3, 3, "f64"), (4, 3, 2, "f64"), (4, 4, 3, "f64")]


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize(("m", "n", "kk", "dtype"), SHAPES)
def test_flat_candidates_agree_with_numpy(name, m, n, kk, dtype):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(m, n, kk, dtype)
    p = plan(source, target="avx512", **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("flat", name, m, n)))
    built = interpret_candidates(p, AVX512, lambda s: s.flat, values,
                                 f"{name} {m}x{n}x{kk} {dtype}")
    assert built >= 1


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize(("name", "m", "n", "kk", "dtype"), [
    ("sum_transposed", 3, 3, 3, "f32"), ("update", 3, 5, 4, "f32"),
    ("both_transposed", 5, 5, 5, "f32"), ("column_major", 3, 3, 3, "f64"),
    ("update", 4, 3, 2, "f64"), ("sum_transposed", 4, 4, 4, "f32"),
    ("update", 4, 4, 3, "f64"), ("accumulate", 2, 4, 3, "f32"),
    ("dot_scaled", 2, 3, 6, "f32")])
def test_flat_compiled_against_guard_pages(tmp_path, name, m, n, kk, dtype):
    """Each flat candidate compiled by gcc with -Werror (always) and run on operands
    against guard pages where the CPU has AVX-512."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(m, n, kk, dtype)
    p = plan(source, target="avx512", **decls)
    modules = [(s, mod) for s, mod in candidate_modules(p, AVX512, lambda s: s.flat)
               if mod is not None]
    assert modules
    fns = [(s, "c", _compiled(mod, AVX512, tmp_path / f"flat{i}"))
           for i, (s, mod) in enumerate(modules)]
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("flatg", name, m, n)))
    check_guarded(fns, p, values, f"{name} {m}x{n}x{kk} {dtype}")
