"""Instruction sets as data: which one a machine gets (``isa_for``, ``BLACC_ISA``), the
AVX-512 table's C, and GEMM kernels of every ISA this machine runs, native, on operands
against guard pages (the host's own ISA is covered by test_gemm and test_guard_pages;
here the others too, e.g. AVX2 kernels on an AVX-512 machine)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

import blacc
from blacc.backend.c import render
from blacc.errors import ArgumentError
from blacc.ir.structured import matmul
from blacc.runtime import gemm as gemm_runtime
from blacc.strategy import small
from blacc.strategy.gemm import blis, dot_tiles, no_packing
from blacc.target.isa import AVX2, AVX512, GENERIC, ISAS, isa_for
from blacc.target.machine import Machine, detect_machine
from blacc.transform.apply import apply
from blacc.transform.pipeline import lower
from conftest import DTYPES
from guard import run_isolated
from test_guard_pages import SIDES, _gemm_on_guarded

AVX512_FLAGS = ("avx2", "fma", "avx512f", "avx512dq", "avx512vl")


def _machine(*features: str) -> Machine:
    return Machine(name="Test CPU", arch="x86_64", features=frozenset(features), cores=2)


def test_isa_for_picks_the_widest_the_machine_runs(monkeypatch):
    monkeypatch.delenv("BLACC_ISA", raising=False)
    assert isa_for(_machine(*AVX512_FLAGS)) is AVX512
    assert isa_for(_machine("avx2", "fma", "avx512f")) is AVX2  # no DQ/VL: not our table
    assert isa_for(_machine("avx2", "fma")) is AVX2
    assert isa_for(_machine("avx", "sse2")) is GENERIC


def test_blacc_isa_overrides_within_what_the_machine_runs(monkeypatch):
    monkeypatch.setenv("BLACC_ISA", "AVX2")
    assert isa_for(_machine(*AVX512_FLAGS)) is AVX2
    monkeypatch.setenv("BLACC_ISA", "generic")
    assert isa_for(_machine("avx2", "fma")) is GENERIC
    monkeypatch.setenv("BLACC_ISA", "avx512")
    with pytest.raises(ArgumentError, match="lacks avx512f, avx512dq, avx512vl"):
        isa_for(_machine("avx2", "fma"))
    monkeypatch.setenv("BLACC_ISA", "neon")
    with pytest.raises(ArgumentError, match="'neon' is not an instruction set.*avx512, avx2"):
        isa_for(_machine(*AVX512_FLAGS))


def test_avx512_table_is_complete_for_its_vectors():
    """Every op the AVX2 table has for full and narrow vectors that GEMM and the BLACs use
    without checking first, the AVX-512 table has for its own widths."""
    needed = ("load", "store", "mask_load", "mask_store", "broadcast_load", "splat", "fma",
              "+", "-", "*", "mask")
    for dt in ("f32", "f64"):
        for lanes in AVX512.widths(dt)[:-1]:
            for name in needed:
                assert AVX512.op(name, dt, lanes)
        assert AVX512.op("hsum", dt) and AVX512.op("prefetch", dt)
    assert AVX512.lanes("f32") == 16 and AVX512.lanes("f64") == 8 and AVX512.registers == 32


# Compile-only: any x86-64 gcc or clang builds AVX-512 code, whatever the CPU running it.
CC = shutil.which(os.environ.get("CC", "cc"))
STRICT = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
          "-Wno-unused-function")

AVX512_PLANS = {
    "blis-f32": ("f32", blis(48, 16, 128, 6, 64, 4, 16), {"C_s1": 1}),
    "no_packing-f64": ("f64", no_packing(9, 24, 4, 8), {"C_s1": 1, "B_s1": 1}),
    "dot-f32": ("f32", dot_tiles(16).schedule, {"A_s1": 1, "B_s0": 1}),
}


@pytest.mark.skipif(CC is None or os.uname().machine != "x86_64",
                    reason="needs an x86-64 C compiler")
@pytest.mark.parametrize("case", list(AVX512_PLANS))
def test_avx512_c_compiles_without_warnings(case, tmp_path):
    dtype, schedule, strides = AVX512_PLANS[case]
    module = lower(apply(matmul(dtype), schedule, name="gemm", known_strides=strides),
                   AVX512)[0]
    src = render(module, AVX512)
    assert "_mm512_fmadd_" in src and "__mmask" in src
    path = tmp_path / "k.c"
    path.write_text(src)
    proc = subprocess.run([CC, *STRICT, *AVX512.flags, "-c", str(path), "-o",
                           str(tmp_path / "k.o")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.skipif(CC is None or os.uname().machine != "x86_64",
                    reason="needs an x86-64 C compiler")
def test_sums_of_128_and_256_bits_compile_to_shuffles_two_pipes_take(tmp_path):
    """The horizontal sums of AVX2's vectors transpose with shufps/shufpd and blends,
    which a Xeon (CPU model 167) issues two a cycle, not with unpcks, movlhps or
    movhlps, which it issues one a cycle (and which the C compiler makes of shufps 0x44
    or shufpd 0)."""
    sums = [name for name in AVX2.prelude if name.startswith(("blacc_sum", "blacc_pairs"))]
    assert len(sums) >= 9
    src = "#include <immintrin.h>\n" + "\n".join(
        AVX2.prelude[name].replace("static inline ", "") for name in sums)
    path = tmp_path / "sums.c"
    path.write_text(src)
    proc = subprocess.run([CC, "-O2", *AVX2.flags, "-S", str(path), "-o", "-"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "shufp" in proc.stdout
    for slow in ("unpck", "movlhps", "movhlps"):
        assert slow not in proc.stdout, slow


def _runnable() -> list[str]:
    machine = detect_machine()
    return [name for name, isa in ISAS.items() if machine.has(*isa.requires)]


# shapes taking each kind of plan (packed; in place, both loop orders and the ISA's wide
# tiles; dot products), none a multiple of any tile
ISA_SHAPES = [(297, 331, 203), (97, 131, 203), (131, 13, 257), (7, 999, 300), (37, 1, 301),
              (1, 45, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _runnable())
def test_gemm_of_every_runnable_isa_against_guards(name, dtype, backend, rng,
                                                   assert_gemm_close):
    """blacc.gemm with ``BLACC_ISA`` set to each ISA this machine runs (in a child
    process, with the host target and the call caches cleared), both backends, every
    transpose, beta 0 and not, operands against guard pages on both sides."""
    seed = int(rng.integers(2**32))

    def body():
        os.environ["BLACC_ISA"] = name
        gemm_runtime.host_target.cache_clear()
        gemm_runtime._DISPATCH.clear()
        gemm_runtime.forget_calls()
        assert gemm_runtime.host_target().isa is ISAS[name]
        for shape, side, (trans_a, trans_b), beta in itertools.product(
                ISA_SHAPES, SIDES, itertools.product((False, True), repeat=2), (0.0, 0.75)):
            _gemm_on_guarded(assert_gemm_close, seed, shape, dtype,
                             {op: (side, "C") for op in "ABC"}, trans_a, trans_b, beta)
        assert blacc.explain(m=297, n=331, k=203, dtype=np.dtype(dtype)).plan.strategy == "blis"

    run_isolated(body, timeout=600)


def test_avx512_packed_plan_is_the_measured_tile_with_rows_of_tiles_outside():
    """The packed plan takes the ISA's measured micro-kernel. Its kc (384) is too long for
    a B sliver to stay in L1, so rows of tiles run outside: the B panel gets half of L2,
    with kc at most the ISA's; the A block is a few slivers."""
    from blacc.strategy.gemm import choose, register_tile
    from blacc.target.blocking import ROWS_OUTSIDE_KC_MIN
    from blacc.target.machine import DEFAULT_CACHES

    for l2 in (DEFAULT_CACHES[1].size, 2 << 20):
        caches = (DEFAULT_CACHES[0], replace(DEFAULT_CACHES[1], size=l2), DEFAULT_CACHES[2])
        machine = Machine("test", "x86_64", caches=caches)
        for dtype, size, nr in (("f32", 4, 64), ("f64", 8, 32)):
            params = dict(choose(1000, 1000, 1000, dtype, machine=machine, isa=AVX512,
                                 b_unit_cols=True).params)
            assert (params["mr"], params["nr"], params["rows_outside"]) == (6, nr, 1)
            assert ROWS_OUTSIDE_KC_MIN <= params["kc"] <= AVX512.gemm_kc
            assert params["kc"] * params["nc"] * size <= l2 // 2
            assert params["mc"] % 6 == 0 and params["nc"] % nr == 0
            if l2 == 2 << 20:  # the Xeon's L2: panels 1024 wide, 1 KiB rows
                assert (params["kc"], params["nc"]) == (1024 // size, 1024)
        # in-place tiles still come from the register budget: 14 rows x 2 vectors
        assert register_tile(dtype, AVX512) == (14, 2 * AVX512.lanes(dtype),
                                                AVX512.lanes(dtype))
    avx2 = dict(choose(1000, 1000, 1000, "f32", machine=machine, isa=AVX2,
                       b_unit_cols=True).params)
    assert (avx2["mr"], avx2["nr"]) == (6, 16)  # AVX2 keeps the model's tile and order
    assert "rows_outside" not in avx2


def test_avx512_packed_plan_on_amd_keeps_the_b_panel_in_l3():
    """On AMD (Zen 4) the AVX-512 plan still runs rows of tiles outside, but the B panel
    lives in L3 (half of this core's share) and kc is the longest A sliver that fits the
    L1 ways but one; other vendors keep the panel in half of L2."""
    from blacc.strategy.gemm import choose
    from blacc.target.blocking import KC_MAX
    from blacc.target.machine import CacheLevel

    l1 = CacheLevel(1, 32 << 10, 8, 64, 1)
    caches = (l1, CacheLevel(2, 1 << 20, 8, 64, 1), CacheLevel(3, 32 << 20, 16, 64, 2))
    amd = Machine("zen4", "x86_64", caches=caches, vendor="AuthenticAMD", family=25)
    intel = replace(amd, vendor="GenuineIntel")
    for dtype, size, nr, kc, nc in (("f32", 4, 64, KC_MAX, 2048), ("f64", 8, 32, 596, 1728)):
        params = dict(choose(1000, 1000, 1000, dtype, machine=amd, isa=AVX512,
                             b_unit_cols=True).params)
        assert (params["mr"], params["nr"], params["rows_outside"]) == (6, nr, 1)
        assert (params["kc"], params["nc"]) == (kc, nc)
        assert 6 * params["kc"] * size <= 7 * l1.way_size  # the A sliver in L1
        assert params["kc"] * params["nc"] * size <= (32 << 20) // 2 // 2
        other = dict(choose(1000, 1000, 1000, dtype, machine=intel, isa=AVX512,
                            b_unit_cols=True).params)
        assert other["kc"] * other["nc"] * size <= (1 << 20) // 2


def test_avx512_packed_plan_on_zen5_keeps_each_b_sliver_in_l2():
    """Where AMD's vector pipes take whole 512-bit vectors (family 26, Zen 5), the B
    panel stays in L3 but columns of tiles run outside: each kc x nr B sliver stays in L2,
    beside the next one and a small A block, while the A slivers pass it."""
    from blacc.strategy.gemm import choose
    from blacc.target.machine import CacheLevel

    l1, l2 = CacheLevel(1, 48 << 10, 12, 64, 1), CacheLevel(2, 1 << 20, 16, 64, 1)
    zen5 = Machine("zen5", "x86_64", caches=(l1, l2, CacheLevel(3, 32 << 20, 16, 64, 2)),
                   vendor="AuthenticAMD", family=26)
    assert zen5.vector_datapath == 0
    for dtype, size, nr, kc, mc, nc in (("f32", 4, 64, 1024, 108, 2048),
                                        ("f64", 8, 32, 1024, 54, 1024)):
        params = dict(choose(1000, 1000, 1000, dtype, machine=zen5, isa=AVX512,
                             b_unit_cols=True).params)
        assert "rows_outside" not in params
        assert (params["mr"], params["nr"]) == (6, nr)
        assert (params["kc"], params["mc"], params["nc"]) == (kc, mc, nc)
        way2 = l2.size // l2.associativity
        sliver_ways = -(-nr * kc * size // way2)
        assert params["mc"] * kc * size + 2 * sliver_ways * way2 <= l2.size - way2
        assert params["kc"] * params["nc"] * size <= (32 << 20) // 2 // 2


def _avx512_host(monkeypatch, **machine_fields):
    """blacs on a (pretend) AVX-512 machine, whose ISA follows BLACC_ISA."""
    from blacc import blacs

    machine = replace(_machine(*AVX512_FLAGS), **machine_fields)
    monkeypatch.setattr(blacs, "host_target",
                        lambda: gemm_runtime.Target(machine, isa_for(machine)))
    return blacs


def test_small_programs_choose_avx2_or_avx512_on_an_avx512_host(monkeypatch):
    """'host' on an AVX-512 machine is AVX2 or AVX-512 per program, by the model: a wide
    output fills 512-bit vectors (C = A*B, 4 x 4 x 64 f32: the model halves the FMAs),
    rows of 10 f64 do not (y = A*x, A 10 x 10: AVX2's kernel ran 5.5 ns, AVX-512's 10.6).
    BLACC_ISA fixes one."""
    monkeypatch.delenv("BLACC_ISA", raising=False)
    blacs = _avx512_host(monkeypatch)
    assert blacs.host_isas() == (AVX2, AVX512)
    wide = dict(A=blacc.Matrix(4, 4, "f32"), B=blacc.Matrix(4, 64, "f32"),
                C=blacc.Matrix(4, 64, "f32"))
    narrow = dict(A=blacc.Matrix(10, 10, "f64"), x=blacc.Vector(10, "f64"),
                  y=blacc.Vector(10, "f64"))
    assert blacs.plan("C = A*B", **wide).isa is AVX512
    assert blacs.plan("y = A*x", **narrow).isa is AVX2
    assert blacs.plan("C = A*B", target="avx2", **wide).isa is AVX2
    monkeypatch.setenv("BLACC_ISA", "avx2")
    assert blacs.host_isas() == (AVX2,)
    assert blacs.plan("C = A*B", **wide).isa is AVX2
    monkeypatch.setenv("BLACC_ISA", "avx512")
    assert blacs.host_isas() == (AVX512,)
    assert blacs.plan("y = A*x", **narrow).isa is AVX512


def test_host_models_avx2_only_where_its_fewest_cycles_could_win(monkeypatch):
    """'host' models AVX-512 first, and AVX2 only where AVX2's ``fewest_cycles`` (its
    multiplies on full vectors) is not already slower by the gain AVX-512 needs: C = A*B
    12 x 12 x 12 f64 cannot take AVX2 (216 cycles of FMAs at best). The choice is the one
    that modelling both gives, on each core's rule."""
    monkeypatch.delenv("BLACC_ISA", raising=False)
    programs = [("C = A*B", {n: blacc.Matrix(12, 12, "f64") for n in "ABC"}, False),
                ("y = A*x", dict(A=blacc.Matrix(10, 10, "f64"), x=blacc.Vector(10, "f64"),
                                 y=blacc.Vector(10, "f64")), True),
                ("C = A*B", dict(A=blacc.Matrix(4, 4, "f32"), B=blacc.Matrix(4, 64, "f32"),
                                 C=blacc.Matrix(4, 64, "f32")), None)]
    skipped = 0
    for fields in (dict(vendor="GenuineIntel", family=6), dict(vendor="AuthenticAMD", family=25),
                   dict(vendor="AuthenticAMD", family=26)):
        blacs = _avx512_host(monkeypatch, **fields)
        gain = small.wider_gain(blacs.host_target().machine)
        for source, decls, needs_avx2 in programs:
            typed = blacs._typed(source, decls)
            specs, forms = blacs.arg_specs(typed), blacs.forms(typed)
            costs = blacs.isa_choice_costs(typed, specs, forms, (AVX2, AVX512), "k")
            modelled = []
            full = blacs.isa_choice_costs

            def spy(typed, specs, candidates, isas, *args, full=full, modelled=modelled):
                modelled.extend(isas)
                return full(typed, specs, candidates, isas, *args)

            monkeypatch.setattr(blacs, "isa_choice_costs", spy)
            isa = blacs._host_isa(typed, specs, forms, (AVX2, AVX512), "k", {})
            monkeypatch.setattr(blacs, "isa_choice_costs", full)
            assert isa is (AVX2, AVX512)[small.worth_wider(costs, gain=gain)]
            assert modelled[0] is AVX512
            if needs_avx2 is not None:
                assert (AVX2 in modelled) == needs_avx2, (source, fields)
            skipped += AVX2 not in modelled
            if AVX2 not in modelled:
                assert isa is AVX512
                assert costs[0] >= small.fewest_cycles(forms, AVX2)
    assert skipped >= 3


def test_small_programs_on_zen4_count_512_bit_instructions_twice(monkeypatch):
    """Zen 4 (AMD family 25) runs a 512-bit instruction over its 256-bit pipes, so the
    choice between ISAs models each one issued twice: the wide C = A*B that fills 512-bit
    vectors is modelled a little faster there (64 cycles against 72, not the half the Xeon
    sees) and takes AVX-512, as Zen 4's rule asks no more (``ZEN4_WIDER_GAIN``; 0.98x the
    loops in the fit's runs, AVX2 0.79x); a 6 x 6 x 6 f32 product,
    whose rows fit masked 512-bit vectors, still takes AVX-512 (6.4 ns against 12.4), and
    so does 7 x 7 x 7 f64 (14.7 ns against 25.0), whose broadcasts from memory take the
    load pipes alone at any width."""
    from blacc.strategy.small import program_cost

    monkeypatch.delenv("BLACC_ISA", raising=False)
    wide = dict(A=blacc.Matrix(4, 4, "f32"), B=blacc.Matrix(4, 64, "f32"),
                C=blacc.Matrix(4, 64, "f32"))
    micro = dict(A=blacc.Matrix(6, 6, "f32"), B=blacc.Matrix(6, 6, "f32"),
                 C=blacc.Matrix(6, 6, "f32"))
    xeon = _avx512_host(monkeypatch, vendor="GenuineIntel", family=6)
    assert xeon.plan("C = A*B", **wide).isa is AVX512
    zen4 = _avx512_host(monkeypatch, vendor="AuthenticAMD", family=25)
    assert zen4.host_target().machine.vector_datapath == 256
    assert zen4.plan("C = A*B", **wide).isa is AVX512
    assert zen4.plan("C = A*B", **micro).isa is AVX512
    seven = {name: blacc.Matrix(7, 7, "f64") for name in "ABC"}
    assert zen4.plan("C = A*B", **seven).isa is AVX512
    for isa in (AVX2, AVX512):
        p = zen4.plan("C = A*B", target=isa.name, **wide)
        full, split = (program_cost(p.module, p.indexed, p.schedule, isa, datapath)
                       for datapath in (0, 256))
        if isa is AVX2:
            assert split == full
        else:  # every FMA, load and store of the kernel is on 512 bits
            assert 1.6 * full < split <= 2 * full


def test_intel_cores_overlap_calls_as_far_as_their_fp_instructions_allow(monkeypatch):
    """On Intel's cores a call's chains overlap the next calls' as far as ``WINDOW`` FP
    instructions and shuffles allow, not ``WINDOW`` instructions of any kind: loads leave
    the scheduler early. C = alpha*A*B + beta*C 4 x 12 x 4 f64 in 4 x 1 blocks of
    broadcasts and FMAs (chains of 12 FMAs, 124 instructions, 56 FP) ran 31 cycles a call
    on a Xeon, modelled 44 counting every instruction; rows held in pairs, modelled 30,
    ran 34-38 and were taken. Other cores keep the constants' window."""
    from blacc.transform.blac import OpSchedule, build_module
    from blacc.transform.index_notation import arg_specs, forms

    intel = replace(_machine(*AVX512_FLAGS), vendor="GenuineIntel", family=6)
    amd = replace(_machine(*AVX512_FLAGS), vendor="AuthenticAMD", family=26)
    assert all(small.core_for(intel, isa).overlap_by_fp for isa in (AVX2, AVX512))
    assert not small.core_for(amd, AVX512).overlap_by_fp and not small._core(None).overlap_by_fp

    blacs = _avx512_host(monkeypatch, vendor="GenuineIntel", family=6)
    decls = {"alpha": blacc.Scalar("f64"), "A": blacc.Matrix(4, 12, "f64"),
             "B": blacc.Matrix(12, 4, "f64"), "beta": blacc.Scalar("f64"),
             "C": blacc.Matrix(4, 4, "f64")}
    typed = blacs._typed("C = alpha*A*B + beta*C", decls)
    form, specs = forms(typed)[0], arg_specs(typed)
    rows = (OpSchedule(vector="j", block=(4, 1)),)
    module = build_module(form, specs, rows, AVX512, "k")
    core = small.core_for(intel, AVX512)
    fp_only, every = (small.program_cost(module, form, rows, AVX512, core=c)
                      for c in (core, replace(core, overlap_by_fp=False)))
    assert fp_only < 0.7 * every
    plan = blacs.plan("C = alpha*A*B + beta*C", **decls)
    assert not any(s.pairs or s.folds for s in plan.schedule), plan.schedule


def test_intel_cores_count_the_shuffles_of_horizontal_sums(monkeypatch):
    """On Intel's cores a horizontal sum's extracts, ``vmovhlps`` and unpacks take the one
    shuffle pipe (``Core.reduce_shuffle``; f32's last step, ``vmovshdup``, two pipes).
    alpha = x'*A*y 4 x 4 f32 with AVX2 folded two rows of A into each vector, x's pairs
    permuted into its halves (two ``vpermilps``, an extract, then the sum: five shuffles),
    1.38-1.45 ns a call on a Xeon; four 128-bit FMAs on broadcasts ran 1.05-1.09, Eigen's
    speed, and are taken once the sum's shuffles count. AMD's cores (the constants) do
    not count them."""
    from blacc.ir import kernel as k

    intel = replace(_machine(*AVX512_FLAGS), vendor="GenuineIntel", family=6)
    amd = replace(_machine(*AVX512_FLAGS), vendor="AuthenticAMD", family=26)
    core = small.core_for(intel, AVX2)
    assert core.reduce_shuffle == 1 and small.core_for(amd, AVX2).reduce_shuffle == 0
    for lanes, dtype, shuffles in ((4, "f32", 1), (8, "f32", 2), (2, "f64", 1),
                                   (4, "f64", 2)):
        total = k.Reduce(k.Load("x", k.Const(0), dtype, lanes))
        issue = small._Issue()
        small._expr_issue(total, issue, AVX2, core=core)
        assert issue.shuffles == shuffles, (lanes, dtype)
        constants = small._Issue()
        small._expr_issue(total, constants, AVX2)
        assert constants.shuffles == 0

    blacs = _avx512_host(monkeypatch, vendor="GenuineIntel", family=6)
    decls = {"x": blacc.Vector(4, "f32"), "A": blacc.Matrix(4, 4, "f32"),
             "y": blacc.Vector(4, "f32"), "alpha": blacc.Scalar("f32")}
    plan = blacs.plan("alpha = x'*A*y", target="avx2", **decls)
    assert not plan.schedule[0].folds, plan.schedule


def test_intel_cores_shuffle_512_bit_vectors_on_the_second_fma_pipe(monkeypatch):
    """On Intel's cores a 512-bit shuffle takes port 5, which is also the second FMA pipe
    for 512-bit vectors, and a broadcast from memory is a load alone (``core_for``). C =
    A*B 8 x 4 x 8 f32 on AVX-512 folded two rows of B into each vector, A's two elements
    permuted into its halves: 16 permutes and 8 extracts beside 16 FMAs, 7.1 ns a call on
    a Xeon, where the fixed-size loops (eight rows of 256-bit FMAs on broadcasts) ran 4.9.
    Modelled on Intel's pipes, the folds cost the shuffles they wait for, and the rows of
    broadcasts are taken; the model's constants (AMD's two shuffle pipes beside the FMA
    pipes, the default) keep the folds. A two-source permute is one shuffle on that one
    pipe, as it is one instruction."""
    from blacc import blacs
    from blacc.ir import kernel as k
    from blacc.ir.walk import nodes_of
    from blacc.transform.blac import OpSchedule, build_module
    from blacc.transform.index_notation import arg_specs, forms

    intel = replace(_machine(*AVX512_FLAGS), vendor="GenuineIntel", family=6)
    amd = replace(_machine(*AVX512_FLAGS), vendor="AuthenticAMD", family=26)
    wide = small.core_for(intel, AVX512)
    assert (wide.shuffle_pipes, wide.fp_and_shuffle_pipes, wide.broadcast_fp,
            wide.pair_shuffle) == (1, 2, 0, 1)
    narrow = small.core_for(intel, AVX2)
    assert (narrow.shuffle_pipes, narrow.fp_and_shuffle_pipes, narrow.broadcast_fp,
            narrow.pair_shuffle) == (1, 3, 0, 1)
    assert small.core_for(amd, AVX512) == small.core_for(amd, AVX2) == small._core(None)
    folded = small._Issue(fp=16 + 8, shuffles=16 + 8)
    assert folded.cycles(wide) == 24 and folded.cycles(None) == 16

    decls = {"A": blacc.Matrix(8, 4, "f32"), "B": blacc.Matrix(4, 8, "f32"),
             "C": blacc.Matrix(8, 8, "f32")}
    plans = {}
    for name, fields in (("intel", dict(vendor="GenuineIntel", family=6)),
                         ("amd", dict(vendor="AuthenticAMD", family=26))):
        plans[name] = _avx512_host(monkeypatch, **fields).plan("C = A*B", target="avx512",
                                                               **decls)
    assert plans["amd"].schedule[0].folds
    assert not plans["intel"].schedule[0].folds
    body = plans["intel"].module.function(plans["intel"].module.entry).body
    assert not nodes_of(body, (k.Permute, k.Half))
    assert len(nodes_of(body, k.Fma)) + len(nodes_of(body, k.Bin)) == 32  # 8 rows x 4

    # one vpermt2ps is one shuffle there (two where two pipes take shuffles): C = A*B
    # 4 x 8 x 4 f32 in quarters, A's column k from two 512-bit loads of its rows
    quads = OpSchedule(vector="j", block=(4, 1), quads=True)
    decls = {"A": blacc.Matrix(4, 8, "f32"), "B": blacc.Matrix(8, 4, "f32"),
             "C": blacc.Matrix(4, 4, "f32")}
    typed = blacs._typed("C = A*B", decls)
    module = build_module(forms(typed)[0], arg_specs(typed), (quads,), AVX512, "k")
    body = module.function(module.entry).body
    assert len([p for p in nodes_of(body, k.Permute) if p.y is not None]) == 8
    assert small._cycles(body, AVX512, core=wide).issue.shuffles == 8
    assert small._cycles(body, AVX512).issue.shuffles == 16


def test_worth_wider_needs_a_clear_modelled_gain():
    from blacc.strategy.small import CALL_CYCLES, WIDER_GAIN, worth_wider

    assert worth_wider([100.0]) == 0
    assert worth_wider([100.0, 100.0]) == 0
    assert worth_wider([100.0, 50.0]) == 1
    # just short of the gain once the fixed cost of a call is counted
    short = (100.0 + CALL_CYCLES) / WIDER_GAIN - CALL_CYCLES + 1.0
    assert worth_wider([100.0, short]) == 0
    assert worth_wider([100.0, short - 2.0]) == 1


def test_zen5_and_intel_take_the_wider_isa_on_a_smaller_modelled_gain(monkeypatch):
    """C = A*B 4 x 4 x 4 f32: AVX-512 in quarters (5.3 -> 2.8 modelled cycles; one
    512-bit FMA a row of A, 1.0 ns a call on Zen 5 against AVX2's pairs' 1.5). Short of
    the 1.4x the rule asks elsewhere, enough for Zen 5's 1.05x (``wider_gain``), and for
    Intel's 1.1x, whose model counts 512-bit shuffles on one pipe (1.57 ns a call on a
    Xeon against AVX2's 2.14). Zen 4's 256-bit datapath halves AVX-512's gain to a tie,
    which its rule gives to AVX-512 (1.01x the loops there, AVX2's pairs 0.80x); an AMD
    family 25 core without AVX-512 (Zen 3) keeps the rule of the constants."""
    from blacc.strategy.small import (
        INTEL_WIDER_GAIN,
        WIDER_GAIN,
        ZEN4_WIDER_GAIN,
        ZEN5_WIDER_GAIN,
        wider_gain,
    )

    monkeypatch.delenv("BLACC_ISA", raising=False)
    decls = {name: blacc.Matrix(4, 4, "f32") for name in "ABC"}
    zen5 = dict(vendor="AuthenticAMD", family=26)
    for fields, gain, isa in ((zen5, ZEN5_WIDER_GAIN, AVX512),
                              (dict(vendor="GenuineIntel", family=6), INTEL_WIDER_GAIN, AVX512),
                              (dict(zen5, family=25), ZEN4_WIDER_GAIN, AVX512)):
        blacs = _avx512_host(monkeypatch, **fields)
        assert wider_gain(blacs.host_target().machine) == gain
        assert blacs.plan("C = A*B", **decls).isa is isa
    zen3 = replace(_machine("avx2", "fma"), vendor="AuthenticAMD", family=25)
    assert wider_gain(zen3) == WIDER_GAIN


def test_zen4_charges_avx512_pairs_of_f64_rows_their_lane_crossing_splats(monkeypatch):
    """C = A*B n x 4 x 4 f64: AVX-512 holds two rows of C a vector and splats A's
    elements within 256-bit halves (``vpermpd`` with an immediate), which Zen 4 runs over
    its 256-bit pipes at more than a shuffle a piece (1.01x the loops against AVX2's
    broadcasts' 1.28x at n = 8). The choice charges them ``WIDE_SPLAT_SHUFFLES`` there
    and takes AVX2, while f32's splats within 128-bit quarters keep AVX-512."""
    from blacc.ir import kernel as k

    monkeypatch.delenv("BLACC_ISA", raising=False)
    blacs = _avx512_host(monkeypatch, vendor="AuthenticAMD", family=25)
    for dtype, isa in (("f64", AVX2), ("f32", AVX512)):
        decls = {"A": blacc.Matrix(8, 4, dtype), "B": blacc.Matrix(4, 4, dtype),
                 "C": blacc.Matrix(8, 4, dtype)}
        assert blacs.plan("C = A*B", **decls).isa is isa
    x = k.Load("A", k.Const(0), "f64", 8)
    splat = k.HalfSplat(x, lane=1)
    assert small._wide_splat(splat, 256)
    assert not small._wide_splat(splat, 0)  # a core that takes 512 bits at once
    quarters = k.HalfSplat(replace(x, dtype="f32", lanes=16), lane=1, parts=4)
    assert not small._wide_splat(quarters, 256)


def test_zen4_avx512_splats_at_each_width_of_its_own(monkeypatch):
    """C = A*B 24 x 4 x 24 f32: a row of C is a 16-lane and an 8-lane vector. Zen 4
    runs AVX-512 over 256-bit pipes, and there one 512-bit broadcast of each element of A
    shared by both FMAs ran 51.3 ns a call against 45.9 with each FMA's own broadcast
    (``Core.shared_splats``); AVX2 there, and cores that take 512 bits at once, share.
    The model picks blocks of 6 x 2 there either way; the kernel emitted does not share."""
    from blacc.ir import kernel as k
    from blacc.ir.walk import nodes_of

    zen4 = replace(_machine(*AVX512_FLAGS), vendor="AuthenticAMD", family=25)
    assert not small.core_for(zen4, AVX512).shared_splats
    assert small.core_for(zen4, AVX2).shared_splats
    assert small.core_for(replace(zen4, family=26), AVX512).shared_splats
    decls = {"A": blacc.Matrix(24, 4, "f32"), "B": blacc.Matrix(4, 24, "f32"),
             "C": blacc.Matrix(24, 24, "f32")}
    for family, shared in ((25, False), (26, True)):  # Zen 4, Zen 5
        blacs = _avx512_host(monkeypatch, vendor="AuthenticAMD", family=family)
        module = blacs.plan("C = A*B", target="avx512", **decls).module
        casts = [h for h in nodes_of(module, k.Half) if isinstance(h.x, k.Var)]
        assert bool(casts) is shared


def test_zen4_charges_avx512_spreads_across_the_whole_vector(monkeypatch):
    """gemm n x 4 x 4 x n f32, n = 8: AVX-512's folds spread A's elements over the
    output's lanes (``vpermps`` across the whole 512-bit vector), which Zen 4 runs over
    its 256-bit pipes at more than a shuffle a piece (14-18 ns a call against AVX2's
    9.1). The choice charges them ``WIDE_SPREAD_SHUFFLES`` there and takes AVX2; a core
    that takes 512 bits at once keeps AVX-512."""
    from blacc.ir import kernel as k

    monkeypatch.delenv("BLACC_ISA", raising=False)
    decls = {"A": blacc.Matrix(8, 4, "f32"), "B": blacc.Matrix(4, 8, "f32"),
             "C": blacc.Matrix(8, 8, "f32"), "alpha": blacc.Scalar("f32"),
             "beta": blacc.Scalar("f32")}
    blacs = _avx512_host(monkeypatch, vendor="AuthenticAMD", family=25)
    assert blacs.plan("C = alpha*A*B + beta*C", **decls).isa is AVX2
    monkeypatch.setattr(small, "WIDE_SPREAD_SHUFFLES", 1.0)
    assert blacs.plan("C = alpha*A*B + beta*C", **decls).isa is AVX512
    spread = k.Spread(k.Load("A", k.Const(0), "f32", 2), 16)
    assert small._wider_than(spread, 256)
    assert not small._wider_than(spread, 0)  # a core that takes 512 bits at once
    assert not small._wider_than(replace(spread, lanes=8), 256)


def test_isa_choice_counts_avx512_broadcasts_read_by_their_fma(monkeypatch):
    """C = A*B 12 x 4 x 12 f64: AVX-512 reads each broadcast of A inside its FMA
    ({1to8}; 96 FMAs and multiplies, no broadcast of their own), against AVX2's 144 FMAs
    and 48 broadcasts. Counted so, 'host' takes AVX-512 (13.8 ns a call on Zen 5 against
    AVX2's 17.0). A broadcast that occurs twice (32 x 4 x 32 f32, two vectors a row) is
    kept in a register by the C compiler, a load of its own; AVX2 has no such operand."""
    from blacc.blacs import plan
    from blacc.strategy.small import program_cost

    monkeypatch.delenv("BLACC_ISA", raising=False)

    def product(m: int, k: int, n: int, dtype: str, target: str | None = None):
        decls = dict(A=blacc.Matrix(m, k, dtype), B=blacc.Matrix(k, n, dtype),
                     C=blacc.Matrix(m, n, dtype))
        if target is None:
            return _avx512_host(monkeypatch).plan("C = A*B", **decls)
        return plan("C = A*B", target=target, **decls)

    def costs(p) -> tuple[float, float]:
        return tuple(program_cost(p.module, p.indexed, p.schedule, p.isa, embedded=e)
                     for e in (False, True))

    separate, embedded = costs(product(12, 4, 12, "f64", "avx512"))
    assert embedded < separate
    assert "_mm512_set1_pd(*(" in product(12, 4, 12, "f64", "avx512").source
    assert product(12, 4, 12, "f64").isa is AVX512
    separate, embedded = costs(product(12, 4, 12, "f64", "avx2"))
    assert embedded == separate
    # held in registers, 32 x 4 x 32 f32's broadcasts are loads of their own: between
    # ISAs without an FP slot (AVX-512 cores take them as loads alone), folded into no FMA
    body = product(32, 4, 32, "f32", "avx512").module.function("blac_kernel").body
    within = small._cycles(body, AVX512).issue
    between = small._cycles(body, AVX512, single=small._single_broadcasts(body)).issue
    saved = (within.fp - between.fp) / small.BROADCAST_FP  # one per broadcast issued
    assert within.loads == between.loads and saved >= 32 and saved == int(saved)


def test_isa_choice_counts_a_repeated_broadcast_once(monkeypatch):
    """alpha = x'*A*y, A 4 x 24 f32: AVX2's kernel writes the broadcasts of x[0..3] once
    for each of its three column vectors, and gcc emits four. The choice between ISAs
    counts them as emitted, 4 loads rather than 12 (ranking within an ISA keeps the
    count it was fitted with), and on Zen 4 'host' takes AVX2: 3.7 ns a call against
    AVX-512's 5.4 (Eigen's 3.7)."""
    from blacc.blacs import plan

    monkeypatch.delenv("BLACC_ISA", raising=False)
    decls = dict(x=blacc.Vector(4, "f32"), A=blacc.Matrix(4, 24, "f32"),
                 y=blacc.Vector(24, "f32"), alpha=blacc.Scalar("f32"))
    p = plan("alpha = x'*A*y", target="avx2", **decls)
    assert p.source.count("_mm256_broadcast_ss(") == 12
    body = p.module.function(p.module.entry).body
    within = small._cycles(body, AVX2).issue
    between = small._cycles(body, AVX2, single=small._single_broadcasts(body)).issue
    assert within.loads - between.loads == 8
    zen4 = _avx512_host(monkeypatch, vendor="AuthenticAMD", family=25)
    assert zen4.plan("alpha = x'*A*y", **decls).isa is AVX2


def test_temporaries_read_back_an_element_at_a_time_pay_the_round_trip():
    """C = alpha*(A0 + A1)'*B + beta*C, 4 x 4 x 4 f32: the form that stores A0 + A1 in a
    temporary and broadcasts its elements back waits on each store (5.97 ns on Zen 5
    with AVX2, against the fused form's 4.05), and is charged SCRATCH_ROUND_TRIP; a
    temporary read back in whole vectors (y = alpha*A*x + beta*B*x) is not."""
    from blacc.blacs import plan

    def gemam(target: str):
        return plan("C = alpha*(A0 + A1)'*B + beta*C", target=target,
                    A0=blacc.Matrix(4, 4, "f32"), A1=blacc.Matrix(4, 4, "f32"),
                    B=blacc.Matrix(4, 4, "f32"), C=blacc.Matrix(4, 4, "f32"),
                    alpha=blacc.Scalar("f32"), beta=blacc.Scalar("f32"))

    for target in ("avx2", "avx512"):
        assert "t0[" not in gemam(target).source  # the fused form
    summed = plan("y = alpha*A*x + beta*B*x", target="avx2", A=blacc.Matrix(32, 4, "f32"),
                  B=blacc.Matrix(32, 4, "f32"), x=blacc.Vector(4, "f32"),
                  y=blacc.Vector(32, "f32"), alpha=blacc.Scalar("f32"),
                  beta=blacc.Scalar("f32"))
    assert "t0[" in summed.source


def test_zen3_reads_temporaries_back_without_the_round_trip(monkeypatch):
    """Zen 3 (AMD family 25 without AVX-512) forwards a temporary's vector stores to the
    loads of its elements without a wait calls do not overlap: C = alpha*(A0 + A1)'*B +
    beta*C 4 x 4 x 24 f64 with the sum in a temporary ran 25.0 ns a call there, the
    fused form 32.0. Its core charges no round trip (``ZEN3_SCRATCH_ROUND_TRIP``) and
    its plan keeps the temporary; Zen 4 (the same family, with AVX-512), Zen 5 and
    Intel's cores are charged ``SCRATCH_ROUND_TRIP``, and Zen 5 plans the fused form. Spreads
    of two f32 elements from a temporary still wait on Zen 3 (C 4 x 4 from A0 12 x 4:
    12.3 ns a call, the temporary read in whole vectors and permuted in lanes 9.5), and
    its plan there reads none."""
    zen3 = Machine("zen3", "x86_64", features=frozenset({"avx2", "fma"}), cores=2,
                   vendor="AuthenticAMD", family=25)
    assert small.core_for(zen3, AVX2).scratch_round_trip == small.ZEN3_SCRATCH_ROUND_TRIP == 0
    others = (replace(zen3, features=frozenset(AVX512_FLAGS)), replace(zen3, family=26),
              replace(zen3, vendor="GenuineIntel", family=6))
    assert all(small.core_for(m, AVX2).scratch_round_trip is None for m in others)

    from blacc import blacs
    from blacc.ir import kernel as k
    from blacc.ir.walk import nodes_of

    monkeypatch.setattr(blacs, "core_for", small.core_for)  # not the suite's constants
    decls = dict(A0=blacc.Matrix(4, 4, "f64"), A1=blacc.Matrix(4, 4, "f64"),
                 B=blacc.Matrix(4, 24, "f64"), C=blacc.Matrix(4, 24, "f64"),
                 alpha=blacc.Scalar("f64"), beta=blacc.Scalar("f64"))
    for machine, temporary in ((zen3, True), (others[1], False)):
        monkeypatch.setattr(blacs, "host_target",
                            lambda m=machine: gemm_runtime.Target(m, isa_for(m)))
        p = blacs.plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx2", **decls)
        assert ("t0[" in p.source) is temporary, machine
    spread = dict(A0=blacc.Matrix(12, 4, "f32"), A1=blacc.Matrix(12, 4, "f32"),
                  B=blacc.Matrix(12, 4, "f32"), C=blacc.Matrix(4, 4, "f32"),
                  alpha=blacc.Scalar("f32"), beta=blacc.Scalar("f32"))
    monkeypatch.setattr(blacs, "host_target", lambda: gemm_runtime.Target(zen3, AVX2))
    p = blacs.plan("C = alpha*(A0 + A1)'*B + beta*C", target="avx2", **spread)
    body = p.module.function(p.module.entry).body
    local = {s.buf for s in body if isinstance(s, k.Local)}
    assert local and not any(s.x.buf in local for s in nodes_of(p.module, k.Spread))


def test_temporaries_read_in_vectors_no_single_store_holds_pay_the_round_trip():
    """C = alpha*(A0 + A1)'*B + beta*C, 4 x 12 x 4 f64 on AVX-512: the form with the
    sum in a temporary stores its last four rows as 256-bit vectors and, with the folds
    of the product, reads them two rows per 512-bit load, which no store forwards (15.6
    ns a call on a Xeon against the fused form's 9.5): charged UNFORWARDED_ROUND_TRIP,
    and the model takes a form without it. A temporary read in the vectors it was stored
    in (y = alpha*A*x + beta*B*x), read within one store, or read over a masked store,
    is told apart."""
    from blacc.blacs import plan
    from blacc.ir import kernel as k
    from blacc.transform.blac import OpSchedule, build_module
    from blacc.transform.index_notation import arg_specs, forms

    decls = dict(A0=blacc.Matrix(12, 4, "f64"), A1=blacc.Matrix(12, 4, "f64"),
                 B=blacc.Matrix(12, 4, "f64"), C=blacc.Matrix(4, 4, "f64"),
                 alpha=blacc.Scalar("f64"), beta=blacc.Scalar("f64"))
    source = "C = alpha*(A0 + A1)'*B + beta*C"
    typed = blacc.blacs._typed(source, decls)
    specs = arg_specs(typed)
    split = next(f for f in forms(typed) if len(f.ops) == 2)
    schedule = (OpSchedule("i", (4, 1)), OpSchedule("j", (4, 1), folds=True))
    module = build_module(split, specs, schedule, AVX512, "k")
    body = module.function(module.entry).body
    scratch = frozenset(s.buf for s in body if isinstance(s, k.Local))
    assert small._unforwarded_scratch_loads(body, scratch)
    unknown = tuple(s for s in body if not isinstance(s, k.Local))
    plain = replace(module, functions=(replace(module.function(module.entry), body=unknown),))
    assert small.model_cost(module, 0, AVX512) == pytest.approx(
        small.model_cost(plain, 0, AVX512) + small.UNFORWARDED_ROUND_TRIP)
    assert "t0[" not in plan(source, target="avx512", **decls).source

    summed = plan("y = alpha*A*x + beta*B*x", target="avx512", A=blacc.Matrix(32, 4, "f32"),
                  B=blacc.Matrix(32, 4, "f32"), x=blacc.Vector(4, "f32"),
                  y=blacc.Vector(32, "f32"), alpha=blacc.Scalar("f32"),
                  beta=blacc.Scalar("f32"))
    body = summed.module.function(summed.module.entry).body
    scratch = frozenset(s.buf for s in body if isinstance(s, k.Local))
    assert scratch and not small._unforwarded_scratch_loads(body, scratch)

    i = k.Var("i")

    def store(index: k.Expr, lanes: int, count: int | None = None) -> k.Store:
        return k.Store("t", index, k.Broadcast(k.Const(1.0, "f64"), lanes),
                       None if count is None else k.Const(count))

    def load(index: k.Expr, lanes: int) -> k.Store:
        return k.Store("out", k.Const(0), k.Load("t", index, "f64", lanes))

    t = frozenset({"t"})
    looped = (k.For(i, k.Const(0), k.Const(16), 8, (store(i, 8),)),)
    assert not small._unforwarded_scratch_loads((*looped, load(k.Const(8), 8)), t)
    assert not small._unforwarded_scratch_loads((*looped, load(k.Const(12), 4)), t)
    assert small._unforwarded_scratch_loads((*looped, load(k.Const(4), 8)), t)
    assert small._unforwarded_scratch_loads((store(k.Const(0), 8, 6), load(k.Const(0), 4)), t)
    assert not small._unforwarded_scratch_loads((store(k.Const(0), 8, 6), load(k.Const(8), 4)),
                                                t)


def test_masked_stores_into_an_operand_read_back_set_a_floor(monkeypatch):
    """y = alpha*x + y, n = 99 f32: on AVX-512 its leftover (3 of 4 lanes) is a masked
    store into y, which the next call loads; such a call lasts at least READ_BACK_CYCLES,
    so 'host' keeps AVX2's plain stores. n = 96 (no leftover), n = 100 (96 + 4 lanes,
    unmasked) and a long kernel are not floored."""
    from blacc.blacs import plan
    from blacc.strategy.small import READ_BACK_CYCLES, program_cost

    monkeypatch.delenv("BLACC_ISA", raising=False)

    def axpy(n: int, target: str):
        return plan("y = alpha*x + y", target=target, x=blacc.Vector(n, "f32"),
                    y=blacc.Vector(n, "f32"), alpha=blacc.Scalar("f32"))

    def cost(p) -> float:
        return program_cost(p.module, p.indexed, p.schedule, p.isa)

    assert cost(axpy(99, "avx512")) == READ_BACK_CYCLES
    assert cost(axpy(96, "avx512")) < READ_BACK_CYCLES / 2
    assert cost(axpy(100, "avx512")) < READ_BACK_CYCLES / 2
    assert cost(axpy(99, "avx2")) < READ_BACK_CYCLES  # plain stores of the leftover
    gemm = plan("C = alpha*A*B + beta*C", target="avx512", A=blacc.Matrix(4, 4, "f32"),
                B=blacc.Matrix(4, 100, "f32"), C=blacc.Matrix(4, 100, "f32"),
                alpha=blacc.Scalar("f32"), beta=blacc.Scalar("f32"))
    assert cost(gemm) > READ_BACK_CYCLES
    assert _avx512_host(monkeypatch).plan("y = alpha*x + y", x=blacc.Vector(99, "f32"),
                                          y=blacc.Vector(99, "f32"),
                                          alpha=blacc.Scalar("f32")).isa is AVX2


def test_compile_refuses_a_target_the_machine_cannot_run(monkeypatch):
    from blacc import blacs

    monkeypatch.setattr(blacs, "host_target", lambda: gemm_runtime.Target(
        _machine("avx2", "fma"), AVX2))
    assert blacs.host_isas() == (AVX2,)
    with pytest.raises(ArgumentError, match="cannot run target 'avx512'.*lacks avx512f"):
        blacc.compile("y = A*x", target="avx512", A=blacc.Matrix(3, 3), x=blacc.Vector(3),
                      y=blacc.Vector(3))


def test_rows_of_b_reloaded_where_hoisted_broadcasts_fill_the_registers():
    """C = A*B, n x 4 x n on AVX-512: for n = 48 f32 (and 24 f64) a block of 6 rows hoists
    24 broadcasts out of a 3-trip loop along the row, which the C compiler unrolls; its
    rows of B would then be hoisted too and spilled, so each block reloads them after a
    barrier. With 4-row blocks (n = 64) the compiler is left alone."""
    def source(n: int, dtype: str) -> str:
        decls = dict(A=blacc.Matrix(n, 4, dtype), B=blacc.Matrix(4, n, dtype),
                     C=blacc.Matrix(n, n, dtype))
        return blacc.blacs.plan("C = A*B", target="avx512", **decls).source

    assert "BLACC_BARRIER();" in source(48, "f32")
    assert "BLACC_BARRIER();" in source(24, "f64")
    assert "BLACC_BARRIER();" not in source(64, "f32")


def test_zen4_charges_broadcasts_hoisted_out_of_loops_gcc_unrolls():
    """Zen 4 with AVX-512: broadcasts hoisted out of a short loop that gcc unrolls
    completely stay live across its copies and spill (``HOISTED_FREE``). C = A*B
    80 x 4 x 80 f32 in blocks of 6 rows x 1 vector hoists 24 broadcasts out of a 5-trip
    loop and ran 1.07x the time of blocks of 2 or 3 rows; the model ranked it first
    without the charge. A 12-trip loop (100 x 4 x 100 f64) stays a loop: nothing is
    charged, nor broadcasts hoisted to the top of the kernel (C = A*B 4 x 4 x 80 f64 in
    blocks of 4 rows: 16, once a call). Other cores are not charged."""
    from blacc.transform.blac import OpSchedule, build_module
    from blacc.transform.index_notation import arg_specs, forms

    zen4 = replace(_machine(*AVX512_FLAGS), vendor="AuthenticAMD", family=25)
    zen3 = replace(_machine("avx2", "fma"), vendor="AuthenticAMD", family=25)
    zen5 = replace(zen4, family=26)
    intel = replace(_machine(*AVX512_FLAGS), vendor="GenuineIntel", family=6)
    core = small.core_for(zen4, AVX512)
    assert core.hoisted_splat > 0
    assert small.core_for(intel, AVX512).hoisted_splat == 0
    assert small.core_for(zen4, AVX2).hoisted_splat == 0
    assert small.core_for(zen3, AVX2).hoisted_splat == 0
    assert small.core_for(zen5, AVX512).hoisted_splat == 0  # 512-bit pipes

    def module(n: int, dtype: str, rows: int, m: int | None = None):
        m = n if m is None else m
        decls = {"A": blacc.Matrix(m, 4, dtype), "B": blacc.Matrix(4, n, dtype),
                 "C": blacc.Matrix(m, n, dtype)}
        typed = blacc.blacs._typed("C = A*B", decls)
        form, specs = forms(typed)[0], arg_specs(typed)
        sched = OpSchedule(vector="j", block=(rows, 1), unroll=16)
        return form, sched, build_module(form, specs, (sched,), AVX512, "k")

    def cost(n: int, dtype: str, rows: int, c=core) -> float:
        form, sched, m = module(n, dtype, rows)
        return small.model_cost(m, small._registers(form, form.ops[0], sched, m, AVX512),
                                AVX512, core=c)

    six = module(80, "f32", 6)[2]
    assert small._unrolled_hoists(six.function(six.entry).body, AVX512) == 24
    wide = module(100, "f64", 6)[2]
    assert small._unrolled_hoists(wide.function(wide.entry).body, AVX512) == 0
    once = module(80, "f64", 4, m=4)[2]
    assert small._unrolled_hoists(once.function(once.entry).body, AVX512) == 0
    assert small._unrolled_hoists(once.function(once.entry).body, AVX512, nested=True) == 16
    uncharged = replace(core, hoisted_splat=0.0)
    assert cost(80, "f32", 6, uncharged) < cost(80, "f32", 3, uncharged)
    assert cost(80, "f32", 6) > cost(80, "f32", 3) > cost(80, "f32", 3, uncharged)
    assert cost(80, "f32", 2) == cost(80, "f32", 2, uncharged)


def test_short_outputs_are_computed_in_blocks_of_all_their_rows_on_cpu_model_167():
    """On a Xeon of CPU model 167 an output of at most ``SHORT_OUTPUT_ROWS`` rows, each
    of two vectors or more, is computed in blocks of all its rows: C = A*B 4 x 4 x 100
    f32 ran 30.6 ns a call in the model's 2 x 4 blocks, 23.4 in 4 x 2. Shorter rows, and
    other cores, keep the model's blocks."""
    from blacc.transform.index_notation import arg_specs, forms

    xeon = replace(_machine(*AVX512_FLAGS), vendor="GenuineIntel", family=6, model=167)
    other = replace(xeon, model=143)
    assert small.core_for(xeon, AVX512).whole_short_outputs
    assert not small.core_for(other, AVX512).whole_short_outputs

    def rows(m: int, n: int, dtype: str, machine: Machine) -> set[int]:
        decls = {"A": blacc.Matrix(m, 4, dtype), "B": blacc.Matrix(4, n, dtype),
                 "C": blacc.Matrix(m, n, dtype)}
        typed = blacc.blacs._typed("C = A*B", decls)
        form = forms(typed)[0]
        (ranked,) = small.options(form, arg_specs(typed), AVX512, keep=1000,
                                  core=small.core_for(machine, AVX512))
        return {s.block[0] for _, s in ranked if s.vector == form.ops[0].dims[1]}

    assert rows(4, 100, "f32", xeon) == {4}
    assert rows(4, 48, "f64", xeon) == {4}
    assert rows(3, 48, "f64", xeon) == {3}
    assert {1, 2} <= rows(4, 100, "f32", other)
    assert {1, 2} <= rows(4, 8, "f32", xeon)  # half a vector a row
    assert rows(4, 16, "f64", xeon) == {4}  # two vectors a row
    assert {1, 2} <= rows(4, 8, "f64", xeon)  # one vector a row
    assert len(rows(6, 100, "f32", xeon)) > 1  # more rows than SHORT_OUTPUT_ROWS


def test_outputs_near_l1_are_computed_one_row_at_a_time_on_cpu_model_167():
    """On a Xeon of CPU model 167 an output that fills a third of L1 to all of it, read
    and written (``beta*C``) or only written, is computed in blocks of one row
    (``ONE_ROW_BAND``): C = alpha*A*B + beta*C 100 x 4 x 100 f32 ran 867 ns a call in the
    model's blocks of 4 rows, 661 in one-row blocks; C = A*B the same size 590 and 519.
    Only one-row blocks that load the rows of B once for all the rows count
    (``_keeps_rows_of_b``): 1 x 4 there, reloading them after a barrier each row, ran
    908 ns; where none does (longer rows of A) the blocks are as before. Outside the
    band and on other cores too."""
    from blacc.transform.index_notation import arg_specs, forms

    xeon = replace(_machine(*AVX512_FLAGS), vendor="GenuineIntel", family=6, model=167)
    other = replace(xeon, model=143)
    assert small.core_for(xeon, AVX512).one_row_near_l1
    assert small.core_for(xeon, AVX512).straight_rows_near_l1
    assert not small.core_for(other, AVX512).one_row_near_l1
    zen4 = replace(_machine(*AVX512_FLAGS), vendor="AuthenticAMD", family=25)
    assert not small.core_for(zen4, AVX512).one_row_near_l1

    def blocks(source: str, n: int, dtype: str, machine: Machine,
               k: int = 4) -> set[tuple[int, int]]:
        decls = {"alpha": blacc.Scalar(dtype), "beta": blacc.Scalar(dtype),
                 "A": blacc.Matrix(n, k, dtype), "B": blacc.Matrix(k, n, dtype),
                 "C": blacc.Matrix(n, n, dtype)}
        typed = blacc.blacs._typed(source, decls)
        form = forms(typed)[0]
        (ranked,) = small.options(form, arg_specs(typed), AVX512, keep=1000,
                                  core=small.core_for(machine, AVX512))
        return {s.block for _, s in ranked if s.vector == form.ops[0].dims[1]}

    def rows(source: str, n: int, dtype: str, machine: Machine, k: int = 4) -> set[int]:
        return {r for r, _ in blocks(source, n, dtype, machine, k)}

    for source in ("C = alpha*A*B + beta*C", "C = A*B"):
        assert rows(source, 100, "f32", xeon) == {1}
        assert rows(source, 64, "f64", xeon) == {1}
        assert len(rows(source, 100, "f32", other)) > 1
        assert len(rows(source, 48, "f32", xeon)) > 1  # 0.19 L1
        assert len(rows(source, 80, "f64", xeon)) > 1  # 1.04 L1
    # one-row blocks of 4 vectors (f32 n = 100, with 3 left over) or 8 (f64 n = 64)
    # take 28 and 32 vectors of B across the rows, more than their blocks leave of the
    # registers: reloaded after a barrier each row, they are left out
    only = blocks("C = A*B", 100, "f32", xeon)
    assert (1, 3) in only and (1, 4) not in only
    assert (1, 4) in blocks("C = A*B", 100, "f32", other)
    assert (1, 8) not in blocks("C = A*B", 64, "f64", xeon)
    # B of 8 rows: one row at a time at n = 64 (32 vectors of B a row); at n = 100 every
    # one-row block reloads B each row (its rows in straight lines), and B of 32 rows at
    # n = 64 is 128 vectors a row, 4 register files: the taller blocks
    assert rows("C = A*B", 64, "f32", xeon, k=8) == {1}
    assert len(rows("C = A*B", 100, "f32", xeon, k=8)) > 1
    assert len(rows("C = A*B", 64, "f32", xeon, k=32)) > 1
