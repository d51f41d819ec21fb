"""Layers 3 and 4: interpret the kernel IR straight from ``apply``, after ``lower_packs`` and
after the whole pipeline (AVX2, and GENERIC for scalar tiles) with ``blacc.ir.interp.run``,
and compare with a float64 NumPy reference.

Operands are passed as flat 1-D buffers with element strides, so layouts (row-major,
column-major, leading dimensions, non-unit strides in both axes) are just stride choices
over a buffer. Padding in A and B holds NaN (a read of it poisons the result); padding in C
holds a finite sentinel (a write into it is seen). The IR interpreter is pure Python: shapes
stay tiny.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blacc.errors import ScheduleError
from blacc.ir import kernel as k
from blacc.ir import printer
from blacc.ir.interp import run
from blacc.ir.structured import matmul
from blacc.ir.walk import rewrite
from blacc.strategy.gemm import blis, no_packing
from blacc.target.isa import AVX2, GENERIC
from blacc.transform.apply import apply
from blacc.transform.lower_pack import lower_packs
from blacc.transform.lower_tile import lower_tiles
from blacc.transform.pipeline import lower
from blacc.transform.schedule import Pack, Tile, UnrollJam, Vectorize
from conftest import _assert_gemm_close

C_PAD = -999.0
NP = {"f32": np.float32, "f64": np.float64}

# name: (dtype, schedule, known strides, ISAs the fully lowered module is built for)
CASES = {
    "blis-f32-v8": ("f32", blis(12, 8, 32, 6, 16, 4, 8), {"C_s1": 1}, (AVX2,)),
    "blis-f64-v4": ("f64", blis(12, 8, 32, 6, 8, 4, 4), {"C_s1": 1}, (AVX2,)),
    "blis-f64-scalar": ("f64", blis(12, 8, 32, 4, 4, 4), {"C_s1": 1}, (AVX2, GENERIC)),
    # mc, nc not multiples of mr, nr; kc not a multiple of ku; no stride fixed at all
    "blis-f32-scalar-odd": ("f32", blis(10, 5, 20, 4, 4, 3), {}, (AVX2, GENERIC)),
    "no_packing-f32-v8": ("f32", no_packing(6, 16, 4, 8), {"C_s1": 1, "B_s1": 1}, (AVX2,)),
    "no_packing-f64-v4": ("f64", no_packing(6, 8, 4, 4), {"C_s1": 1, "B_s1": 1}, (AVX2,)),
    "no_packing-f64-scalar": ("f64", no_packing(4, 4, 4), {}, (AVX2, GENERIC)),
    "no_packing-f32-scalar": ("f32", no_packing(3, 5, 2), {"C_s1": 1}, (GENERIC,)),
    # one operand packed: the micro-kernel is not padded and takes its guarded edge path
    "pack-B-only-f32-v8": ("f32", (Tile((("k", 8),)), Pack("B", 16), Tile((("i", 6), ("j", 16))),
                                   UnrollJam("k", 2), Vectorize("j", 8)), {"C_s1": 1}, (AVX2,)),
    "pack-A-only-f64-v4": ("f64", (Tile((("k", 8),)), Pack("A", 6), Tile((("i", 6), ("j", 8))),
                                   Vectorize("j", 4)), {"C_s1": 1, "B_s1": 1}, (AVX2,)),
    # both packed with no k blocking (the pack spans all of k)
    "pack-no-kc-f64-v4": ("f64", (Tile((("j", 16),)), Pack("B", 8), Pack("A", 6),
                                  Tile((("i", 6), ("j", 8))), UnrollJam("k", 3),
                                  Vectorize("j", 4)), {"C_s1": 1}, (AVX2,)),
    # the register tile is the last two loops even when i was tiled before
    "i-blocked-f64-scalar": ("f64", (Tile((("i", 12), ("j", 8))), Tile((("i", 4),))), {},
                             (GENERIC,)),
    # tiles of dot products (Vectorize along k): rows of A and columns of B contiguous
    "dot-f32-v8": ("f32", (Tile((("i", 8), ("j", 1))), UnrollJam("k", 2), Vectorize("k", 8)),
                   {"A_s1": 1, "B_s0": 1}, (AVX2,)),
    "dot-f64-v4": ("f64", (Tile((("i", 3), ("j", 2))), UnrollJam("k", 3), Vectorize("k", 4)),
                   {"A_s1": 1, "B_s0": 1}, (AVX2,)),
}
SHAPES = [(1, 1, 1), (5, 3, 7), (13, 37, 19), (6, 16, 9), (12, 33, 17)]
SCALARS = [(1.0, 0.0), (-0.5, 1.0), (2.5, -0.5), (1.0, 2.5), (0.0, -0.5), (-0.5, 0.0)]


def _levels(case: str) -> list[str]:
    return ["schedule", "lower-packs", *(f"lowered-{isa.name}" for isa in CASES[case][3])]


@functools.cache
def _module(case: str, level: str, trans_a: bool = False, trans_b: bool = False) -> k.Module:
    dtype, schedule, strides, _ = CASES[case]
    module = apply(matmul(dtype, trans_a=trans_a, trans_b=trans_b), schedule, name="gemm",
                   known_strides=strides)
    if level == "schedule":
        return module
    if level == "lower-packs":
        return lower_packs(module)
    isa = {"lowered-avx2": AVX2, "lowered-generic": GENERIC}[level]
    return lower(module, isa)[0]


# ----------------------------------------------------------------------------- operands


def _place(x: np.ndarray, layout: str, pad: float) -> tuple[np.ndarray, int, int, np.ndarray]:
    """Store the logical 2-D ``x`` in a flat buffer: (buffer, s0, s1, element indices)."""
    r, c = x.shape
    if layout == "C":  # row-major
        size, off, s0, s1 = r * c, 0, c, 1
    elif layout == "F":  # column-major
        size, off, s0, s1 = r * c, 0, 1, r
    elif layout == "ld":  # row-major with leading dimension c + 3, starting at element 2
        size, off, s0, s1 = 2 + r * (c + 3), 2, c + 3, 1
    elif layout == "ldF":  # column-major with leading dimension r + 2
        size, off, s0, s1 = (r + 2) * c, 0, 1, r + 2
    elif layout == "strided":  # non-unit strides in both axes, like big[::2, ::3]
        size, off, s0, s1 = 1 + 2 * r * 3 * c, 1, 6 * c, 3
    else:
        raise ValueError(layout)
    buf = np.full(size, pad, dtype=x.dtype)
    idx = off + np.arange(r)[:, None] * s0 + np.arange(c)[None, :] * s1
    buf[idx] = x
    # A pointer argument is a view at the operand's first element.
    return buf[off:], s0, s1, idx - off


def _call(case, level, m, n, k_, *, alpha, beta, rng, trans_a=False, trans_b=False,
          layouts=None, c_nan=False, assert_close=None):
    """Run the case's module at ``level`` and check C against NumPy (and untouched padding).
    Default layouts: row-major, but B column-major where the case fixes B_s0 = 1."""
    if layouts is None:
        layouts = ("C", "F" if CASES[case][2].get("B_s0") == 1 else "C", "C")
    dtype = NP[CASES[case][0]]
    a = rng.uniform(-1, 1, size=(k_, m) if trans_a else (m, k_)).astype(dtype)
    b = rng.uniform(-1, 1, size=(n, k_) if trans_b else (k_, n)).astype(dtype)
    c = np.full((m, n), np.nan, dtype) if c_nan else rng.uniform(-1, 1, (m, n)).astype(dtype)
    A, A_s0, A_s1, _ = _place(a, layouts[0], np.nan)
    B, B_s0, B_s1, _ = _place(b, layouts[1], np.nan)
    C, C_s0, C_s1, c_idx = _place(c, layouts[2], C_PAD)
    A0, B0, C0 = A.copy(), B.copy(), C.copy()
    run(_module(case, level, trans_a, trans_b),
        dict(m=m, n=n, k=k_, alpha=alpha, A=A, A_s0=A_s0, A_s1=A_s1, B=B, B_s0=B_s0, B_s1=B_s1,
             beta=beta, C=C, C_s0=C_s0, C_s1=C_s1))
    got = C[c_idx]
    context = f"{case} @ {level}, layouts {layouts}"
    assert_close(got, a, b, c, alpha, beta, trans_a, trans_b, context=context)
    # Inputs are read-only; nothing outside C's view is written.
    np.testing.assert_array_equal(A, A0)
    np.testing.assert_array_equal(B, B0)
    outside = np.ones(C.shape, bool)
    outside[c_idx] = False
    np.testing.assert_array_equal(C[outside], C0[outside], err_msg=f"{context}: wrote padding")
    return got


# ----------------------------------------------------------------------------- every level


def _level_params():
    for case in CASES:
        for level in _levels(case):
            yield pytest.param(case, level, id=f"{case}-{level}")


@pytest.mark.parametrize("case, level", list(_level_params()))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_level_matches_numpy(case, level, shape, rng, assert_gemm_close):
    n_shape = SHAPES.index(shape)
    for alpha, beta in (SCALARS[n_shape % len(SCALARS)], SCALARS[(n_shape + 3) % len(SCALARS)]):
        _call(case, level, *shape, alpha=alpha, beta=beta, rng=rng,
              assert_close=assert_gemm_close)


@pytest.mark.parametrize("case, level", list(_level_params()))
@pytest.mark.parametrize("alpha", [1.0, -0.5, 2.5])
def test_beta_zero_never_reads_c(case, level, alpha, rng, assert_gemm_close):
    for shape in [(5, 3, 7), (7, 17, 10)]:  # k=10 > kc=8: a second k block reads C
        got = _call(case, level, *shape, alpha=alpha, beta=0.0, rng=rng, c_nan=True,
                    assert_close=assert_gemm_close)
        assert np.isfinite(got).all()


# ----------------------------------------------------------------------------- layouts


def _layout_params():
    combos = [("C", "C", "C"), ("F", "F", "ld"), ("ld", "strided", "C"), ("strided", "ldF", "ld"),
              ("ldF", "ld", "ld")]
    for case, (_, _, strides, isas) in CASES.items():
        level = f"lowered-{isas[0].name}"
        if strides.get("B_s0") == 1:  # rows of A, columns of B contiguous; no transposes
            for lay in [("C", "F", "C"), ("ld", "ldF", "ld"), ("C", "ldF", "strided"),
                        ("ld", "F", "F")]:
                yield pytest.param(case, level, False, False, lay,
                                   id=f"{case}-NN-{'/'.join(lay)}")
            continue
        for (ta, tb), lay in itertools.product(itertools.product((False, True), repeat=2), combos):
            if strides.get("C_s1") == 1 and lay[2] not in ("C", "ld"):
                continue
            if strides.get("B_s1") == 1 and (tb or lay[1] not in ("C", "ld")):
                continue
            trans = f"{'T' if ta else 'N'}{'T' if tb else 'N'}"
            yield pytest.param(case, level, ta, tb, lay, id=f"{case}-{trans}-{'/'.join(lay)}")


@pytest.mark.parametrize("case, level, trans_a, trans_b, layouts", list(_layout_params()))
def test_layouts_and_transposes(case, level, trans_a, trans_b, layouts, rng, assert_gemm_close):
    _call(case, level, 7, 17, 10, alpha=1.5, beta=-0.5, rng=rng, trans_a=trans_a,
          trans_b=trans_b, layouts=layouts, assert_close=assert_gemm_close)


@pytest.mark.parametrize("case", ["blis-f64-v4", "blis-f32-scalar-odd", "no_packing-f64-scalar",
                                  "no_packing-f32-v8"])
def test_strides_reinterpret_one_buffer(case, rng):
    """The same flat A buffer read with column-major strides by the plain contraction, and
    with row-major strides by the trans_a contraction, is the same computation: bitwise equal."""
    dtype, _, _, isas = CASES[case]
    m, n, k_ = 7, 17, 10
    flat_a = rng.uniform(-1, 1, m * k_).astype(NP[dtype])
    b = rng.uniform(-1, 1, (k_, n)).astype(NP[dtype])
    c = rng.uniform(-1, 1, (m, n)).astype(NP[dtype])
    level = f"lowered-{isas[0].name}"
    results = []
    for trans_a, A_s0, A_s1 in [(False, 1, m), (True, m, 1)]:
        C = c.ravel().copy()
        run(_module(case, level, trans_a, False),
            dict(m=m, n=n, k=k_, alpha=1.5, A=flat_a.copy(), A_s0=A_s0, A_s1=A_s1, B=b.ravel(),
                 B_s0=n, B_s1=1, beta=0.5, C=C, C_s0=n, C_s1=1))
        results.append(C.reshape(m, n))
    np.testing.assert_array_equal(results[0], results[1])
    a = flat_a.reshape(k_, m).T.astype(np.float64)
    want = 1.5 * a @ b + 0.5 * c
    np.testing.assert_allclose(results[0], want, rtol=0, atol=40 * np.finfo(NP[dtype]).eps)


# ----------------------------------------------------------------------------- interpreter checks


def _args(dtype, m, n, k_, b_rows_unit=False):
    """Row-major operands (B column-major with ``b_rows_unit``), all ones."""
    t = NP[dtype]
    b_s0, b_s1 = (1, k_) if b_rows_unit else (n, 1)
    return dict(m=m, n=n, k=k_, alpha=1.0, A=np.ones(m * k_, t), A_s0=k_, A_s1=1,
                B=np.ones(k_ * n, t), B_s0=b_s0, B_s1=b_s1, beta=1.0, C=np.zeros(m * n, t),
                C_s0=n, C_s1=1)


@pytest.mark.parametrize("case, level", list(_level_params()))
@pytest.mark.parametrize("short", ["A", "B", "C"])
def test_out_of_bounds_raises_index_error(case, level, short):
    dtype = CASES[case][0]
    m, n, k_ = 5, 3, 7
    args = _args(dtype, m, n, k_, b_rows_unit=CASES[case][2].get("B_s0") == 1)
    args[short] = args[short][:-1]  # one element too few: the last one is read or written
    with pytest.raises(IndexError):
        run(_module(case, level), args)


@pytest.mark.parametrize("case", ["blis-f64-v4", "no_packing-f64-scalar"])
def test_too_large_stride_raises_index_error(case):
    args = _args("f64", 5, 3, 7)
    args["A_s0"] = 8  # row 4 ends past the buffer
    with pytest.raises(IndexError):
        run(_module(case, "schedule"), args)
    with pytest.raises(IndexError):
        run(_module(case, _levels(case)[-1]), args)


def test_interpreter_argument_checks():
    module = _module("no_packing-f64-scalar", "schedule")
    args = _args("f64", 2, 2, 2)
    del args["beta"]
    with pytest.raises(TypeError, match="beta"):
        run(module, args)
    args = _args("f64", 2, 2, 2)
    args["A"] = args["A"].astype(np.float32)
    with pytest.raises(TypeError, match="'A'"):
        run(module, args)
    args = _args("f64", 2, 2, 2)
    args["B"] = args["B"].reshape(2, 2)
    with pytest.raises(TypeError, match="'B'"):
        run(module, args)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 14), n=st.integers(1, 18), k_=st.integers(1, 11),
       alpha=st.sampled_from([1.0, -0.5, 2.5]), beta=st.sampled_from([0.0, 1.0, -0.5]),
       case=st.sampled_from(["blis-f64-scalar", "no_packing-f32-v8", "pack-B-only-f32-v8",
                             "dot-f32-v8", "dot-f64-v4"]),
       seed=st.integers(0, 2**16))
def test_lowered_property(m, n, k_, alpha, beta, case, seed):
    rng = np.random.default_rng(seed)
    _call(case, _levels(case)[-1], m, n, k_, alpha=alpha, beta=beta, rng=rng,
          c_nan=beta == 0, assert_close=_assert_gemm_close)


# ----------------------------------------------------------------------------- IR structure


def _node_types(module: k.Module) -> set[str]:
    seen: set[str] = set()

    def visit(x):
        seen.add(type(x).__name__)
        return x

    for f in module.functions:
        rewrite(f.body, visit)
    return seen


TILE_OPS = {"TileZero", "TileMMA", "TileStore"}


@pytest.mark.parametrize("case", list(CASES))
def test_levels_contain_what_each_pass_leaves(case):
    _, schedule, _, isas = CASES[case]
    packs = [t.operand for t in schedule if isinstance(t, Pack)]
    scheduled = _module(case, "schedule")
    types = _node_types(scheduled)
    assert TILE_OPS <= types
    assert ("PackSlivers" in types) == bool(packs)
    assert ("Alloc" in types) == bool(packs)
    (mma,) = [s for s in scheduled.function("gemm_micro").body if isinstance(s, k.TileMMA)]
    assert mma.padded == (len(packs) == 2)
    text = printer.module(scheduled)
    assert "tile_mma(" in text and "tile_store(" in text
    assert ("pack_slivers(" in text) == bool(packs)

    packed = _module(case, "lower-packs")
    assert "PackSlivers" not in _node_types(packed)
    assert TILE_OPS <= _node_types(packed)
    names = {f.name for f in packed.functions}
    for op in packs:
        width = next(t.sliver for t in schedule if isinstance(t, Pack) and t.operand == op)
        assert f"blacc_pack_{CASES[case][0]}_w{width}" in names

    for isa in isas:
        final, levels = lower(scheduled, isa)
        assert [name for name, _ in levels] == ["lower-packs", "lower-tiles"]
        assert levels[-1][1] == final
        assert levels[0][1] == packed
        final_types = _node_types(final)
        assert not (TILE_OPS | {"PackSlivers"}) & final_types
        assert "Fma" in final_types
        lanes = next((t.lanes for t in schedule if isinstance(t, Vectorize)), 1)
        vec_loads = {e.lanes for f in final.functions for e in _loads(f)}
        assert max(vec_loads) == lanes
        assert f"load{lanes}(" in printer.module(final) if lanes > 1 else True


def _loads(f: k.Function) -> list[k.Load]:
    out: list[k.Load] = []

    def visit(x):
        if isinstance(x, k.Load):
            out.append(x)
        return x

    rewrite(f.body, visit)
    return out


def test_lower_tiles_rejects_mismatched_vectors():
    scheduled = _module("blis-f32-v8", "schedule")
    with pytest.raises(ScheduleError, match="generic"):
        lower(scheduled, GENERIC)
    f64_8 = apply(matmul("f64"), blis(12, 8, 32, 6, 16, 4, 8), known_strides={"C_s1": 1})
    with pytest.raises(ScheduleError, match="lane"):
        lower(f64_8, AVX2)


def test_vectorize_needs_unit_strides():
    # C's column stride unknown: the vector stores cannot be built.
    with pytest.raises(ScheduleError, match="unit stride"):
        lower_tiles(apply(matmul("f32"), blis(12, 8, 32, 6, 16, 4, 8)), AVX2)
    # no_packing reads B directly: its column stride must be known to be 1.
    with pytest.raises(ScheduleError, match="unit stride"):
        lower_tiles(apply(matmul("f32"), no_packing(6, 16, 4, 8), known_strides={"C_s1": 1}),
                    AVX2)
    # ... and a transposed B has unit stride along k, not j.
    with pytest.raises(ScheduleError, match="unit stride"):
        lower_tiles(apply(matmul("f32", trans_b=True), no_packing(6, 16, 4, 8),
                          known_strides={"C_s1": 1, "B_s1": 1}), AVX2)


def test_scalar_lowering_is_the_same_for_both_isas():
    """Without Vectorize the ISA table is not consulted: AVX2 and GENERIC lower alike."""
    scheduled = _module("blis-f64-scalar", "schedule")
    assert lower(scheduled, AVX2)[0] == lower(scheduled, GENERIC)[0]


# ----------------------------------------------------------------------------- balanced k blocks


def _b_panels(schedule, k_: int, monkeypatch, m: int = 3, n: int = 5
              ) -> list[tuple[int, int]]:
    """(columns, k length) of every packed B panel when ``schedule`` runs with this m, n
    and k; the product is checked against NumPy."""
    from blacc.ir import interp

    seen: list[tuple[int, int]] = []
    real = interp._pack

    def spy(s, env):
        if s.dst == "Bp":
            seen.append((int(interp.evaluate(s.rows, env)), int(interp.evaluate(s.cols, env))))
        real(s, env)

    monkeypatch.setattr(interp, "_pack", spy)
    module = apply(matmul("f64"), schedule, name="gemm", known_strides={"C_s1": 1})
    rng = np.random.default_rng(k_)
    a, b = rng.uniform(-1, 1, (m, k_)), rng.uniform(-1, 1, (k_, n))
    c = np.zeros(m * n)
    run(module, dict(m=m, n=n, k=k_, alpha=1.0, A=a.ravel(), A_s0=k_, A_s1=1, B=b.ravel(),
                     B_s0=n, B_s1=1, beta=0.0, C=c, C_s0=n, C_s1=1))
    np.testing.assert_allclose(c.reshape(m, n), a @ b, rtol=1e-12, atol=1e-12)
    return seen


def _k_blocks(schedule, k_: int, monkeypatch) -> list[int]:
    """The k length of every packed B panel when ``schedule`` runs with this k."""
    return [kb for _, kb in _b_panels(schedule, k_, monkeypatch)]


@pytest.mark.parametrize("k_, blocks", [
    (1, [1]), (8, [8]), (9, [5, 4]), (17, [6, 6, 5]), (24, [8, 8, 8]), (25, [7, 7, 7, 4]),
])
def test_balanced_k_blocks_are_even_and_no_longer_than_kc(k_, blocks, monkeypatch):
    assert _k_blocks(blis(6, 8, 16, 6, 8, 4, 4), k_, monkeypatch) == blocks


def test_unbalanced_k_tile_leaves_the_remainder_last(monkeypatch):
    schedule = (Tile((("k", 8),)), Pack("B", 8), Pack("A", 6), Tile((("j", 8), ("i", 6))),
                Vectorize("j", 4))
    assert _k_blocks(schedule, 17, monkeypatch) == [8, 8, 1]


def test_balanced_k_with_k_zero_runs_no_block(monkeypatch):
    assert _k_blocks(blis(6, 8, 16, 6, 8, 4, 4), 0, monkeypatch) == []


@pytest.mark.parametrize("n, panels", [
    (1, [1]), (40, [40]), (48, [48]), (70, [48, 22]), (96, [48, 48]), (100, [48, 48, 4]),
])
@pytest.mark.parametrize("rows_outside", [False, True])
def test_balanced_b_panels_are_whole_slivers_and_no_wider_than_nc(n, panels, rows_outside,
                                                                   monkeypatch):
    """Panels of nc = 48 columns over slivers of 16: n = 70 runs 48 + 22 (not 35 + 35,
    which would cut a sliver), and either order of the register tiles gives the product."""
    schedule = blis(6, 8, 48, 6, 16, 4, 4, rows_outside=rows_outside)
    assert [cols for cols, _ in _b_panels(schedule, 5, monkeypatch, m=7, n=n)] == panels
