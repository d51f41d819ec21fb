"""Shared fixtures for the GEMM tests: random operands in many memory layouts, a float64
reference GEMM, and an error bound scaled by k and the dtype's epsilon."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from blacc.runtime.build import environment_backend
from blacc.runtime.gemm import forget_calls

DTYPES = (np.float32, np.float64)

# Memory layouts make_operand can produce for a (rows, cols) operand:
#   C        C-contiguous
#   F        Fortran-contiguous
#   T        transposed view of a C-contiguous (cols, rows) array
#   ld       C-order view into a wider buffer: leading dimension > cols, unaligned start
#   ldF      Fortran-order view into a taller buffer: leading dimension > rows
#   strided  non-unit strides in both dimensions (like big[::2, ::3])
#   neg      negative strides in both dimensions
#   revrows  rows reversed: unit column stride, negative leading dimension
#   revcols  Fortran order with columns reversed: unit row stride, negative leading dimension
LAYOUTS = ("C", "F", "T", "ld", "ldF", "strided", "neg", "revrows", "revcols")


def _make_operand(rng, rows, cols, dtype, layout="C", *, pad_value=np.nan, values=None):
    """A (rows, cols) array of ``dtype`` in ``layout`` (see LAYOUTS).

    Values are uniform in [-1, 1) unless ``values`` is given. Every element of the
    surrounding buffer that is not part of the view (padding, gaps) holds ``pad_value``: NaN by
    default, so a kernel that reads padding into its result is caught.
    """
    if values is None:
        values = rng.uniform(-1.0, 1.0, size=(rows, cols))
    values = np.asarray(values, dtype=dtype)
    assert values.shape == (rows, cols)
    if layout == "C":
        out = np.array(values, order="C")
    elif layout == "F":
        out = np.array(values, order="F")
    elif layout == "T":
        out = np.array(values.T, order="C").T
    elif layout == "ld":
        big = np.full((rows + 3, cols + 5), pad_value, dtype=dtype)
        out = big[2 : 2 + rows, 3 : 3 + cols]
    elif layout == "ldF":
        big = np.full((rows + 5, cols + 3), pad_value, dtype=dtype, order="F")
        out = big[3 : 3 + rows, 2 : 2 + cols]
    elif layout == "strided":
        big = np.full((2 * rows + 1, 3 * cols + 1), pad_value, dtype=dtype)
        out = big[1 : 1 + 2 * rows : 2, 1 : 1 + 3 * cols : 3]
    elif layout == "neg":
        big = np.full((rows + 2, cols + 2), pad_value, dtype=dtype)
        out = big[1 : 1 + rows, 1 : 1 + cols][::-1, ::-1]
    elif layout == "revrows":
        big = np.full((rows + 2, cols + 3), pad_value, dtype=dtype)
        out = big[1 : 1 + rows, 2 : 2 + cols][::-1, :]
    elif layout == "revcols":
        big = np.full((rows + 3, cols + 2), pad_value, dtype=dtype, order="F")
        out = big[2 : 2 + rows, 1 : 1 + cols][:, ::-1]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    out[...] = values
    assert out.shape == (rows, cols) and out.dtype == np.dtype(dtype)
    return out


# NumPy's BLAS computes the references on one thread: on small machines (and in forked
# children) its thread pool is often many times slower than one thread for these sizes.
_BLAS = ThreadpoolController()


def _op(x, trans):
    return x.T if trans else x


def _reference_gemm(A, B, C=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False):
    """alpha * op(A) @ op(B) + beta * C in float64; C is not read when it is None or beta == 0."""
    a = _op(np.asarray(A, dtype=np.float64), trans_a)
    b = _op(np.asarray(B, dtype=np.float64), trans_b)
    with _BLAS.limit(limits=1, user_api="blas"):
        result = alpha * (a @ b)
    if C is not None and beta != 0:
        result = result + beta * np.asarray(C, dtype=np.float64)
    return result


def _gemm_tolerance(A, B, C=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, c=4.0):
    """Elementwise bound on |computed - exact| for a GEMM computed in A's dtype.

    c * (k + 2) * eps * (|alpha| * |op(A)| @ |op(B)| + |beta| * |C|): the classic k * u bound
    for a length-k dot product (u = eps / 2), plus a rounding each for scaling and adding C,
    with a safety factor, plus the smallest normal number so that all-zero rows compare.
    """
    dtype = np.result_type(A, B)
    a = np.abs(_op(np.asarray(A, dtype=np.float64), trans_a))
    b = np.abs(_op(np.asarray(B, dtype=np.float64), trans_b))
    k = a.shape[1]
    with _BLAS.limit(limits=1, user_api="blas"):
        magnitude = abs(alpha) * (a @ b)
    if C is not None and beta != 0:
        magnitude = magnitude + abs(beta) * np.abs(np.asarray(C, dtype=np.float64))
    finfo = np.finfo(dtype)
    return c * (k + 2) * float(finfo.eps) * magnitude + float(finfo.tiny)


def _assert_gemm_close(got, A, B, C0=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                       context=""):
    """Check a GEMM result against the float64 reference.

    ``C0`` must be a copy of C taken *before* the call (C is updated in place).
    """
    where = f" [{context}]" if context else ""
    expected = _reference_gemm(A, B, C0, alpha, beta, trans_a, trans_b)
    assert got.shape == expected.shape, f"shape {got.shape}, expected {expected.shape}{where}"
    assert got.dtype == np.result_type(A, B), f"dtype {got.dtype}, expected {A.dtype}{where}"
    tol = _gemm_tolerance(A, B, C0, alpha, beta, trans_a, trans_b)
    err = np.abs(np.asarray(got, dtype=np.float64) - expected)
    bad = ~(err <= tol)  # NaN in the result counts as bad
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} elements out of tolerance{where}; "
            f"first at ({i}, {j}): got {got[i, j]!r}, expected {expected[i, j]!r}, "
            f"|error| {err[i, j]:.3e} > tolerance {tol[i, j]:.3e} "
            f"(m, n, k = {expected.shape[0]}, {expected.shape[1]}, "
            f"{_op(A, trans_a).shape[1]}; alpha={alpha}, beta={beta}, "
            f"trans_a={trans_a}, trans_b={trans_b})"
        )


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: reproducible, different for every test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def make_operand():
    return _make_operand


@pytest.fixture(scope="session")
def reference_gemm():
    return _reference_gemm


@pytest.fixture(scope="session")
def gemm_tolerance():
    return _gemm_tolerance


@pytest.fixture(scope="session")
def assert_gemm_close():
    return _assert_gemm_close


#: Every code generator the spine's tests run on.
BACKENDS = ("c", "llvm")


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Run the test once per backend: the public API follows $BLACC_BACKEND (read again
    here, and after the test, when the variable is restored)."""
    monkeypatch.setenv("BLACC_BACKEND", request.param)
    environment_backend.cache_clear()
    forget_calls()  # calls remembered under the other backend

    def restore() -> None:
        environment_backend.cache_clear()
        forget_calls()

    request.addfinalizer(restore)
    return request.param


@pytest.fixture(autouse=True)
def _model_prices_the_host_with_its_constants(monkeypatch):
    """The cost model's picks that tests pin were measured with its constants' pipes
    (AMD's cores); on an Intel host it would price them with Intel's pipes and rule
    (``strategy.small.core_for``, ``wider_gain``), and a pinned pick would depend on the
    machine the suite runs on. So the host is priced with the constants; a test that
    pretends a machine of its own (``blacs.host_target`` replaced) gets that machine's.
    Likewise the host's kernels are built without the straight-line rows of the one core
    that gets them (``Machine.straight_rows_near_l1``)."""
    from blacc import blacs
    from blacc.runtime.gemm import host_target
    from blacc.strategy import small

    host = host_target().machine
    monkeypatch.setattr(blacs, "core_for", lambda machine, isa: small._core(None)
                        if machine is host else small.core_for(machine, isa))
    monkeypatch.setattr(blacs, "wider_gain", lambda machine: small.WIDER_GAIN
                        if machine is host else small.wider_gain(machine))
    build_flags = blacs._build_flags

    def host_flags(core: small.Core) -> dict[str, bool]:
        flags = build_flags(core)
        if blacs.host_target().machine is host:
            flags["straight_near_l1"] = False
        return flags

    monkeypatch.setattr(blacs, "_build_flags", host_flags)
