"""Seed 000's matrix-multiply intrinsic path: the kernel IR's matrix values (MatrixLoad,
MatrixMultiply, MatrixStore), the lowering of register tiles to them, their generic
expansion for C, and the "intrinsic" / "tiling-intrinsic" strategies built and run with
both backends.

Buffers are flat, with element strides; C starts as NaN whenever beta == 0, so a kernel
that reads C then (or reads past the operands' views) shows NaN in its result.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numpy as np
import pytest

from blacc.backend import c as c_backend
from blacc.backend import llvm as llvm_backend
from blacc.errors import CompilerNotFoundError, ScheduleError
from blacc.ir import interp, printer
from blacc.ir import kernel as k
from blacc.ir.structured import matmul
from blacc.ir.walk import rewrite
from blacc.runtime.build import build, host_compiler
from blacc.strategy.gemm import Plan, blis, no_packing
from blacc.strategy.intrinsic import (
    INTRINSIC,
    TILING_INTRINSIC,
    fixed_matmul,
    intrinsic,
    matrix_kr,
    plan_contraction,
    tiling_intrinsic,
)
from blacc.target.isa import AVX2, GENERIC, Isa
from blacc.transform.apply import apply
from blacc.transform.lower_matrix import (
    expand_matrix,
    has_matrix_values,
    lower_tiles_to_matrix_intrinsic,
)
from blacc.transform.pipeline import lower, passes
from blacc.transform.schedule import Pack, Tile
from conftest import _assert_gemm_close

NP = {"f32": np.float32, "f64": np.float64}


def _lanes(dtype: str) -> int:
    return AVX2.lanes(dtype)


# ----------------------------------------------------------------------------- the nodes


def _col_major(buf: np.ndarray, index: int, stride: int, rows: int, cols: int) -> np.ndarray:
    """The reference meaning of a matrix access: element (r, c) at index + c*stride + r."""
    return np.array([[buf[index + c * stride + r] for c in range(cols)] for r in range(rows)])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("rows, inner, cols", [(1, 1, 1), (4, 4, 4), (3, 5, 2), (8, 1, 6)])
def test_interpreter_matches_numpy(dtype, rows, inner, cols, rng):
    """out = A @ B + C with A, B, C read column-major at strides > rows, stored elsewhere."""
    a_stride, b_stride, c_stride = rows + 2, inner + 1, rows + 3
    bufs = {name: rng.uniform(-1, 1, size).astype(NP[dtype])
            for name, size in (("x", 3 + a_stride * inner), ("y", 1 + b_stride * cols),
                               ("z", c_stride * cols), ("out", 2 + c_stride * cols))}
    before = {name: b.copy() for name, b in bufs.items()}
    a = k.MatrixLoad("x", k.Const(3), k.Var("sa"), rows, inner, dtype)
    b = k.MatrixLoad("y", k.Const(1), k.Const(b_stride), inner, cols, dtype)
    c = k.MatrixLoad("z", k.Const(0), k.Const(c_stride), rows, cols, dtype)
    value = k.Bin("+", k.MatrixMultiply(a, b, rows, inner, cols), c)
    params = tuple(k.Param(n, dtype, pointer=True) for n in bufs) + (k.Param("sa", "i64"),)
    body = (k.MatrixStore("out", k.Const(2), k.Const(c_stride), value, rows, cols),)
    module = k.Module((k.Function("f", params, body, exported=True),), "f")
    interp.run(module, {**bufs, "sa": a_stride})

    A = _col_major(before["x"], 3, a_stride, rows, inner).astype(np.float64)
    B = _col_major(before["y"], 1, b_stride, inner, cols).astype(np.float64)
    C = _col_major(before["z"], 0, c_stride, rows, cols).astype(np.float64)
    got = _col_major(bufs["out"], 2, c_stride, rows, cols)
    eps = np.finfo(NP[dtype]).eps
    np.testing.assert_allclose(got, A @ B + C, rtol=0, atol=8 * (inner + 1) * eps)
    # Only the matrix's elements were written: the gaps between columns are untouched.
    written = np.zeros(bufs["out"].shape, bool)
    written[2 + np.arange(cols)[:, None] * c_stride + np.arange(rows)[None, :]] = True
    np.testing.assert_array_equal(bufs["out"][~written], before["out"][~written])


def test_interpreter_lane_order_is_column_major():
    env = interp._Env(k.Module((), "f"), {"b": np.arange(20, dtype=np.float32)})
    load = k.MatrixLoad("b", k.Const(1), k.Const(5), 2, 3, "f32")
    np.testing.assert_array_equal(interp.evaluate(load, env), [1, 2, 6, 7, 11, 12])


def test_interpreter_checks_bounds_and_overlap():
    buf = np.zeros(10, np.float64)
    env = interp._Env(k.Module((), "f"), {"b": buf})
    with pytest.raises(IndexError):
        interp.evaluate(k.MatrixLoad("b", k.Const(5), k.Const(4), 2, 2, "f64"), env)
    with pytest.raises(ValueError, match="overlap"):
        interp.evaluate(k.MatrixLoad("b", k.Const(0), k.Const(1), 2, 2, "f64"), env)


def test_nodes_check_their_shapes():
    a = k.MatrixLoad("a", k.Const(0), k.Const(4), 4, 2, "f32")
    assert (a.lanes, a.dtype) == (8, "f32")
    product = k.MatrixMultiply(a, k.MatrixLoad("b", k.Const(0), k.Const(2), 2, 3, "f32"), 4, 2, 3)
    assert (product.lanes, product.dtype) == (12, "f32")
    with pytest.raises(ValueError, match="lanes"):
        k.MatrixMultiply(a, a, 4, 2, 3)
    with pytest.raises(ValueError, match="positive"):
        k.MatrixLoad("a", k.Const(0), k.Const(4), 0, 2, "f32")
    with pytest.raises(ValueError, match="lanes"):
        k.MatrixStore("c", k.Const(0), k.Const(4), a, 4, 3)


def test_printer_shows_matrix_values():
    a = k.MatrixLoad("a", k.Var("p"), k.Var("a_rs"), 4, 2, "f32")
    b = k.MatrixLoad("b", k.Const(0), k.Const(2), 2, 3, "f32")
    text = printer.stmt(k.MatrixStore("c", k.Const(0), k.Var("c_rs"),
                                      k.MatrixMultiply(a, b, 4, 2, 3), 4, 3))[0]
    assert text == ("mstore4x3(c[0], stride=c_rs <- mmul4x2x3(mload4x2(a[p], stride=a_rs), "
                    "mload2x3(b[0], stride=2)))")


# ----------------------------------------------------------------------------- plans and levels


def _scheduled(plan: Plan, dtype: str) -> k.Module:
    op = plan_contraction(plan, dtype)
    return apply(op, plan.schedule, name="g", known_strides=dict(plan.known_strides))


@functools.cache
def _lowered(plan: Plan, dtype: str, isa: Isa, backend: str | None) -> k.Module:
    return lower(_scheduled(plan, dtype), isa, backend=backend, matrix_kr=matrix_kr(plan))[0]


def _shape_of(plan: Plan, m: int, n: int, kk: int) -> dict[str, int]:
    """The extent arguments of the plan's entry (none for a fixed-size plan)."""
    return {} if plan.strategy == INTRINSIC else {"m": m, "n": n, "k": kk}


def _operands(rng, dtype, m, n, kk, beta, a_ld=0, b_ld=0, c_ld=0):
    """Row-major A, B, C with leading dimensions cols + *_ld; C is NaN when beta == 0."""
    t = NP[dtype]
    a = rng.uniform(-1, 1, (m, kk + a_ld)).astype(t)[:, :kk]
    b = rng.uniform(-1, 1, (kk, n + b_ld)).astype(t)[:, :n]
    c = np.full((m, n + c_ld), np.nan, t)[:, :n] if beta == 0 else \
        rng.uniform(-1, 1, (m, n + c_ld)).astype(t)[:, :n]
    return a, b, c


def _flat(x: np.ndarray) -> tuple[np.ndarray, int, int]:
    """A view as (flat buffer from its first element, row stride, column stride)."""
    base = x.base if x.base is not None else x
    s0, s1 = (s // x.itemsize for s in x.strides)
    start = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // x.itemsize
    return base.reshape(-1)[start:], s0, s1


def _interpret(module: k.Module, plan: Plan, a, b, c, alpha, beta) -> None:
    (m, kk), n = a.shape, b.shape[1]
    A, A_s0, A_s1 = _flat(a)
    B, B_s0, B_s1 = _flat(b)
    C, C_s0, C_s1 = _flat(c)
    interp.run(module, dict(_shape_of(plan, m, n, kk), alpha=alpha, A=A, A_s0=A_s0, A_s1=A_s1,
                            B=B, B_s0=B_s0, B_s1=B_s1, beta=beta, C=C, C_s0=C_s0, C_s1=C_s1))


INTERP_PLANS = {
    "intrinsic-one-call": lambda m, n, kk: intrinsic(m, n, kk),
    "intrinsic-grid": lambda m, n, kk: intrinsic(m, n, kk, 4, 4, 2),
    "tiling-kr1": lambda m, n, kk: tiling_intrinsic(4, 8, 1),
    "tiling-kr3": lambda m, n, kk: tiling_intrinsic(3, 4, 3),
    "tiling-blocked": lambda m, n, kk: tiling_intrinsic(2, 4, 2, mc=4, kc=3, nc=8),
}
INTERP_SHAPES = [(1, 1, 1), (4, 4, 4), (8, 8, 8), (5, 7, 3), (6, 9, 7)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("level", ["matrix", "expanded"])
@pytest.mark.parametrize("plan_name", list(INTERP_PLANS))
@pytest.mark.parametrize("shape", INTERP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_lowered_module_interprets_to_numpy(dtype, level, plan_name, shape, rng):
    """The module after the whole pipeline, with the intrinsics kept (for LLVM) and with
    them expanded (for C): alpha/beta, and beta == 0 on a NaN C."""
    plan = INTERP_PLANS[plan_name](*shape)
    module = _lowered(plan, dtype, AVX2, "llvm" if level == "matrix" else "c")
    assert has_matrix_values(module) == (level == "matrix")
    for alpha, beta in ((1.5, 0.0), (-0.5, 2.0)):
        a, b, c = _operands(rng, dtype, *shape, beta, a_ld=1, c_ld=2)
        c0 = c.copy()
        _interpret(module, plan, a, b, c, alpha, beta)
        _assert_gemm_close(c, a, b, c0, alpha, beta, context=f"{plan.describe()} {level}")


@pytest.mark.parametrize("level", ["matrix", "expanded"])
def test_strides_below_the_column_height_take_the_outer_products(level, rng):
    """kr=4 needs A's row stride >= 4; with k=3 (a_rs=3) the tile falls back, and still
    computes the right thing."""
    plan = tiling_intrinsic(4, 8, 4)
    module = _lowered(plan, "f64", AVX2, "llvm" if level == "matrix" else "c")
    a, b, c = _operands(rng, "f64", 4, 8, 3, 0.0)
    _interpret(module, plan, a, b, c, 2.0, 0.0)
    _assert_gemm_close(c, a, b, None, 2.0, 0.0)


def test_packed_b_panels_take_the_intrinsic(rng):
    """Tiling+Packing with only B packed (its panel has b_rs = nr, unit columns) and A read
    in place: the intrinsic reads the packed panel."""
    schedule = (Tile((("j", 16),)), Tile((("k", 5),)), Pack("B", 8), Tile((("i", 4), ("j", 8))))
    module = apply(matmul("f64"), schedule, name="g", known_strides={"A_s1": 1, "C_s1": 1})
    for backend in ("llvm", "c"):
        final = lower(module, AVX2, backend=backend, matrix_kr=2)[0]
        assert has_matrix_values(final) == (backend == "llvm")
        a, b, c = _operands(rng, "f64", 9, 21, 12, 0.5, a_ld=2)
        c0 = c.copy()
        _interpret(final, tiling_intrinsic(4, 8, 2), a, b, c, -1.0, 0.5)
        _assert_gemm_close(c, a, b, c0, -1.0, 0.5, context=backend)


def test_matrix_lowering_shape():
    """One full 8x8 tile with k=8 and kr=4: two unrolled multiplies of (8x4)@(4x8), the
    first one assigned, the second accumulated; edges keep the tile operations."""
    module = lower_tiles_to_matrix_intrinsic(_scheduled(intrinsic(8, 8, 8, kr=4), "f32"), AVX2, 4)
    micro = module.function("g_micro")
    products, loads, stores, tiles = [], [], [], []

    def visit(x):
        for kind, found in ((k.MatrixMultiply, products), (k.MatrixLoad, loads),
                            (k.MatrixStore, stores), (k.TileMMA, tiles)):
            if isinstance(x, kind):
                found.append(x)
        return x

    rewrite(micro.body, visit)
    assert [(p.rows, p.inner, p.cols) for p in products] == [(8, 4, 8), (8, 4, 8)]
    assert len(stores) == 2  # beta == 0 and beta != 0
    assert len(loads) == 5  # two per multiply, and C when beta != 0
    assert len(tiles) == 1  # the outer-product fallback
    assert not any(isinstance(s, k.For) for s in micro.body)


def test_constant_k_larger_than_the_unroll_limit_loops(rng):
    plan = intrinsic(2, 4, 40, kr=1)
    module = lower_tiles_to_matrix_intrinsic(_scheduled(plan, "f64"), AVX2, 1)
    text = printer.module(module)
    assert "for pm in range" in text and text.count("mmul") == 2  # main and remainder loops
    final = _lowered(plan, "f64", AVX2, "c")
    a, b, c = _operands(rng, "f64", 2, 4, 40, 0.0)
    _interpret(final, plan, a, b, c, 1.0, 0.0)
    _assert_gemm_close(c, a, b)


def test_generic_expansion_uses_isa_vectors_then_scalars():
    """A 13-row column (nr=13 f32 on AVX2): one 8-lane vector and five scalars."""
    scheduled = _scheduled(intrinsic(2, 13, 3), "f32")
    expanded = expand_matrix(lower_tiles_to_matrix_intrinsic(scheduled, AVX2, 3), AVX2)
    assert not has_matrix_values(expanded)
    widths = set()

    def visit(x):
        if isinstance(x, k.Store) and x.buf == "c":
            widths.add(x.value.lanes)
        return x

    rewrite(expanded.function("g_micro").body, visit)
    assert widths == {8, 1}
    generic = expand_matrix(lower_tiles_to_matrix_intrinsic(scheduled, GENERIC, 3), GENERIC)
    c_source = c_backend.render(lower(generic, GENERIC)[0], GENERIC)
    assert "__m256" not in c_source


# ----------------------------------------------------------------------------- errors and wiring


def test_unsupported_layouts_raise_schedule_errors():
    packed_a = apply(matmul("f32"), blis(12, 8, 32, 6, 16, 4, 8), known_strides={"C_s1": 1})
    with pytest.raises(ScheduleError, match="unit stride"):
        lower(packed_a, AVX2, backend="llvm", matrix_kr=1)
    unknown = apply(matmul("f32"), no_packing(6, 16, 4, 8), known_strides={"B_s1": 1, "C_s1": 1})
    with pytest.raises(ScheduleError, match="A_s1"):
        lower(unknown, AVX2, backend="c", matrix_kr=1)
    with pytest.raises(ScheduleError, match="kr"):
        lower(unknown, AVX2, matrix_kr=0)


def test_pipeline_default_is_unchanged():
    module = apply(matmul("f64"), no_packing(6, 8, 4, 4), known_strides={"B_s1": 1, "C_s1": 1})
    assert [name for name, _ in passes()] == ["lower-packs", "lower-tiles"]
    assert lower(module, AVX2)[0] == lower(module, AVX2, backend="llvm")[0]
    assert [name for name, _ in passes(backend="llvm", matrix_kr=2)] == \
        ["lower-packs", "lower-matrix", "lower-tiles"]
    assert [name for name, _ in passes(matrix_kr=2)] == \
        ["lower-packs", "lower-matrix", "expand-matrix", "lower-tiles"]
    with pytest.raises(ValueError, match="backend"):
        passes(backend="fortran")


def test_c_backend_rejects_unexpanded_matrix_values():
    module = _lowered(tiling_intrinsic(6, 16, 1, lanes=8), "f32", AVX2, "llvm")
    with pytest.raises(ScheduleError, match="expand"):
        c_backend.render(module, AVX2)


def test_plans():
    p = intrinsic(5, 7, 3)
    assert (p.strategy, matrix_kr(p), p.describe()) == \
        (INTRINSIC, 3, "intrinsic(m=5, n=7, k=3, mr=5, nr=7, kr=3)")
    assert plan_contraction(p, "f32") == fixed_matmul("f32", 5, 7, 3)
    t = tiling_intrinsic(6, 16, 2, kc=256, lanes=8)
    assert (t.strategy, matrix_kr(t)) == (TILING_INTRINSIC, 2)
    assert plan_contraction(t, "f64") == matmul("f64")
    assert matrix_kr(Plan("blis", (("kr", 4),), (), ())) is None
    with pytest.raises(ScheduleError):
        intrinsic(4, 4, 0)
    entry = _scheduled(p, "f32").function("g")
    assert [x.name for x in entry.params][:2] == ["alpha", "A"]  # no extent parameters


# ------------------------------------------------------------------------ native, both backends


def _host_isa() -> Isa:
    host = llvm.get_host_cpu_features()
    return AVX2 if host.get("avx2", False) and host.get("fma", False) else GENERIC


HOST = _host_isa()


@functools.cache
def _native(plan: Plan, dtype: str, backend: str):
    if backend == "c":
        try:
            host_compiler()
        except CompilerNotFoundError:
            pytest.skip("no C compiler")
    module = _lowered(plan, dtype, HOST, backend)
    return module, build(module, HOST, backend=backend)


def _run_native(native, module: k.Module, plan: Plan, a, b, c, alpha, beta) -> None:
    """Call the entry through ctypes with its ABI: extents..., alpha, A, A_s0, A_s1, B, ...,
    beta, C, C_s0, C_s1 (strides in elements; views of any sign)."""
    (m, kk), n = a.shape, b.shape[1]
    values = dict(_shape_of(plan, m, n, kk), alpha=alpha, beta=beta)
    for name, x in (("A", a), ("B", b), ("C", c)):
        values[name] = x.ctypes.data
        values[f"{name}_s0"], values[f"{name}_s1"] = (s // x.itemsize for s in x.strides)
    entry = module.function(module.entry)
    assert native.function(*(values[p.name] for p in entry.params)) == 0


# Whole-product intrinsic kernels compile slowly (the product is unrolled), so the native
# builds keep to small shapes; 13x17x11 (edges) is covered once below.
NATIVE_SHAPES = [(1, 1, 1), (1, 1, 7), (4, 4, 4), (8, 8, 8), (5, 7, 3)]


def _native_plans(m, n, kk, dtype):
    """The whole product as one call (and, when small, as calls of two k steps), a grid of
    4 x 2-vector tiles, and tiled loops with kr = 1 and kr = 4 in kc = 8 blocks."""
    lanes = HOST.lanes(dtype)
    plans = {
        "intrinsic": intrinsic(m, n, kk, lanes=lanes),
        "intrinsic-grid": intrinsic(m, n, kk, 4, 2 * lanes, 4, lanes=lanes),
        "tiling-intrinsic": tiling_intrinsic(6, 2 * lanes, 1, lanes=lanes),
        "tiling-intrinsic-kr4": tiling_intrinsic(4, lanes, 4, kc=8, lanes=lanes),
    }
    if m * n <= 64:
        plans["intrinsic-kr2"] = intrinsic(m, n, kk, kr=2)
    return plans


@pytest.mark.parametrize("backend", ["c", "llvm"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("shape", NATIVE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_native_matches_numpy(backend, dtype, shape, rng):
    for name, plan in _native_plans(*shape, dtype).items():
        module, native = _native(plan, dtype, backend)
        for alpha, beta, lds in ((1.0, 0.0, (0, 0, 0)), (-1.5, 0.5, (3, 1, 2))):
            a, b, c = _operands(rng, dtype, *shape, beta, *lds)
            c0 = c.copy()
            _run_native(native, module, plan, a, b, c, alpha, beta)
            _assert_gemm_close(c, a, b, c0, alpha, beta, context=f"{name} {backend}")


@pytest.mark.parametrize("backend", ["c", "llvm"])
def test_native_negative_leading_dimensions(backend, rng):
    """Rows reversed (negative row strides): LLVM's column stride must be >= the column
    height, so these tiles take the outer products; the result is still right."""
    dtype, shape = "f64", (13, 17, 11)
    for plan in _native_plans(*shape, dtype).values():
        module, native = _native(plan, dtype, backend)
        a, b, c = _operands(rng, dtype, *shape, 0.0)
        a, b, c = a[::-1], b[::-1], c[::-1]
        _run_native(native, module, plan, a, b, c, 0.5, 0.0)
        _assert_gemm_close(c, a, b, None, 0.5, 0.0, context=plan.describe())


def test_llvm_ir_has_the_intrinsic_and_c_does_not():
    plan = tiling_intrinsic(6, 16, 1, lanes=8)
    llvm_text = llvm_backend.render(_lowered(plan, "f32", AVX2, "llvm"), AVX2)
    for name in ("@llvm.matrix.multiply.v96f32.v16f32.v6f32",
                 "@llvm.matrix.column.major.load.v16f32.i64",
                 "@llvm.matrix.column.major.store.v96f32.i64"):
        assert name in llvm_text
    assert "call contract <96 x float> @llvm.matrix.multiply" in llvm_text
    c_text = c_backend.render(_lowered(plan, "f32", AVX2, "c"), AVX2)
    assert "matrix" not in c_text and "_mm256_fmadd_ps" in c_text
    tiny = intrinsic(8, 8, 8)
    assert "llvm.matrix.multiply.v64f32.v64f32.v64f32" in \
        llvm_backend.render(_lowered(tiny, "f32", AVX2, "llvm"), AVX2)


def test_llvm_rejects_odd_vectors_outside_matrix_functions():
    body = (k.Decl(k.Var("v", "f32", 5), k.Broadcast(k.Const(0.0, "f32"), 5)),)
    module = k.Module((k.Function("f", (), body, exported=True),), "f")
    with pytest.raises(ScheduleError, match="5-lane"):
        llvm_backend.render(module, AVX2)
