"""The C backend (blacc.backend.c), the generic no-intrinsics target end to end, ``explain``, and
golden files of generated C.

Golden files live in tests/golden/; regenerate them with ``BLACC_REGEN_GOLDEN=1 pytest
tests/test_c_backend.py`` after an intended change to the generated code, and review the diff.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import blacc
from blacc.backend.c import render
from blacc.errors import CompilerNotFoundError, ScheduleError
from blacc.ir import kernel as k
from blacc.ir.structured import matmul
from blacc.runtime.build import host_compiler
from blacc.runtime.gemm import Target, check_gemm, run_gemm
from blacc.strategy.gemm import blis, choose, no_packing
from blacc.target.isa import AVX2, GENERIC
from blacc.target.machine import detect_machine
from blacc.transform.apply import apply
from blacc.transform.pipeline import lower
from conftest import LAYOUTS

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("BLACC_REGEN_GOLDEN") == "1"
STRICT_FLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-Werror")


def _lowered(dtype, schedule, isa, known_strides=None, name="kernel", **trans):
    module = apply(matmul(dtype, **trans), schedule, name=name, known_strides=known_strides)
    return lower(module, isa)[0]


AVX2_F32 = _lowered("f32", blis(12, 8, 32, 6, 16, 4, 8), AVX2, {"C_s1": 1})
AVX2_F64 = _lowered("f64", no_packing(6, 8, 4, 4), AVX2, {"C_s1": 1, "B_s1": 1})
GENERIC_F64 = _lowered("f64", blis(12, 8, 32, 4, 4, 4), GENERIC, {"C_s1": 1})
GENERIC_F32 = _lowered("f32", no_packing(4, 4, 4), GENERIC)


# ----------------------------------------------------------------------------- rendered text


def test_avx2_f32_uses_intrinsics():
    src = render(AVX2_F32, AVX2)
    assert "#include <immintrin.h>" in src
    for intrinsic in ("_mm256_fmadd_ps", "_mm256_broadcast_ss", "_mm256_maskstore_ps",
                      "_mm256_maskload_ps", "_mm256_loadu_ps", "_mm256_storeu_ps",
                      "_mm256_set1_ps", "_mm256_mul_ps", "_mm256_cmpgt_epi32", "__m256 "):
        assert intrinsic in src, intrinsic
    assert "_pd" not in src and "double" not in src
    assert "blacc_alloc(64," in src and "goto out_of_memory;" in src
    assert "int kernel(" in src and "static void kernel_micro(" in src


def test_avx2_f64_uses_intrinsics():
    src = render(AVX2_F64, AVX2)
    for intrinsic in ("_mm256_fmadd_pd", "_mm256_broadcast_sd", "_mm256_maskstore_pd",
                      "_mm256_maskload_pd", "_mm256_cmpgt_epi64", "__m256d "):
        assert intrinsic in src, intrinsic
    assert "_ps(" not in src and "float" not in src
    assert "blacc_alloc" not in src  # no_packing allocates nothing


@pytest.mark.parametrize("module", [GENERIC_F64, GENERIC_F32], ids=["blis-f64", "no_packing-f32"])
def test_generic_has_no_intrinsics(module):
    src = render(module, GENERIC)
    assert "_mm" not in src
    assert "immintrin" not in src
    assert "__m256" not in src
    assert "#include <stdint.h>" in src and "#include <stdlib.h>" in src
    assert "target: generic" in src


def test_render_needs_lowered_ir():
    scheduled = apply(matmul("f32"), no_packing(4, 4, 1))
    with pytest.raises(TypeError, match="lower it first"):
        render(scheduled, GENERIC)


def test_render_rejects_vectors_the_isa_lacks():
    with pytest.raises(ScheduleError, match="generic"):
        render(AVX2_F32, GENERIC)


# ----------------------------------------------------------------------------- compiles cleanly


@pytest.fixture(scope="module")
def cc():
    try:
        return host_compiler()
    except CompilerNotFoundError as exc:
        pytest.skip(f"no C compiler: {exc}")


def _compile(cc, source: str, tmp_path: Path, flags) -> subprocess.CompletedProcess:
    path = tmp_path / "kernel.c"
    path.write_text(source)
    return subprocess.run([*cc.command, *flags, "-c", str(path), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                          check=False)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("schedule", [no_packing(4, 4, 4), blis(12, 8, 32, 4, 4, 4),
                                      blis(10, 5, 20, 4, 4, 3)], ids=["no_packing", "blis", "odd"])
def test_generic_c_compiles_without_warnings(cc, tmp_path, dtype, schedule):
    """Generic C, no strides fixed at compile time, with -Wall -Wextra -Werror."""
    src = render(_lowered(dtype, schedule, GENERIC), GENERIC)
    proc = _compile(cc, src, tmp_path, STRICT_FLAGS)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("shape", [(8, 8, 8), (300, 300, 300)], ids=["small", "large"])
def test_generic_c_of_the_runtime_plans_compiles_without_warnings(cc, tmp_path, dtype, shape):
    """The C that ``run_gemm`` compiles for the GENERIC target (the plan's known strides
    included) must build cleanly with -Wall -Wextra -Werror.

    Fails today: ``known_strides`` ({"C_s1": 1}) folds the stride into the code but the
    exported entry keeps the parameter, so gcc -Wextra reports ``unused parameter 'C_s1'``."""
    plan = choose(*shape, dtype, machine=detect_machine(), isa=GENERIC, b_unit_cols=True)
    module = _lowered(dtype, plan.schedule, GENERIC, dict(plan.known_strides))
    proc = _compile(cc, render(module, GENERIC), tmp_path, STRICT_FLAGS)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


@pytest.mark.parametrize("module", [AVX2_F32, AVX2_F64], ids=["blis-f32", "no_packing-f64"])
def test_avx2_c_compiles_without_warnings(cc, tmp_path, module):
    """Compile only (no AVX2 CPU needed). The entry keeps the C_s1 / B_s1 parameters that
    known_strides fixed; -Wno-unused-parameter isolates that known issue (see the test
    above) so every other warning still fails."""
    flags = (*STRICT_FLAGS, "-Wno-unused-parameter", *AVX2.flags)
    proc = _compile(cc, render(module, AVX2), tmp_path, flags)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- end to end


GENERIC_SHAPES = [(1, 1, 1), (5, 3, 7), (13, 37, 19), (2, 1, 41), (50, 61, 53)]


@pytest.fixture(scope="module")
def generic_target(cc):
    return Target(detect_machine(), GENERIC)


def test_generic_shapes_cover_both_strategies():
    machine = detect_machine()
    strategies = {choose(*s, dt, machine=machine, isa=GENERIC, b_unit_cols=True).strategy
                  for s in GENERIC_SHAPES for dt in ("f32", "f64")}
    assert strategies == {"no_packing", "blis"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", GENERIC_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_generic_target_matches_numpy(generic_target, dtype, shape, rng, make_operand,
                                      assert_gemm_close):
    m, n, k = shape
    for n_case, (trans_a, trans_b) in enumerate([(False, False), (True, False), (False, True),
                                                 (True, True)]):
        la, lb, lc = (LAYOUTS[(n_case + i) % len(LAYOUTS)] for i in (0, 2, 4))
        a = make_operand(rng, *((k, m) if trans_a else (m, k)), dtype, la)
        b = make_operand(rng, *((n, k) if trans_b else (k, n)), dtype, lb)
        c = make_operand(rng, m, n, dtype, lc, pad_value=-999.0)
        c0 = c.copy()
        alpha, beta = [(1.0, 0.0), (-0.5, 1.0), (2.5, -0.5), (1.0, 2.5)][n_case]
        if beta == 0:
            c[...] = np.nan
        out = run_gemm(check_gemm(a, b, c, alpha, beta, trans_a, trans_b), target=generic_target)
        assert out is c
        assert_gemm_close(c, a, b, c0, alpha, beta, trans_a, trans_b,
                          context=f"GENERIC layouts A={la} B={lb} C={lc}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_generic_target_allocates_c(generic_target, dtype, rng, assert_gemm_close):
    a = rng.uniform(-1, 1, (13, 19)).astype(dtype)
    b = rng.uniform(-1, 1, (19, 37)).astype(dtype)
    out = run_gemm(check_gemm(a, b, None, 1.5, 0.0, False, False), target=generic_target)
    assert out.shape == (13, 37) and out.dtype == dtype
    assert_gemm_close(out, a, b, alpha=1.5)


# ----------------------------------------------------------------------------- explain

LEVEL_NAMES = ("== structured operation ==", "== schedule ==", "== kernel IR: schedule ==",
               "== kernel IR: lower-packs ==", "== kernel IR: lower-tiles ==", "== C ==")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_explain_small_and_large(cc, dtype):
    small = blacc.explain(m=8, n=8, k=8, dtype=dtype, backend="c")
    large = blacc.explain(m=300, n=300, k=300, dtype=dtype, backend="c")
    assert small.plan.strategy == "no_packing"
    assert large.plan.strategy == "blis"
    for e, shape in ((small, "8x8x8"), (large, "300x300x300")):
        text = str(e)
        for name in LEVEL_NAMES:
            assert name in text, name
        assert f"GEMM {shape} {dtype}" in text
        assert f"strategy: {e.plan.describe()}" in text
        assert e.plan.strategy + "(" in text
        assert "contract gemm: C[i,j]" in text
        assert e.source in text
    assert "pack_slivers(" in str(large) and "pack_slivers(" not in str(small)
    assert "strategy: no_packing(mr=" in str(small)
    assert "strategy: blis(mc=" in str(large)


# ----------------------------------------------------------------------------- golden files

GOLDEN_CASES = {
    "blis_avx2_f32.c": (AVX2_F32, AVX2),
    "blis_generic_f64.c": (GENERIC_F64, GENERIC),
    "no_packing_avx2_f64.c": (AVX2_F64, AVX2),
}


@pytest.mark.parametrize("filename", list(GOLDEN_CASES))
def test_golden_c(filename):
    module, isa = GOLDEN_CASES[filename]
    source = render(module, isa)
    path = GOLDEN / filename
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(source)
        return
    if not path.exists():
        pytest.fail(f"{path} is missing: run with BLACC_REGEN_GOLDEN=1 to create it")
    expected = path.read_text()
    if source != expected:
        diff = "".join(list(difflib.unified_diff(expected.splitlines(True), source.splitlines(True),
                                                 str(path), "rendered"))[:80])
        pytest.fail(f"generated C differs from {path.name} (BLACC_REGEN_GOLDEN=1 regenerates it "
                    f"if the change is intended):\n{diff}")


def test_render_is_deterministic():
    assert render(AVX2_F32, AVX2) == render(
        _lowered("f32", blis(12, 8, 32, 6, 16, 4, 8), AVX2, {"C_s1": 1}), AVX2)


# ----------------------------------------------------------------------------- unroll hint


def _k_loops(backend):
    from blacc.ir.walk import nodes_of

    module = apply(matmul("f64"), blis(12, 8, 32, 6, 8, 4, 4), name="gemm",
                   known_strides={"C_s1": 1})
    final, _ = lower(module, AVX2, backend=backend)
    micro = final.function("gemm_micro")
    return final, [s for s in nodes_of(micro.body, k.For) if s.var.name == "p"]


def test_c_backend_leaves_the_k_loop_rolled_for_gcc_to_unroll(cc):
    final, loops = _k_loops("c")
    assert [(s.step, s.unroll) for s in loops] == [(1, 4)]
    source = render(final, AVX2)
    hinted = "#if defined(__GNUC__)\n    #pragma GCC unroll 4\n#endif\n    for (int64_t p = 0;"
    assert hinted in source
    # the hint is printed only where it was asked for: the k loop of each micro-kernel
    # (the full tile and its narrow edge tile, NarrowEdges)
    micros = [f for f in final.functions if f.name.startswith("gemm_micro")]
    assert [f.name for f in micros] == ["gemm_micro4", "gemm_micro"]
    assert source.count("#pragma GCC unroll") == len(micros)


@pytest.mark.parametrize("backend", ["llvm", None])
def test_other_backends_get_the_k_loop_unrolled_in_the_ir(backend):
    _, loops = _k_loops(backend)
    assert [(s.step, s.unroll) for s in loops] == [(4, 1), (1, 1)]  # main loop + remainder


def test_the_hint_survives_printing_and_interpreting():
    from blacc.ir import printer
    from blacc.ir.interp import run

    final, _ = _k_loops("c")
    assert "for p in range(0, kc):  # unroll 4" in printer.module(final)
    rng = np.random.default_rng(3)
    m, n, k_ = 13, 11, 19
    a, b = rng.uniform(-1, 1, (m, k_)), rng.uniform(-1, 1, (k_, n))
    c = np.zeros(m * n)
    run(final, dict(m=m, n=n, k=k_, alpha=1.0, A=a.ravel(), A_s0=k_, A_s1=1, B=b.ravel(),
                    B_s0=n, B_s1=1, beta=0.0, C=c, C_s0=n, C_s1=1))
    np.testing.assert_allclose(c.reshape(m, n), a @ b, rtol=1e-12, atol=1e-12)


def test_a_barrier_names_the_local_arrays_written_before_it(cc, tmp_path):
    """gcc lets a memory clobber pass a local array whose address never escapes, so a
    barrier that holds for locals (``Barrier.locals``) names each local written before
    it (``BLACC_IN_MEMORY``): loads of t0 after it are made after it. t1, not yet
    written, is left out; a plain barrier names none. Compiles warning-free, with
    intrinsics and as generic C."""
    def load(buf: str) -> k.Load:
        return k.Load(buf, k.Const(0), "f64")

    out = k.Param("out", "f64", pointer=True, extent=2)
    body = (k.Local("t0", "f64", 2), k.Local("t1", "f64", 2),
            k.Store("t0", k.Const(0), k.Const(2.0, "f64")), k.Barrier(locals=True),
            k.Store("t1", k.Const(0), load("t0")), k.Barrier(locals=True),
            k.Store("out", k.Const(0), load("t1")), k.Barrier())
    module = k.Module((k.Function("kern", (out,), body, exported=True, status=False),),
                      entry="kern")
    src = render(module, AVX2)
    barriers = src.split("BLACC_BARRIER();")[1:]
    assert "BLACC_IN_MEMORY(t0);" in barriers[0] and "t1);" not in barriers[0]
    assert "BLACC_IN_MEMORY(t0);\n    BLACC_IN_MEMORY(t1);" in barriers[1]
    assert "BLACC_IN_MEMORY" not in barriers[2]
    assert "#define BLACC_IN_MEMORY(a)" in src
    plain = k.Module((k.Function("kern", (out,), (k.Store("out", k.Const(0), k.Const(
        1.0, "f64")), k.Barrier(locals=True)), exported=True, status=False),), entry="kern")
    assert "BLACC_BARRIER();" in render(plain, AVX2)
    assert "BLACC_IN_MEMORY" not in render(plain, AVX2)
    for isa, flags in ((AVX2, ("-mavx2", "-mfma")), (GENERIC, ("-pedantic",))):
        proc = _compile(cc, render(module, isa), tmp_path, [*STRICT_FLAGS, *flags])
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
