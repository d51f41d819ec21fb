"""Tests of the generated CPython entry points of fixed-size kernels (runtime.pycall)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from blacc.backend.compiler import Compiler, find_compiler
from blacc.errors import (
    AliasingError,
    ArgumentError,
    CompilerNotFoundError,
    DTypeError,
    ShapeError,
)
from blacc.runtime import pycall
from blacc.runtime.cache import KernelCache
from blacc.runtime.pycall import FixedKernel, build_extension, wrapper_source
from blacc.runtime.signature import ArgSpec

# y = alpha*A*x + y for a 3x2 A, then *s = sum(y).
AXPY_C = """
int axpy(T alpha, const T *restrict A, const T *restrict x, T *restrict y, T *restrict s) {
    T total = 0;
    for (int i = 0; i < 3; i++) {
        T acc = 0;
        for (int j = 0; j < 2; j++) acc += A[i * 2 + j] * x[j];
        y[i] = alpha * acc + y[i];
        total += y[i];
    }
    *s = total;
    return 0;
}
"""


def axpy_source(ctype: str) -> str:
    return f"#define T {ctype}\n{AXPY_C}#undef T\n"


def axpy_specs(dtype: str) -> list[ArgSpec]:
    return [ArgSpec("alpha", "scalar", dtype, "in"),
            ArgSpec("A", "array", dtype, "in", 3, 2),
            ArgSpec("x", "array", dtype, "in", 2, 1),
            ArgSpec("y", "array", dtype, "inout", 3, 1),
            ArgSpec("s", "scalar", dtype, "out")]


# b = a stored column-major with leading dimension 4; c = 2*a row-major.
SPLIT_C = """
int split(const double *restrict a, double *restrict b, double *restrict c) {
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) {
            b[k * 4 + r] = a[r * 3 + k];
            c[r * 3 + k] = 2 * a[r * 3 + k];
        }
    return 0;
}
"""
SPLIT_SPECS = [ArgSpec("a", "array", "f64", "in", 2, 3),
               ArgSpec("b", "array", "f64", "out", 2, 3, layout="col", ld=4),
               ArgSpec("c", "array", "f64", "out", 2, 3)]

# Several scalar outputs: lo = min(v), hi = max(v), acc += sum(v).
STATS_C = """
int stats(const double *restrict v, double *restrict lo, double *restrict hi,
          double *restrict acc) {
    *lo = v[0];
    *hi = v[0];
    for (int i = 0; i < 4; i++) {
        if (v[i] < *lo) *lo = v[i];
        if (v[i] > *hi) *hi = v[i];
        *acc += v[i];
    }
    return 0;
}
"""
STATS_SPECS = [ArgSpec("v", "array", "f64", "in", 1, 4),
               ArgSpec("lo", "scalar", "f64", "out"),
               ArgSpec("hi", "scalar", "f64", "out"),
               ArgSpec("acc", "scalar", "f64", "inout")]

# No arrays at all.
SQUARE_C = "int square(float a, float *restrict b) { *b = a * a; return 0; }\n"
SQUARE_SPECS = [ArgSpec("a", "scalar", "f32", "in"), ArgSpec("b", "scalar", "f32", "out")]

# 1x1 arrays.
DOUBLE_C = "int twice(const double *restrict a, double *restrict b) { *b = 2 * *a; return 0; }\n"
DOUBLE_SPECS = [ArgSpec("a", "array", "f64", "in", 1, 1),
                ArgSpec("b", "array", "f64", "out", 1, 1)]

# A kernel whose scratch allocation "fails" after writing.
FAIL_C = "int fail(double *restrict y) { (void)y; return 1; }\n"
FAIL_SPECS = [ArgSpec("y", "array", "f64", "out", 2, 1)]

MATMUL4_C = """
int mm4(const float *restrict A, const float *restrict B, float *restrict C) {
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            float acc = 0.0f;
            for (int k = 0; k < 4; k++) acc += A[i * 4 + k] * B[k * 4 + j];
            C[i * 4 + j] = acc;
        }
    return 0;
}
"""
MATMUL4_SPECS = [ArgSpec("A", "array", "f32", "in", 4, 4),
                 ArgSpec("B", "array", "f32", "in", 4, 4),
                 ArgSpec("C", "array", "f32", "out", 4, 4)]


@pytest.fixture(scope="module")
def cc() -> Compiler:
    try:
        return find_compiler()
    except CompilerNotFoundError as exc:
        pytest.skip(f"no working C compiler: {exc}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> KernelCache:
    return KernelCache(tmp_path_factory.mktemp("pycall-cache"))


@pytest.fixture(scope="module")
def build(cc: Compiler, cache: KernelCache) -> Callable[..., FixedKernel]:
    def make(source: str, entry: str, specs: list[ArgSpec], **options: Any) -> FixedKernel:
        return FixedKernel.build(source, entry, specs, compiler=cc, cache=cache, **options)

    return make


@pytest.fixture(scope="module")
def axpy(build: Callable[..., FixedKernel]) -> FixedKernel:
    return build(axpy_source("double"), "axpy", axpy_specs("f64"))


def axpy_operands(dtype: Any = np.float64) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {"alpha": 1.5, "A": rng.standard_normal((3, 2)).astype(dtype),
            "x": rng.standard_normal((2, 1)).astype(dtype),
            "y": rng.standard_normal((3, 1)).astype(dtype)}


def axpy_expected(ops: dict[str, Any]) -> tuple[np.ndarray, float]:
    y = ops["alpha"] * (ops["A"].astype(float) @ ops["x"].reshape(2, 1).astype(float))
    y = y + ops["y"].reshape(3, 1).astype(float)
    return y, float(y.sum())


# --- the generated source -----------------------------------------------------------------


@pytest.mark.parametrize("source, entry, specs, release_gil", [
    (axpy_source("double"), "axpy", axpy_specs("f64"), False),
    (axpy_source("float"), "axpy", axpy_specs("f32"), True),
    (SPLIT_C, "split", SPLIT_SPECS, False),
    (STATS_C, "stats", STATS_SPECS, True),
    (SQUARE_C, "square", SQUARE_SPECS, False),
    ("int nothing(void) { return 0; }\n", "nothing", [], True),
])
def test_wrapper_compiles_without_warnings(cc: Compiler, tmp_path: Path, source: str,
                                           entry: str, specs: list[ArgSpec],
                                           release_gil: bool) -> None:
    text = source + wrapper_source(entry, specs, "blacc_test_mod", release_gil=release_gil)
    assert ("Py_BEGIN_ALLOW_THREADS" in text) == release_gil
    (tmp_path / "k.c").write_text(text)
    proc = subprocess.run(
        [*cc.command, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
         f"-I{sysconfig.get_paths()['include']}", "k.c", "-o", "k.so"],
        cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_gil_is_kept_for_small_kernels_and_released_for_large_ones() -> None:
    small = wrapper_source("mm4", MATMUL4_SPECS, "m")
    big = [ArgSpec("A", "array", "f64", "inout", 256, 256)]
    assert "Py_BEGIN_ALLOW_THREADS" not in small
    assert "Py_BEGIN_ALLOW_THREADS" in wrapper_source("big", big, "m")


@pytest.mark.parametrize("entry, specs, module, message", [
    ("k", [ArgSpec("n", "scalar", "i64", "in")], "m", "n: dtype 'i64' is not supported"),
    ("k", [ArgSpec("a", "scalar", "f64", "in"), ArgSpec("a", "scalar", "f64", "out")], "m",
     "unique"),
    ("k", [ArgSpec("A", "array", "f64", "in", 3, 4, ld=2)], "m", "leading dimension 2 < 4"),
    ("k", [ArgSpec("A", "array", "f64", "in", 0, 4)], "m", "must be positive"),
    ("not-c", [], "m", "not a C identifier"),
    ("k", [], "bad name", "not a C identifier"),
])
def test_wrapper_rejects_bad_specs(entry: str, specs: list[ArgSpec], module: str,
                                   message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        wrapper_source(entry, specs, module)


# --- results ------------------------------------------------------------------------------


def test_axpy_results_by_name_and_positionally(axpy: FixedKernel) -> None:
    ops = axpy_operands()
    expected_y, expected_s = axpy_expected(ops)
    y = ops["y"]
    out = axpy(**ops)
    assert set(out) == {"y", "s"}
    assert out["y"] is y
    np.testing.assert_allclose(y, expected_y, rtol=1e-14)
    assert out["s"] == pytest.approx(expected_s, rel=1e-14)

    ops = axpy_operands()
    s = axpy.fast(ops["alpha"], ops["A"], ops["x"], ops["y"], None)
    assert isinstance(s, float) and s == pytest.approx(expected_s, rel=1e-14)
    np.testing.assert_allclose(ops["y"], expected_y, rtol=1e-14)


@pytest.mark.parametrize("alpha", [2, np.float32(2.0), np.float64(2.0), np.int64(2)])
def test_scalar_inputs_accept_numbers(axpy: FixedKernel, alpha: Any) -> None:
    ops = {**axpy_operands(), "alpha": alpha}
    expected_y, _ = axpy_expected({**ops, "alpha": 2.0})
    axpy(**ops)
    np.testing.assert_allclose(ops["y"], expected_y, rtol=1e-14)


def test_one_dimensional_vectors_and_singleton_strides(axpy: FixedKernel) -> None:
    ops = axpy_operands()
    expected_y, expected_s = axpy_expected(ops)
    x = np.zeros((2, 4), order="F")[:, :1]  # (2, 1) with strides (8, 16)
    x[...] = ops["x"]
    assert x.strides == (8, 16)
    y = ops["y"].ravel().copy()
    assert axpy(alpha=ops["alpha"], A=ops["A"], x=x, y=y)["s"] == pytest.approx(expected_s)
    np.testing.assert_allclose(y, expected_y.ravel(), rtol=1e-14)
    row = np.ones((1, 4))
    assert axpy.fast(0.0, ops["A"], ops["x"].ravel(), row[0, :3], None) == 3.0


def test_one_by_one_arrays_take_any_strides_and_zero_dimensions(
        build: Callable[..., FixedKernel]) -> None:
    kernel = build(DOUBLE_C, "twice", DOUBLE_SPECS)
    b = np.zeros(())
    assert kernel(a=np.array(1.5), b=b) is b and b == 3.0
    b = np.zeros((3, 3))[1:2, ::2][:, 1:]
    assert b.shape == (1, 1) and b.strides == (24, 16)
    kernel.fast(np.full((1,), 2.0), b)
    assert b[0, 0] == 4.0
    assert kernel(a=np.ones((1, 1))).shape == (1, 1)
    with pytest.raises(ShapeError, match=r"b: expected shape \(1, 1\), \(1,\) or \(\) "
                                         r"float64 array, got \(1, 1, 1\) float64"):
        kernel(a=np.ones(1), b=np.ones((1, 1, 1)))


def test_float32_variant(build: Callable[..., FixedKernel]) -> None:
    kernel = build(axpy_source("float"), "axpy", axpy_specs("f32"))
    ops = axpy_operands(np.float32)
    expected_y, expected_s = axpy_expected(ops)
    out = kernel(**ops)
    assert ops["y"].dtype == np.float32
    np.testing.assert_allclose(ops["y"], expected_y, rtol=1e-5)
    assert out["s"] == pytest.approx(expected_s, rel=1e-5)
    with pytest.raises(DTypeError, match=r"A: expected shape \(3, 2\) float32 C-contiguous, "
                                         r"got \(3, 2\) float64"):
        kernel(**{**axpy_operands(np.float32), "A": np.ones((3, 2))})


def test_several_scalar_outputs(build: Callable[..., FixedKernel]) -> None:
    kernel = build(STATS_C, "stats", STATS_SPECS)
    v = np.array([3.0, -1.0, 4.0, 1.5])
    assert kernel.fast(v, None, None, 10.0) == (-1.0, 4.0, 17.5)
    assert kernel(v=v.reshape(1, 4), acc=0.5) == {"lo": -1.0, "hi": 4.0, "acc": 8.0}
    square = build(SQUARE_C, "square", SQUARE_SPECS)
    assert square(a=3) == 9.0
    assert square.fast(1.5, None) == 2.25


def test_omitted_outputs_are_allocated_in_the_kernel_layout(
        build: Callable[..., FixedKernel]) -> None:
    kernel = build(SPLIT_C, "split", SPLIT_SPECS)
    a = np.arange(6.0).reshape(2, 3)
    out = kernel(a=a)
    assert list(out) == ["b", "c"]
    np.testing.assert_array_equal(out["b"], a)
    np.testing.assert_array_equal(out["c"], 2 * a)
    assert out["b"].strides == (8, 32) and out["c"].flags.c_contiguous
    # Given outputs are written in place, in any layout the spec allows.
    b = np.zeros((4, 3), order="F")[:2]
    c = np.zeros((2, 3))
    out = kernel(a=a, c=c, b=b)
    assert out["b"] is b and out["c"] is c
    np.testing.assert_array_equal(b, a)
    with pytest.raises(ArgumentError, match=r"b: expected shape \(2, 3\) float64 column-major "
                                            r"with leading dimension 4 \(strides \(8, 32\)\), "
                                            r"got \(2, 3\) float64 with strides \(24, 8\)"):
        kernel(a=a, b=np.zeros((2, 3)))


def test_single_output_is_returned_alone(build: Callable[..., FixedKernel]) -> None:
    kernel = build(MATMUL4_C, "mm4", MATMUL4_SPECS)
    rng = np.random.default_rng(1)
    A, B = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    C = kernel(A=A, B=B)
    assert C.shape == (4, 4) and C.dtype == np.float32 and C.flags.c_contiguous
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-6)
    given = np.empty((4, 4), np.float32)
    assert kernel(A=A, B=B, C=given) is given
    assert kernel.fast(A, B, given) is None


def test_kernel_failure_status_raises(build: Callable[..., FixedKernel]) -> None:
    kernel = build(FAIL_C, "fail", FAIL_SPECS)
    with pytest.raises(MemoryError, match="kernel fail could not allocate its scratch memory "
                       r"\(status 1\); no output was written"):
        kernel()


def test_release_gil_variant_gives_the_same_results(build: Callable[..., FixedKernel]) -> None:
    kernel = build(axpy_source("double"), "axpy", axpy_specs("f64"), release_gil=True)
    ops = axpy_operands()
    expected_y, expected_s = axpy_expected(ops)
    assert kernel(**ops)["s"] == pytest.approx(expected_s)
    np.testing.assert_allclose(ops["y"], expected_y, rtol=1e-14)


# --- argument checks ----------------------------------------------------------------------


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _misaligned(shape: tuple[int, ...]) -> np.ndarray:
    raw = np.zeros(8 * int(np.prod(shape)) + 1, np.uint8)
    return raw[1:].view(np.float64).reshape(shape)


BAD_ARGUMENTS: list[tuple[str, Callable[[dict[str, Any]], Any], type, str]] = [
    ("A", lambda o: o["A"].astype(np.float32), DTypeError,
     r"A: expected shape \(3, 2\) float64 C-contiguous, got \(3, 2\) float32"),
    ("A", lambda o: o["A"].astype(">f8"), DTypeError, r"A: .* got \(3, 2\) format '>d'"),
    ("A", lambda o: o["A"].astype(np.int64), DTypeError, r"got \(3, 2\) int64"),
    ("A", lambda o: np.ones((2, 3)), ShapeError,
     r"A: expected shape \(3, 2\) float64 C-contiguous, got \(2, 3\) float64"),
    ("A", lambda o: np.ones(6), ShapeError, r"A: expected .* got \(6,\) float64"),
    ("A", lambda o: np.array(1.0), ShapeError, r"A: expected .* got \(\) float64"),
    ("x", lambda o: np.ones(4), ShapeError,
     r"x: expected shape \(2, 1\) or \(2,\) float64 contiguous, got \(4,\) float64"),
    ("x", lambda o: np.ones((1, 2)), ShapeError, r"x: .* got \(1, 2\) float64"),
    ("x", lambda o: np.ones((2, 1, 1)), ShapeError, r"x: .* got \(2, 1, 1\) float64"),
    ("x", lambda o: np.ones(4)[::2], ArgumentError,
     r"x: .* contiguous, got \(2,\) float64 with strides \(16,\)"),
    ("A", lambda o: np.asfortranarray(o["A"]), ArgumentError,
     r"A: expected shape \(3, 2\) float64 C-contiguous, got \(3, 2\) float64 "
     r"with strides \(8, 24\)"),
    ("A", lambda o: _misaligned((3, 2)), ArgumentError, "A: .* not aligned"),
    ("A", lambda o: [[1.0, 2.0]] * 3, TypeError,
     r"A: expected an array of shape \(3, 2\) float64 C-contiguous, got list"),
    ("y", lambda o: _readonly(o["y"]), ArgumentError,
     r"y: expected a writable array of .* got a read-only \(3, 1\) float64"),
    ("y", lambda o: o["y"][::-1], ArgumentError, r"y: .* with strides \(-8, 8\)"),
    ("y", lambda o: np.ones((3, 1), np.float32), DTypeError, r"y: .* got \(3, 1\) float32"),
    ("y", lambda o: b"x" * 24, ArgumentError, "y: expected a writable array"),
    ("x", lambda o: o["y"][:2], AliasingError, "y: output overlaps input x in memory"),
    ("A", lambda o: np.lib.stride_tricks.as_strided(o["y"], (3, 2), (16, 8)), AliasingError,
     "y: output overlaps input A"),
    ("alpha", lambda o: "2", TypeError, "alpha: expected a real number, got str"),
    ("alpha", lambda o: None, TypeError, "alpha: expected a real number, got NoneType"),
    ("alpha", lambda o: True, TypeError, "alpha: expected a real number, got bool"),
    ("alpha", lambda o: 1j, TypeError, "alpha: expected a real number, got complex"),
    ("alpha", lambda o: np.ones(2), TypeError, "alpha: expected a real number"),
    ("alpha", lambda o: 10**400, ArgumentError, "alpha: cannot convert int to a float"),
]


@pytest.mark.parametrize("name, make, error, message", BAD_ARGUMENTS,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_raise_and_write_nothing(axpy: FixedKernel, name: str,
                                               make: Callable[[dict[str, Any]], Any],
                                               error: type, message: str) -> None:
    ops = axpy_operands()
    ops[name] = make(ops)
    y = ops["y"]
    before = np.array(y, copy=True)
    # (buffers only: the counts of shared objects such as None move with other threads)
    buffers = [v for v in ops.values() if isinstance(v, (np.ndarray, bytes))]
    refcounts = [sys.getrefcount(v) for v in buffers]
    with pytest.raises(error, match=message):
        axpy(**ops)
    with pytest.raises(error, match=message):
        axpy.fast(*ops.values(), None)
    np.testing.assert_array_equal(np.asarray(y), before)
    # Every buffer taken before the failure was released.
    assert [sys.getrefcount(v) for v in buffers] == refcounts


def test_overlapping_outputs_are_rejected(build: Callable[..., FixedKernel]) -> None:
    kernel = build(SPLIT_C, "split", SPLIT_SPECS)
    a = np.arange(6.0).reshape(2, 3)
    big = np.zeros((4, 3), order="F")
    c = np.lib.stride_tricks.as_strided(big, (2, 3), (24, 8))
    with pytest.raises(AliasingError, match="b and c: outputs overlap in memory"):
        kernel(a=a, b=big[:2], c=c)
    assert not big.any()
    buf = np.zeros(12)
    a = buf[:6].reshape(2, 3)
    a[...] = 1.0
    b = np.lib.stride_tricks.as_strided(buf, (2, 3), (8, 32))
    with pytest.raises(AliasingError, match="b: output overlaps input a in memory"):
        kernel.fast(a, b, np.zeros((2, 3)))
    assert buf.tolist() == [1.0] * 6 + [0.0] * 6


def test_output_scalar_slot_is_ignored(axpy: FixedKernel) -> None:
    ops = axpy_operands()
    expected_y, _ = axpy_expected(ops)
    axpy.fast(ops["alpha"], ops["A"], ops["x"], ops["y"], 123.0)  # out slot is ignored
    np.testing.assert_allclose(ops["y"], expected_y, rtol=1e-14)


def test_wrong_argument_counts_and_names(axpy: FixedKernel) -> None:
    ops = axpy_operands()
    with pytest.raises(TypeError, match=r"axpy\(\) takes exactly 5 arguments "
                                        r"\(alpha, A, x, y, s\), got 4"):
        axpy.fast(*ops.values())
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'x'"):
        axpy(alpha=1.0, A=ops["A"], y=ops["y"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'B'"):
        axpy(**ops, B=ops["A"])
    with pytest.raises(TypeError, match="unexpected keyword argument 's'"):
        axpy(**ops, s=0.0)  # output scalars are returned, not passed
    with pytest.raises(TypeError):
        axpy(1.0, ops["A"], ops["x"], ops["y"])  # by name only


def test_generic_call_for_names_that_are_not_identifiers(cc: Compiler,
                                                         cache: KernelCache) -> None:
    specs = [ArgSpec("lambda", "scalar", "f64", "in"), ArgSpec("A", "array", "f64", "in", 3, 2),
             ArgSpec("x", "array", "f64", "in", 2, 1), ArgSpec("in", "array", "f64", "inout", 3, 1),
             ArgSpec("s", "scalar", "f64", "out")]
    fast = build_extension(axpy_source("double"), "axpy", specs, compiler=cc, cache=cache)
    kernel = FixedKernel(specs, fast, axpy_source("double"), name="axpy")
    assert type(kernel) is FixedKernel  # no generated subclass
    ops = axpy_operands()
    expected_y, expected_s = axpy_expected(ops)
    out = kernel(**{"lambda": ops["alpha"], "A": ops["A"], "x": ops["x"], "in": ops["y"]})
    assert out["in"] is ops["y"] and out["s"] == pytest.approx(expected_s)
    np.testing.assert_allclose(ops["y"], expected_y, rtol=1e-14)
    with pytest.raises(TypeError, match=r"axpy\(\) got bad arguments: missing 'x'; "
                                        r"unexpected 'B', 's'"):
        kernel(**{"lambda": 1.0, "A": ops["A"], "in": ops["y"], "B": 1, "s": 2})
    renamed = [ArgSpec("def", "array", "f64", "in", 2, 3), *SPLIT_SPECS[1:]]
    fast = build_extension(SPLIT_C, "split", renamed, compiler=cc, cache=cache)
    split = FixedKernel(renamed, fast, SPLIT_C, name="split")
    a = np.arange(6.0).reshape(2, 3)
    out = split(**{"def": a})
    assert out["b"].strides == (8, 32)
    np.testing.assert_array_equal(out["b"], a)
    np.testing.assert_array_equal(out["c"], 2 * a)


# --- the disk cache -----------------------------------------------------------------------


def test_second_build_loads_from_disk(cc: Compiler, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    compiles = []
    real = pycall.compile_shared

    def counting(*args: Any, **kwargs: Any) -> None:
        compiles.append(args[2])
        real(*args, **kwargs)

    monkeypatch.setattr(pycall, "compile_shared", counting)
    monkeypatch.setattr(pycall, "default_cache", lambda: KernelCache(tmp_path))
    source, specs = axpy_source("double"), axpy_specs("f64")
    first = build_extension(source, "axpy", specs, compiler=cc)
    second = build_extension(source, "axpy", specs, compiler=cc)  # a fresh KernelCache
    assert len(compiles) == 1
    assert Path(compiles[0]).parent.parent == tmp_path
    suffix = pycall.importlib.machinery.EXTENSION_SUFFIXES[0]
    assert len(list(tmp_path.glob(f"*/*{suffix}"))) == 1
    for fn in (first, second):
        ops = axpy_operands()
        expected = axpy_expected(ops)[1]
        assert fn(*ops.values(), None) == pytest.approx(expected)
    assert first.__module__ == second.__module__
    assert first.__module__.startswith("blacc_k_")
    # A different kernel gets a different module name.
    other = build_extension(axpy_source("float"), "axpy", axpy_specs("f32"), compiler=cc)
    assert other.__module__ != first.__module__ and len(compiles) == 2


# --- overhead -----------------------------------------------------------------------------


def _per_call_ns(stmt: Callable[[], Any], number: int = 20_000, repeat: int = 15) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


def test_measure_call_overhead(build: Callable[..., FixedKernel]) -> None:
    """Print (not assert) per-call times of a 4x4 @ 4x4 float32 product."""
    kernel = build(MATMUL4_C, "mm4", MATMUL4_SPECS)
    rng = np.random.default_rng(2)
    A, B = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    C = np.empty((4, 4), np.float32)
    fast = kernel.fast
    times = {
        "fast(A, B, C)": _per_call_ns(lambda: fast(A, B, C)),
        "kernel(A=A, B=B, C=C)": _per_call_ns(lambda: kernel(A=A, B=B, C=C)),
        "kernel(A=A, B=B) (allocates C)": _per_call_ns(lambda: kernel(A=A, B=B)),
        "np.matmul(A, B, out=C)": _per_call_ns(lambda: np.matmul(A, B, out=C)),
    }
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-6)
    print()
    for what, ns in times.items():
        print(f"    {what:32s} {ns:8.0f} ns per call")


def test_kernel_without_arguments(build: Callable[..., FixedKernel]) -> None:
    kernel = build("int nothing(void) { return 0; }\n", "nothing", [])
    assert kernel() is None and kernel.fast() is None
    with pytest.raises(TypeError, match=r"nothing\(\) takes exactly 0 arguments"):
        kernel.fast(1)
