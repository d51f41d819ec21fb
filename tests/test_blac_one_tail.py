"""One masked tail (``OpSchedule.one_tail``): the last lanes of a vectorized output
dimension in one masked vector (7 of 8 f64 lanes as one AVX-512 vector) instead of exact
narrower vectors and a masked one (4 + 3 of 4); and equally fast blocks tried tallest
first (``TALL_FIRST``).

* ``chunks`` with and without the one tail cover every position once;
* the tail is a candidate only with mask registers and where it differs; into an output
  the program reads it is stored as plain pieces (a masked store would delay the next
  call's loads of it), into one it only writes with a mask;
* every one-tail candidate of several programs, over sizes 1-37, through the interpreter
  on buffers with no slack (a read or write one element outside an operand raises);
* compiled by gcc (``-std=c99 -Wall -Wextra -Werror``) and, on a CPU with AVX-512, run
  with the LLVM JIT too on operands that touch guard pages;
* the layouts it cannot take are refused, its choice survives the plan cache, and the
  model takes it where it pays.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.runtime import plan_cache
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import (
    BLOCKS,
    TALL_FIRST,
    OpSchedule,
    build_module,
    candidates,
    chunks,
)
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import _llvm_function, candidate_modules, check_guarded
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector
WIDTHS = [AVX512.widths("f32"), AVX512.widths("f64"), AVX2.widths("f32"),
          AVX2.widths("f64")]


# ----------------------------------------------------------------------------- chunks


@pytest.mark.parametrize("widths", WIDTHS, ids=[str(w) for w in WIDTHS])
def test_chunks_cover_every_position_once(widths):
    for extent in range(1, 41):
        for one_tail in (False, True):
            pieces = chunks(extent, widths, one_tail)
            starts = [c.start for c in pieces]
            assert starts == list(np.cumsum([0] + [c.count for c in pieces[:-1]]))
            assert sum(c.count for c in pieces) == extent
            assert all(c.width in widths and 0 < c.count <= c.width for c in pieces)
            if one_tail:  # full vectors, then at most one more
                assert all(c.width == widths[0] and not c.masked for c in pieces[:-1])


def test_chunks_one_tail_examples():
    def shape(pieces):
        return [(c.start, c.width, c.count) for c in pieces]

    f64 = AVX512.widths("f64")  # (8, 4, 2, 1)
    assert shape(chunks(7, f64)) == [(0, 4, 4), (4, 2, 2), (6, 1, 1)]
    assert shape(chunks(7, (8, 4, 1))) == [(0, 4, 4), (4, 4, 3)]
    assert shape(chunks(7, f64, True)) == [(0, 8, 7)]
    assert shape(chunks(19, f64, True)) == [(0, 8, 8), (8, 8, 8), (16, 4, 3)]
    assert shape(chunks(16, f64, True)) == shape(chunks(16, f64))
    assert shape(chunks(12, AVX512.widths("f32"), True)) == [(0, 16, 12)]


def test_candidates_try_the_tallest_blocks_first():
    """With the lanes along an output dimension the blocks come tallest first for each
    number of chunks (the first of equally modelled ones is kept); with the lanes on a
    sum they keep the order of ``BLOCKS``."""
    assert sorted(TALL_FIRST) == sorted(BLOCKS)
    p = _plan("C = A*B", "avx512", A=M(40, 40), B=M(40, 40), C=M(40, 40))
    op = p.indexed.ops[0]
    for vector, order in (("j", TALL_FIRST), ("k1", BLOCKS)):
        got = [s.block for s in candidates(p.indexed, op, AVX512)
               if s.vector == vector and s.split == 1 and not s.pairs and not s.one_tail]
        assert got[:len(order)] == list(order), (vector, got)


# ----------------------------------------------------------------------------- candidates


def _plan(source: str, isa: str, **decls):
    return plan(source, target=isa, **decls)


def _tails(p, isa) -> list[OpSchedule]:
    return [s for op in p.indexed.ops for s in candidates(p.indexed, op, isa)
            if s.one_tail]


def test_one_tail_candidates_only_where_they_apply():
    seven = dict(A=M(7, 7, "f64"), B=M(7, 7, "f64"), C=M(7, 7, "f64"))
    assert _tails(_plan("C = A*B", "avx512", **seven), AVX512)
    assert not _tails(_plan("C = A*B", "avx2", **seven), AVX2)  # vmaskmov: slow
    eight = dict(A=M(8, 8, "f64"), B=M(8, 8, "f64"), C=M(8, 8, "f64"))
    assert not _tails(_plan("C = A*B", "avx512", **eight), AVX512)  # no tail
    # 13 f32 lanes: 8 + 4 + 1, or 13 of 16; 6: 4 + 2 of 4, or 6 of 8; 3: 3 of 4 either way
    for n in (13, 6):
        wide = dict(A=M(3, 3, "f32"), B=M(3, n, "f32"), C=M(3, n, "f32"))
        assert _tails(_plan("C = A*B", "avx512", **wide), AVX512)
    three = dict(A=M(3, 3, "f32"), B=M(3, 3, "f32"), C=M(3, 3, "f32"))
    assert not _tails(_plan("C = A*B", "avx512", **three), AVX512)
    gemm = dict(A=M(7, 7, "f64"), B=M(7, 7, "f64"), C=M(7, 7, "f64"), alpha=S("f64"),
                beta=S("f64"))  # C read and written: its tail stored as pieces
    assert _tails(_plan("C = alpha*A*B + beta*C", "avx512", **gemm), AVX512)


def _stores(module: k.Module, buf: str) -> list[k.Store]:
    return [s for s in nodes_of(module, k.Store) if s.buf == buf and s.count is not None]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_a_tail_into_an_output_read_back_is_stored_as_plain_pieces(dtype):
    """A masked tail into an output the kernel also reads (C of C = alpha*A*B + beta*C)
    is stored as plain moves of its first lanes, 7 as 4 + 2 + 1: the next call's load of
    a masked store waits for it to reach the cache. Its loads stay masked (one fast
    instruction; one narrower vector would be a plain load), and so do the stores into an
    output only written."""
    from blacc.backend import c as c_backend

    assert AVX512.plain_moves("store", dtype, AVX512.lanes(dtype), 7) is None
    assert AVX512.plain_moves("store", dtype, AVX512.lanes(dtype), 7,
                              read_back=True) == (4, 2, 1)
    assert AVX512.plain_moves("load", dtype, AVX512.lanes(dtype), 7, read_back=True) is None
    assert AVX2.plain_moves("store", dtype, AVX2.lanes(dtype), 3) == (2, 1)  # always
    decls = dict(A=M(3, 3, dtype), B=M(3, 7, dtype), C=M(3, 7, dtype), alpha=S(dtype),
                 beta=S(dtype))
    one_tail = (OpSchedule("j", (3, 1), one_tail=True),)
    for source, read in (("C = alpha*A*B + beta*C", True), ("C = A*B", False)):
        p = _plan(source, "avx512", **{n: d for n, d in decls.items()
                                       if n in source or n == "C"})
        module = build_module(p.indexed, p.specs, one_tail, AVX512, "k")
        assert len(_stores(module, "C")) == 3
        text = c_backend.render(module, AVX512)
        assert ("_mask_storeu_" in text) is not read, source
        if read:
            assert text.count("_mm_store_s") == 3  # the seventh lane of each row
            assert "_maskz_loadu_" in text


def test_one_tail_refuses_layouts_it_cannot_take():
    p = _plan("C = A'*B", "avx512", A=M(3, 9), B=M(3, 4), C=M(9, 4))
    with pytest.raises(ScheduleError, match="one masked tail needs C contiguous"):
        build_module(p.indexed, p.specs, (OpSchedule("i", (4, 1), one_tail=True),), AVX512,
                     "x")
    p = _plan("C = A*B", "avx512", A=M(6, 3), B=M(3, 4), C=M(6, 4))
    with pytest.raises(ScheduleError, match="pairs have no tail"):
        build_module(p.indexed, p.specs,
                     (OpSchedule("j", (2, 1), pairs=True, one_tail=True),), AVX512, "x")


#: name -> (source, declarations from (m, n, dtype)): outputs m x n.
PROGRAMS = {
    "matmul": ("C = A*B", lambda m, n, dt: dict(A=M(m, 5, dt), B=M(5, n, dt),
                                                C=M(m, n, dt))),
    "scaled_sum": ("C = alpha*A*B + D", lambda m, n, dt: dict(
        A=M(m, 3, dt), B=M(3, n, dt), D=M(m, n, dt), C=M(m, n, dt), alpha=S(dt))),
    "at_x": ("y = A'*x", lambda m, n, dt: dict(A=M(m, n, dt), x=V(m, dt), y=V(n, dt))),
    "two_statements": ("T = A*B; C = T + 2*D", lambda m, n, dt: dict(
        A=M(m, 4, dt), B=M(4, n, dt), D=M(m, n, dt), T=M(m, n, dt), C=M(m, n, dt))),
    # outputs read and written: their tails stored as plain pieces
    "update": ("C = alpha*A*B + beta*C", lambda m, n, dt: dict(
        A=M(m, 3, dt), B=M(3, n, dt), C=M(m, n, dt), alpha=S(dt), beta=S(dt))),
    "sum_transposed": ("C = alpha*(A0 + A1)'*B + beta*C", lambda m, n, dt: dict(
        A0=M(4, m, dt), A1=M(4, m, dt), B=M(4, n, dt), C=M(m, n, dt), alpha=S(dt),
        beta=S(dt))),
}
INTERP_CASES = [(name, m, n, dt) for name in PROGRAMS for dt in ("f32", "f64")
                for m, n in ((1, 3), (3, 7), (5, 6), (2, 13), (4, 15), (7, 19), (3, 37),
                             (9, 23))]


@pytest.mark.parametrize(("name", "m", "n", "dtype"), INTERP_CASES,
                         ids=[f"{a}-{d}-{m}x{n}" for a, m, n, d in INTERP_CASES])
def test_every_one_tail_candidate_in_the_interpreter(name, m, n, dtype):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(m, n, dtype)
    p = _plan(source, "avx512", **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("tail", name, m, n)))
    built = 0
    for schedule, module in candidate_modules(p, AVX512, lambda s: s.one_tail):
        if module is None:
            continue
        built += 1
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{name} {m}x{n} {dtype} {schedule}")
    widths = AVX512.widths(dtype)
    assert built or chunks(n, widths, True) == chunks(n, widths), "no one-tail schedule"


# ----------------------------------------------------------------------------- compiled

COMPILED_CASES = [("matmul", 7, 7, "f64"), ("matmul", 10, 10, "f32"),
                  ("scaled_sum", 5, 13, "f64"), ("at_x", 9, 27, "f32"),
                  ("update", 7, 7, "f64"), ("update", 5, 15, "f32"),
                  ("sum_transposed", 7, 7, "f64"), ("sum_transposed", 6, 9, "f32")]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "m", "n", "dtype"), COMPILED_CASES,
                         ids=[f"{a}-{d}-{m}x{n}" for a, m, n, d in COMPILED_CASES])
def test_one_tail_compiled_against_guard_pages(tmp_path, name, m, n, dtype):
    """The first and last one-tail candidate, compiled by gcc (always) and run with it
    and the LLVM JIT where the CPU has AVX-512, on operands that touch guard pages."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(m, n, dtype)
    p = _plan(source, "avx512", **decls)
    fns = first_and_last_compiled(
        p, lambda s: s.one_tail,
        lambda module: any(x.count is not None for x in nodes_of(module, (k.Load, k.Store))),
        tmp_path / "tk")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("tg", name, m, n)))
    check_guarded(fns, p, values, f"{name} {m}x{n} {dtype}")


def first_and_last_compiled(p, wanted, check, stem) -> list:
    """The first and last AVX-512 candidate of plan ``p`` that ``wanted`` accepts, each
    module passing ``check``, compiled by gcc (always): as (schedule, backend, function)
    for gcc's code and the LLVM JIT's where the CPU runs AVX-512; else the test is
    skipped once they compiled."""
    modules = [(schedule, module) for schedule, module
               in candidate_modules(p, AVX512, wanted) if module is not None]
    assert modules
    fns = []
    for i, (sched, module) in enumerate(dict.fromkeys((modules[0], modules[-1]))):
        assert check(module), sched
        fn = _compiled(module, AVX512, stem.with_name(f"{stem.name}{i}"))
        if NATIVE["avx512"]:
            fns += [(sched, "c", fn), (sched, "llvm", _llvm_function(module, AVX512))]
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    return fns


# ----------------------------------------------------------------------------- choice


def test_plan_cache_keeps_the_one_tail():
    choice = (0, (OpSchedule("j", (7, 1), one_tail=True), OpSchedule("i", (2, 1))))
    assert plan_cache._decode(json.loads(plan_cache._encode(choice))) == choice
    old = json.loads(plan_cache._encode(choice))
    del old["schedules"][0]["one_tail"]  # an entry from before the field: planned again
    assert plan_cache._decode(old) is None


@pytest.mark.parametrize(("n", "dtype"), [(7, "f64"), (10, "f32")])
def test_the_model_takes_one_tail_and_all_rows(n, dtype):
    """C = A*B, n x n x n on AVX-512: one masked vector per row, all n rows in one block
    (each row of B loaded once), as LIBXSMM does."""
    decls = dict(A=M(n, n, dtype), B=M(n, n, dtype), C=M(n, n, dtype))
    p = _plan("C = A*B", "avx512", **decls)
    assert p.schedule[0].one_tail and p.schedule[0].block == (n, 1), p.schedule


def test_the_model_takes_one_tail_into_an_output_it_reads():
    """C = alpha*(A0 + A1)'*B + beta*C, 7 x 7 x 7 f64 on AVX-512: one masked vector per
    row of C, stored as 4 + 2 + 1, ran 15.4 ns a call on Zen 5; the plan before (AVX2,
    rows as 4 + 2 + 1 vectors, three times the FMAs) 30.9, the loops 29.3."""
    decls = dict(A0=M(7, 7, "f64"), A1=M(7, 7, "f64"), B=M(7, 7, "f64"), C=M(7, 7, "f64"),
                 alpha=S("f64"), beta=S("f64"))
    p = _plan("C = alpha*(A0 + A1)'*B + beta*C", "avx512", **decls)
    assert p.schedule[-1].one_tail, p.schedule
