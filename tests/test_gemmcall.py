"""The CPython extension that calls GEMM kernels (runtime.gemmcall): same results as the
ctypes path over every layout, and its own checks refuse what could touch bad memory."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import blacc
from blacc.runtime import gemm as runtime_gemm
from blacc.runtime.gemm import dispatch, host_target
from blacc.runtime.gemmcall import GIL_RELEASE_FLOPS, gemm_caller
from conftest import DTYPES, LAYOUTS

pytestmark = pytest.mark.skipif(gemm_caller() is None, reason="needs a C compiler")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_extension_and_ctypes_agree(dtype, layout, rng, make_operand, monkeypatch):
    m, n, k = 23, 17, 31
    A = make_operand(rng, m, k, dtype, layout)
    B = make_operand(rng, k, n, dtype, layout)
    C0 = make_operand(rng, m, n, dtype, layout)
    C1 = C0.copy()
    blacc.gemm(A, B, C0, alpha=1.5, beta=-0.5)
    monkeypatch.setattr(runtime_gemm, "gemm_caller", lambda: None)
    blacc.gemm(A, B, C1, alpha=1.5, beta=-0.5)
    np.testing.assert_array_equal(C0, C1)


def _kernel(dtype: str, m: int, n: int, k: int) -> tuple[int, bool]:
    _, sized, address = dispatch(host_target(), "c", "blis", dtype, m, n, k, True, True)
    return address, sized


def test_extension_refuses_disagreeing_shapes():
    call = gemm_caller()["f64"]
    address, sized = _kernel("f64", 4, 5, 6)
    a, b, c = np.ones((4, 6)), np.ones((6, 5)), np.zeros((4, 5))
    for args, what in (((a, b, np.zeros((4, 4))), "C"), ((a, np.ones((5, 5)), c), "B"),
                       ((np.ones((3, 6)), b, c), "A")):
        with pytest.raises(ValueError, match="shapes do not agree"):
            call(address, sized, 1.0, *args[:2], 0.0, args[2])
        assert not np.any(c), what


def test_extension_refuses_wrong_item_size_and_read_only_c():
    call = gemm_caller()["f32"]
    address, sized = _kernel("f32", 4, 5, 6)
    a, b = np.ones((4, 6), np.float32), np.ones((6, 5), np.float32)
    with pytest.raises(ValueError, match="2-D float arrays"):
        call(address, sized, 1.0, a, b, 0.0, np.zeros((4, 5), np.float64))
    with pytest.raises(ValueError, match="2-D float arrays"):
        call(address, sized, 1.0, a.ravel(), b, 0.0, np.zeros((4, 5), np.float32))
    frozen = np.zeros((4, 5), np.float32)
    frozen.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        call(address, sized, 1.0, a, b, 0.0, frozen)
    assert not np.any(frozen)
    with pytest.raises(ValueError, match="null kernel address"):
        call(0, sized, 1.0, a, b, 0.0, np.zeros((4, 5), np.float32))


def test_products_from_two_threads():
    """Two threads each run a product big enough for the kernel to run without the GIL;
    both results are right."""
    n = int(round(GIL_RELEASE_FLOPS ** (1 / 3))) * 4
    rng = np.random.default_rng(1)
    pairs = [(rng.standard_normal((n, n)), rng.standard_normal((n, n))) for _ in range(2)]
    out: list[np.ndarray | None] = [None, None]

    def work(i: int) -> None:
        out[i] = blacc.gemm(*pairs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (a, b), got in zip(pairs, out, strict=True):
        np.testing.assert_allclose(got, a @ b, rtol=1e-10, atol=1e-10)
