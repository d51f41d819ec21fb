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
    monkeypatch.setattr(runtime_gemm, "extension", lambda: None)  # no fast path either
    blacc.gemm(A, B, C1, alpha=1.5, beta=-0.5)
    np.testing.assert_array_equal(C0, C1)


def _kernel(dtype: str, m: int, n: int, k: int) -> tuple[int, bool]:
    _, sized, address, _ = dispatch(host_target(), "c", "blis", dtype, m, n, k, True, True)
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


# ------------------------------------------------------------------ the fast path (repeat)


def _forbid_checked_path(monkeypatch):
    """Make the checked path fail, so a call that succeeds must have been repeated."""
    def refuse(*args, **kwargs):
        raise AssertionError("took the checked path")

    monkeypatch.setattr(blacc.api, "check_gemm", refuse)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True),
                                              (True, True)])
@pytest.mark.parametrize("shape", [(5, 7, 3), (23, 17, 31), (70, 65, 80)])
def test_repeat_gives_the_checked_result(dtype, layout, trans_a, trans_b, shape, rng,
                                         make_operand, monkeypatch, backend):
    """A call like an earlier one is repeated without the checks in Python (when no copy
    was needed), and computes bit for bit what the checked path computes; with C=None
    too. Layouts that need a copy keep taking the checked path, and stay right."""
    m, n, k = shape
    A = make_operand(rng, *((k, m) if trans_a else (m, k)), dtype, layout)
    B = make_operand(rng, *((n, k) if trans_b else (k, n)), dtype, layout)
    C = make_operand(rng, m, n, dtype, layout)
    kw = dict(alpha=1.5, beta=-0.5, trans_a=trans_a, trans_b=trans_b)
    C0 = C.copy()
    first = blacc.gemm(A, B, C, **kw).copy()
    fresh = blacc.gemm(A, B, alpha=-2.0, trans_a=trans_a, trans_b=trans_b)
    in_place = runtime_gemm.remembered(A, B, C, trans_a, trans_b) is not None
    assert (runtime_gemm.remembered(A, B, None, trans_a, trans_b) is not None) == in_place
    # copied: views with no unit stride ([::2, ::3]) or none positive ([::-1, ::-1])
    assert in_place == (layout not in ("strided", "neg")), layout
    if in_place:
        _forbid_checked_path(monkeypatch)
    C[...] = C0
    assert blacc.gemm(A, B, C, **kw) is C
    np.testing.assert_array_equal(C, first)
    np.testing.assert_array_equal(
        blacc.gemm(A, B, alpha=-2.0, trans_a=trans_a, trans_b=trans_b), fresh)


def test_repeat_leaves_overlap_and_read_only_c_to_the_checks():
    """Same dtypes, shapes and strides as a repeated call, but C overlapping A (an error),
    C sharing A's buffer without overlap (fine), a read-only C (an error), alpha == 0
    (C = beta * C): the checked path decides, and nothing is written before an error."""
    rng = np.random.default_rng(5)
    n = 6
    buf = rng.standard_normal((n, 2 * n))
    B = rng.standard_normal((n, n))
    A, C = buf[:, :n], buf[:, n:]  # interleaved rows: the memory ranges meet, no element
    expected = A @ B
    blacc.gemm(A, B, C.copy())  # make the signature known
    blacc.gemm(A, B, C)
    np.testing.assert_allclose(C, expected, rtol=1e-12, atol=1e-12)

    overlapping = buf[:, 1:n + 1]  # shares columns 1..n-1 with A
    before = buf.copy()
    with pytest.raises(blacc.AliasingError, match="C shares memory with A"):
        blacc.gemm(A, B, overlapping)
    np.testing.assert_array_equal(buf, before)

    frozen = np.zeros((n, 2 * n))[:, :n]
    blacc.gemm(A, B, frozen)  # a writable one first
    frozen.flags.writeable = False
    with pytest.raises(blacc.ArgumentError, match="read-only"):
        blacc.gemm(A, B, frozen)

    C2 = np.ones((n, 2 * n))[:, :n]
    blacc.gemm(A, B, C2, alpha=0.0, beta=3.0)
    np.testing.assert_array_equal(C2, np.full((n, n), 3.0))


def test_extension_flags():
    """The extension's flags: transposes and C^T = op(B)^T op(A)^T computed on the arrays
    as given; a unit column stride the kernel needs is checked; possible overlap is
    reported (MAY_OVERLAP) before anything is written."""
    from blacc.runtime import gemmcall as ext

    call = gemm_caller()["f64"]
    rng = np.random.default_rng(2)
    m, n, k = 5, 7, 3
    a, b = rng.standard_normal((k, m)), rng.standard_normal((n, k))  # A^T, B^T
    address, sized = _kernel("f64", m, n, k)
    unit = ext.UNIT_A | ext.UNIT_B | ext.UNIT_C
    c = np.zeros((m, n))
    with pytest.raises(ValueError, match="needs a unit stride"):  # A^T has unit row stride
        call(address, sized, 1.0, a.T, b.T, 0.0, c, ext.UNIT_A)
    with pytest.raises(ValueError, match="needs a unit stride"):  # rows of B are n apart
        call(address, sized, 1.0, np.ascontiguousarray(a.T), np.ascontiguousarray(b.T),
             0.0, c, ext.UNIT_B_ROWS)
    assert call(address, sized, 1.0, np.ascontiguousarray(a.T), np.ascontiguousarray(b.T),
                0.0, c, unit) == 0
    np.testing.assert_allclose(c, a.T @ b.T, rtol=1e-12)
    # C in Fortran order: computed as C^T = B A with the kernel for n x m x k
    address_t, sized_t = _kernel("f64", n, m, k)
    cf = np.zeros((m, n), order="F")
    flags = ext.TRANS_A | ext.TRANS_B | ext.SWAP | unit
    assert call(address_t, sized_t, 1.0, a, b, 0.0, cf, flags) == 0
    np.testing.assert_allclose(cf, a.T @ b.T, rtol=1e-12)
    with pytest.raises(ValueError, match="shapes do not agree"):
        call(address_t, sized_t, 1.0, a, b, 0.0, cf, ext.TRANS_A | ext.SWAP)
    # overlap: C is A
    sq = rng.standard_normal((4, 4))
    address_s, sized_s = _kernel("f64", 4, 4, 4)
    before = sq.copy()
    status = call(address_s, sized_s, 1.0, sq, np.eye(4), 0.0, sq, ext.CHECK_OVERLAP)
    assert status == ext.MAY_OVERLAP
    np.testing.assert_array_equal(sq, before)


def test_repeat_keeps_its_kernel_loaded(backend):
    """The kernel caches may drop a kernel (both are bounded); a remembered call holds it,
    so repeating the call still runs loaded code."""
    import ctypes
    import gc

    rng = np.random.default_rng(9)
    A, B = rng.standard_normal((9, 11)), rng.standard_normal((11, 13))
    C = np.zeros((9, 13))
    blacc.gemm(A, B, C)
    runtime_gemm._DISPATCH.clear()
    runtime_gemm.gemm_kernel.cache_clear()
    gc.collect()
    rep = runtime_gemm.remembered(A, B, C)
    assert ctypes.cast(rep.kernel.function, ctypes.c_void_p).value == rep.address
    C[...] = 0
    assert blacc.gemm(A, B, C) is C
    np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)


def test_the_table_of_calls_is_bounded_and_stays_right(rng):
    """The extension remembers 32 calls; the 33rd takes the oldest slot, and every call,
    repeated or not, still computes its own product."""
    runtime_gemm.forget_calls()
    calls = []
    for i in range(40):
        A, B = rng.standard_normal((3 + i, 5)), rng.standard_normal((5, 4))
        C = np.empty((3 + i, 4))
        assert blacc.gemm(A, B, C) is C
        calls.append((A, B, C))
    known = [runtime_gemm.remembered(A, B, C) is not None for A, B, C in calls]
    assert known == [False] * 8 + [True] * 32
    for A, B, C in calls[::-1]:
        C[...] = np.nan
        blacc.gemm(A, B, C)
        np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)


def test_the_fast_path_takes_only_what_it_remembered(rng, monkeypatch):
    """Arguments that agree with a remembered call in shape and strides but not in type:
    a float32 A with a float64 call's strides, an ndarray subclass, a Python int alpha, a
    numpy float beta. The checked path takes them: it raises or computes."""
    m, k, n = 6, 5, 4
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    C = np.empty((m, n))
    blacc.gemm(A, B, C)
    assert runtime_gemm.remembered(A, B, C) is not None
    # float32 elements 8 bytes apart: A's strides, another format
    A32 = np.zeros((m, 2 * k), np.float32)[:, ::2]
    assert A32.strides == A.strides
    assert runtime_gemm.remembered(A32, B, C) is None
    before = C.copy()
    with pytest.raises(blacc.DTypeError):
        blacc.gemm(A32, B, C)
    np.testing.assert_array_equal(C, before)

    class Sub(np.ndarray):
        pass

    checked = []
    real_check = blacc.api.check_gemm
    monkeypatch.setattr(blacc.api, "check_gemm",
                        lambda *a, **kw: checked.append(1) or real_check(*a, **kw))
    for args, kwargs in (((A.view(Sub), B, C), {}), ((A, B, C), {"alpha": 2}),
                         ((A, B, C), {"beta": np.float64(0.5)})):
        C[...] = 1.0
        blacc.gemm(*args, **kwargs)
        alpha, beta = kwargs.get("alpha", 1.0), kwargs.get("beta", 0.0)
        np.testing.assert_allclose(C, alpha * (A @ B) + beta, rtol=1e-12, atol=1e-12)
    assert len(checked) == 3
    blacc.gemm(A, B, C)  # as remembered: no check
    assert len(checked) == 3


def test_routes_keep_backends_and_strategies_apart(rng):
    """A call remembered with one strategy is not repeated for another."""
    A, B = rng.standard_normal((7, 9)), rng.standard_normal((9, 5))
    C = np.empty((7, 5))
    blacc.gemm(A, B, C, strategy="tiling")
    assert runtime_gemm.remembered(A, B, C, strategy="tiling") is not None
    assert runtime_gemm.remembered(A, B, C, strategy="blis") is None
    blacc.gemm(A, B, C, strategy="blis")
    held = {runtime_gemm.remembered(A, B, C, strategy=s).kernel.module.entry
            for s in ("tiling", "blis")}
    assert len(held) == 2


# NumPy leaves the stride of a dimension of extent 1 arbitrary, also in what
# ascontiguousarray returns: [m, n, k] with ones, in layouts that give such strides.
EXTENT_ONE_SHAPES = [(1, 10, 2), (10, 1, 2), (1, 1, 5), (3, 7, 1), (1, 1, 1), (1, 9, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", EXTENT_ONE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_dimension_of_extent_one_takes_any_stride(dtype, shape, rng, make_operand,
                                                    assert_gemm_close):
    """A stride along a dimension of extent 1 is never applied, so it counts as unit, both
    where the kernel is chosen and where the extension checks the strides the kernel was
    compiled for (the first call is checked too, so the two must agree). Each call is made
    twice, the second repeating the first where it was remembered, in every layout of A,
    B and C. 1 x 10 x 2 with C's columns reversed is the repeat a CI run once refused
    ("the kernel needs a unit stride"), in a test order not reproduced since."""
    m, n, k = shape
    for layout in LAYOUTS:
        for la, lb in ((layout, "C"), ("C", layout), (layout, layout)):
            A = make_operand(rng, m, k, dtype, la)
            B = make_operand(rng, k, n, dtype, lb)
            C = make_operand(rng, m, n, dtype, layout, pad_value=-7.0)
            C0 = C.copy()
            for _ in range(2):
                C[...] = C0
                assert blacc.gemm(A, B, C, alpha=1.0, beta=0.5) is C
                assert_gemm_close(C, A, B, C0, 1.0, 0.5,
                                  context=f"A {la}, B {lb}, C {layout}")


def test_the_first_call_checks_the_strides_its_kernel_was_compiled_for(rng, monkeypatch):
    """A kernel chosen for strides the arrays do not have is refused before it runs, on the
    first call as on a repeat: nothing is written, and nothing is remembered."""
    A, B = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    C = np.zeros((6, 4))
    real = runtime_gemm.dispatch

    def claims_unit_rows_of_b(*args):
        kernel, sized, address, unit = real(*args)
        return kernel, sized, address, unit | runtime_gemm.UNIT_B_ROWS

    monkeypatch.setattr(runtime_gemm, "dispatch", claims_unit_rows_of_b)
    with pytest.raises(ValueError, match="needs a unit stride"):
        blacc.gemm(A, B, C)
    np.testing.assert_array_equal(C, 0.0)
    assert runtime_gemm.remembered(A, B, C) is None


def test_dispatch_keeps_the_targets_it_keys_alive():
    """The dispatch table keys a target by its id; the target stays alive, so that a target
    made later cannot take the id and be given another target's kernels."""
    import dataclasses
    import gc
    import weakref

    from blacc.target.isa import GENERIC

    target = dataclasses.replace(host_target(), isa=GENERIC)
    seen = weakref.ref(target)
    dispatch(target, "c", "auto", "f64", 3, 4, 5, True, True)
    del target
    gc.collect()
    assert seen() is not None
