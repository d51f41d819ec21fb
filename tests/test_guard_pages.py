"""GEMM on operands that touch guard pages: any out-of-bounds read or write by the kernels
(packing, edge tiles, write-back) hits a PROT_NONE page and kills a forked child, which fails
just that test.

The first part checks the guard machinery itself (tests/guard.py); the rest runs blacc.gemm.
"""

from __future__ import annotations

import ctypes
import faulthandler
import itertools
import random
import signal
import time

import numpy as np
import pytest

import blacc
from blacc.ir.dtypes import float_type_of
from blacc.runtime.gemm import host_target
from blacc.strategy.gemm import FEW_ROWS, ROW_KC, tile_shapes
from conftest import DTYPES
from guard import (
    PAGE,
    bits,
    guarded_array,
    outside_view,
    run_in_child,
    run_isolated,
    span_bounds,
)

# Every test here runs on both code generators (the C compiler and the LLVM JIT).
pytestmark = pytest.mark.usefixtures("backend")

SIDES = ("after", "before")
# Storage layouts of guarded operands (keyword arguments of guarded_array).
GUARD_LAYOUTS = {
    "C": {"order": "C"},
    "F": {"order": "F"},
    "ldC": {"order": "C", "ld_pad": 3},
    "ldF": {"order": "F", "ld_pad": 5},
    "T": {"order": "C", "transpose": True},
    "ldT": {"order": "C", "ld_pad": 2, "transpose": True},
}
# For GEMM operands, also a padded C-order array viewed with its rows reversed: blacc uses
# such a view in place with a negative leading dimension.
GEMM_LAYOUTS = (*GUARD_LAYOUTS, "revC")
C_PAD = -999.0  # finite sentinel in C's padding: a write into it is seen

# (m, n, k): single elements, primes, a register tile (6 x 16 / 6 x 8) with a long k that
# crosses several k blocks (kc = 256 for f64 / 320 for f32 on the development host), m just
# past the f32 m block (306), and a large-ish case that runs packing and every edge tile.
# test_gemm_across_cache_blocks derives more edge shapes from the plan blacc really uses.
GUARD_SHAPES = [
    (1, 1, 1), (7, 13, 5), (37, 41, 29), (97, 5, 131), (6, 16, 1201), (7, 9, 1025),
    (5, 17, 1), (307, 17, 321), (300, 301, 257),
]


def _ids(shape):
    return "x".join(map(str, shape))


def _protection(addr: int) -> str:
    """The permissions ('rw-p', '---p', ...) of the mapping holding ``addr``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                return perms
    return "unmapped"


# --------------------------------------------------------------- the guard machinery itself


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("layout", GUARD_LAYOUTS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (64, 64), (0, 5)], ids=_ids)
def test_guarded_array_geometry(dtype, side, layout, shape):
    kwargs = GUARD_LAYOUTS[layout]
    values = np.arange(np.prod(shape), dtype=dtype).reshape(shape) + 1
    arr = guarded_array(shape, dtype, side=side, fill=values, **kwargs)
    assert arr.shape == shape and arr.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(arr, values)
    assert arr.flags.writeable

    lo, hi = span_bounds(arr)
    if side == "after":
        assert hi % PAGE == 0, "the array does not end at a page boundary"
        assert _protection(hi) == "---p" and _protection(hi - 1).startswith("rw")
    else:
        assert lo % PAGE == 0, "the array does not start at a page boundary"
        assert _protection(lo - 1) == "---p" and _protection(lo).startswith("rw")

    # The leading dimension is the padded one, the padding lies only between rows/columns.
    rows, cols = shape[::-1] if kwargs.get("transpose") else shape
    pad = kwargs.get("ld_pad", 0)
    storage = arr.T if kwargs.get("transpose") else arr
    itemsize = np.dtype(dtype).itemsize
    if arr.size:
        if kwargs["order"] == "C":
            assert storage.strides == ((cols + pad) * itemsize, itemsize)
            n_pad = (rows - 1) * pad
        else:
            assert storage.strides == (itemsize, (rows + pad) * itemsize)
            n_pad = (cols - 1) * pad
        around = outside_view(arr)
        assert around.size == n_pad and np.isnan(around).all()
        assert hi - lo == (arr.size + n_pad) * itemsize


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", GUARD_LAYOUTS)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("access", ["read", "write"])
def test_one_byte_outside_crashes(dtype, layout, side, access):
    arr = guarded_array((5, 3), dtype, side=side, fill=1.0, **GUARD_LAYOUTS[layout])
    lo, hi = span_bounds(arr)
    addr = hi if side == "after" else lo - 1

    def touch():
        faulthandler.disable()  # die quietly: the crash is the expected outcome
        cell = ctypes.c_char.from_address(addr)
        if access == "read":
            _ = cell.value
        else:
            cell.value = b"x"

    outcome = run_in_child(touch, timeout=30)
    assert outcome.signal == signal.SIGSEGV, f"expected SIGSEGV, the child {outcome.describe()}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", GUARD_LAYOUTS)
@pytest.mark.parametrize("side", SIDES)
def test_whole_span_is_accessible(dtype, layout, side):
    """The control for the crash test: every byte of the span itself can be read and written."""
    arr = guarded_array((5, 3), dtype, side=side, fill=1.0, **GUARD_LAYOUTS[layout])
    lo, hi = span_bounds(arr)

    def touch_all():
        raw = (ctypes.c_char * (hi - lo)).from_address(lo)
        raw[:] = bytes(raw)  # read every byte, write it back unchanged
        arr[...] = 2.0
        assert (arr == 2.0).all()

    outcome = run_in_child(touch_all, timeout=30)
    assert outcome.exitcode == 0, f"the child {outcome.describe()}:\n{outcome.report}"


def test_run_isolated_passes_a_clean_child():
    run_isolated(lambda: None)


def test_run_isolated_reports_a_crash():
    arr = guarded_array((4, 4), np.float64, fill=0.0)
    end = span_bounds(arr)[1]

    def crash():
        faulthandler.disable()
        ctypes.c_double.from_address(end).value  # noqa: B018 - reading is the point

    with pytest.raises(pytest.fail.Exception, match="SIGSEGV"):
        run_isolated(crash)


def test_run_isolated_reports_a_failed_assertion():
    def fail():
        assert 1 + 1 == 3, "arithmetic is broken"

    with pytest.raises(pytest.fail.Exception, match="arithmetic is broken"):
        run_isolated(fail)


def test_run_isolated_reports_a_hang():
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish"):
        run_isolated(lambda: time.sleep(30), timeout=0.5)
    assert time.monotonic() - started < 10


# ------------------------------------------------------------------------ GEMM against guards


@pytest.fixture(scope="module", autouse=True)
def _compile_kernels_before_forking():
    """Build (or load) the kernels in the parent, small (unpacked) and large (packed), so that
    the children inherit them instead of each building them again; blacc's kernels are
    single-threaded, so using them across fork is safe."""
    for dtype, size, (trans_a, trans_b) in itertools.product(
        DTYPES, (9, 64), itertools.product((False, True), repeat=2)
    ):
        A = np.ones((size, size), dtype)
        blacc.gemm(A, A, np.ones((size, size), dtype), beta=1.5, trans_a=trans_a,
                   trans_b=trans_b)


def _guarded_operand(rng, shape, dtype, side, layout, *, fill=None, pad_fill=np.nan):
    """A random (or ``fill``) operand in one of GEMM_LAYOUTS, against a guard on ``side``."""
    values = rng.uniform(-1, 1, shape) if fill is None else fill
    if layout == "revC":
        arr = guarded_array(shape, dtype, side=side, fill=0.0, pad_fill=pad_fill, order="C",
                            ld_pad=3)[::-1, :]
        arr[...] = values
        return arr
    return guarded_array(shape, dtype, side=side, fill=values, pad_fill=pad_fill,
                         **GUARD_LAYOUTS[layout])


def _gemm_on_guarded(assert_gemm_close, seed, shape, dtype, placements, trans_a, trans_b, beta,
                     strategy="auto"):
    """One GEMM with A, B and C each against a guard page; ``placements`` maps 'A', 'B', 'C'
    to (side, layout). Checks the result, that C's padding and the inputs are untouched, and
    that C=None works with the same guarded inputs. Runs in the child."""
    rng = np.random.default_rng(seed)
    m, n, k = shape
    context = (f"m, n, k = {m}, {n}, {k}, {np.dtype(dtype).name}, {placements}, "
               f"trans_a={trans_a}, trans_b={trans_b}, beta={beta}")
    A = _guarded_operand(rng, (k, m) if trans_a else (m, k), dtype, *placements["A"])
    B = _guarded_operand(rng, (n, k) if trans_b else (k, n), dtype, *placements["B"])
    c_fill = np.full((m, n), np.nan) if beta == 0 else None  # beta == 0 must not read C
    C = _guarded_operand(rng, (m, n), dtype, *placements["C"], fill=c_fill, pad_fill=C_PAD)
    A0, B0, C0 = A.copy(), B.copy(), C.copy()
    around_c = bits(outside_view(C))

    kw = dict(trans_a=trans_a, trans_b=trans_b, strategy=strategy)
    assert blacc.gemm(A, B, C, alpha=-1.5, beta=beta, **kw) is C
    assert_gemm_close(C, A, B, C0, -1.5, beta, trans_a, trans_b, context=context)
    assert np.array_equal(bits(outside_view(C)), around_c), f"wrote into C's padding: {context}"
    assert np.array_equal(bits(A), bits(A0)) and np.array_equal(bits(B), bits(B0)), context
    # the same call again takes the fast path (runtime.gemm.repeat) where it applies: the
    # same bits, inside the same guards
    first = C.copy()
    C[...] = C0
    assert blacc.gemm(A, B, C, alpha=-1.5, beta=beta, **kw) is C
    assert np.array_equal(bits(C), bits(first)), f"repeated call differs: {context}"
    assert np.array_equal(bits(outside_view(C)), around_c), f"repeat wrote outside C: {context}"
    assert np.array_equal(bits(A), bits(A0)) and np.array_equal(bits(B), bits(B0)), context

    for _ in range(2):  # the second call repeats the first
        new = blacc.gemm(A, B, alpha=0.5, **kw)
        assert_gemm_close(new, A, B, None, 0.5, 0.0, trans_a, trans_b,
                          context=f"C=None, {context}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("layout", GEMM_LAYOUTS)
@pytest.mark.parametrize("shape", GUARD_SHAPES, ids=_ids)
def test_gemm_against_guards(dtype, side, layout, shape, rng, assert_gemm_close):
    """A, B and C all in the same layout against the same side, every transpose and beta."""
    seed = int(rng.integers(2**32))
    placements = {name: (side, layout) for name in "ABC"}

    def body():
        for (trans_a, trans_b), beta in itertools.product(
            itertools.product((False, True), repeat=2), (0.0, 0.75)
        ):
            _gemm_on_guarded(assert_gemm_close, seed, shape, dtype, placements,
                             trans_a, trans_b, beta)

    run_isolated(body)


def _mixed_cases(count=40, seed=20240611):
    """Reproducible random mixes: each operand has its own side and layout."""
    pick = random.Random(seed)
    shapes = [s for s in GUARD_SHAPES if s[0] * s[1] * s[2] < 10**6] + [(16, 6, 65), (9, 7, 2)]
    cases = []
    for _ in range(count):
        placements = {name: (pick.choice(SIDES), pick.choice(GEMM_LAYOUTS))
                      for name in "ABC"}
        case = (pick.choice(shapes), pick.choice(DTYPES), placements,
                pick.random() < 0.5, pick.random() < 0.5, pick.choice((0.0, 2.0)))
        label = "-".join(f"{name}{side[0]}{lay}" for name, (side, lay) in placements.items())
        cases.append(pytest.param(*case, id=f"{_ids(case[0])}-{np.dtype(case[1]).name}-{label}"
                                  f"-t{int(case[3])}{int(case[4])}-b{case[5]}"))
    return cases


@pytest.mark.parametrize("shape, dtype, placements, trans_a, trans_b, beta", _mixed_cases())
def test_gemm_mixed_guards(shape, dtype, placements, trans_a, trans_b, beta, rng,
                           assert_gemm_close):
    seed = int(rng.integers(2**32))
    run_isolated(lambda: _gemm_on_guarded(assert_gemm_close, seed, shape, dtype, placements,
                                          trans_a, trans_b, beta))


def _block_edge_shapes(dtype):
    """Shapes one past (and one short of) the blocking of the plan blacc picks for a large
    GEMM of ``dtype`` on this machine: the last m, k and n blocks are then partial."""
    plan = blacc.explain(m=1000, n=1000, k=1000, dtype=np.dtype(dtype)).plan
    params = dict(plan.params)
    if not {"mc", "kc", "nc", "mr", "nr"} <= params.keys():
        pytest.skip(f"the plan for a large GEMM is not cache-blocked: {plan.describe()}")
    mc, kc, nc, mr, nr = (params[name] for name in ("mc", "kc", "nc", "mr", "nr"))
    shapes = [
        (mc + 1, 2 * nr + 1, kc + 1),
        (mc - 1, 3 * nr - 1, 2 * kc + 3),
        (3 * mr + 1, nc + 1, 5),  # packed (m*n*k is large enough), a partial n block
        (2 * mc + mr - 1, 3 * nr - 1, kc - 1),
    ]
    return shapes  # run with strategy='blis': some would run in place


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("layout", ["C", "ldF", "ldT"])
def test_gemm_across_cache_blocks(dtype, side, layout, rng, assert_gemm_close):
    shapes = _block_edge_shapes(dtype)
    seed = int(rng.integers(2**32))
    placements = {name: (side, layout) for name in "ABC"}

    def body():
        for shape, (trans_a, trans_b) in itertools.product(
            shapes, itertools.product((False, True), repeat=2)
        ):
            _gemm_on_guarded(assert_gemm_close, seed, shape, dtype, placements,
                             trans_a, trans_b, 1.0, strategy="blis")

    run_isolated(body)


def _edge_tile_shapes(dtype: str) -> list[tuple[int, int, int]]:
    """Shapes whose last column tile of the packed plan leaves 1, lanes, lanes + 1, ...,
    nr - 1 columns: each of the narrow edge tiles (``NarrowEdges``) and the full one."""
    plan = blacc.explain(m=1000, n=1000, k=1000, dtype=np.dtype(dtype)).plan
    params = dict(plan.params)
    if not {"mr", "nr"} <= params.keys():
        pytest.skip(f"the plan for a large GEMM is not cache-blocked: {plan.describe()}")
    mr, nr = params["mr"], params["nr"]
    lanes = host_target().isa.lanes(float_type_of(np.dtype(dtype)))
    left = sorted({1, lanes, lanes + 1, 2 * lanes + 3, nr - lanes, nr - lanes + 1, nr - 1})
    return [(5 * mr + 2, 2 * nr + r, 67) for r in left if 0 < r < nr]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("strategy", ["blis", "tiling"])
def test_gemm_narrow_edge_tiles_against_guards(dtype, side, strategy, rng, assert_gemm_close):
    """Packed, and in place with the ISA's wide tiles where it has them."""
    shapes = _edge_tile_shapes(dtype)
    seed = int(rng.integers(2**32))
    placements = {"A": (side, "C"), "B": (side, "ldC"), "C": (side, "ldC")}

    def body():
        for shape, beta in itertools.product(shapes, (0.0, 0.75)):
            _gemm_on_guarded(assert_gemm_close, seed, shape, dtype, placements, False, False,
                             beta, strategy=strategy)

    run_isolated(body)


def _in_place_cases(dtype: str) -> list[tuple[tuple[int, int, int], str]]:
    """(m, n, k) and the register tile that runs over the operands in place
    (strategy.gemm.choose) on this machine's ISA: narrow C with B in cache (rows of tiles
    outside), few rows of C with a long k and a large B (columns of tiles outside), in
    each tile shape; a matrix times a vector as dot products."""
    isa = host_target().isa
    lanes = isa.lanes(dtype)
    (_, rows2), (_, rows3), (_, rows1), (widest, _) = tile_shapes(isa)
    m3 = 2 * rows3 if 2 * rows3 <= FEW_ROWS else rows3  # two row tiles where they fit

    def tiling(mr: int, vectors: int, j_outer: int, edges: bool = False, kc: int = 0) -> str:
        return (f"no_packing(mr={mr}, nr={vectors * lanes}, ku=4, j_outer={j_outer}"
                f"{', edges=1' if edges else ''}{f', kc={kc}' if kc else ''})")

    wide = bool(isa.in_place_tiles)  # an ISA's wide tiles take C at least that wide
    cases = [
        ((131, lanes, 257), tiling(rows1, 1, 0)),
        ((101, 3 * lanes, 300), tiling(rows3, 3, 0, wide)),
        ((rows2, 1000, 300), tiling(6, 4, 1, True) if wide else tiling(rows2, 2, 1)),
        ((m3, 999, 300), tiling(rows3, 3, 1, wide)),
        ((1 if wide else 3, 1001, 300), tiling(1, widest, 1, kc=ROW_KC)),
        ((37, 1, 301), "dot_tiles(mr=8, nr=1, ku=2)"),
    ]
    if wide:  # the last of them where its rows fit m best, narrow edge 1 + 3
        rows, vectors = isa.in_place_tiles[-1]
        cases.append(((5 * rows, (vectors + 1) * lanes + 3, 100), tiling(rows, vectors, 0, True)))
    return cases


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(7))
def test_gemm_in_place_plans_against_guards(dtype, case, rng, assert_gemm_close):
    """Each in-place plan (tile shape, loop order; dot products for a matrix times a
    vector) on operands against guard pages, every transpose, beta 0 and not."""
    cases = _in_place_cases(f"f{np.dtype(dtype).itemsize * 8}")
    if case >= len(cases):
        pytest.skip("this ISA has no in-place tiles of its own (Isa.in_place_tiles)")
    shape, expected = cases[case]
    plan = blacc.explain(m=shape[0], n=shape[1], k=shape[2], dtype=np.dtype(dtype)).plan
    assert plan.describe() == expected, plan.describe()
    seed = int(rng.integers(2**32))

    def body():
        for side, layout, (trans_a, trans_b), beta in itertools.product(
            SIDES, ("C", "ldF"), itertools.product((False, True), repeat=2), (0.0, 0.75)
        ):
            _gemm_on_guarded(assert_gemm_close, seed, shape, dtype, {
                name: (side, layout) for name in "ABC"}, trans_a, trans_b, beta)

    run_isolated(body)
