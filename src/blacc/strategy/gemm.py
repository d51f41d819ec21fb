"""Named GEMM strategies: a few numbers -> a schedule, and the choice per shape.

``blis(mc, kc, nc, mr, nr, ku)`` is the layered Goto/BLIS algorithm (seed 000's
Algorithm 1; seed 003's M_C, K_C, N_C, M_R, N_R, K_U); ``no_packing`` is seed
000's "Tiling" strategy for problems that already sit in cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import itemsize
from ..target.blocking import blis_blocking
from ..target.isa import Isa
from ..target.machine import DEFAULT_CACHES, Machine
from ..transform.schedule import (
    NarrowEdges,
    Pack,
    Prefetch,
    Schedule,
    Tile,
    UnrollJam,
    Vectorize,
)


def blis(mc: int, kc: int, nc: int, mr: int, nr: int, ku: int, lanes: int = 1, *,
         prefetch_a: int = 0, prefetch_b: int = 0, balanced: bool = True,
         narrow_edges: bool = True, rows_outside: bool = False) -> Schedule:
    """jc (nc) / pc (kc) / pack B / ic (mc) / pack A / jr (nr) / ir (mr) / micro-kernel.

    The kc blocks and nc panels are balanced unless ``balanced=False`` (k = 330 with kc =
    320 runs 165 + 165, not 320 + 10; panels in whole nr slivers): every block pays for
    reading and writing C around it, which a short one cannot hide. With vectors, the
    last column tile is only as many vectors wide as it needs unless
    ``narrow_edges=False`` (``NarrowEdges``). ``rows_outside``: ir outside jr, so that
    the mr x kc A sliver stays in L1 while the kc x nr B slivers of a panel held in L2 (L3
    on AMD) stream past it (``Blocking.rows_outside``)."""
    tiles = (("i", mr), ("j", nr)) if rows_outside else (("j", nr), ("i", mr))
    return (
        Tile((("j", nc),), balanced=balanced),
        Tile((("k", kc),), balanced=balanced),
        Pack("B", nr),
        Tile((("i", mc),)),
        Pack("A", mr),
        Tile(tiles),
        UnrollJam("k", ku),
        *((Vectorize("j", lanes),) if lanes > 1 else ()),
        *((NarrowEdges("j"),) if lanes > 1 and narrow_edges else ()),
        *((Prefetch("A", prefetch_a),) if prefetch_a else ()),
        *((Prefetch("B", prefetch_b),) if prefetch_b else ()),
    )


def no_packing(mr: int, nr: int, ku: int, lanes: int = 1, *, j_outer: bool = False,
               narrow_edges: bool = False, kc: int | None = None) -> Schedule:
    """Register tiles straight over the operands: no copies, for problems whose reused
    operand sits in cache. Rows of tiles outside (each row of A read once, B again for
    each) or, with ``j_outer``, columns of tiles outside (each column panel of B read
    once, A again for each). ``narrow_edges``: the last column tile only as many vectors
    wide as it needs (``NarrowEdges``). ``kc``: the reduction in blocks of kc outside
    the tiles, so that the tiles of one block read whole rows of B one after another."""
    tiles = (("j", nr), ("i", mr)) if j_outer else (("i", mr), ("j", nr))
    return (
        *((Tile((("k", kc),), balanced=True),) if kc else ()),
        Tile(tiles),
        UnrollJam("k", ku),
        *((Vectorize("j", lanes),) if lanes > 1 else ()),
        *((NarrowEdges("j"),) if lanes > 1 and narrow_edges else ()),
    )


@dataclass(frozen=True)
class Plan:
    """A strategy with its numbers, the schedule it builds, and the strides it fixes."""

    strategy: str
    params: tuple[tuple[str, int], ...]
    schedule: Schedule
    known_strides: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return f"{self.strategy}({', '.join(f'{k}={v}' for k, v in self.params)})"


def register_tile(dtype: str, isa: Isa, m: int | None = None, n: int | None = None
                  ) -> tuple[int, int, int]:
    """(mr, nr, lanes): 6 rows x 2 vectors, i.e. 12 accumulators + 2 b vectors + 1 broadcast
    = 15 of 16 registers on AVX2 (14 x 2 = 31 of 32 on AVX-512); the generic target uses a
    4x4 scalar tile.

    Given the problem's m and n: the first of 6 x 2, 4 x 3, 8 x 1 and 1 x 7 (rows x
    vectors, most FMAs per load first) that pads C by at most ``PADDING_TOLERANCE`` over
    the tile that pads least. C = A*B with n = 8 f32 would waste half of every 16-wide
    tile and takes 8 x 1; m = 8 takes two 4-row tiles instead of 6 + 2 rows; a row vector
    times a matrix (m = 1) takes one row of 7 vectors. A C exactly half a vector wide (8
    f32 on AVX-512) takes tiles of half-vectors, with no masked lanes: on the
    Xeon, 1000 x 8 x 1000 f32 ran 87 GFLOPS with 8 x 8 (256-bit) against 57 with 8 x 16
    (LLVM backend). Narrower C keeps full vectors: 4000 x 4 x 4000 f32 ran 17 GFLOPS
    with LLVM's masked 256-bit moves against 29 with 512-bit ones."""
    lanes = isa.lanes(dtype)
    if lanes == 1:
        return 4, 4, 1
    half = isa.widths(dtype)[1]
    if n == half > 1:
        lanes = half  # C exactly half a vector wide: no lane left empty
    tiles = tile_shapes(isa)
    nv, mr = tiles[0]
    if m is not None and n is not None:
        def padded(tile: tuple[int, int]) -> int:
            v, r = tile
            return -(-m // r) * r * -(-n // (v * lanes)) * v * lanes

        least = min(padded(t) for t in tiles)
        nv, mr = next(t for t in tiles if padded(t) <= (1 + PADDING_TOLERANCE) * least)
    return mr, nv * lanes, lanes


def packed_tile(dtype: str, isa: Isa) -> tuple[int, int, int]:
    """(mr, nr, lanes) of the packed (blis) plan's micro-kernel: the ISA's measured
    ``gemm_tile`` where it has one, else ``register_tile``'s default."""
    lanes = isa.lanes(dtype)
    if isa.gemm_tile is None or lanes == 1:
        return register_tile(dtype, isa)
    rows, vectors = isa.gemm_tile
    return rows, vectors * lanes, lanes


def _blis_plan(dtype: str, isa: Isa, machine: Machine, ku: int = 4) -> Plan:
    mr, nr, lanes = packed_tile(dtype, isa)
    blk = blis_blocking(machine, dtype_size=itemsize(dtype), mr=mr, nr=nr, kc=isa.gemm_kc)
    params = (("mc", blk.mc), ("kc", blk.kc), ("nc", blk.nc), ("mr", mr), ("nr", nr), ("ku", ku),
              *((("rows_outside", 1),) if blk.rows_outside else ()))
    schedule = blis(blk.mc, blk.kc, blk.nc, mr, nr, ku, lanes, rows_outside=blk.rows_outside)
    return Plan("blis", params, schedule, (("C_s1", 1),))


def tile_shapes(isa: Isa) -> list[tuple[int, int]]:
    """(vectors, rows) of the register tiles ``register_tile`` picks from, most FMAs per
    load first: 2, 3 and 1 vectors wide, and one row as wide as the registers allow (nv
    accumulators and nv vectors of B)."""
    widest = (isa.registers - 1) // 2
    return [(nv, _rows_for(nv, isa)) for nv in (2, 3, 1, widest)]


#: How much more of C (in padded tiles) a tile may compute than the tile that fits the
#: shape best and still be preferred for doing more FMAs per load.
PADDING_TOLERANCE = 0.15

#: Independent accumulators that keep every FMA pipe busy (Zen 3, Skylake: two pipes,
#: latency four): a one-vector tile has this many rows, each costing a broadcast.
LATENCY_ACCUMULATORS = 8


def _rows_for(nv: int, isa: Isa) -> int:
    """Rows of a tile nv vectors wide: the registers left after nv vectors of B and a
    broadcast of A, one accumulator per row and vector (at most ``LATENCY_ACCUMULATORS``
    for one vector: more rows would only add broadcasts)."""
    rows = (isa.registers - nv - 1) // nv
    return min(rows, LATENCY_ACCUMULATORS) if nv == 1 else rows


def _in_place_order(m: int, n: int, k: int, size: int, nr: int, machine: Machine
                    ) -> bool | None:
    """Whether register tiles should run over the operands in place, skipping the copies
    of packing, which pay only when a packed block is reused by many tiles. False (rows
    of tiles outside): C is at most two default tiles wide (``nr`` columns each), so a
    packed block of A would serve at most two tiles, and B fits in half of L2, where it
    stays while each row of A is read once. True (columns of tiles outside): A fits in
    half of L2 while each column panel of B is read once, and C has at most ``FEW_ROWS``
    rows (a packed B would serve at most three tiles), or at most ``SKINNY_ROWS`` with a
    long k and a B too big for L2. None: pack."""
    half_l2 = _l2_bytes(machine) // 2
    b_fits = k * n * size <= half_l2
    if n <= 2 * nr and b_fits:
        return False
    if m * k * size <= half_l2 and (
            m <= FEW_ROWS or (m <= SKINNY_ROWS and k >= LONG_K and not b_fits)):
        return True
    return None


#: See ``_in_place_order``. Measured on Zen 3 (f32, n = 1000): in-place column panels beat
#: packing 1.1-2.2x for m <= 16 at k = 1000 and 1.5-6x at k = 64; they break even by
#: m = 64 at k = 1000, and lose at m = 64 with a short k (0.88x) or m = 32 with a B that
#: fits in cache (0.90x, 32 x 256 x 256), where packing B is cheap.
FEW_ROWS = 16
SKINNY_ROWS = 32
LONG_K = 256


def _l2_bytes(machine: Machine) -> int:
    l2 = machine.cache(2)
    return l2.size if l2 is not None else DEFAULT_CACHES[1].size


#: Strategy names a caller may ask for; 'auto' picks per shape (``choose``). The names
#: follow seed 000: Tiling+Packing (blis), Tiling (no packing), Intrinsic (the whole
#: product as LLVM matrix-multiply calls, fixed sizes), Tiling with the intrinsic.
STRATEGIES = ("auto", "blis", "tiling", "intrinsic", "tiling-intrinsic")

#: The largest product the 'intrinsic' strategy unrolls (compile time grows with it).
INTRINSIC_MAX_WORK = 32 * 32 * 32

#: Below this many multiply-adds the copies of packing cost more than they save.
SMALL_WORK = 48 * 48 * 48


def choose(m: int, n: int, k: int, dtype: str, *, machine: Machine, isa: Isa,
           b_unit_cols: bool, a_unit_cols: bool = False, b_unit_rows: bool = False
           ) -> Plan:
    """The strategy for one shape: packing, unless the problem is small or skinny
    (``_in_place_order``) and B can be read with unit stride along its columns (the
    vector loads need that); then register tiles fitted to m and n run in place. A
    matrix times a vector (n = 1) with rows of A and the vector contiguous is a tile of
    dot products (``dot_tiles``)."""
    lanes = isa.lanes(dtype)
    ku = 4
    size = itemsize(dtype)
    if n == 1 and lanes > 1 and a_unit_cols and b_unit_rows:
        return dot_tiles(lanes)
    if b_unit_cols or lanes == 1:
        j_outer = _in_place_order(m, n, k, size, _narrow_width(dtype, isa), machine)
        if m * n * k <= SMALL_WORK:
            j_outer = bool(j_outer)
        if j_outer is None and isa.in_place_work is not None and m * n * k <= isa.in_place_work:
            j_outer = False
        if j_outer is not None:
            return _in_place_plan(dtype, isa, m, n, ku, j_outer)
    return _blis_plan(dtype, isa, machine, ku)


def _narrow_width(dtype: str, isa: Isa) -> int:
    """The tile width against which C counts as narrow (``_in_place_order``): the default
    register tile's, or the widest of the ISA's ``in_place_tiles``."""
    _, nr, lanes = register_tile(dtype, isa)
    return max([nr, *(v * lanes for _, v in isa.in_place_tiles or ())])


#: How many more rows of C (in whole tiles) an ISA's in-place tile may compute than the
#: one that fits m best and still be taken for coming first (``Isa.in_place_tiles``).
IN_PLACE_ROW_TOLERANCE = 0.05


def _in_place_plan(dtype: str, isa: Isa, m: int, n: int, ku: int, j_outer: bool) -> Plan:
    """Register tiles over the operands in place: with C at least as wide as one of the
    ISA's ``in_place_tiles``, the first of those (the widest first with columns of tiles
    outside, for more than one row) whose rows fit m within ``IN_PLACE_ROW_TOLERANCE``,
    with narrow edge tiles; otherwise ``register_tile``'s tile fitted to m and n.
    Measured on the Xeon, columns outside, 1000 columns and k = 1000 f32: m = 4 ran 49
    GFLOPS with 6 x 4 vectors against 24 with the 1 x 15 row tile (NumPy 31), m = 12 101
    against 75 with 14 x 2 (NumPy 72)."""
    lanes = isa.lanes(dtype)
    wide = [(r, v) for r, v in isa.in_place_tiles or () if v * lanes <= n]
    if j_outer:
        # columns of tiles outside read each panel of B once and A once per panel: the
        # widest panel first. One row keeps its row-vector tile (1 x widest).
        wide = sorted(wide, key=lambda t: -t[1]) if m > 1 else []
    if not wide or lanes == 1:
        mr, nr, lanes = register_tile(dtype, isa, m, n)
        row_kc = ROW_KC if j_outer and mr == 1 and lanes > 1 else None
        return _tiling(mr, nr, ku, lanes, j_outer, kc=row_kc)
    least = min(-(-m // r) * r for r, _ in wide)
    mr, nv = next((r, v) for r, v in wide
                  if -(-m // r) * r <= (1 + IN_PLACE_ROW_TOLERANCE) * least)
    return _tiling(mr, nv * lanes, ku, lanes, j_outer, narrow_edges=True)


#: Rows of a tile of dot products (one column): accumulators enough to cover the FMA
#: latency on both pipes, each a stream of A read from memory.
DOT_ROWS = LATENCY_ACCUMULATORS
DOT_UNROLL = 2


def dot_tiles(lanes: int) -> Plan:
    """C = A x for a vector x: ``DOT_ROWS`` rows of A at a time, each row's dot product
    with x in a vector of partial sums along k (``Vectorize('k')``), added up at the
    store. Where a tile vectorized along n would use one lane in ``lanes``, this uses
    all of them; A is read once, row by row, as NumPy's GEMV does."""
    schedule = (Tile((("i", DOT_ROWS), ("j", 1))), UnrollJam("k", DOT_UNROLL),
                Vectorize("k", lanes))
    params = (("mr", DOT_ROWS), ("nr", 1), ("ku", DOT_UNROLL))
    return Plan("dot_tiles", params, schedule, (("A_s1", 1), ("B_s0", 1)))


#: k block of the row tiles (1 x widest, columns of tiles outside: a row vector times a
#: matrix, or a few rows on AVX2): without it each column panel of a tile walks down all
#: k rows of B, a few hundred bytes from each; with it the tiles of a block read 32 whole
#: rows of B in turn, and C's rows stay in L1. Measured on the Xeon, 1 x 4000 x 4000 with
#: AVX-512: f32 8.5 -> 13.9 GFLOPS (NumPy's GEMV 13.8), f64 3.3 -> 5.5 (5.2); with AVX2
#: kernels 2 x 4000 x 4000 f32 6.6 -> 22.0 (NumPy 8.2); blocks of 16-64 ran alike.
ROW_KC = 32


def _tiling(mr: int, nr: int, ku: int, lanes: int, j_outer: bool, *,
            narrow_edges: bool = False, kc: int | None = None) -> Plan:
    strides = (("B_s1", 1), ("C_s1", 1)) if lanes > 1 else (("C_s1", 1),)
    params = (("mr", mr), ("nr", nr), ("ku", ku), ("j_outer", int(j_outer)),
              *((("edges", 1),) if narrow_edges else ()), *((("kc", kc),) if kc else ()))
    return Plan("no_packing", params,
                no_packing(mr, nr, ku, lanes, j_outer=j_outer, narrow_edges=narrow_edges,
                           kc=kc),
                strides)


def plan_for(strategy: str, m: int, n: int, k: int, dtype: str, *, machine: Machine, isa: Isa,
             a_unit_cols: bool, b_unit_cols: bool, b_unit_rows: bool = False) -> Plan:
    """The plan of a named strategy for one shape ('auto': ``choose``)."""
    from ..errors import ScheduleError
    from . import intrinsic

    if strategy == "auto":
        return choose(m, n, k, dtype, machine=machine, isa=isa, b_unit_cols=b_unit_cols,
                      a_unit_cols=a_unit_cols, b_unit_rows=b_unit_rows)
    mr, nr, lanes = register_tile(dtype, isa)
    size = itemsize(dtype)
    if strategy == "blis":
        return _blis_plan(dtype, isa, machine)
    unit = b_unit_cols or lanes == 1
    if strategy == "tiling":
        if not unit:
            raise ScheduleError("strategy 'tiling' reads B in place and needs its rows "
                                "contiguous (unit column stride)")
        j_outer = bool(_in_place_order(m, n, k, size, _narrow_width(dtype, isa), machine))
        return _in_place_plan(dtype, isa, m, n, 4, j_outer)
    if not (a_unit_cols and b_unit_cols):
        raise ScheduleError(f"strategy {strategy!r} needs A and B with contiguous rows")
    if strategy == "intrinsic":
        if m * n * k > INTRINSIC_MAX_WORK:
            raise ScheduleError(f"strategy 'intrinsic' unrolls the whole {m}x{n}x{k} product "
                                f"and is for tiny sizes (m*n*k <= {INTRINSIC_MAX_WORK}); use "
                                "'tiling-intrinsic'")
        return intrinsic.intrinsic(m, n, k, lanes=lanes)
    if strategy == "tiling-intrinsic":
        return intrinsic.tiling_intrinsic(mr, nr, lanes=lanes)
    raise ScheduleError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
