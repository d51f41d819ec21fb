"""Named GEMM strategies: a few numbers -> a schedule, and the choice per shape.

``blis(mc, kc, nc, mr, nr, ku)`` is the layered Goto/BLIS algorithm (seed 000's
Algorithm 1; seed 003's M_C, K_C, N_C, M_R, N_R, K_U); ``no_packing`` is seed
000's "Tiling" strategy for problems that already sit in cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..target.blocking import blis_blocking
from ..target.isa import Isa
from ..target.machine import Machine
from ..transform.schedule import Pack, Prefetch, Schedule, Tile, UnrollJam, Vectorize


def blis(mc: int, kc: int, nc: int, mr: int, nr: int, ku: int, lanes: int = 1, *,
         prefetch_a: int = 0, prefetch_b: int = 0, balanced: bool = True) -> Schedule:
    """jc (nc) / pc (kc) / pack B / ic (mc) / pack A / jr (nr) / ir (mr) / micro-kernel.

    The kc blocks are balanced unless ``balanced=False`` (k = 330 with kc = 320 runs
    165 + 165, not 320 + 10): every block pays for reading and writing C around it, which a
    short one cannot hide."""
    return (
        Tile((("j", nc),)),
        Tile((("k", kc),), balanced=balanced),
        Pack("B", nr),
        Tile((("i", mc),)),
        Pack("A", mr),
        Tile((("j", nr), ("i", mr))),
        UnrollJam("k", ku),
        *((Vectorize("j", lanes),) if lanes > 1 else ()),
        *((Prefetch("A", prefetch_a),) if prefetch_a else ()),
        *((Prefetch("B", prefetch_b),) if prefetch_b else ()),
    )


def no_packing(mr: int, nr: int, ku: int, lanes: int = 1) -> Schedule:
    """Register tiles straight over the operands: no copies, for small problems."""
    return (
        Tile((("i", mr), ("j", nr))),
        UnrollJam("k", ku),
        *((Vectorize("j", lanes),) if lanes > 1 else ()),
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


def register_tile(dtype: str, isa: Isa) -> tuple[int, int, int]:
    """(mr, nr, lanes): 6 rows x 2 vectors, i.e. 12 accumulators + 2 b vectors + 1 broadcast
    = 15 of 16 registers on AVX2; the generic target uses a 4x4 scalar tile."""
    lanes = isa.lanes(dtype)
    if lanes == 1:
        return 4, 4, 1
    nv = 2
    accumulators = isa.registers - nv - 1
    return accumulators // nv, nv * lanes, lanes


#: Strategy names a caller may ask for; 'auto' picks per shape (``choose``). The names
#: follow seed 000: Tiling+Packing (blis), Tiling (no packing), Intrinsic (the whole
#: product as LLVM matrix-multiply calls, fixed sizes), Tiling with the intrinsic.
STRATEGIES = ("auto", "blis", "tiling", "intrinsic", "tiling-intrinsic")

#: The largest product the 'intrinsic' strategy unrolls (compile time grows with it).
INTRINSIC_MAX_WORK = 32 * 32 * 32

#: Below this many multiply-adds the copies of packing cost more than they save.
SMALL_WORK = 48 * 48 * 48


def choose(m: int, n: int, k: int, dtype: str, *, machine: Machine, isa: Isa,
           b_unit_cols: bool) -> Plan:
    """The strategy for one shape: packing unless the problem is small and B can be read
    with unit stride along its columns (the vector loads need that)."""
    mr, nr, lanes = register_tile(dtype, isa)
    ku = 4
    size = 4 if dtype == "f32" else 8
    if m * n * k <= SMALL_WORK and (b_unit_cols or lanes == 1):
        strides = (("B_s1", 1), ("C_s1", 1)) if lanes > 1 else (("C_s1", 1),)
        return Plan("no_packing", (("mr", mr), ("nr", nr), ("ku", ku)),
                    no_packing(mr, nr, ku, lanes), strides)
    blk = blis_blocking(machine, dtype_size=size, mr=mr, nr=nr)
    params = (("mc", blk.mc), ("kc", blk.kc), ("nc", blk.nc), ("mr", mr), ("nr", nr), ("ku", ku))
    return Plan("blis", params, blis(blk.mc, blk.kc, blk.nc, mr, nr, ku, lanes), (("C_s1", 1),))


def plan_for(strategy: str, m: int, n: int, k: int, dtype: str, *, machine: Machine, isa: Isa,
             a_unit_cols: bool, b_unit_cols: bool) -> Plan:
    """The plan of a named strategy for one shape ('auto': ``choose``)."""
    from ..errors import ScheduleError
    from . import intrinsic

    mr, nr, lanes = register_tile(dtype, isa)
    if strategy == "auto":
        return choose(m, n, k, dtype, machine=machine, isa=isa, b_unit_cols=b_unit_cols)
    if strategy == "blis":
        size = 4 if dtype == "f32" else 8
        blk = blis_blocking(machine, dtype_size=size, mr=mr, nr=nr)
        params = (("mc", blk.mc), ("kc", blk.kc), ("nc", blk.nc), ("mr", mr), ("nr", nr),
                  ("ku", 4))
        return Plan("blis", params, blis(blk.mc, blk.kc, blk.nc, mr, nr, 4, lanes),
                    (("C_s1", 1),))
    unit = b_unit_cols or lanes == 1
    if strategy == "tiling":
        if not unit:
            raise ScheduleError("strategy 'tiling' reads B in place and needs its rows "
                                "contiguous (unit column stride)")
        strides = (("B_s1", 1), ("C_s1", 1)) if lanes > 1 else (("C_s1", 1),)
        return Plan("no_packing", (("mr", mr), ("nr", nr), ("ku", 4)),
                    no_packing(mr, nr, 4, lanes), strides)
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
