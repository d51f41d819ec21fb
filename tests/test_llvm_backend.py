"""The LLVM backend (blacc.backend.llvm) and the in-process JIT (blacc.backend.jit).

Kernels are built the way the runtime builds them (apply a schedule, lower for an ISA),
rendered as LLVM IR, compiled to object code in-process and called through ctypes on
NumPy arrays: no C compiler is involved anywhere in this file.
"""

from __future__ import annotations

import ctypes
import functools
import time

import llvmlite.binding as llvm
import numpy as np
import pytest

from blacc.backend import jit
from blacc.backend.llvm import render
from blacc.errors import ScheduleError
from blacc.ir import interp
from blacc.ir import kernel as k
from blacc.ir.structured import matmul
from blacc.strategy.gemm import blis, no_packing
from blacc.target.isa import AVX2, GENERIC, Isa
from blacc.transform.apply import apply
from blacc.transform.pipeline import lower

_CTYPES = {"i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double}
_NUMPY = {"f32": np.float32, "f64": np.float64}

# name -> (dtype, isa, schedule, known strides)
CASES = {
    "avx2-f32-blis": ("f32", AVX2, blis(12, 8, 32, 6, 16, 4, 8), {"C_s1": 1}),
    "avx2-f64-blis": ("f64", AVX2, blis(12, 8, 32, 6, 8, 4, 4), {"C_s1": 1}),
    "avx2-f32-nopack": ("f32", AVX2, no_packing(6, 16, 4, 8), {"C_s1": 1, "B_s1": 1}),
    "avx2-f64-nopack": ("f64", AVX2, no_packing(6, 8, 4, 4), {"C_s1": 1, "B_s1": 1}),
    "generic-f32-blis": ("f32", GENERIC, blis(8, 8, 16, 4, 4, 4), {"C_s1": 1}),
    "generic-f64-blis": ("f64", GENERIC, blis(8, 8, 16, 4, 4, 4), {"C_s1": 1}),
    "generic-f64-nopack": ("f64", GENERIC, no_packing(4, 4, 4), {}),
}
SHAPES = [(1, 1, 1), (13, 37, 19), (50, 45, 70)]


def _host_has(*features: str) -> bool:
    host = llvm.get_host_cpu_features()
    return all(host.get(f, False) for f in features)


def _lowered(case: str) -> tuple[k.Module, Isa]:
    dtype, isa, schedule, strides = CASES[case]
    module = apply(matmul(dtype), schedule, name="g", known_strides=strides)
    return lower(module, isa)[0], isa


def _function(module: k.Module, isa: Isa):
    """Render, compile and load ``module``; its entry function as a ctypes function."""
    lib = jit.JitLibrary(jit.emit_object(render(module, isa)))
    entry = module.function(module.entry)
    argtypes = [ctypes.c_void_p if p.pointer else _CTYPES[p.dtype] for p in entry.params]
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(lib.address(entry.name))


@functools.cache
def _kernel(case: str):
    return _function(*_lowered(case))


def _strides(x: np.ndarray) -> tuple[int, int]:
    return x.strides[0] // x.itemsize, x.strides[1] // x.itemsize


def _gemm(fn, A: np.ndarray, B: np.ndarray, C: np.ndarray, alpha: float, beta: float) -> None:
    """C = alpha * A @ B + beta * C through the kernel's C ABI; strides are in elements."""
    (m, kk), n = A.shape, B.shape[1]
    rc = fn(m, n, kk, alpha, A.ctypes.data, *_strides(A), B.ctypes.data, *_strides(B),
            beta, C.ctypes.data, *_strides(C))
    assert rc == 0


def _check(case: str, A, B, C, alpha: float, beta: float) -> None:
    dtype = CASES[case][0]
    exact = alpha * (A.astype(np.float64) @ B.astype(np.float64))
    if beta != 0:
        exact += beta * C.astype(np.float64)
    _gemm(_kernel(case), A, B, C, alpha, beta)
    eps = float(np.finfo(_NUMPY[dtype]).eps)
    magnitude = abs(alpha) * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)))
    if beta != 0:
        magnitude += abs(beta) * np.abs(exact)  # a loose, safe bound on |beta * C|
    tol = 4 * (A.shape[1] + 2) * eps * magnitude + float(np.finfo(_NUMPY[dtype]).tiny)
    err = np.abs(C.astype(np.float64) - exact)
    assert np.all(err <= tol), f"{case}: max error {err.max():.3e} (tolerance {tol.max():.3e})"


def _operands(rng, m: int, n: int, kk: int, dtype: str):
    t = _NUMPY[dtype]
    return (rng.uniform(-1, 1, (m, kk)).astype(t), rng.uniform(-1, 1, (kk, n)).astype(t),
            rng.uniform(-1, 1, (m, n)).astype(t))


# ----------------------------------------------------------------------------- GEMM results


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(CASES))
def test_gemm_matches_numpy(case, shape):
    rng = np.random.default_rng(sum(shape))
    A, B, C = _operands(rng, *shape, CASES[case][0])
    _check(case, A, B, C, alpha=1.0, beta=0.0)


@pytest.mark.parametrize("alpha, beta", [(1.0, 1.0), (-0.5, 2.0), (2.5, -1.0), (0.0, 0.75)])
@pytest.mark.parametrize("case", ["avx2-f32-blis", "avx2-f64-nopack", "generic-f32-blis"])
def test_alpha_beta(case, alpha, beta):
    A, B, C = _operands(np.random.default_rng(7), 50, 45, 70, CASES[case][0])
    _check(case, A, B, C, alpha, beta)


@pytest.mark.parametrize("case", list(CASES))
def test_beta_zero_never_reads_c(case):
    dtype = CASES[case][0]
    A, B, _ = _operands(np.random.default_rng(3), 13, 37, 19, dtype)
    C = np.full((13, 37), np.nan, dtype=_NUMPY[dtype])
    _check(case, A, B, C, alpha=1.5, beta=0.0)
    assert np.isfinite(C).all()


@pytest.mark.parametrize("case", ["avx2-f32-blis", "avx2-f64-blis", "generic-f64-nopack"])
def test_column_major_and_strided_operands(case):
    dtype = CASES[case][0]
    rng = np.random.default_rng(11)
    A, B, C = _operands(rng, 50, 45, 70, dtype)
    A = np.asfortranarray(A)  # column-major: A_s0 == 1
    big = np.zeros((3 * 70, 45), dtype=A.dtype)
    big[::3] = B
    B = big[::3]  # every third row: B_s0 == 3 * 45
    if case.startswith("generic"):  # no known strides at all: C may be column-major too
        C = np.asfortranarray(C)
    assert _strides(A) == (1, 50)
    _check(case, A, B, C, alpha=1.0, beta=0.5)


def test_negative_strides():
    rng = np.random.default_rng(5)
    A, B, C = _operands(rng, 13, 37, 19, "f64")
    _check("avx2-f64-blis", A[::-1, ::-1].copy()[::-1, ::-1], B[::-1], C, alpha=1.0, beta=1.0)


def test_out_of_memory_returns_one():
    """An Alloc that fails jumps to the block that frees every buffer and returns 1."""
    n, out = k.Var("n"), k.Param("out", "f32", pointer=True)
    body = (k.Alloc("a", "f32", n), k.Alloc("b", "f32", k.Const(16)),
            k.Store("a", k.Const(0), k.Const(2.0, "f32")),
            k.Store("b", k.Const(0), k.Load("a", k.Const(0), "f32")),
            k.Store("out", k.Const(0), k.Load("b", k.Const(0), "f32")),
            k.Free("a"), k.Free("b"))
    module = k.Module((k.Function("f", (k.Param("n", "i64"), out), body, exported=True),), "f")
    fn = _function(module, GENERIC)
    y = np.zeros(1, dtype=np.float32)
    assert fn(100, y.ctypes.data) == 0 and y[0] == 2.0
    assert fn(1 << 58, y.ctypes.data) == 1  # 2**60 bytes: aligned_alloc gives NULL


def test_masks_selects_and_integer_ops_match_the_interpreter():
    """Masked loads/stores with counts below 0, inside and past the lane count, selects
    whose arms load, integer min/max/div/mod and float min/max, against ir.interp (with
    a compiler barrier and a value kept in a register, which change nothing here)."""
    x, y, z = (k.Param(p, "f32", pointer=True) for p in ("x", "y", "z"))
    cnt, i = k.Var("cnt"), k.Var("i")
    v = k.Var("v", "f32", 8)
    q = k.Bin("%", k.Bin("/", i * 7 + 3, k.Const(4)), k.Const(5))
    body = (
        k.Comment("masked copy of x into y"),
        k.Decl(v, k.Load("x", k.Const(0), "f32", 8, cnt), in_register=True),
        k.Store("y", k.Const(0), k.Fma(k.Broadcast(k.Const(2.0, "f32"), 8), v, v), cnt + 1),
        k.Barrier(),
        k.For(i, k.Const(0), k.Const(8), 1, (
            k.Store("z", i, k.Select(k.Bin("<", i, cnt), k.Load("x", i, "f32"),
                                     k.Bin("max", k.Load("x", q, "f32"), k.Const(0.25, "f32")))),
            k.Store("z", i + 8, k.Select(k.Bin("==", k.Bin("min", i, cnt), i),
                                         k.Const(1.0, "f32"), k.Const(-1.0, "f32"))),
        )),
    )
    params = (x, y, z, k.Param("cnt", "i64"))
    module = k.Module((k.Function("f", params, body, exported=True),), "f")
    fn = _function(module, AVX2)
    src = np.arange(1, 9, dtype=np.float32) / 3
    for c in (-3, 0, 1, 5, 7, 8, 12):
        got_y, got_z = np.full(8, 9.0, np.float32), np.zeros(16, np.float32)
        assert fn(src.ctypes.data, got_y.ctypes.data, got_z.ctypes.data, c) == 0
        want_y, want_z = np.full(8, 9.0, np.float32), np.zeros(16, np.float32)
        interp.run(module, {"x": src, "y": want_y, "z": want_z, "cnt": c})
        np.testing.assert_array_equal(got_y, want_y, err_msg=f"count {c}")
        np.testing.assert_array_equal(got_z, want_z, err_msg=f"count {c}")


# ----------------------------------------------------------------------------- IR and code


@pytest.mark.parametrize("case", list(CASES))
def test_ir_parses_and_verifies(case):
    module, isa = _lowered(case)
    text = render(module, isa)
    llvm.parse_assembly(text).verify()
    assert "ptr noalias %A" in text and "define i32 @g(" in text
    assert "define internal void @g_micro(" in text
    assert '!{!"llvm.loop.mustprogress"}' in text
    assert ("aligned_alloc" in text) == ("blis" in case)
    if isa is AVX2:
        lanes = 8 if CASES[case][0] == "f32" else 4
        assert f"@llvm.fma.v{lanes}f" in text and "@llvm.masked.store" in text
    else:
        assert " x " not in text.replace("i64 x", "")  # no vector types on GENERIC
    jit.optimize(text)  # the -O3 pipeline keeps it valid


@pytest.mark.skipif(not _host_has("avx2", "fma"), reason="the host lacks AVX2 and FMA")
def test_avx2_assembly_uses_fma_and_broadcasts():
    module, isa = _lowered("avx2-f32-blis")
    asm = jit.emit_assembly(render(module, isa))
    assert "vfmadd" in asm and "vbroadcastss" in asm


def test_render_rejects_tile_operations_and_foreign_vectors():
    dtype, isa, schedule, strides = CASES["avx2-f32-blis"]
    unlowered = apply(matmul(dtype), schedule, name="g", known_strides=strides)
    with pytest.raises(TypeError, match="lower it first"):
        render(unlowered, isa)
    with pytest.raises(ScheduleError, match="8-lane f32"):
        render(_lowered("avx2-f32-blis")[0], GENERIC)


def test_library_exports_only_the_entry_function():
    module, isa = _lowered("generic-f32-blis")
    lib = jit.JitLibrary(jit.emit_object(render(module, isa)))
    assert lib.address("g") != 0
    with pytest.raises(KeyError):
        lib.address("g_micro")  # internal linkage
    assert llvm.get_host_cpu_name() in jit.cpu_id()
    assert "llvm-" + ".".join(map(str, llvm.llvm_version_info)) in jit.cpu_id()


def test_compile_time_is_reported(capsys):
    """Not asserted: the machine may be shared. Shown with ``pytest -s``."""
    module, isa = _lowered("avx2-f32-blis")
    t0 = time.perf_counter()
    text = render(module, isa)
    t1 = time.perf_counter()
    obj = jit.emit_object(text)
    t2 = time.perf_counter()
    jit.JitLibrary(obj).address("g")
    t3 = time.perf_counter()
    with capsys.disabled():
        print(f"\nLLVM JIT, f32 AVX2 GEMM: render {t1 - t0:.3f} s, optimize + emit "
              f"{t2 - t1:.3f} s, load {t3 - t2:.4f} s, total {t3 - t0:.3f} s "
              f"({len(text) // 1024} KiB IR, {len(obj) // 1024} KiB object)")
