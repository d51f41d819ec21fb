"""Randomized correctness tests of blacc.gemm and blacc.matmul against a float64 reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blacc
from conftest import DTYPES, LAYOUTS
from guard import bits, outside_view

# Every test here runs on both code generators (the C compiler and the LLVM JIT).
pytestmark = pytest.mark.usefixtures("backend")

TRANSPOSES = list(itertools.product((False, True), repeat=2))
SCALARS = (0.0, 1.0, -0.5, 2.5)
C_PAD = -999.0  # finite sentinel around C views: a write into padding changes it

# (m, n, k): tiny, primes, and sizes that are not multiples of 6, 8 or 16 (register tiles),
# mixed with exact multiples, so every edge-tile path is taken. At the time of writing blacc
# packs when m*n*k > 48**3 (48x48x48 does not, 49x49x49 does) and blocks k by 320 (f32) or
# 256 (f64) and m by 306 (f32) or 192 (f64) on the development host; shapes just past those
# are included, but blocking is also tested against the live plan in test_guard_pages.py.
SHAPES = [
    (1, 1, 1), (1, 1, 7), (2, 3, 5), (3, 2, 7), (5, 7, 3), (7, 13, 5), (13, 7, 17),
    (17, 31, 3), (31, 37, 61), (37, 61, 31), (61, 97, 13), (97, 61, 131), (131, 37, 97),
    (6, 8, 16), (12, 16, 32), (24, 48, 64), (23, 47, 9), (25, 49, 65), (50, 10, 100),
    (1, 97, 131), (97, 1, 131), (131, 97, 1), (1, 1, 200), (33, 65, 129),
    (48, 48, 48), (49, 49, 49), (6, 16, 1201), (193, 7, 257), (307, 9, 321),
    # register tiles run in place over narrow C (8 or 24 columns) or few rows with a long k
    (131, 8, 257), (101, 24, 300), (8, 999, 300), (5, 1000, 300),
]
LARGE_SHAPES = [(257, 263, 301), (600, 17, 513), (17, 600, 513)]


def _ids(shape):
    return "x".join(map(str, shape))


def _operands(make_operand, rng, m, n, k, dtype, la="C", lb="C", trans_a=False, trans_b=False):
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    return make_operand(rng, *a_shape, dtype, la), make_operand(rng, *b_shape, dtype, lb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_shapes(dtype, shape, rng, make_operand, assert_gemm_close):
    m, n, k = shape
    A, B = _operands(make_operand, rng, m, n, k, dtype)
    assert_gemm_close(blacc.gemm(A, B), A, B, context="C=None")

    C = make_operand(rng, m, n, dtype)
    C0 = C.copy()
    out = blacc.gemm(A, B, C, alpha=1.5, beta=-0.5)
    assert out is C
    assert_gemm_close(C, A, B, C0, alpha=1.5, beta=-0.5, context="alpha=1.5, beta=-0.5")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=_ids)
def test_large(dtype, shape, rng, make_operand, assert_gemm_close):
    m, n, k = shape
    A, B = _operands(make_operand, rng, m, n, k, dtype, "C", "ld", trans_b=True)
    C = make_operand(rng, m, n, dtype, "F")
    C0 = C.copy()
    assert blacc.gemm(A, B, C, alpha=-0.5, beta=2.5, trans_b=True) is C
    assert_gemm_close(C, A, B, C0, alpha=-0.5, beta=2.5, trans_b=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (13, 5, 7), (37, 41, 29),
                                   (64, 48, 96), (97, 5, 131)], ids=_ids)
def test_transposes(dtype, trans_a, trans_b, shape, rng, make_operand, assert_gemm_close):
    m, n, k = shape
    A, B = _operands(make_operand, rng, m, n, k, dtype, trans_a=trans_a, trans_b=trans_b)
    C = make_operand(rng, m, n, dtype)
    C0 = C.copy()
    blacc.gemm(A, B, C, alpha=2.5, beta=1.0, trans_a=trans_a, trans_b=trans_b)
    assert_gemm_close(C, A, B, C0, 2.5, 1.0, trans_a, trans_b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
def test_input_layouts(dtype, la, lb, rng, make_operand, assert_gemm_close):
    """Every layout of A and B, each with every transpose flag; A and B stay untouched."""
    m, n, k = 19, 23, 29
    for trans_a, trans_b in TRANSPOSES:
        context = f"A {la}, B {lb}, trans_a={trans_a}, trans_b={trans_b}"
        A, B = _operands(make_operand, rng, m, n, k, dtype, la, lb, trans_a, trans_b)
        A0, B0 = A.copy(), B.copy()
        A_around, B_around = outside_view(A), outside_view(B)
        C = blacc.gemm(A, B, alpha=-0.5, trans_a=trans_a, trans_b=trans_b)
        assert_gemm_close(C, A, B, None, -0.5, 0.0, trans_a, trans_b, context=context)
        np.testing.assert_array_equal(A, A0, err_msg=f"A was modified [{context}]")
        np.testing.assert_array_equal(B, B0, err_msg=f"B was modified [{context}]")
        assert np.array_equal(bits(outside_view(A)), bits(A_around)), context
        assert np.array_equal(bits(outside_view(B)), bits(B_around)), context


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lc", LAYOUTS)
@pytest.mark.parametrize("beta", [0.0, 2.5])
def test_output_layouts(dtype, lc, beta, rng, make_operand, assert_gemm_close):
    """C in every layout is updated in place (written back for copied layouts), C itself is
    returned, and nothing around the view (padding, gaps between elements) is written."""
    for m, n, k in [(19, 23, 29), (6, 16, 8), (50, 60, 70)]:
        context = f"C {lc}, m, n, k = {m}, {n}, {k}"
        A, B = _operands(make_operand, rng, m, n, k, dtype, "ld", "F")
        C = make_operand(rng, m, n, dtype, lc, pad_value=C_PAD)
        C0 = C.copy()
        around = outside_view(C)
        assert blacc.gemm(A, B, C, alpha=-0.5, beta=beta) is C, context
        assert_gemm_close(C, A, B, C0, -0.5, beta, context=context)
        assert np.array_equal(bits(outside_view(C)), bits(around)), f"wrote outside C: {context}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", SCALARS)
@pytest.mark.parametrize("beta", SCALARS)
def test_alpha_beta(dtype, alpha, beta, rng, make_operand, assert_gemm_close):
    m, n, k = 23, 19, 11
    A, B = _operands(make_operand, rng, m, n, k, dtype)
    C = make_operand(rng, m, n, dtype, "ld")
    C0 = C.copy()
    assert blacc.gemm(A, B, C, alpha=alpha, beta=beta) is C
    assert_gemm_close(C, A, B, C0, alpha, beta)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "alpha, beta",
    [(2, 1), (-3, 0), (np.float64(-0.5), np.float32(2.5)), (np.float32(1.5), np.int64(0))],
    ids=["int", "int-zero-beta", "numpy-float", "numpy-int"],
)
def test_scalar_types(dtype, alpha, beta, rng, make_operand, assert_gemm_close):
    """Python ints and numpy scalars are numbers too."""
    A, B = _operands(make_operand, rng, 9, 11, 13, dtype)
    C = make_operand(rng, 9, 11, dtype)
    C0 = C.copy()
    blacc.gemm(A, B, C, alpha=alpha, beta=beta)
    assert_gemm_close(C, A, B, C0, float(alpha), float(beta))


@st.composite
def _gemm_cases(draw):
    dim = st.integers(min_value=0, max_value=70)
    return {
        "m": draw(dim), "n": draw(dim), "k": draw(dim),
        "dtype": draw(st.sampled_from(DTYPES)),
        "la": draw(st.sampled_from(LAYOUTS)),
        "lb": draw(st.sampled_from(LAYOUTS)),
        "lc": draw(st.sampled_from((None, *LAYOUTS))),
        "trans_a": draw(st.booleans()),
        "trans_b": draw(st.booleans()),
        "alpha": draw(st.sampled_from(SCALARS) | st.floats(-4, 4)),
        "beta": draw(st.sampled_from(SCALARS) | st.floats(-4, 4)),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


@settings(max_examples=60, deadline=None)
@given(case=_gemm_cases())
def test_random_gemm(case, make_operand, assert_gemm_close):
    rng = np.random.default_rng(case["seed"])
    m, n, k, dtype = case["m"], case["n"], case["k"], case["dtype"]
    alpha, beta, trans_a, trans_b = case["alpha"], case["beta"], case["trans_a"], case["trans_b"]
    A, B = _operands(make_operand, rng, m, n, k, dtype, case["la"], case["lb"], trans_a, trans_b)
    if case["lc"] is None:
        C = blacc.gemm(A, B, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)
        assert C.flags.c_contiguous
        assert_gemm_close(C, A, B, None, alpha, 0.0, trans_a, trans_b)
    else:
        C = make_operand(rng, m, n, dtype, case["lc"], pad_value=C_PAD)
        C0, around = C.copy(), outside_view(C)
        out = blacc.gemm(A, B, C, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)
        assert out is C
        assert_gemm_close(C, A, B, C0, alpha, beta, trans_a, trans_b)
        assert np.array_equal(bits(outside_view(C)), bits(around)), "wrote outside C"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lc", LAYOUTS)
def test_beta_zero_never_reads_c(dtype, lc, rng, make_operand, assert_gemm_close):
    """With beta == 0, NaN and Inf already in C must not reach the result."""
    for m, n, k in [(13, 17, 11), (60, 50, 70), (13, 17, 0)]:
        context = f"C {lc}, m, n, k = {m}, {n}, {k}"
        A, B = _operands(make_operand, rng, m, n, k, dtype)
        poison = np.where(rng.random((m, n)) < 0.5, np.nan, np.inf)
        C = make_operand(rng, m, n, dtype, lc, values=poison)
        blacc.gemm(A, B, C, alpha=2.5, beta=0.0)
        assert np.isfinite(C).all(), f"NaN/Inf from C leaked although beta == 0: {context}"
        assert_gemm_close(C, A, B, None, 2.5, 0.0, context=context)
        if k == 0:
            assert not C.any(), f"k == 0 and beta == 0 must give zeros: {context}"


def _special_values(rng, m, n, dtype):
    """Values whose bits change under 1.0 * x + 0.0 or any arithmetic: -0.0, NaN, Inf,
    subnormals, plus ordinary random numbers."""
    finfo = np.finfo(dtype)
    special = np.array([-0.0, np.nan, np.inf, -np.inf, finfo.smallest_subnormal,
                        -finfo.smallest_subnormal * 3, finfo.max], dtype=dtype)
    values = rng.uniform(-1, 1, (m, n)).astype(dtype)
    mask = rng.random((m, n)) < 0.5
    values[mask] = rng.choice(special, size=int(mask.sum()))
    values.flat[: len(special)] = special[: values.size]
    return values


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lc", LAYOUTS)
def test_alpha_zero_beta_one_keeps_c_bitwise(dtype, lc, rng, make_operand):
    for m, n, k in [(13, 17, 11), (1, 1, 1), (60, 50, 70), (13, 17, 0)]:
        A, B = _operands(make_operand, rng, m, n, k, dtype)
        C = make_operand(rng, m, n, dtype, lc, values=_special_values(rng, m, n, dtype))
        C0 = C.copy()
        assert blacc.gemm(A, B, C, alpha=0.0, beta=1.0) is C
        assert np.array_equal(bits(C), bits(C0)), (
            f"alpha=0, beta=1 changed the bits of C (C {lc}, m, n, k = {m}, {n}, {k})")


@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_zero_beta_one_ignores_nonfinite_inputs(dtype, rng, make_operand):
    """alpha == 0, beta == 1 leaves C unchanged even when 0 * A @ B would be NaN."""
    m, n, k = 7, 5, 3
    A, B = _operands(make_operand, rng, m, n, k, dtype)
    A[0, 0], B[1, 1] = np.nan, np.inf
    C = make_operand(rng, m, n, dtype)
    C0 = C.copy()
    blacc.gemm(A, B, C, alpha=0.0, beta=1.0)
    assert np.array_equal(bits(C), bits(C0)), "alpha=0, beta=1 changed the bits of C"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", SCALARS)
@pytest.mark.parametrize("lc", ["C", "F", "ld", "strided"])
def test_k_zero(dtype, beta, lc, rng, make_operand, assert_gemm_close):
    """k == 0: C = beta * C (zeros when beta == 0)."""
    m, n = 9, 14
    A, B = _operands(make_operand, rng, m, n, 0, dtype)
    C = make_operand(rng, m, n, dtype, lc, pad_value=C_PAD)
    C0, around = C.copy(), outside_view(C)
    assert blacc.gemm(A, B, C, alpha=2.5, beta=beta) is C
    if beta == 0:
        assert not C.any()
    elif beta == 1:
        assert np.array_equal(bits(C), bits(C0))
    else:
        assert_gemm_close(C, A, B, C0, 2.5, beta)
    assert np.array_equal(bits(outside_view(C)), bits(around)), "wrote outside C"

    new = blacc.gemm(A, B, alpha=2.5, beta=beta)
    assert new.shape == (m, n) and new.dtype == np.dtype(dtype) and not new.any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 5, 3), (5, 0, 3), (0, 0, 3), (0, 5, 0), (0, 0, 0)],
                         ids=_ids)
def test_empty_output(dtype, shape, rng, make_operand):
    m, n, k = shape
    for trans_a, trans_b in TRANSPOSES:
        A, B = _operands(make_operand, rng, m, n, k, dtype, trans_a=trans_a, trans_b=trans_b)
        new = blacc.gemm(A, B, beta=1.0, trans_a=trans_a, trans_b=trans_b)
        assert new.shape == (m, n) and new.dtype == np.dtype(dtype)
        C = np.empty((m, n), dtype=dtype)
        assert blacc.gemm(A, B, C, beta=0.5, trans_a=trans_a, trans_b=trans_b) is C


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("la, lb", [("C", "C"), ("F", "T"), ("strided", "neg"), ("ld", "ldF")])
def test_new_output(dtype, la, lb, rng, make_operand, assert_gemm_close):
    """C=None gives a new C-ordered array of the operands' dtype; beta is ignored."""
    A, B = _operands(make_operand, rng, 15, 9, 21, dtype, la, lb)
    out = blacc.gemm(A, B, beta=2.5)
    assert isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable
    assert not np.shares_memory(out, A) and not np.shares_memory(out, B)
    assert_gemm_close(out, A, B)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_and_b_may_share_memory(dtype, rng, make_operand, assert_gemm_close):
    """Only C must not alias the inputs: A @ A.T with A passed twice is fine."""
    A = make_operand(rng, 17, 11, dtype)
    assert_gemm_close(blacc.gemm(A, A, trans_b=True), A, A, trans_b=True)
    assert_gemm_close(blacc.gemm(A, A.T), A, A.T)
    sq = make_operand(rng, 13, 13, dtype)
    assert_gemm_close(blacc.gemm(sq, sq), sq, sq)


@pytest.mark.parametrize("dtype", DTYPES)
def test_c_beside_inputs_in_one_buffer(dtype, rng, assert_gemm_close):
    """C in the same buffer as A and B but not overlapping them (np.shares_memory is False)."""
    buf = rng.uniform(-1, 1, (12, 30)).astype(dtype)
    A, B, C = buf[:, :12], buf[:, 12:20], buf[:, 20:28]
    assert not np.shares_memory(C, A) and not np.shares_memory(C, B)
    A0, B0, C0, tail0 = A.copy(), B.copy(), C.copy(), buf[:, 28:].copy()
    assert blacc.gemm(A, B, C, alpha=0.5, beta=-0.5) is C
    assert_gemm_close(C, A0, B0, C0, 0.5, -0.5)
    np.testing.assert_array_equal(A, A0)
    np.testing.assert_array_equal(B, B0)
    np.testing.assert_array_equal(buf[:, 28:], tail0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(13, 11, 9), (70, 60, 50)], ids=_ids)
def test_broadcast_inputs(dtype, shape, rng, assert_gemm_close):
    """Zero-stride (np.broadcast_to) operands are valid read-only inputs."""
    m, n, k = shape
    A = np.broadcast_to(rng.uniform(-1, 1, k).astype(dtype), (m, k))
    B = np.broadcast_to(rng.uniform(-1, 1, (k, 1)).astype(dtype), (k, n))
    assert_gemm_close(blacc.gemm(A, B), A, B)
    assert_gemm_close(blacc.gemm(B, A, trans_a=True, trans_b=True), B, A, None, 1.0, 0.0,
                      True, True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(13, 11, 9), (70, 60, 50)], ids=_ids)
def test_misaligned_operands(dtype, shape, rng, assert_gemm_close):
    """Arrays whose data pointer is not a multiple of the itemsize (flags.aligned is False)."""
    m, n, k = shape

    def misaligned(rows, cols):
        raw = np.zeros(rows * cols * np.dtype(dtype).itemsize + 1, dtype=np.uint8)
        out = np.ndarray((rows, cols), dtype=dtype, buffer=raw, offset=1)
        out[...] = rng.uniform(-1, 1, (rows, cols))
        assert not out.flags.aligned
        return out

    A, B, C = misaligned(m, k), misaligned(k, n), misaligned(m, n)
    C0 = C.copy()
    assert blacc.gemm(A, B, C, alpha=0.5, beta=-1.0) is C
    assert_gemm_close(C, A, B, C0, 0.5, -1.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_c_interleaved_with_input(dtype, rng, assert_gemm_close):
    """C and A interleaved column by column in one buffer: they do not overlap."""
    buf = rng.uniform(-1, 1, (17, 2 * 23)).astype(dtype)
    A, C = buf[:, 0::2], buf[:, 1::2]
    assert not np.shares_memory(A, C)
    B = rng.uniform(-1, 1, (23, 23)).astype(dtype)
    A0, C0 = A.copy(), C.copy()
    assert blacc.gemm(A, B, C, beta=1.0) is C
    assert_gemm_close(C, A0, B, C0, 1.0, 1.0)
    np.testing.assert_array_equal(A, A0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_alpha_beta_are_allowed(dtype, rng, make_operand):
    """Like BLAS, NaN alpha or beta is a number: no error, and it propagates."""
    A, B = _operands(make_operand, rng, 4, 5, 6, dtype)
    assert np.isnan(blacc.gemm(A, B, alpha=np.nan)).all()
    C = make_operand(rng, 4, 5, dtype)
    blacc.gemm(A, B, C, beta=np.nan)
    assert np.isnan(C).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (64, 33, 97), (130, 70, 1)], ids=_ids)
@pytest.mark.parametrize("la, lb", [("C", "C"), ("T", "F"), ("ld", "strided")])
def test_matmul(dtype, shape, la, lb, rng, make_operand, assert_gemm_close):
    m, n, k = shape
    A, B = _operands(make_operand, rng, m, n, k, dtype, la, lb)
    got = blacc.matmul(A, B)
    assert got.shape == (m, n) and got.dtype == np.dtype(dtype)
    assert_gemm_close(got, A, B)
    np.testing.assert_allclose(got, np.matmul(A, B), rtol=0, atol=(
        8 * (k + 1) * np.finfo(dtype).eps * (np.abs(A) @ np.abs(B)).max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lout", ["C", "F", "ld", "strided"])
def test_matmul_out(dtype, lout, rng, make_operand, assert_gemm_close):
    m, n, k = 21, 10, 17
    A, B = _operands(make_operand, rng, m, n, k, dtype)
    out = make_operand(rng, m, n, dtype, lout, values=np.full((m, n), np.nan), pad_value=C_PAD)
    around = outside_view(out)
    assert blacc.matmul(A, B, out=out) is out
    assert_gemm_close(out, A, B)
    assert np.array_equal(bits(outside_view(out)), bits(around)), "wrote outside out"
