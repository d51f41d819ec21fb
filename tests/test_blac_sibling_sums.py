"""Sibling sums reduced in one loop (``transform.blac.siblings``, ``_Gen.reduce``).

* which sums of an expression are siblings: outermost, one index and extent, distinct;
* y = alpha*A*x + beta*B*x built with a block of four rows: one loop whose body loads x
  once per vector and a row of A and of B per accumulator, the interpreter's values
  equal to the reference;
* every candidate schedule of programs with sibling sums (scaled, unscaled, three of
  them, one extent apart, nested under another sum) in the interpreter, over extents
  that are not multiples of the vector width, 1 included;
* the planned kernels compiled and called on guarded operands.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import indexed as ix
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512, GENERIC
from blacc.transform.blac import OpSchedule, build_module, candidates, siblings
from blacc.transform.index_notation import forms
from test_blac_columns import _compiled
from test_blac_pairs import check_guarded, needs_native
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar


def _gesummv(m: int, n: int, dtype: str) -> dict:
    return dict(A=M(m, n, dtype), B=M(m, n, dtype), x=V(n, dtype), y=V(m, dtype),
                alpha=S(dtype), beta=S(dtype))


def _sum(index: str, operand: str, extent: int = 8) -> ix.Sum:
    return ix.Sum(index, extent, ix.Mul(ix.Read(operand, ("i", index)), ix.Read("x", (index, 0))))


def test_siblings_are_outermost_sums_over_one_index_and_extent():
    a, b, c = _sum("k1", "A"), _sum("k1", "B"), _sum("k1", "C", extent=9)
    scaled = ix.Add(ix.Mul(ix.Read("alpha", (0, 0)), a), ix.Mul(ix.Read("beta", (0, 0)), b))
    assert siblings(scaled) == [[a, b]]
    assert siblings(ix.Add(ix.Add(a, c), b)) == [[a, b]]  # 9 terms: not with the others
    assert siblings(ix.Add(a, a)) == []  # one sum, read twice
    assert siblings(a) == []
    # a sum inside another is the inner body's sibling, not the outer sum's
    outer = ix.Sum("k1", 8, ix.Mul(ix.Read("x", ("k1", 0)), ix.Add(_sum("k2", "A"),
                                                                     _sum("k2", "B"))))
    assert siblings(ix.Add(outer, a)) == [[outer, a]]
    assert siblings(outer.body) == [[_sum("k2", "A"), _sum("k2", "B")]]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_sibling_sums_share_one_loop_and_the_loads_of_x(dtype):
    """y = alpha*A*x + beta*B*x, A and B 4 x 64, fused, in one block of four rows: one
    loop over k, its body one load of x per vector and one of A and of B per row."""
    lanes = AVX2.lanes(dtype)
    decls = _gesummv(4, 64, dtype)
    p = plan("y = alpha*A*x + beta*B*x", target="avx2", **decls)
    fused = forms(p.typed)[0]  # alpha and beta outside the sums
    module = build_module(fused, p.specs, (OpSchedule("k1", (4, 1)),), AVX2, "g")
    (loop,) = nodes_of(module.function("g").body, k.For)
    loads = nodes_of(loop.body, k.Load)
    per_vector = {buf: sum(e.buf == buf for e in loads) for buf in "ABx"}
    assert per_vector == {"A": 4, "B": 4, "x": 1}, per_vector
    assert loop.step == lanes
    values = make_values(decls, dtype, np.random.default_rng(seed_of("sib", dtype)))
    assert_matches(p.typed, values, run_interp(module, p.specs, p.typed, values))


PROGRAMS = {
    "gesummv": ("y = alpha*A*x + beta*B*x", _gesummv),
    "unscaled": ("y = A*x + B*x", _gesummv),
    "three": ("y = alpha*A*x + beta*B*x - C*z",
              lambda m, n, dt: dict(_gesummv(m, n, dt), C=M(m, n, dt), z=V(n, dt))),
    "transposed": ("y = alpha*A'*x + beta*B'*x",
                   lambda m, n, dt: dict(A=M(n, m, dt), B=M(n, m, dt), x=V(n, dt),
                                         y=V(m, dt), alpha=S(dt), beta=S(dt))),
    "nested": ("s = x'*(A*z + B*z) + beta*s",
               lambda m, n, dt: dict(A=M(m, n, dt), B=M(m, n, dt), x=V(m, dt), z=V(n, dt),
                                     s=S(dt), beta=S(dt))),
}
CASES = [("gesummv", 3, 37, "f32"), ("gesummv", 5, 13, "f64"), ("gesummv", 1, 1, "f64"),
         ("gesummv", 4, 1, "f32"), ("gesummv", 2, 20, "f32"), ("unscaled", 6, 9, "f32"),
         ("three", 3, 11, "f64"), ("three", 2, 40, "f32"), ("transposed", 5, 7, "f64"),
         ("nested", 3, 10, "f32"), ("nested", 5, 6, "f64")]


@pytest.mark.parametrize("isa", [AVX2, AVX512, GENERIC], ids=["avx2", "avx512", "generic"])
@pytest.mark.parametrize(("name", "m", "n", "dtype"), CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" for c in CASES])
def test_every_schedule_of_sibling_sums(name, m, n, dtype, isa):
    """Every form and every candidate schedule that builds computes the reference, x
    and the arrays read only as they are (``run_interp`` checks inputs and padding)."""
    source, make = PROGRAMS[name]
    decls = make(m, n, dtype)
    p = plan(source, target=isa, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of(name, m, n, dtype)))
    typed = p.typed
    built = 0
    for form in forms(typed):
        for op_index, op in enumerate(form.ops):
            for sched in candidates(form, op, isa):
                schedule = tuple(sched if i == op_index else OpSchedule(None)
                                 for i in range(len(form.ops)))
                try:
                    module = build_module(form, p.specs, schedule, isa, "cand")
                except ScheduleError:
                    continue
                built += 1
                got = run_interp(module, p.specs, typed, values)
                assert_matches(typed, values, got, f"{name} {m}x{n} {dtype} {schedule}")
    assert built > 0


@needs_native
@pytest.mark.parametrize(("name", "m", "n", "dtype"), CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" for c in CASES])
def test_planned_kernels_with_sibling_sums_on_guarded_operands(name, m, n, dtype, tmp_path):
    source, make = PROGRAMS[name]
    decls = make(m, n, dtype)
    p = plan(source, target="avx2", **decls)
    fn = _compiled(p.module, AVX2, tmp_path / "sib")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("g", name, m, n)))
    check_guarded([(p.schedule, "c", fn)], p, values, f"{name} {m}x{n} {dtype}")
