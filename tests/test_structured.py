"""Layer 2: the GEMM contraction (blacc.ir.structured) and its NumPy reference interpreter."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blacc.errors import ShapeError
from blacc.ir.structured import (
    PARALLEL,
    REDUCTION,
    Access,
    Contraction,
    Dim,
    extents_of,
    interpret,
    matmul,
)

TRANSPOSES = list(itertools.product((False, True), repeat=2))
SCALARS = (0.0, 1.0, -0.5, 2.5)
# Small shapes that are not register-tile multiples: 1, primes, and a few composites.
SHAPES = [(1, 1, 1), (1, 7, 1), (5, 3, 7), (2, 13, 11), (13, 37, 19), (6, 16, 9), (12, 33, 17)]


def _stored(rng, m, n, k, dtype, trans_a, trans_b):
    """A and B as stored (before op()), and a C."""
    a = rng.uniform(-1, 1, size=(k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, size=(n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.uniform(-1, 1, size=(m, n)).astype(dtype)
    return a, b, c


# ----------------------------------------------------------------------------- the contraction


@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_matmul_structure(dtype, trans_a, trans_b):
    op = matmul(dtype, trans_a=trans_a, trans_b=trans_b)
    assert [d.name for d in op.domain] == ["i", "j", "k"]
    assert [d.extent for d in op.domain] == ["m", "n", "k"]
    assert op.parallel_dims == ("i", "j")
    assert op.reduction_dims == ("k",)
    assert op.dim("k").kind == REDUCTION and op.dim("i").kind == PARALLEL
    assert op.access("A").dims == (("k", "i") if trans_a else ("i", "k"))
    assert op.access("B").dims == (("j", "k") if trans_b else ("k", "j"))
    assert op.access("C").dims == ("i", "j")
    assert op.output == Access("C", ("i", "j"))
    assert op.dtype == dtype
    a = "ki" if trans_a else "ik"
    b = "jk" if trans_b else "kj"
    assert op.einsum_spec() == f"{a},{b}->ij"
    with pytest.raises(KeyError):
        op.dim("q")
    with pytest.raises(KeyError):
        op.access("D")


@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_matmul_str_shows_domain_maps_iterators(trans_a, trans_b):
    text = str(matmul("f32", trans_a=trans_a, trans_b=trans_b))
    a = "A[k,i]" if trans_a else "A[i,k]"
    b = "B[j,k]" if trans_b else "B[k,j]"
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0] == f"contract gemm: C[i,j] = alpha * sum_k {a} * {b} + beta * C[i,j]"
    assert "domain  i<m, j<n, k<k" in lines[1]
    assert "iterators (parallel, parallel, reduction)" in lines[1]
    a_map = "A:(k,i)" if trans_a else "A:(i,k)"
    b_map = "B:(j,k)" if trans_b else "B:(k,j)"
    assert f"maps    {a_map}  {b_map}  C:(i,j)" in lines[2]
    assert lines[2].endswith("dtype f32")


def test_matmul_is_a_value():
    assert matmul("f64") == matmul("f64")
    assert hash(matmul("f64", trans_a=True)) == hash(matmul("f64", trans_a=True))
    assert matmul("f64") != matmul("f64", trans_b=True)
    assert matmul("f64") != matmul("f32")


# ----------------------------------------------------------------------------- interpret


@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_interpret_matches_numpy(dtype, shape, trans_a, trans_b, rng, assert_gemm_close):
    m, n, k = shape
    a, b, c = _stored(rng, m, n, k, dtype, trans_a, trans_b)
    op = matmul("f32" if dtype == np.float32 else "f64", trans_a=trans_a, trans_b=trans_b)
    for alpha, beta in itertools.product(SCALARS, SCALARS):
        c0 = c.copy()
        got = interpret(op, {"A": a, "B": b, "C": c}, alpha=alpha, beta=beta)
        assert got.shape == (m, n)
        assert got.dtype == np.float64  # the reference computes in float64
        np.testing.assert_array_equal(c, c0)  # the output operand is not modified
        # Computed in float64 from the same inputs: tight agreement.
        assert_gemm_close(got.astype(dtype), a, b, c0, alpha, beta, trans_a, trans_b,
                          context=f"alpha={alpha}, beta={beta}")
        a64, b64, c64 = (np.asarray(x, np.float64) for x in (a, b, c))
        want = alpha * ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64)) + beta * c64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_interpret_default_scalars_and_beta_zero_ignores_nan(rng):
    a, b, _ = _stored(rng, 5, 3, 7, np.float64, False, False)
    c = np.full((5, 3), np.nan)
    op = matmul("f64")
    np.testing.assert_allclose(interpret(op, {"A": a, "B": b, "C": c}), a @ b, rtol=1e-14)
    got = interpret(op, {"A": a, "B": b, "C": c}, alpha=2.5, beta=0.0)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, 2.5 * (a @ b), rtol=1e-14)
    # beta != 0 does read C: NaN propagates.
    assert np.isnan(interpret(op, {"A": a, "B": b, "C": c}, beta=1.0)).all()


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 9), k=st.integers(1, 9),
       trans_a=st.booleans(), trans_b=st.booleans(),
       alpha=st.sampled_from(SCALARS), beta=st.sampled_from(SCALARS), seed=st.integers(0, 2**16))
def test_interpret_property(m, n, k, trans_a, trans_b, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    a, b, c = _stored(rng, m, n, k, np.float64, trans_a, trans_b)
    got = interpret(matmul("f64", trans_a=trans_a, trans_b=trans_b), {"A": a, "B": b, "C": c},
                    alpha=alpha, beta=beta)
    want = alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + beta * c
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------- extents_of


@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
def test_extents_of_binds_every_dim(trans_a, trans_b):
    m, n, k = 5, 3, 7
    op = matmul("f64", trans_a=trans_a, trans_b=trans_b)
    arrays = {"A": np.zeros((k, m) if trans_a else (m, k)),
              "B": np.zeros((n, k) if trans_b else (k, n)), "C": np.zeros((m, n))}
    assert extents_of(op, arrays) == {"i": m, "j": n, "k": k}


@pytest.mark.parametrize("trans_a, trans_b", TRANSPOSES)
@pytest.mark.parametrize("which", ["A", "B", "C"])
def test_extents_of_disagreeing_shapes(which, trans_a, trans_b):
    m, n, k = 5, 3, 7
    op = matmul("f64", trans_a=trans_a, trans_b=trans_b)
    arrays = {"A": np.zeros((k, m) if trans_a else (m, k)),
              "B": np.zeros((n, k) if trans_b else (k, n)), "C": np.zeros((m, n))}
    bad = arrays[which].shape[::-1]  # 5, 3, 7 are distinct: swapping axes disagrees
    arrays[which] = np.zeros(bad)
    with pytest.raises(ShapeError, match="dimension"):
        extents_of(op, arrays)
    with pytest.raises(ShapeError):
        interpret(op, arrays)


@pytest.mark.parametrize("shape", [(5,), (5, 7, 1), ()])
def test_extents_of_wrong_rank(shape):
    arrays = {"A": np.zeros(shape), "B": np.zeros((7, 3)), "C": np.zeros((5, 3))}
    with pytest.raises(ShapeError, match="A must be 2-D"):
        extents_of(matmul("f64"), arrays)


def test_shape_error_is_a_value_error():
    arrays = {"A": np.zeros((5, 7)), "B": np.zeros((6, 3)), "C": np.zeros((5, 3))}
    with pytest.raises(ValueError, match="'k'"):
        extents_of(matmul("f64"), arrays)


# ----------------------------------------------------------------------------- validation

_DOMAIN = (Dim("i", "m"), Dim("j", "n"), Dim("k", "k", REDUCTION))


def test_contraction_unknown_dims():
    with pytest.raises(ValueError, match=r"A is indexed by unknown dims \['q'\]"):
        Contraction("bad", _DOMAIN, (Access("A", ("i", "q")), Access("B", ("k", "j"))),
                    Access("C", ("i", "j")), "f32")
    with pytest.raises(ValueError, match=r"C is indexed by unknown dims \['x', 'y'\]"):
        Contraction("bad", _DOMAIN, (Access("A", ("i", "k")), Access("B", ("k", "j"))),
                    Access("C", ("y", "x")), "f32")


def test_contraction_reduction_dim_in_output():
    with pytest.raises(ValueError, match="reduction"):
        Contraction("bad", _DOMAIN, (Access("A", ("i", "k")), Access("B", ("k", "j"))),
                    Access("C", ("i", "k")), "f64")


@pytest.mark.parametrize("dtype", ["f16", "i64", "float32", "", None])
def test_contraction_bad_dtype(dtype):
    with pytest.raises(ValueError, match="dtype"):
        Contraction("bad", _DOMAIN, (Access("A", ("i", "k")), Access("B", ("k", "j"))),
                    Access("C", ("i", "j")), dtype)
    with pytest.raises(ValueError, match="dtype"):
        matmul(dtype)


def test_custom_contraction_interprets():
    """A valid non-GEMM contraction (a batched-free matrix-vector product) interprets too."""
    op = Contraction("gemv", (Dim("i", 4), Dim("k", 3, REDUCTION)),
                     (Access("A", ("i", "k")), Access("x", ("k",))), Access("y", ("i",)), "f64")
    a, x, y = np.arange(12.0).reshape(4, 3), np.array([1.0, -2.0, 0.5]), np.ones(4)
    assert extents_of(op, {"A": a, "x": x, "y": y}) == {"i": 4, "k": 3}
    np.testing.assert_allclose(interpret(op, {"A": a, "x": x, "y": y}, alpha=2.0, beta=3.0),
                               2.0 * a @ x + 3.0)
    assert "sum_k A[i,k] * x[k]" in str(op)
