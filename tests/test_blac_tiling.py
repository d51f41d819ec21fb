"""Register tiles and partial accumulators of the small-size path (transform.blac):
blocks of rows x vector chunks that share loaded operands, ``split`` partial chains of a
long reduction, and the cost model's choice among them (strategy.small).

Every tiling is run through the kernel IR interpreter on odd sizes (1, primes, sizes
that are not multiples of the vector length) and compared with NumPy; the interpreter's
buffers carry sentinel padding, so a read or write outside the operands fails.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

import blacc
from blacc import blacs
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of, rewrite
from blacc.strategy import small
from blacc.strategy.small import options
from blacc.target.isa import AVX2, AVX512, GENERIC
from blacc.target.machine import Machine
from blacc.transform.blac import OpSchedule, build_module, candidates, sums_of
from blacc.transform.index_notation import forms
from test_blac_programs import PROGRAMS, assert_matches, decls_of, make_values, run_interp, seed_of

#: (program, (m, n, k, p)) for C = op(A) * B shapes: n x 4 * 4 x 4, 4 x 4 * 4 x n,
#: 4 x n * n x 4, n x 4 * 4 x n with n odd or prime, and squares around the widths.
SHAPES = [
    ("matmul", (1, 1, 1, 1)), ("matmul", (7, 4, 4, 1)), ("matmul", (4, 13, 4, 1)),
    ("matmul", (4, 4, 37, 1)), ("matmul", (5, 17, 3, 1)), ("matmul", (9, 9, 9, 1)),
    ("gemm", (3, 11, 2, 1)), ("gemm", (13, 4, 4, 1)), ("gemm", (4, 4, 29, 1)),
    ("matvec", (5, 41, 1, 1)), ("gemv", (3, 23, 1, 1)), ("sum_t_gemm", (5, 7, 19, 1)),
    # rows long enough for a loop over column blocks (broadcasts hoisted out of it),
    # with masked tails, and nested in a loop over rows
    ("matmul", (3, 53, 4, 1)), ("gemm", (5, 45, 3, 1)), ("matmul", (19, 41, 4, 1)),
]

SCHEDULES = [OpSchedule("j", (4, 3)), OpSchedule("j", (3, 2), split=2),
             OpSchedule("j", (1, 4), unroll=4), OpSchedule("j", (2, 1), unroll=2, split=4),
             OpSchedule("j", (6, 2), unroll=1), OpSchedule("j", (8, 1), split=3),
             OpSchedule(None, (2, 3), unroll=2, split=2), OpSchedule("k1", (3, 1), split=2),
             OpSchedule("k1", (2, 2), unroll=8, split=4), OpSchedule("j", (1, 13))]


def _vector_for(sched: OpSchedule, op) -> OpSchedule:
    """The schedule with its lane index renamed to the operation's (matvec: i, k1)."""
    if sched.vector == "j" and "j" not in op.dims:
        return OpSchedule(op.dims[0], sched.block, sched.unroll, sched.split)
    return sched


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize(("name", "dims"), SHAPES, ids=[f"{n}-{d}" for n, d in SHAPES])
def test_tilings_match_numpy(name, dims, dtype):
    decls = decls_of(name, dims, dtype)
    p = plan(PROGRAMS[name][0], target="avx2", **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("tile", name, dims)))
    op = p.indexed.ops[-1]
    built = 0
    for sched in SCHEDULES:
        schedule = (*p.schedule[:-1], _vector_for(sched, op))
        try:
            module = build_module(p.indexed, p.specs, schedule, AVX2, "tiled")
        except blacc.errors.ScheduleError:
            continue  # e.g. lanes on a reduction whose terms do not vanish when masked
        built += 1
        got = run_interp(module, p.specs, p.typed, values)
        assert_matches(p.typed, values, got, f"{name} {dims} {dtype} {schedule}")
    assert built >= 4


def _statements(module: k.Module) -> list[k.Stmt]:
    out: list[k.Stmt] = []

    def walk(body):
        for s in body:
            out.append(s)
            if isinstance(s, k.For):
                walk(s.body)

    walk(module.function(module.entry).body)
    return out


def test_block_loads_shared_operands_once():
    """A 4 x 2-vector tile of C = A*B (f32): per k, two vector loads of B and four
    broadcasts of A feed eight FMAs (the GEMM micro-kernel), not sixteen loads."""
    decls = dict(A=blacc.Matrix(4, 3, "f32"), B=blacc.Matrix(3, 16, "f32"),
                 C=blacc.Matrix(4, 16, "f32"))
    p = plan("C = A*B", target="avx2", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (4, 2)),), AVX2, "t")
    loads, fmas = [], 0

    def visit(node):
        nonlocal fmas
        if isinstance(node, k.Load):
            loads.append(node)
        if isinstance(node, (k.Fma, k.Bin)) and node.lanes == 8:
            fmas += 1
        return node

    rewrite(module.function(module.entry).body, visit)
    assert fmas == 4 * 2 * 3
    assert len([x for x in loads if x.lanes == 8]) == 2 * 3 + 0  # B rows, once each
    assert len([x for x in loads if x.lanes == 1]) == 4 * 3      # A elements, once each


def test_split_makes_independent_chains():
    """C(4x4) = A(4 x 40) * B(40 x 4) with split 2: two accumulators per row, each
    updated in every iteration of a loop of half the trips, added at the end."""
    decls = dict(A=blacc.Matrix(4, 40, "f64"), B=blacc.Matrix(40, 4, "f64"),
                 C=blacc.Matrix(4, 4, "f64"))
    p = plan("C = A*B", target="avx2", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (4, 1), split=2),), AVX2, "t")
    loops = [s for s in _statements(module) if isinstance(s, k.For)]
    assert len(loops) == 1 and loops[0].step == 2
    assigned = {s.var.name for s in loops[0].body if isinstance(s, k.Assign)}
    assert len(assigned) == 8
    values = make_values(decls, "f64", np.random.default_rng(1))
    assert_matches(p.typed, values, run_interp(module, p.specs, p.typed, values), "split")


def test_model_prefers_tiles_and_partial_chains():
    """The model's pick: a register tile with several rows or vectors for a product with
    many outputs, partial chains for a long reduction into few outputs."""
    wide = plan("C = A*B", target="avx2", A=blacc.Matrix(4, 4, "f32"),
                B=blacc.Matrix(4, 64, "f32"), C=blacc.Matrix(4, 64, "f32"))
    bu, bv = wide.schedule[0].block
    assert wide.schedule[0].vector == "j" and bu * bv >= 4
    deep = plan("C = A*B", target="avx2", A=blacc.Matrix(4, 100, "f32"),
                B=blacc.Matrix(100, 4, "f32"), C=blacc.Matrix(4, 4, "f32"))
    s = deep.schedule[0]
    assert s.block[0] * s.block[1] * s.split >= 8


def test_a_short_kernel_overlaps_the_next_call(monkeypatch):
    """alpha = x'*A*y, A 4 x 32 f32 on AVX-512: about 20 instructions, so the next call
    runs while this one's chain completes, and the model keeps one chain (it ran 2.74 ns,
    two partial sums 3.16 ns). Charged its whole latency, the one chain loses its lead
    (it was split before chains started where the core reaches them, ``IN_ORDER_RATE``);
    a long reduction still gets partial chains
    (``test_model_prefers_tiles_and_partial_chains``)."""
    from blacc.strategy import small

    decls = dict(x=blacc.Vector(4, "f32"), A=blacc.Matrix(4, 32, "f32"),
                 y=blacc.Vector(32, "f32"), alpha=blacc.Scalar("f32"))
    p = plan("alpha = x'*A*y", target="avx512", **decls)
    assert p.schedule[0].split == 1
    split = build_module(p.indexed, p.specs, (replace(p.schedule[0], split=2),), AVX512, "t")

    def lead() -> float:  # the one chain's cost over the two partial chains'
        return small.model_cost(p.module, 0, AVX512) / small.model_cost(split, 0, AVX512)

    assert lead() < 0.9
    monkeypatch.setattr(small, "WINDOW", 0)
    assert lead() > 0.98


def _unrolled(body: tuple, loop: k.For) -> tuple:
    """``body`` with ``loop`` replaced by its copies, as the C compiler unrolls it: the
    loop variable a constant, the variables each copy declares renamed."""
    from blacc.ir.walk import simplify, substitute

    declared = [s.var for s in loop.body if isinstance(s, k.Decl)]
    copies = []
    for n, at in enumerate(range(loop.start.value, loop.stop.value, loop.step)):
        names = {v.name: k.Var(f"{v.name}_{n}", v.dtype, v.lanes) for v in declared}
        copies.extend(simplify(substitute(loop.body, {**names, loop.var.name: k.Const(at)})))
    i = body.index(loop)
    return (*body[:i], *copies, *body[i + 1:])


def test_a_loop_the_compiler_unrolls_costs_what_its_copies_cost():
    """alpha = x'*A*y, A 4 x 64 f32 on AVX-512, one chain per vector of x'*A: a loop of 3
    trips that gcc unrolls completely. The model costs it as the straight-line copies
    gcc makes of it, which overlap each other, not as a loop after its prologue: modelled
    as a loop it cost 28.4 cycles and lost to two partial chains (18.5), which ran 6.9 ns
    a call against the loop's 5.5 (Emerald Rapids)."""
    from blacc.strategy import small

    decls = dict(x=blacc.Vector(4, "f32"), A=blacc.Matrix(4, 64, "f32"),
                 y=blacc.Vector(64, "f32"), alpha=blacc.Scalar("f32"))
    p = plan("alpha = x'*A*y", target="avx512", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("k1"),), AVX512, "k")
    body = module.function(module.entry).body
    (loop,) = nodes_of(body, k.For)
    assert (loop.stop.value - loop.start.value) // loop.step == 3
    timing = small._cycles(body, AVX512)
    assert not timing.looped
    straight = replace(module, functions=(replace(module.function(module.entry),
                                                  body=_unrolled(body, loop)),))
    assert not nodes_of(straight, k.For)
    assert small.model_cost(module, 0, AVX512) == small.model_cost(straight, 0, AVX512)
    assert timing.issue == small._cycles(_unrolled(body, loop), AVX512).issue
    split = build_module(p.indexed, p.specs, (OpSchedule("k1", split=2),), AVX512, "k")
    assert small.model_cost(module, 0, AVX512) < small.model_cost(split, 0, AVX512)
    assert p.schedule[0].split == 1 and not p.schedule[0].folds


@pytest.mark.parametrize(("n", "split", "looped"), [(64, 1, False), (200, 1, True),
                                                   (256, 4, True)])
def test_a_loop_of_many_trips_or_a_long_body_stays_a_loop(n, split, looped):
    """x'*A*y with A 4 x n f32 on AVX2, ``split`` chains: 7 trips of one chain, 24 of
    one, 7 of four. gcc -O3 unrolls at most 16 trips (``PEELED_TRIPS``) of at most about
    ``PEELED_INSNS`` instructions in all; beyond that the model keeps the loop, with its
    bookkeeping and the chain it carries from one trip to the next."""
    from blacc.strategy import small

    decls = dict(x=blacc.Vector(4, "f32"), A=blacc.Matrix(4, n, "f32"),
                 y=blacc.Vector(n, "f32"), alpha=blacc.Scalar("f32"))
    p = plan("alpha = x'*A*y", target="avx2", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("k1", split=split),), AVX2, "k")
    body = module.function(module.entry).body
    (loop,) = nodes_of(body, k.For)
    trips = (loop.stop.value - loop.start.value) // loop.step
    assert trips == {64: 7, 200: 24, 256: 7}[n]
    inner = small._cycles(loop.body, AVX2, loop.var.name)
    assert small._peeled(loop, inner) is not looped
    assert small._cycles(body, AVX2).looped is looped
    if looped:  # each trip waits for the last one's update of its accumulators
        assert small._cycles(body, AVX2).cycles >= trips * small.FMA_LATENCY


def test_short_loops_that_store_or_permute_stay_loops():
    """Only reductions are taken as their unrolled copies: a 4-trip loop of y = alpha*x +
    y (a store per trip) and the 5-trip reduction of C = A*B 4 x 24 x 4 f64 with its
    terms spread over quarters (``folds``) stay loops to the model, which picked slower
    kernels when it took them as straight-line code (``PEELED_INSNS``)."""
    from blacc.strategy import small

    axpy = plan("y = alpha*x + y", target="avx512", alpha=blacc.Scalar("f64"),
                x=blacc.Vector(32, "f64"), y=blacc.Vector(32, "f64"))
    module = build_module(axpy.indexed, axpy.specs, (OpSchedule("i"),), AVX512, "k")
    (loop,) = nodes_of(module, k.For)
    assert nodes_of(loop.body, k.Store) and (loop.stop.value - loop.start.value) // 8 == 4
    assert small._cycles(module.function(module.entry).body, AVX512).looped
    decls = dict(A=blacc.Matrix(4, 24, "f64"), B=blacc.Matrix(24, 4, "f64"),
                 C=blacc.Matrix(4, 4, "f64"))
    p = plan("C = A*B", target="avx512", **decls)
    folded = build_module(p.indexed, p.specs, (OpSchedule("j", (1, 1), split=2, folds=True),),
                          AVX512, "k")
    loops = nodes_of(folded, k.For)
    assert loops and all(nodes_of(lp.body, k.Spread) for lp in loops)
    assert small._cycles(folded.function(folded.entry).body, AVX512).looped


def test_three_load_pipes_favour_blocks_of_more_rows(monkeypatch):
    """C = A*B, A 4 x 4 and B 4 x 100 f32 on AVX-512: blocks of 4 x 3 vectors (four
    broadcasts of A and three loads of B feed twelve FMAs per k) ran 18.7 ns a call on a
    Xeon, blocks of 2 x 4 24.1 ns. Counted with two load pipes, not three, the model took
    the 2 x 4 blocks (before chains started where the core reaches them, ``IN_ORDER_RATE``,
    which favours the four rows too); the third pipe still shortens them the most."""
    from blacc.strategy import small

    decls = dict(A=blacc.Matrix(4, 4, "f32"), B=blacc.Matrix(4, 100, "f32"),
                 C=blacc.Matrix(4, 100, "f32"))
    p = plan("C = A*B", target="avx512", **decls)
    assert p.schedule[0].block == (4, 3)

    def ratio() -> float:
        """The model's cost of blocks of 4 x 3 over that of 2 x 4 (one ranking: each
        takes seconds)."""
        (ranked,) = small.options(p.indexed, p.specs, AVX512, keep=1000)
        four, two = (next(c for c, s in ranked if s.block == block and s.split == 1
                          and s.vector == p.schedule[0].vector and not s.one_tail)
                     for block in ((4, 3), (2, 4)))
        return four / two

    three = ratio()
    monkeypatch.setattr(small, "LOAD_PORTS", 2)
    assert ratio() > three


def test_stores_across_cache_lines_of_an_output_beyond_l1_cost_more(monkeypatch):
    """C = A*B, A 100 x 4 and B 4 x 100 f64: C's 800-byte rows put AVX-512's 64-byte
    stores across a line on every other row, 600 a call, and C (80 KB) leaves L1 between
    calls. On a Xeon AVX-512's plan ran 2.03 us a call, AVX2's 1.53; without the charge
    the rule between ISAs took AVX-512. 640-byte rows (n = 80) cross no line, and an
    output that is read as well (C = A*B + C) is in L1 when it is stored to."""
    from blacc.strategy import small

    def plans(n: int, source: str = "C = A*B"):
        decls = dict(A=blacc.Matrix(n, 4, "f64"), B=blacc.Matrix(4, n, "f64"),
                     C=blacc.Matrix(n, n, "f64"))
        return [plan(source, target=isa, **decls) for isa in ("avx2", "avx512")]

    def crossing(p) -> int:
        return small._crossing_stores(p.module.function(p.module.entry).body, frozenset())

    def pick(ps, crossing_cycles: float | None = None) -> str:
        costs = [small.program_cost(p.module, p.indexed, p.schedule, p.isa, 0, crossing_cycles)
                 for p in ps]
        return ps[small.worth_wider(costs)].isa.name

    wide = plans(100)
    assert [crossing(p) for p in wide] == [0, 600]
    assert pick(wide) == "avx2"
    # Zen 5 pays nothing measurable for them (652 ns a call on AVX-512, 1288 on AVX2)
    zen5 = Machine("zen5", "x86_64", vendor="AuthenticAMD", family=26)
    assert small.crossing_store_cycles(zen5) == 0.0
    assert pick(wide, small.crossing_store_cycles(zen5)) == "avx512"
    # nor does Zen 4 (1.07x the loops' speed on AVX-512, 0.97x on AVX2); Zen 3 (family
    # 25 without AVX-512) and Intel's cores keep the charge
    zen4 = replace(zen5, family=25, features=frozenset({"avx2", "fma", "avx512f"}))
    assert small.crossing_store_cycles(zen4) == 0.0
    for other in (replace(zen5, family=25), replace(zen5, vendor="GenuineIntel")):
        assert small.crossing_store_cycles(other) == small.CROSSING_STORE_CYCLES
    assert [crossing(p) for p in plans(80)] == [0, 0]
    assert [crossing(p) for p in plans(100, "C = A*B + C")] == [0, 0]
    monkeypatch.setattr(small, "CROSSING_STORE_CYCLES", 0.0)
    assert pick(wide) == "avx512"


def test_column_tiles_count_their_columns_and_hoisted_broadcasts(monkeypatch):
    """C = A*B, A 100 x 4 and B 4 x 4 f32 on AVX-512, lanes down the columns of C: blocks
    of 4 columns x 3 vectors keep 12 accumulators, 12 columns of A and the 16 broadcasts
    of B hoisted out of the loop, and gcc spills (33.3 ns a call on a Xeon, 4 x 1 blocks
    31.3). Counted as 16 registers, the block was taken. (The model's plan now holds
    four rows of C per vector instead, ``test_blac_output_parts``; of the column tiles it
    still ranks 4 x 1 first.)"""
    from blacc.strategy import small

    decls = dict(A=blacc.Matrix(100, 4, "f32"), B=blacc.Matrix(4, 4, "f32"),
                 C=blacc.Matrix(100, 4, "f32"))
    p = plan("C = A*B", target="avx512", **decls)

    def best_column_tile():
        (ranked,) = small.options(p.indexed, p.specs, AVX512, keep=1000)
        return next(s for _, s in ranked if s.vector == "i")

    assert best_column_tile().block == (4, 1)
    op = p.indexed.ops[0]
    tall = next(s for s in candidates(p.indexed, op, AVX512)
                if s.vector == "i" and s.block == (4, 3) and s.split == 1)
    module = build_module(p.indexed, p.specs, (tall,), AVX512, "t")
    assert small._column_tile_registers(p.indexed, op, tall, module) == 3 * 3 + 16
    monkeypatch.setattr(small, "_column_tile_registers", lambda *args: 0)
    assert best_column_tile().block == (4, 3)


def test_blocks_count_the_rows_of_b_that_stay_live_across_blocks(monkeypatch):
    """C = A*B 12 x 4 x 12 f32 on AVX2: a block of 6 rows x 2 vectors keeps 12
    accumulators, and the 8 vectors of B (4 rows of 8 + 4 f32) are the same for both
    blocks, so gcc loads them once and keeps them: it spilled, and the block ran 37.7 ns
    a call against 19.6 for one-row blocks (Zen 3). Counted with one row of B, 15
    registers, the block was taken. Rows of B are not counted where each block reads
    others (blocks narrower than C) or where they could not all be kept anyway."""
    from blacc.strategy import small

    def setup(m, kk, n, dtype="f32"):
        decls = dict(A=blacc.Matrix(m, kk, dtype), B=blacc.Matrix(kk, n, dtype),
                     C=blacc.Matrix(m, n, dtype))
        p = plan("C = A*B", target="avx2", **decls)
        return p, p.indexed.ops[0]

    def shared(p, op, block):
        sched = next(s for s in candidates(p.indexed, op, AVX2)
                     if s.vector == "j" and s.block == block and s.split == 1
                     and not s.folds)
        return small._shared_rows_registers(p.indexed, op, sched, AVX2)

    p, op = setup(12, 4, 12)
    assert shared(p, op, (6, 2)) == 3 * 2
    (ranked,) = small.options(p.indexed, p.specs, AVX2, keep=1000)
    assert ranked[0][1].block != (6, 2)
    monkeypatch.setattr(small, "_shared_rows_registers", lambda *args: 0)
    (ranked,) = small.options(p.indexed, p.specs, AVX2, keep=1000)
    assert ranked[0][1].block == (6, 2)
    monkeypatch.undo()
    p, op = setup(6, 4, 12)
    assert shared(p, op, (6, 2)) == 0  # one block of rows: B's rows are read once
    p, op = setup(100, 4, 100, "f64")
    assert shared(p, op, (4, 3)) == 0  # 3 of 25 vectors: the next block reads others
    p, op = setup(16, 8, 8, "f64")
    assert shared(p, op, (4, 2)) == 0  # 16 vectors of B: reloaded per block anyway


def test_chains_start_when_the_core_reaches_them(monkeypatch):
    """C = alpha*A*B + beta*C 4 x 16 x 4 f32 on AVX2, the sum folded into the halves of
    vectors: one row per block puts the four rows' chains one after another in the code,
    four rows per block interleave them. The rows one after another ran 22.0 ns a call,
    interleaved 16.9 (Zen 3); with every chain starting at once the model costed them
    alike. It now costs the later chains from where the core reaches them."""
    from blacc.strategy import small

    decls = dict(alpha=blacc.Scalar("f32"), A=blacc.Matrix(4, 16, "f32"),
                 B=blacc.Matrix(16, 4, "f32"), beta=blacc.Scalar("f32"),
                 C=blacc.Matrix(4, 4, "f32"))
    p = plan("C = alpha*A*B + beta*C", target="avx2", **decls)
    (op,) = p.indexed.ops

    def cost(rows: int) -> float:
        sched = next(s for s in candidates(p.indexed, op, AVX2)
                     if s.folds and s.vector == "j" and s.block == (rows, 1) and s.split == 1)
        module = build_module(p.indexed, p.specs, (sched,), AVX2, "k")
        return small.program_cost(module, p.indexed, (sched,), AVX2)

    assert cost(1) > 1.2 * cost(4)
    monkeypatch.setattr(small, "IN_ORDER_RATE", float("inf"))  # every chain at once
    assert cost(1) == pytest.approx(cost(4))


def test_loop_iterations_are_reached_in_program_order():
    """C = alpha*(A0 + A1)'*B + beta*C with C 64 x 4 f64: summing A0 + A1 where it is
    used (two scalar loads, an add and a broadcast beside each FMA) had been modelled at
    its pipes' throughput, as if the core took its instructions 6 a cycle, and ran
    1.21-1.61x as long as the sum stored in a temporary first (Zen 3, A/B). A loop's
    iterations, like straight-line code, are reached at ``IN_ORDER_RATE`` instructions
    a cycle: the sum is now stored first."""
    from blacc.strategy import small
    from blacc.transform.index_notation import forms

    decls = dict(alpha=blacc.Scalar("f64"), A0=blacc.Matrix(4, 64, "f64"),
                 A1=blacc.Matrix(4, 64, "f64"), B=blacc.Matrix(4, 4, "f64"),
                 beta=blacc.Scalar("f64"), C=blacc.Matrix(64, 4, "f64"))
    p = plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx2", **decls)
    assert sum(o.temporary for o in p.indexed.operands) == 2  # A0 + A1 and alpha*B
    fused = next(f for f in forms(p.typed) if not any(o.temporary for o in f.operands))
    ((cost, sched), *_) = options(fused, p.specs, AVX2)[0]
    body = build_module(fused, p.specs, (sched,), AVX2, "k").function("k").body
    (loop,) = [s for s in body if isinstance(s, k.For)]
    per_trip = small._cycles(loop.body, AVX2, loop.var.name).issue.total
    assert cost >= small._trips(loop) * per_trip / small.IN_ORDER_RATE


def _broadcasts_run(body: tuple[k.Stmt, ...], buf: str) -> int:
    """Broadcast loads of ``buf`` executed by ``body`` (loops count once per trip)."""
    total = 0
    for s in body:
        if isinstance(s, k.For):
            trips = -(-(s.stop.value - s.start.value) // s.step)
            total += trips * _broadcasts_run(s.body, buf)
            continue
        total += sum(isinstance(x.value, k.Load) and x.value.buf == buf
                     for x in nodes_of(s, k.Broadcast))
    return total


@pytest.mark.parametrize("dtype, n, rows", [("f64", 64, 4), ("f64", 100, 4), ("f64", 48, "n"),
                                            ("f64", 100, "n"), ("f32", 100, "n")])
def test_model_broadcasts_once_per_row(dtype, n, rows):
    """C = A(rows x 4)*B(4 x n) with long rows: each element of A is broadcast once
    (a loop along the row with A's broadcasts hoisted out of it, or one block as wide
    as the row), not once per block of columns (0.6-0.8x of gcc's loops and LIBXSMM at
    4 x 4 x 64-100 f64, measured on Zen 3). Rows of 6-12 vectors may stay straight-line
    code: the model finds them about even."""
    m = n if rows == "n" else rows
    p = plan("C = A*B", target="avx2", A=blacc.Matrix(m, 4, dtype),
             B=blacc.Matrix(4, n, dtype), C=blacc.Matrix(m, n, dtype))
    assert p.schedule[0].vector == "j"
    assert _broadcasts_run(p.module.function(p.module.entry).body, "A") == m * 4


def test_column_loop_hoists_the_broadcasts():
    """C(4 x 100) = A(4x4)*B(4 x 100) f64, 2 x 2 blocks: per pair of rows a loop over
    the columns, the pair's eight broadcasts of A declared before it and none inside;
    a 4 x 3 block cannot keep its sixteen in registers and stays straight-line code."""
    decls = dict(A=blacc.Matrix(4, 4, "f64"), B=blacc.Matrix(4, 100, "f64"),
                 C=blacc.Matrix(4, 100, "f64"))
    p = plan("C = A*B", target="avx2", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (2, 2)),), AVX2, "t")
    body = module.function(module.entry).body
    loops = [s for s in body if isinstance(s, k.For)]
    assert len(loops) == 2 and all(s.step == 8 and s.stop.value == 96 for s in loops)
    assert all(_broadcasts_run(s.body, "A") == 0 for s in loops)
    assert _broadcasts_run(body, "A") == 16
    values = make_values(decls, "f64", np.random.default_rng(2))
    assert_matches(p.typed, values, run_interp(module, p.specs, p.typed, values), "loop")
    tall = build_module(p.indexed, p.specs, (OpSchedule("j", (4, 3)),), AVX2, "t")
    assert not any(isinstance(s, k.For) for s in tall.function(tall.entry).body)


def test_column_loop_hoists_broadcasts_of_computed_values():
    """C(4 x 32) = alpha*(A0 + A1)'*B + beta*C f64 in 1 x 4 blocks: per row a loop over
    the columns with the row's four broadcasts of A0(k, i) + A1(k, i) declared before it
    (gcc hoists them anyway, and a loop the model counted without them spilled), and a
    barrier after each row's loop, which gcc unrolls (two trips): else the next row's
    loads of B are this row's, kept live and spilled. In 2 x 4 blocks the eight
    broadcasts do not fit beside the block: straight-line code."""
    decls = dict(A0=blacc.Matrix(4, 4, "f64"), A1=blacc.Matrix(4, 4, "f64"),
                 B=blacc.Matrix(4, 32, "f64"), C=blacc.Matrix(4, 32, "f64"),
                 alpha=blacc.Scalar("f64"), beta=blacc.Scalar("f64"))
    p = plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx2", **decls)
    form = next(f for f in forms(p.typed) if len(f.ops) == 1)  # (A0 + A1) in the sum
    module = build_module(form, p.specs, (OpSchedule("j", (1, 4)),), AVX2, "t")
    body = module.function(module.entry).body
    loops = [n for n, s in enumerate(body) if isinstance(s, k.For)]
    assert len(loops) == 4
    for n in loops:
        assert not [b for b in nodes_of(body[n].body, k.Broadcast) if nodes_of(b.value, k.Load)]
        hoisted = [s for s in body[n - 4:n] if isinstance(s, k.Decl)
                   and isinstance(s.value, k.Broadcast) and isinstance(s.value.value, k.Bin)]
        assert len(hoisted) == 4
        assert isinstance(body[n + 1], k.Barrier)
    values = make_values(decls, "f64", np.random.default_rng(4))
    assert_matches(p.typed, values, run_interp(module, p.specs, p.typed, values), "loop")
    wide = build_module(form, p.specs, (OpSchedule("j", (2, 4)),), AVX2, "t")
    assert not nodes_of(wide.function(wide.entry).body, k.For)


def test_a_narrower_leftover_takes_the_hoisted_broadcasts():
    """C(100 x 4) = A(100 x 4)*B(4 x 4) f32 on AVX-512 with the lanes down the columns: a
    loop over blocks of rows with B's 16 broadcasts hoisted out of it; the last 4 rows (a
    128-bit vector) take the low quarter of those, not broadcasts of their own (which
    kept 16 scalars live across the loop, and gcc spilled: 45 ns against 34)."""
    decls = dict(A=blacc.Matrix(100, 4, "f32"), B=blacc.Matrix(4, 4, "f32"),
                 C=blacc.Matrix(100, 4, "f32"))
    p = plan("C = A*B", target="avx512", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("i", (4, 3)),), AVX512, "t")
    body = module.function(module.entry).body
    last_loop = max(i for i, s in enumerate(body) if isinstance(s, k.For))
    after = body[last_loop + 1:]
    assert _broadcasts_run(body[:last_loop], "B") == 16
    assert _broadcasts_run(after, "B") == 0
    quarters = [h for h in nodes_of(after, k.Half) if isinstance(h.x, k.Half)]
    assert quarters and all(h.lanes == 4 and h.x.x.lanes == 16 for h in quarters)
    values = make_values(decls, "f32", np.random.default_rng(5))
    assert_matches(p.typed, values, run_interp(module, p.specs, p.typed, values), "tail")


def test_candidates_are_distinct_and_fit_the_registers():
    p = plan("C = A*B", target="avx2", A=blacc.Matrix(3, 50, "f64"),
             B=blacc.Matrix(50, 2, "f64"), C=blacc.Matrix(3, 2, "f64"))
    cands = candidates(p.indexed, p.indexed.ops[0], AVX2)
    assert len(cands) == len(set(cands))
    for s in cands:
        assert s.block[0] <= 3  # clamped to the rows
        assert s.block[0] * s.block[1] * s.split <= AVX2.registers


def test_generic_candidates_put_no_sum_on_its_one_lane():
    """On the generic target (one lane) a sum "on lanes" is the scalar schedule again,
    the same C: it is not a candidate. (C = alpha*A*B 100 x 5 x 100 f64 had 116: 87
    built, as 58 distinct kernels, the 29 repeats all such sums; planning it took 32.7 s,
    then 20.9, and 0.5 s once scalar code loops along its rows.)"""
    from blacc.backend import c as c_backend
    from blacc.target.isa import GENERIC

    p = plan("C = alpha*A*B", target="generic", A=blacc.Matrix(7, 5, "f64"),
             B=blacc.Matrix(5, 9, "f64"), C=blacc.Matrix(7, 9, "f64"),
             alpha=blacc.Scalar("f64"))
    op = p.indexed.ops[0]
    (k_index,) = [s.index for s in sums_of(op.body)]
    cands = candidates(p.indexed, op, GENERIC)
    assert {s.vector for s in cands} == {None, *op.dims}
    for block in ((1, 1), (2, 3)):
        scalar, on_sum = (c_backend.render(build_module(p.indexed, p.specs,
                                                        (OpSchedule(v, block),), GENERIC,
                                                        "k"), GENERIC)
                          for v in (None, k_index))
        assert scalar == on_sum


def test_generic_options_model_each_kernel_once():
    """On the generic target lanes along a row are one wide: such a schedule builds the
    kernel of the scalar schedule with its block, which the model has costed already and
    would rank just after it. ``options`` keeps one of them."""
    from blacc.target.isa import GENERIC

    p = plan("C = A*B", target="generic", A=blacc.Matrix(7, 5, "f64"),
             B=blacc.Matrix(5, 23, "f64"), C=blacc.Matrix(7, 23, "f64"))
    (per_op,) = options(p.indexed, p.specs, GENERIC, keep=1000)
    kernels = [build_module(p.indexed, p.specs, (s,), GENERIC, "k") for _, s in per_op]
    assert len(set(kernels)) == len(kernels) >= 20
    # each the scalar schedule of its block, which comes first
    assert all(s.vector is None for _, s in per_op)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_scalar_code_loops_over_the_blocks_of_a_long_row(dtype):
    """Scalar schedules (all of the generic target's) loop over blocks along a row as
    over blocks of rows, rather than unrolling every column: the generic C = alpha*A*B
    + beta*C 100 x 5 x 100 f64 was 10,025 lines of C (each candidate built and modelled
    in 75 ms, planning 10.8 s) and is a loop over columns in one over rows. Odd sizes:
    the leftover rows and columns are blocks of their own."""
    from blacc.target.isa import GENERIC

    decls = dict(A=blacc.Matrix(23, 5, dtype), B=blacc.Matrix(5, 41, dtype),
                 C=blacc.Matrix(23, 41, dtype), alpha=blacc.Scalar(dtype),
                 beta=blacc.Scalar(dtype))
    p = plan("C = alpha*A*B + beta*C", target="generic", **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("scalar", dtype)))
    for block in ((4, 1), (6, 2), (3, 4)):
        schedule = (*p.schedule[:-1], OpSchedule(None, block))
        module = build_module(p.indexed, p.specs, schedule, GENERIC, "scalar")
        body = module.function(module.entry).body
        prefix = f"s{len(p.indexed.ops) - 1}_"  # the product's loops, not a temporary's
        rows = [f for f in nodes_of(body, k.For) if f.var.name == prefix + "i"]
        assert len(rows) == 1 and [g.var.name for g in nodes_of(rows[0].body, k.For)] == [
            prefix + "j"], block
        # a block's stores in the loops, the leftover rows' and columns' besides
        assert len(nodes_of(body, k.Store)) < 4 * block[0] * block[1] + 23 * 4, block
        got = run_interp(module, p.specs, p.typed, values)
        assert_matches(p.typed, values, got, f"{dtype} {schedule}")


def test_model_search_is_fast():
    """Planning a 100 x 4 x 100 product must not build every candidate in full."""
    t0 = time.process_time()
    p = plan("C = alpha*A*B + beta*C", target="avx2", A=blacc.Matrix(100, 4, "f64"),
             B=blacc.Matrix(4, 100, "f64"), C=blacc.Matrix(100, 100, "f64"),
             alpha=blacc.Scalar("f64"), beta=blacc.Scalar("f64"))
    assert time.process_time() - t0 < 10
    assert len(options(p.indexed, p.specs, p.isa)[0]) <= 8


@pytest.mark.parametrize("keep", [1, 3, 8])
def test_options_cut_short_only_what_they_drop(monkeypatch, keep):
    """A candidate whose modelled cost reaches the last one kept stops being modelled there
    (``model_cost``'s ``above``); the options kept, and their costs, are those of modelling
    every candidate in full."""
    p = plan("C = alpha*A*B + beta*C", target="avx2", A=blacc.Matrix(9, 11, "f64"),
             B=blacc.Matrix(11, 7, "f64"), C=blacc.Matrix(9, 7, "f64"),
             alpha=blacc.Scalar("f64"), beta=blacc.Scalar("f64"))
    cut = options(p.indexed, p.specs, AVX2, keep=keep)
    full_cost = small.model_cost
    stopped = []

    def in_full(*args, above=None, **kwargs):
        cost = full_cost(*args, **kwargs)
        if above is not None:
            short = full_cost(*args, above=above, **kwargs)
            assert short <= cost  # never more than the full estimate
            if short < cost:
                assert short >= above  # cut short only at the last kept
                stopped.append(short)
        return cost

    monkeypatch.setattr(small, "model_cost", in_full)
    assert options(p.indexed, p.specs, AVX2, keep=keep) == cut
    assert stopped  # the case exercises the cut


@pytest.mark.parametrize("isa, dtype, dims", [(AVX2, "f64", (5, 4, 6, 3)),
                                              (AVX512, "f32", (5, 4, 6, 3)),
                                              (GENERIC, "f64", (3, 4, 2, 3))])
def test_no_candidate_is_modelled_below_the_fewest_cycles(isa, dtype, dims):
    """``fewest_cycles`` bounds every kernel the model prices, whatever the form,
    schedule or core (Intel's pipes, a 256-bit datapath, AVX-512's broadcasts read by
    their FMA): the choice between ISAs skips modelling the narrower one on it."""
    intel = small.core_for(Machine(name="Xeon", arch="x86_64", features=frozenset(),
                                   cores=2, vendor="GenuineIntel", family=6), isa)
    for name in PROGRAMS:
        typed = blacs._typed(PROGRAMS[name][0], decls_of(name, dims, dtype))
        specs = blacs.arg_specs(typed)
        for form in forms(typed):
            for op in form.ops:
                single = replace(form, ops=(op,))
                floor = small.fewest_cycles([single], isa)
                for sched in candidates(form, op, isa):
                    try:
                        module = build_module(single, specs, (sched,), isa, "probe")
                    except ScheduleError:
                        continue
                    need = small._registers(single, op, sched, module, isa)
                    for kwargs in ({}, {"core": intel, "embedded": True},
                                   {"datapath": 256}):
                        assert small.model_cost(module, need, isa, **kwargs) >= floor, (
                            name, op.out, sched, kwargs)
            chosen = blacs._model_plan(typed, specs, isa, (form,), "probe")
            assert (small.program_cost(chosen.module, form, chosen.schedule, isa)
                    >= small.fewest_cycles([form], isa))


@pytest.mark.parametrize("dims", [(7, 4, 4), (4, 37, 4), (4, 4, 29), (13, 5, 11)])
def test_compiled_tiles_match_numpy(dims):
    """The chosen tiling, compiled (f32, odd sizes): no over-read, correct values."""
    m, kk, n = dims
    kern = blacc.compile("C = alpha*A*B + beta*C", A=blacc.Matrix(m, kk, "f32"),
                         B=blacc.Matrix(kk, n, "f32"), C=blacc.Matrix(m, n, "f32"),
                         alpha=blacc.Scalar("f32"), beta=blacc.Scalar("f32"))
    rng = np.random.default_rng(seed_of(dims))
    a = rng.uniform(-1, 1, (m, kk)).astype(np.float32)
    b = rng.uniform(-1, 1, (kk, n)).astype(np.float32)
    c = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    want = 1.5 * (a.astype(np.float64) @ b) - 0.5 * c
    got = kern(A=a, B=b, C=c.copy(), alpha=1.5, beta=-0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * kk)


def test_scalar_arithmetic_repeated_in_straight_line_code_is_counted_once():
    """A0[k,i] + A1[k,i] of a fused C = alpha*(A0 + A1)'*B + beta*C, 5 x 5 x 5 f64 on
    AVX2, is splatted for a row's 4-wide vector and used as is by its scalar fifth
    column: gcc computes it once (the fused form ran 9.6 ns, the temporary's 13.8, on
    Zen 5). A barrier between blocks ends that reuse, and a splat of a computed value is
    a shuffle, not an FMA slot."""
    from blacc.strategy import small

    decls = dict(A0=blacc.Matrix(5, 5, "f64"), A1=blacc.Matrix(5, 5, "f64"),
                 B=blacc.Matrix(5, 5, "f64"), C=blacc.Matrix(5, 5, "f64"),
                 alpha=blacc.Scalar("f64"), beta=blacc.Scalar("f64"))
    p = plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx2", **decls)
    assert len(p.indexed.ops) == 1, "the fused form"
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (5, 2)),), AVX2, "k")
    body = module.function(module.entry).body
    sums = [e for e in nodes_of(body, k.Bin) if e.op == "+" and e.lanes == 1
            and all(isinstance(x, k.Load) for x in (e.a, e.b))]
    assert len(sums) == 50 and len(set(sums)) == 25  # each sum twice in the code
    issued = small._cycles(body, AVX2).issue
    splats = 25  # of the sums, for the vectors
    fmas = 2 * 25 + 2 * 5  # the products, then alpha and beta of the 4-wide rows
    scalar_tail = 2 * 5  # alpha and beta of the fifth column
    assert issued.fp == 25 + fmas + scalar_tail
    assert issued.shuffles == splats
    # the same sums after a barrier are computed again
    cut = len(body) // 2
    again = small._cycles((*body[:cut], k.Barrier(), *body[cut:]), AVX2).issue
    assert again.fp > issued.fp


def test_a_row_of_several_widths_splats_each_element_once():
    """C = A*B 10 x 10 x 10 f64 on AVX-512: a row of C is a vector of 8 and one of 2;
    each element of A is splatted once into a 512-bit variable, and the 2-lane FMA takes
    its low part (a free cast), not a second broadcast from memory (written so by hand,
    23.6-24.1 ns against 27.3-27.5 on Zen 5)."""
    decls = dict(A=blacc.Matrix(10, 10, "f64"), B=blacc.Matrix(10, 10, "f64"),
                 C=blacc.Matrix(10, 10, "f64"))
    p = plan("C = A*B", target="avx512", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (10, 2)),), AVX512, "k")
    splats = [s for s in nodes_of(module, k.Decl)
              if isinstance(s.value, k.Broadcast) and isinstance(s.value.value, k.Load)]
    assert len(splats) == 100 and {s.var.lanes for s in splats} == {8}
    assert len({s.value.value.index for s in splats}) == 100  # each element once
    narrow = [e for e in nodes_of(module, k.Fma) if e.lanes == 2]
    assert narrow and all(isinstance(e.a, k.Half) and isinstance(e.a.x, k.Half)
                          and isinstance(e.a.x.x, k.Var) for e in narrow)
    assert not [b for b in nodes_of(module, k.Broadcast) if b.lanes == 2]
    # where 512 bits are wider than the datapath (Zen 4) each FMA broadcasts its own
    apart = build_module(p.indexed, p.specs, (OpSchedule("j", (10, 2)),), AVX512, "k",
                         shared_splats=False)
    assert not nodes_of(apart, k.Half)
    assert len([b for b in nodes_of(apart, k.Broadcast) if b.lanes == 2]) == 100


def test_the_isa_choice_takes_avx512_broadcasts_from_memory_as_loads():
    """Between ISAs, an AVX-512 broadcast from memory into a register is a load alone
    (Zen 4 and 5, Intel since Skylake); within an ISA it keeps its FP slot."""
    from blacc.strategy import small

    decls = dict(A=blacc.Matrix(10, 10, "f64"), B=blacc.Matrix(10, 10, "f64"),
                 C=blacc.Matrix(10, 10, "f64"))
    p = plan("C = A*B", target="avx512", **decls)
    module = build_module(p.indexed, p.specs, (OpSchedule("j", (10, 2)),), AVX512, "k")
    body = module.function(module.entry).body
    within = small._cycles(body, AVX512).issue
    between = small._cycles(body, AVX512, single=small._single_broadcasts(body)).issue
    assert within.fp - between.fp == 100 * small.BROADCAST_FP
    assert within.loads == between.loads


def test_a_long_row_is_a_loop_even_where_the_broadcasts_stay_inside():
    """D = alpha*A*B + beta*C with B 8 x 600 f32 on AVX2: each block of rows broadcasts
    its 6 x 8 elements of A again for every group of vectors along a row (they do not
    fit in the registers the block leaves), and the 75 vectors of a row are a loop over
    those groups, not 75 vectors of straight-line code (``LONG_ROW_VECTORS``)."""
    from blacc.transform.blac import LONG_ROW_VECTORS

    f32 = "f32"
    decls = dict(A=blacc.Matrix(6, 8, f32), B=blacc.Matrix(8, 600, f32),
                 C=blacc.Matrix(6, 600, f32), D=blacc.Matrix(6, 600, f32),
                 alpha=blacc.Scalar(f32), beta=blacc.Scalar(f32))
    source = "D = alpha*A*B + beta*C"
    form = forms(blacs._typed(source, decls))[0]
    specs = blacs.arg_specs(blacs._typed(source, decls))
    (op,) = form.ops
    sched = (OpSchedule(vector="j", block=(6, 2)),)
    module = build_module(form, specs, sched, AVX2, "long_row")
    body = module.function(module.entry).body
    loops = [f for f in nodes_of(body, k.For) if f.var.name.endswith("j")]
    assert loops and 600 // 8 > LONG_ROW_VECTORS
    fmas = [e for e in nodes_of(body, k.Fma)]
    assert len(fmas) < 6 * 2 * 8 * 4, len(fmas)  # one group's and the leftovers', not 75
    values = make_values(decls, f32, np.random.default_rng(seed_of("long row")))
    typed = blacs._typed(source, decls)
    assert_matches(typed, values, run_interp(module, specs, typed, values), "long row")
