"""Bad arguments to blacc.gemm / blacc.matmul raise the documented exception, with a message that
names the problem, before anything is written to C."""

from __future__ import annotations

import re

import numpy as np
import pytest

import blacc
from blacc.errors import AliasingError, ArgumentError, DTypeError, ShapeError
from guard import bits

# Every test here runs on both code generators (the C compiler and the LLVM JIT).
pytestmark = pytest.mark.usefixtures("backend")


def mentions_shape(message: str, shape) -> bool:
    """Whether ``message`` names the 2-D ``shape``: '(7, 11)', '7x11', '7 x 11', '7×11', ..."""
    r, c = shape
    return re.search(rf"(?<!\d){r}\s*(?:,|x|×|\*|by)\s*{c}(?!\d)", message) is not None


def _c(shape, dtype=np.float64):
    """An output array with recognizable contents, and a copy to check it against."""
    C = (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 0.25).astype(dtype)
    assert C.dtype == np.dtype(dtype)
    return C, C.copy()


def _assert_untouched(C, C0):
    assert np.array_equal(bits(C), bits(C0)), "C was written although the call was rejected"


def _ones(shape, dtype=np.float64):
    return np.ones(shape, dtype=dtype)


# ---------------------------------------------------------------------------------- shapes


def _mismatches():
    """(A shape, B shape, trans_a, trans_b) where op(A) and op(B) do not fit together."""
    for a_shape, b_shape in [((7, 11), (13, 5)), ((0, 3), (4, 5)), ((3, 0), (1, 2)),
                             ((4, 9), (8, 9))]:
        for trans_a in (False, True):
            for trans_b in (False, True):
                op_a = a_shape[::-1] if trans_a else a_shape
                op_b = b_shape[::-1] if trans_b else b_shape
                if op_a[1] != op_b[0]:
                    yield a_shape, b_shape, trans_a, trans_b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_shape, b_shape, trans_a, trans_b", list(_mismatches()))
def test_inner_dimension_mismatch(dtype, a_shape, b_shape, trans_a, trans_b):
    op_a = a_shape[::-1] if trans_a else a_shape
    op_b = b_shape[::-1] if trans_b else b_shape
    A, B = _ones(a_shape, dtype), _ones(b_shape, dtype)
    C, C0 = _c((op_a[0], op_b[1]), dtype)
    with pytest.raises(ShapeError) as info:
        blacc.gemm(A, B, C, beta=1.0, trans_a=trans_a, trans_b=trans_b)
    message = str(info.value)
    for given, op in ((a_shape, op_a), (b_shape, op_b)):
        assert mentions_shape(message, given) or mentions_shape(message, op), (
            f"message does not name the shape {given} (or {op}): {message!r}")
    _assert_untouched(C, C0)
    with pytest.raises(ShapeError):
        blacc.gemm(A, B, trans_a=trans_a, trans_b=trans_b)


@pytest.mark.parametrize("c_shape", [(8, 5), (7, 6), (5, 7), (35, 1), (1, 5), (0, 0)])
def test_c_wrong_shape(c_shape):
    A, B = _ones((7, 3)), _ones((3, 5))  # the result is 7 x 5
    C, C0 = _c(c_shape)
    with pytest.raises(ShapeError) as info:
        blacc.gemm(A, B, C, beta=1.0)
    assert mentions_shape(str(info.value), c_shape), str(info.value)
    _assert_untouched(C, C0)


NOT_2D = {
    "A 1-D": (lambda: _ones(4), lambda: _ones((4, 3)), lambda: _c((1, 3))),
    "A 3-D": (lambda: _ones((2, 4, 4)), lambda: _ones((4, 3)), lambda: _c((4, 3))),
    "A 0-D": (lambda: np.array(2.0), lambda: _ones((1, 3)), lambda: _c((1, 3))),
    "B 1-D": (lambda: _ones((3, 4)), lambda: _ones(4), lambda: _c((3, 1))),
    "B 3-D": (lambda: _ones((3, 4)), lambda: _ones((1, 4, 2)), lambda: _c((3, 2))),
    "C 1-D": (lambda: _ones((3, 4)), lambda: _ones((4, 1)), lambda: _c((3,))),
    "C 3-D": (lambda: _ones((3, 4)), lambda: _ones((4, 2)), lambda: _c((1, 3, 2))),
}


@pytest.mark.parametrize("case", NOT_2D)
def test_not_2d(case):
    make_a, make_b, make_c = NOT_2D[case]
    A, B, (C, C0) = make_a(), make_b(), make_c()
    with pytest.raises(ShapeError) as info:
        blacc.gemm(A, B, C, beta=1.0)
    assert re.search(r"2-?d|dim", str(info.value), re.IGNORECASE), str(info.value)
    _assert_untouched(C, C0)
    if not case.startswith("C"):
        with pytest.raises(ShapeError):
            blacc.gemm(A, B)


# ---------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(
    "a_dtype, b_dtype, c_dtype",
    [
        (np.float32, np.float64, np.float32),
        (np.float64, np.float32, np.float64),
        (np.float32, np.float64, None),
        (np.float32, np.float32, np.float64),
        (np.float64, np.float64, np.float32),
    ],
)
def test_mixed_dtypes(a_dtype, b_dtype, c_dtype):
    A, B = _ones((4, 3), a_dtype), _ones((3, 2), b_dtype)
    C, C0 = _c((4, 2), c_dtype or np.float32)
    with pytest.raises(DTypeError) as info:
        blacc.gemm(A, B, None if c_dtype is None else C, beta=1.0)
    message = str(info.value)
    assert "float32" in message and "float64" in message, message
    _assert_untouched(C, C0)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.complex64,
                                   np.complex128, np.bool_])
@pytest.mark.parametrize("with_c", [False, True])
def test_unsupported_dtype(dtype, with_c):
    A, B = _ones((4, 3), dtype), _ones((3, 2), dtype)
    C, C0 = _c((4, 2), dtype)
    with pytest.raises(DTypeError) as info:
        blacc.gemm(A, B, C if with_c else None, beta=1.0)
    assert np.dtype(dtype).name in str(info.value), str(info.value)
    _assert_untouched(C, C0)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.complex64])
def test_unsupported_c_dtype(dtype):
    A, B = _ones((4, 3)), _ones((3, 2))
    C, C0 = _c((4, 2), dtype)
    with pytest.raises(DTypeError) as info:
        blacc.gemm(A, B, C, beta=1.0)
    assert np.dtype(dtype).name in str(info.value), str(info.value)
    _assert_untouched(C, C0)


# ------------------------------------------------------------------------------- aliasing


def _alias_c_is_a():
    buf = np.ones((6, 6))
    return buf, buf, np.ones((6, 6)), buf, {}


def _alias_c_is_b():
    buf = np.ones((6, 6))
    return buf, np.ones((6, 6)), buf, buf, {}


def _alias_c_is_a_transposed():
    buf = np.ones((6, 6))
    return buf, buf.T, np.ones((6, 6)), buf, {}


def _alias_c_overlaps_a():
    buf = np.ones((8, 12))
    return buf, buf[:, :8], np.ones((8, 8)), buf[:, 4:12], {}


def _alias_c_overlaps_b_transposed():
    buf = np.ones((10, 10))
    return buf, np.ones((5, 10)), buf[:5, :], buf[::2, 5:], {"trans_b": True}


def _alias_c_strided_into_a():
    buf = np.ones((12, 12))
    return buf, buf[:6, :], np.ones((12, 6)), buf[::2, ::2], {}


ALIASES = {
    "C is A": _alias_c_is_a,
    "C is B": _alias_c_is_b,
    "C is A.T": _alias_c_is_a_transposed,
    "C overlaps A": _alias_c_overlaps_a,
    "C overlaps op(B)": _alias_c_overlaps_b_transposed,
    "C strided into A": _alias_c_strided_into_a,
}


@pytest.mark.parametrize("case", ALIASES)
def test_c_shares_memory_with_input(case):
    buf, A, B, C, kwargs = ALIASES[case]()
    buf[...] = np.arange(buf.size).reshape(buf.shape) + 0.5
    assert np.shares_memory(C, A) or np.shares_memory(C, B)
    buf0 = buf.copy()
    with pytest.raises(AliasingError) as info:
        blacc.gemm(A, B, C, alpha=2.0, beta=1.0, **kwargs)
    assert re.search(r"alias|overlap|share|memory", str(info.value), re.IGNORECASE), (
        str(info.value))
    assert np.array_equal(bits(buf), bits(buf0)), "memory was written although rejected"


# ------------------------------------------------------------------------------- read-only


@pytest.mark.parametrize("how", ["flag", "read-only view"])
def test_read_only_c(how):
    A, B = _ones((4, 3)), _ones((3, 2))
    C, C0 = _c((4, 2))
    if how == "flag":
        C.flags.writeable = False
        target = C
    else:
        target = C.view()
        target.flags.writeable = False
    with pytest.raises(ArgumentError) as info:
        blacc.gemm(A, B, target, beta=1.0)
    assert re.search(r"read-?only|writ", str(info.value), re.IGNORECASE), str(info.value)
    _assert_untouched(C, C0)


def test_read_only_inputs_are_fine():
    """The counterpart: A and B are only read, so read-only inputs are accepted."""
    A, B = np.arange(12.0).reshape(4, 3), np.arange(6.0).reshape(3, 2)
    A.flags.writeable = False
    B.flags.writeable = False
    np.testing.assert_allclose(blacc.gemm(A, B), A @ B)


# --------------------------------------------------------------------------------- scalars


BAD_SCALARS = ["2.0", b"1", None, [1.0], {"x": 1}, object()]


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", BAD_SCALARS, ids=lambda v: type(v).__name__)
def test_non_number_scalar(name, value):
    A, B = _ones((4, 3)), _ones((3, 2))
    C, C0 = _c((4, 2))
    with pytest.raises(ArgumentError) as info:
        blacc.gemm(A, B, C, **{name: value})
    assert name in str(info.value), str(info.value)
    _assert_untouched(C, C0)


# ---------------------------------------------------------------------------------- matmul


def test_matmul_inner_dimension_mismatch():
    with pytest.raises(ShapeError) as info:
        blacc.matmul(_ones((7, 11)), _ones((13, 5)))
    message = str(info.value)
    assert mentions_shape(message, (7, 11)) and mentions_shape(message, (13, 5)), message


def test_matmul_out_wrong_shape():
    out, out0 = _c((5, 7))
    with pytest.raises(ShapeError):
        blacc.matmul(_ones((7, 3)), _ones((3, 5)), out=out)
    _assert_untouched(out, out0)


def test_matmul_mixed_dtypes():
    out, out0 = _c((7, 5), np.float32)
    with pytest.raises(DTypeError):
        blacc.matmul(_ones((7, 3), np.float32), _ones((3, 5), np.float64), out=out)
    _assert_untouched(out, out0)


def test_matmul_out_aliases_input():
    A = np.arange(36.0).reshape(6, 6)
    A0 = A.copy()
    with pytest.raises(AliasingError):
        blacc.matmul(A, _ones((6, 6)), out=A)
    _assert_untouched(A, A0)


def test_matmul_read_only_out():
    out, out0 = _c((7, 5))
    out.flags.writeable = False
    with pytest.raises(ArgumentError):
        blacc.matmul(_ones((7, 3)), _ones((3, 5)), out=out)
    _assert_untouched(out, out0)
