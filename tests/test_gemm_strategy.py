"""How blacc picks a GEMM plan per shape (strategy.gemm): the register tile that fits
m and n, and when register tiles run over the operands in place instead of packing.
Correctness of every plan is tested in test_gemm.py and test_guard_pages.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blacc.strategy.gemm import (
    FEW_ROWS,
    IN_PLACE_ROW_TOLERANCE,
    LONG_K,
    PADDING_TOLERANCE,
    ROW_KC,
    SKINNY_ROWS,
    SMALL_WORK,
    choose,
    register_tile,
)
from blacc.target.isa import AVX2, AVX512, GENERIC
from blacc.target.machine import DEFAULT_CACHES, Machine
from blacc.transform.schedule import NarrowEdges, Tile, Vectorize

#: L2 256 KiB: operands of up to 128 KiB count as fitting in half of it
MACHINE = Machine("test", "x86_64", caches=DEFAULT_CACHES)


def _padded(m: int, n: int, mr: int, nr: int) -> int:
    return -(-m // mr) * mr * -(-n // nr) * nr


@pytest.mark.parametrize(("dtype", "lanes"), [("f32", 8), ("f64", 4)])
def test_default_tile_is_six_rows_by_two_vectors(dtype, lanes):
    assert register_tile(dtype, AVX2) == (6, 2 * lanes, lanes)
    assert register_tile(dtype, AVX2, 1000, 1000) == (6, 2 * lanes, lanes)
    assert register_tile(dtype, GENERIC, 1000, 8) == (4, 4, 1)


@pytest.mark.parametrize(("m", "n", "tile"), [
    (1000, 8, (8, 8)),    # 6 x 16 would compute twice the columns
    (8, 1000, (4, 24)),   # two 4-row tiles, not 6 + 2 rows
    (101, 24, (4, 24)),
    (40, 40, (8, 8)),     # 6 x 16: 42 x 48 for 40 x 40
    (32, 32, (6, 16)),    # 36 x 32 pads 12.5%: within the tolerance of the widest tile
    (48, 48, (6, 16)),
    (1, 1, (8, 8)),
    (1, 1000, (1, 56)),   # a row vector times a matrix: one row of 7 vectors
    (3, 1000, (1, 56)),
    (4, 1000, (4, 24)),
])
def test_tile_fits_the_shape(m, n, tile):
    assert register_tile("f32", AVX2, m, n)[:2] == tile


@given(st.integers(1, 400), st.integers(1, 400), st.sampled_from(["f32", "f64"]))
def test_tile_is_the_widest_within_the_padding_tolerance(m, n, dtype):
    """The chosen tile pads C by at most PADDING_TOLERANCE over the least-padding tile of
    the four, and no tile earlier in the preference order (6x2, 4x3, 8x1, 1x7 vectors)
    does."""
    mr, nr, lanes = register_tile(dtype, AVX2, m, n)
    # a C exactly half a vector wide takes half-vectors (test_c_as_wide_as_a_narrow_...)
    half = AVX2.lanes(dtype) // 2
    assert lanes == (half if n == half else AVX2.lanes(dtype))
    order = [(6, 2 * lanes), (4, 3 * lanes), (8, lanes), (1, 7 * lanes)]
    least = min(_padded(m, n, *t) for t in order)
    assert _padded(m, n, mr, nr) <= (1 + PADDING_TOLERANCE) * least
    for tile in order[:order.index((mr, nr))]:
        assert _padded(m, n, *tile) > (1 + PADDING_TOLERANCE) * least


def _plan(m, n, k, dtype="f32", b_unit_cols=True):
    return choose(m, n, k, dtype, machine=MACHINE, isa=AVX2, b_unit_cols=b_unit_cols)


@pytest.mark.parametrize(("shape", "dtype", "expected"), [
    # narrow C, B in half of L2: rows of tiles outside
    ((1000, 8, 1000), "f32", "no_packing(mr=8, nr=8, ku=4, j_outer=0)"),
    ((1000, 32, 1000), "f32", "no_packing(mr=6, nr=16, ku=4, j_outer=0)"),
    ((1000, 16, 1000), "f64", "no_packing(mr=6, nr=8, ku=4, j_outer=0)"),
    # few rows of C, long k, A in half of L2, B not: columns of tiles outside
    ((8, 1000, 1000), "f32", "no_packing(mr=4, nr=24, ku=4, j_outer=1)"),
    ((SKINNY_ROWS, 1000, 500), "f32", "no_packing(mr=6, nr=16, ku=4, j_outer=1)"),
    # at most FEW_ROWS rows: in place whatever k and B
    ((1, 1000, 1000), "f32", "no_packing(mr=1, nr=56, ku=4, j_outer=1, kc=32)"),
    ((4, 1000, 64), "f64", "no_packing(mr=4, nr=12, ku=4, j_outer=1)"),
    ((FEW_ROWS, 1000, 64), "f32", "no_packing(mr=6, nr=16, ku=4, j_outer=1)"),
    # small products are never packed
    ((48, 48, 48), "f32", "no_packing(mr=6, nr=16, ku=4, j_outer=0)"),
])
def test_skinny_shapes_run_in_place(shape, dtype, expected):
    assert _plan(*shape, dtype).describe() == expected


@pytest.mark.parametrize(("shape", "dtype"), [
    ((1000, 1000, 1000), "f32"), ((49, 49, 49), "f32"),
    ((1000, 33, 1000), "f32"),          # wider than two tiles
    ((1000, 17, 1000), "f64"),
    ((1000, 32, 1100), "f32"),          # B over half of L2
    ((SKINNY_ROWS + 1, 1000, 1000), "f32"),
    ((FEW_ROWS + 1, 1000, LONG_K - 1), "f32"),  # more than a few rows, short k
    ((32, 1000, 1100), "f32"),          # A over half of L2
    ((24, 64, 400), "f32"),             # B fits in half of L2: packing it is cheap
])
def test_other_shapes_are_packed(shape, dtype):
    assert _plan(*shape, dtype).strategy == "blis"


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_matrix_times_vector_is_a_tile_of_dot_products(dtype):
    """n = 1 with rows of A and the vector contiguous: dot products along k; otherwise
    (A read down its columns, a strided vector, or no vectors) the tiles of C."""
    def plan(a_unit, b_rows, isa=AVX2):
        return choose(1000, 1, 1000, dtype, machine=MACHINE, isa=isa, b_unit_cols=True,
                      a_unit_cols=a_unit, b_unit_rows=b_rows)

    assert plan(True, True).describe() == "dot_tiles(mr=8, nr=1, ku=2)"
    assert plan(True, True).known_strides == (("A_s1", 1), ("B_s0", 1))
    for a_unit, b_rows in [(False, True), (True, False)]:
        assert plan(a_unit, b_rows).strategy == "no_packing"
    assert plan(True, True, GENERIC).strategy == "no_packing"
    assert choose(1000, 2, 1000, dtype, machine=MACHINE, isa=AVX2, b_unit_cols=True,
                  a_unit_cols=True, b_unit_rows=True).strategy == "no_packing"


def test_in_place_needs_unit_stride_rows_of_b():
    """The tiles load rows of B as vectors: a B read across its rows is packed, even where
    the shape alone would run in place (or the product is small)."""
    for shape in [(1000, 8, 1000), (8, 1000, 1000), (20, 20, 20)]:
        assert _plan(*shape, b_unit_cols=False).strategy == "blis"
    assert 20 * 20 * 20 <= SMALL_WORK


@pytest.mark.parametrize(("shape", "dtype", "expected"), [
    # rows of tiles outside, C at least one wide tile wide: 9 x 3 vectors where its rows
    # fit m within IN_PLACE_ROW_TOLERANCE of the best, else 6 x 4; narrow edge tiles
    ((80, 80, 80), "f32", "no_packing(mr=9, nr=48, ku=4, j_outer=0, edges=1)"),
    ((64, 64, 64), "f32", "no_packing(mr=6, nr=64, ku=4, j_outer=0, edges=1)"),  # 72 vs 66 rows
    ((30, 300, 100), "f64", "no_packing(mr=6, nr=32, ku=4, j_outer=0, edges=1)"),
    ((100, 24, 100), "f64", "no_packing(mr=9, nr=24, ku=4, j_outer=0, edges=1)"),  # 6 x 4 too wide
    ((224, 224, 224), "f32", "no_packing(mr=9, nr=48, ku=4, j_outer=0, edges=1)"),
    # columns of tiles outside: the widest first (16 rows: 18 either way)
    ((16, 1000, 1000), "f32", "no_packing(mr=6, nr=64, ku=4, j_outer=1, edges=1)"),
    ((8, 1000, 1000), "f32", "no_packing(mr=9, nr=48, ku=4, j_outer=1, edges=1)"),  # 12 vs 9
    # narrower than every wide tile, or one row: the fitted tiles
    ((1000, 8, 1000), "f32", "no_packing(mr=8, nr=8, ku=4, j_outer=0)"),  # 256-bit
    ((1, 1000, 1000), "f64", "no_packing(mr=1, nr=120, ku=4, j_outer=1, kc=32)"),
])
def test_avx512_runs_its_wide_tiles_in_place_up_to_its_work_limit(shape, dtype, expected):
    assert AVX512.in_place_work == 224**3 and AVX512.in_place_tiles == ((9, 3), (6, 4))
    plan = choose(*shape, dtype, machine=MACHINE, isa=AVX512, b_unit_cols=True)
    assert plan.describe() == expected
    assert (NarrowEdges("j") in plan.schedule) == ("edges=1" in expected)
    assert 0 < IN_PLACE_ROW_TOLERANCE < PADDING_TOLERANCE


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_past_its_work_limit_avx512_packs_and_avx2_keeps_its_rules(dtype):
    assert choose(225, 225, 225, dtype, machine=MACHINE, isa=AVX512,
                  b_unit_cols=True).strategy == "blis"
    assert choose(80, 80, 80, dtype, machine=MACHINE, isa=AVX2,
                  b_unit_cols=True).strategy == "blis"
    assert AVX2.in_place_work is None and AVX2.in_place_tiles is None


@pytest.mark.parametrize(("dtype", "widest"), [("f32", 64), ("f64", 32)])
def test_avx512_counts_c_narrow_next_to_its_widest_in_place_tile(dtype, widest):
    """Rows of tiles outside for C up to two of the widest in-place tiles wide with B in
    half of L2 (128 KiB here: k = 200), whatever m*n*k; one column more is packed."""
    def plan(n):
        return choose(1000, n, 200, dtype, machine=MACHINE, isa=AVX512, b_unit_cols=True)

    assert plan(2 * widest).describe().endswith("j_outer=0, edges=1)")
    assert plan(2 * widest + 1).strategy == "blis"
    assert 1000 * 2 * widest * 200 > AVX512.in_place_work


def test_row_tiles_read_b_in_blocks_of_whole_rows():
    """The row tile (1 x widest) with columns of tiles outside: the reduction in blocks of
    ROW_KC outside the tiles; other tiles run the whole reduction."""
    for m in (1, 3):
        plan = choose(m, 1000, 1000, "f32", machine=MACHINE, isa=AVX2, b_unit_cols=True)
        assert dict(plan.params)["mr"] == 1
        assert plan.schedule[0] == Tile((("k", ROW_KC),), balanced=True)
    four = choose(4, 1000, 1000, "f32", machine=MACHINE, isa=AVX2, b_unit_cols=True)
    assert dict(four.params)["mr"] == 4
    assert not any(isinstance(t, Tile) and t.sizes[0][0] == "k" for t in four.schedule)


def test_c_as_wide_as_a_narrow_vector_takes_tiles_of_those():
    """No masked lanes: 8 columns f32 on AVX-512 in 256-bit vectors, 4 f64 on AVX2 in
    128-bit ones; narrower C keeps the full vectors (masked)."""
    assert register_tile("f32", AVX512, 1000, 8) == (8, 8, 8)
    assert register_tile("f32", AVX512, 1000, 4) == (8, 16, 16)
    assert register_tile("f64", AVX512, 1000, 4) == (8, 4, 4)
    assert register_tile("f64", AVX2, 1000, 2) == (8, 2, 2)
    assert register_tile("f32", AVX512, 1000, 16) == (8, 16, 16)
    plan = choose(1000, 8, 300, "f32", machine=MACHINE, isa=AVX512, b_unit_cols=True)
    assert Vectorize("j", 8) in plan.schedule
