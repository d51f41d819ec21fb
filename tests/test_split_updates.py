"""512-bit updates of an operand in place moved in 256- and 128-bit pieces on AVX-512
(``transform.split_updates``): which statements split and how, what stays whole, which
plans split (``strategy.small.split_short_updates``), and kernels that split agree with
NumPy, interpreted and compiled against guard pages."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.ir import kernel as k
from blacc.ir.dtypes import itemsize
from blacc.ir.walk import nodes_of
from blacc.strategy.small import split_short_updates
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import build_module
from blacc.transform.split_updates import split_updates
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import check_guarded
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector


def _moves(node, buf: str) -> list[tuple[str, int, int | None]]:
    """(kind, lanes, count) of every load and store of ``buf``."""
    out = [("load", e.lanes, e.count and e.count.value)
           for e in nodes_of(node, k.Load) if e.buf == buf]
    return out + [("store", s.value.lanes, s.count and s.count.value)
                  for s in nodes_of(node, k.Store) if s.buf == buf]


def test_axpy_moves_y_in_256_bit_vectors():
    """y = alpha*x + y, 24 f32: y's 512 + 256 bits become three 256-bit loads and stores,
    and x's loads are cut the same way; on AVX2 nothing changes."""
    decls = dict(alpha=S("f32"), x=V(24, "f32"), y=V(24, "f32"))
    p = plan("y = alpha*x + y", target="avx512", **decls)
    assert sorted(_moves(p.module, "y")) == [("load", 8, None)] * 3 + [("store", 8, None)] * 3
    assert sorted(_moves(p.module, "x")) == [("load", 8, None)] * 3
    on_avx2 = build_module(p.indexed, p.specs, p.schedule, AVX2, "k")
    assert split_updates(on_avx2.function("k").body, AVX2) == on_avx2.function("k").body


def test_rows_with_a_leftover_split_into_whole_vectors():
    """C = alpha*(A0 + A1)'*B + beta*C, 4 x 4 x 12 f32: each row of C, a masked 512-bit
    vector of 12 lanes, is loaded and stored as 8 + 4 whole lanes; alpha times the row's
    sum is computed once, as a 512-bit vector, and taken apart."""
    decls = dict(alpha=S("f32"), A0=M(4, 4, "f32"), A1=M(4, 4, "f32"), B=M(4, 12, "f32"),
                 beta=S("f32"), C=M(4, 12, "f32"))
    p = plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx512", **decls)
    moves = _moves(p.module, "C")
    assert sorted(moves) == sorted([("load", 8, None), ("load", 4, None),
                                    ("store", 8, None), ("store", 4, None)] * 4), moves
    whole = [s for s in nodes_of(p.module, k.Decl) if s.var.name.startswith("whole")]
    assert len(whole) == 4 and all(s.var.lanes == 16 for s in whole)
    halves = nodes_of(p.module, k.Half)
    assert halves and all(h.x.lanes in (16, 8) for h in halves)


Y16 = k.Load("y", k.Const(0), "f32", 16)
X16 = k.Load("x", k.Const(0), "f32", 16)


def test_only_updates_of_the_same_lanes_split():
    """A store whose value loads other lanes of its buffer, or none, or with a count not
    known when the code is generated, stays whole; an update 13 of 16 lanes long splits
    into 8 + 4 whole lanes and one masked 128-bit vector of 1."""
    elsewhere = k.Store("y", k.Const(0), k.Bin("+", X16, k.Load("y", k.Const(16), "f32", 16)))
    no_load = k.Store("y", k.Const(0), X16)
    n = k.Var("n")
    unknown = k.Store("y", k.Const(0), k.Bin("+", X16, k.Load("y", k.Const(0), "f32", 16, n)),
                      n)
    for s in (elsewhere, no_load, unknown):
        assert split_updates((s,), AVX512) == (s,)
    masked = k.Load("y", k.Const(0), "f32", 16, k.Const(13))
    split = split_updates((k.Store("y", k.Const(0), k.Bin("+", X16, masked), k.Const(13)),),
                          AVX512)
    assert [(s.index, s.value.lanes, s.count) for s in split] == [
        (k.Const(0), 8, None), (k.Const(8), 4, None), (k.Const(12), 4, k.Const(1))]
    assert _moves(split, "y")[:3] == [("load", 8, None), ("load", 4, None), ("load", 4, 1)]


def test_a_loop_body_splits_its_own():
    i = k.Var("i")
    update = k.Store("y", i, k.Fma(k.Broadcast(k.Var("a", "f32"), 16),
                                   k.Load("x", i, "f32", 16), k.Load("y", i, "f32", 16)))
    loop = k.For(i, k.Const(0), k.Const(64), 16, (update,))
    (new,) = split_updates((loop,), AVX512)
    assert [s.value.lanes for s in new.body] == [8, 8]
    assert [s.index for s in new.body] == [i, i + 8]


@pytest.mark.parametrize(("source", "n", "dtype", "split"), [
    ("y = alpha*x + y", 24, "f32", True),  # 3 pieces, modelled 3 cycles
    ("y = alpha*x + y", 32, "f64", True),  # 8 pieces
    ("y = alpha*x + y", 48, "f64", False),  # 12 pieces
    ("C = alpha*(A0 + A1)'*B + beta*C", 4, "f64", True),  # flat, modelled 9 cycles
    ("C = alpha*(A0 + A1)'*B + beta*C", 8, "f64", False),  # modelled 30 cycles
    ("C = alpha*(A0 + A1)'*B + beta*C", 4, "f32", True),
])
def test_short_kernels_split(source, n, dtype, split):
    """Plans split their updates where the kernel is short: modelled at most
    ``SPLIT_BELOW_CYCLES``, in at most ``SPLIT_PIECES`` pieces."""
    shapes = dict(alpha=S(dtype), beta=S(dtype), x=V(n, dtype), y=V(n, dtype),
                  A0=M(4, 4, dtype), A1=M(4, 4, dtype), B=M(4, n, dtype), C=M(4, n, dtype))
    decls = {name: shapes[name] for name in shapes if name in source}
    p = plan(source, target="avx512", **decls)
    whole = build_module(p.indexed, p.specs, p.schedule, AVX512, p.module.entry)
    assert (p.module != whole) is split
    out = p.indexed.ops[-1].out
    assert all((s.value.lanes * itemsize(dtype) <= 32) is split
               for s in nodes_of(p.module, k.Store) if s.buf == out)


def test_loops_do_not_split():
    """y = alpha*x + y, 100 f64: a loop over its vectors stays whole, though short."""
    decls = dict(alpha=S("f64"), x=V(100, "f64"), y=V(100, "f64"))
    p = plan("y = alpha*x + y", target="avx512", **decls)
    body = p.module.function(p.module.entry).body
    assert nodes_of(body, k.For) and split_updates(body, AVX512) != body
    assert split_short_updates(p.module, p.indexed, p.schedule, AVX512) == p.module


PROGRAMS = {
    "axpy": ("y = alpha*x + y", lambda n, dt: dict(alpha=S(dt), x=V(n, dt), y=V(n, dt))),
    "gemv": ("y = alpha*A*x + beta*y", lambda n, dt: dict(
        alpha=S(dt), A=M(n, 4, dt), x=V(4, dt), beta=S(dt), y=V(n, dt))),
    "gemm": ("C = alpha*A*B + beta*C", lambda n, dt: dict(
        alpha=S(dt), A=M(3, 4, dt), B=M(4, n, dt), beta=S(dt), C=M(3, n, dt))),
    "gemam": ("C = alpha*(A0 + A1)'*B + beta*C", lambda n, dt: dict(
        alpha=S(dt), A0=M(4, 5, dt), A1=M(4, 5, dt), B=M(4, n, dt), beta=S(dt),
        C=M(5, n, dt))),
}
CASES = [(name, n, dt) for name in PROGRAMS for n, dt in
         ((9, "f32"), (13, "f32"), (16, "f32"), (31, "f32"), (40, "f32"),
          (5, "f64"), (7, "f64"), (8, "f64"), (19, "f64"))]


def _split_plan(name: str, n: int, dtype: str):
    """The AVX-512 plan of ``name`` with every update split, whatever the policy."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n, dtype)
    p = plan(source, target="avx512", **decls)
    module = build_module(p.indexed, p.specs, p.schedule, AVX512, p.module.entry)
    (entry,) = module.functions
    split = replace(module, functions=(replace(entry, body=split_updates(entry.body,
                                                                         AVX512)),))
    return decls, replace(p, module=split)


@pytest.mark.parametrize(("name", "n", "dtype"), CASES)
def test_split_kernels_agree_with_numpy(name, n, dtype):
    """AVX-512 plans whose updates split, through the interpreter on buffers with no
    slack; every store into the updated operand is at most 256 bits."""
    decls, p = _split_plan(name, n, dtype)
    out = p.indexed.ops[-1].out
    stores = [s for s in nodes_of(p.module, k.Store) if s.buf == out]
    assert stores and all(s.value.lanes * itemsize(dtype) <= 32 for s in stores)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("split", name, n)))
    assert_matches(p.typed, values, run_interp(p.module, p.specs, p.typed, values, slack=0),
                   f"{name} {n} {dtype}")


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize(("name", "n", "dtype"), [c for c in CASES if c[1] in (13, 31, 7, 19)])
def test_split_kernels_compiled_against_guard_pages(tmp_path, name, n, dtype):
    """The same kernels compiled by gcc with -Werror (always; blacc's small kernels go
    through the C backend) and run on operands against guard pages where the CPU has
    AVX-512."""
    decls, p = _split_plan(name, n, dtype)
    fn = _compiled(p.module, AVX512, tmp_path / "split")
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    fns = [(p.schedule, "c", fn)]
    values = make_values(decls, dtype, np.random.default_rng(seed_of("splitg", name, n)))
    check_guarded(fns, p, values, f"{name} {n} {dtype}")
