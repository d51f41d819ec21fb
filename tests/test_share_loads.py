"""Masked loads that a list of statements repeats, loaded once (``transform.share_loads``):
on AVX2 only, from buffers the kernel never writes, within one list of statements, and
the kernels still agree with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.backend.c import render
from blacc.blacs import plan
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import build_module, candidates
from blacc.transform.share_loads import share_masked_loads
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector


def _masked(node, buf: str) -> list[k.Load]:
    return [e for e in nodes_of(node, k.Load) if e.buf == buf and e.count is not None]


def test_avx2_loads_the_leftover_of_x_once():
    """y = A*x, A 3 x 3 f32, sums along the rows: x's three lanes are one load for the
    three rows on AVX2 (in plain pieces: its fourth lane would be past the end of x,
    ``transform.past_end``); AVX-512's k-masked loads stay as they were."""
    decls = dict(A=M(3, 3, "f32"), x=V(3, "f32"), y=V(3, "f32"))
    p = plan("y = A*x", target="avx2", **decls)
    # a row at a time, summed along the rows (the model may pick scalar code here)
    (sched,) = [s for s in candidates(p.indexed, p.indexed.ops[0], AVX2)
                if s.vector == "k1" and s.block == (1, 1) and s.split == 1]
    module = build_module(p.indexed, p.specs, (sched,), AVX2, "k")
    source = render(module, AVX2)
    # A's last row is loaded from A[5] and shifted down a lane
    assert len(_masked(module, "x")) == 1 and len(_masked(module, "A")) == 2
    assert len(nodes_of(module, k.ShiftDown)) == 1
    assert source.count("_mm_loadu_si64(x)") == 1 and "_mm_maskload_ps(x," not in source
    values = make_values(decls, "f32", np.random.default_rng(seed_of("share", 3)))
    assert_matches(p.typed, values, run_interp(module, p.specs, p.typed, values, slack=0))
    # the same schedule on AVX-512 keeps a k-masked load of x per row
    on_avx512 = build_module(p.indexed, p.specs, (sched,), AVX512, "k")
    assert len(_masked(on_avx512, "x")) == 3


X = k.Load("x", k.Const(0), "f32", 4, k.Const(3))


def test_loads_of_a_written_buffer_or_at_a_reassigned_index_are_not_shared():
    i = k.Var("i")
    at_i = k.Load("x", i, "f32", 4, k.Const(3))
    body = (k.Decl(i, k.Const(0)),
            k.Store("out", k.Const(0), X), k.Store("out", k.Const(4), X),
            k.Store("out", k.Const(8), at_i), k.Assign(i, k.Const(4)),
            k.Store("out", k.Const(12), at_i))
    shared = share_masked_loads(body, AVX2)
    assert len(_masked(shared, "x")) == 3  # X once, at_i twice
    assert sum(isinstance(s, k.Decl) for s in shared) == 2
    into_x = body + (k.Store("x", k.Const(8), k.Load("x", k.Const(0), "f32")),)
    assert share_masked_loads(into_x, AVX2) == into_x


def test_each_list_of_statements_shares_its_own():
    """A load repeated inside a loop's body is shared there; one used once inside and
    once outside is not moved out of the loop."""
    j = k.Var("j")
    inner = (k.Store("out", j, X), k.Store("out", j + 4, X))
    loop = k.For(j, k.Const(0), k.Const(16), 8, inner)
    body = (k.Store("out", k.Const(16), X), loop)
    shared = share_masked_loads(body, AVX2)
    assert shared[0] == body[0]
    new_loop = shared[1]
    assert isinstance(new_loop, k.For) and isinstance(new_loop.body[0], k.Decl)
    assert len(_masked(new_loop, "x")) == 1


@pytest.mark.parametrize(("source", "n", "dtype"), [
    ("y = A*x", 7, "f32"), ("y = alpha*A*x + beta*B*x", 3, "f32"),
    ("y = alpha*A*x + beta*B*x", 7, "f64"), ("y = A*x + y", 5, "f32")])
def test_kernels_with_shared_loads_agree_with_numpy(source, n, dtype):
    """AVX2 plans that share loads, through the interpreter on buffers with no slack."""
    names = {"A", "B", "C", "x", "y", "alpha", "beta"} & set(source.replace("*", " ")
                                                               .replace("+", " ").split())
    shapes = dict(A=M(n, n, dtype), B=M(n, n, dtype), C=M(n, n, dtype), x=V(n, dtype),
                  y=V(n, dtype), alpha=S(dtype), beta=S(dtype))
    decls = {name: shapes[name] for name in sorted(names)}
    p = plan(source, target="avx2", **decls)
    assert any(isinstance(s, k.Decl) and s.var.name.startswith("shared")
               for s in nodes_of(p.module, k.Decl))
    values = make_values(decls, dtype, np.random.default_rng(seed_of(source, n, dtype)))
    assert_matches(p.typed, values, run_interp(p.module, p.specs, p.typed, values, slack=0),
                   f"{source} {n} {dtype}")
