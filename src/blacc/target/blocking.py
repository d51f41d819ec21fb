"""Cache blocking (mc, kc, nc) for BLIS-style GEMM from the analytical model of Low et al.

T. M. Low, F. D. Igual, T. M. Smith, E. S. Quintana-Orti, "Analytical Modeling Is Enough for
High-Performance BLIS", ACM TOMS 43(2), 2016 -- the model LLVM Polly's MatmulOptimizer uses in
getMacroKernelParams. Caches are modelled as W-way set-associative LRU caches and every block is
sized in whole ways (one way = sets * line = size / W bytes), so that data that must stay resident
is never evicted by data that streams through. S is the element size in bytes. See
docs/blocking.md for the derivation and the numbers for a Zen 3 host.
"""

from __future__ import annotations

from dataclasses import dataclass

from blacc.errors import ArgumentError
from blacc.target.machine import DEFAULT_CACHES, CacheLevel, Machine

__all__ = ["Blocking", "blis_blocking"]

KC_UNROLL = 4  # the micro-kernel's k loop is unrolled by this much
KC_MIN, KC_MAX = 64, 1024
MC_MAX = 1024
NC_MAX = 4096


@dataclass(frozen=True)
class Blocking:
    """Macro-kernel block sizes: A block mc x kc (L2), B panel kc x nc (L3); with
    ``rows_outside``, the B panel in L2 and each mr x kc A sliver in L1 instead."""

    mc: int
    kc: int
    nc: int
    rows_outside: bool = False


def _level(machine: Machine, level: int) -> CacheLevel:
    cache = machine.cache(level)
    return cache if cache is not None else DEFAULT_CACHES[level - 1]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _kc_closed_form(l1: CacheLevel, s: int, mr: int, nr: int) -> int | None:
    """Polly / paper: C_Ar = floor((W1 - 1) / (1 + nr/mr)), kc = C_Ar * way1 / (mr * S).

    Assumes the A sliver fills exactly C_Ar ways and the B sliver gets the nr/mr times larger
    share; None when C_Ar is 0 (too few ways for the model).
    """
    car = (l1.associativity - 1) * mr // (mr + nr)  # floor((W1-1) / (1 + nr/mr)), exact
    return car * l1.way_size // (mr * s) if car > 0 else None


def _kc_exact(l1: CacheLevel, s: int, mr: int, nr: int) -> int | None:
    """Largest kc with ceil(mr*kc*S / way1) + ceil(nr*kc*S / way1) <= W1 - 1.

    This is the paper's L1 constraint before its closed-form simplification: try every split of
    the W1 - 1 usable ways into a ways for the A sliver and b ways for the B sliver. It is never
    smaller than the closed form, and larger when nr/mr makes the floor lose a whole way.
    """
    usable = l1.associativity - 1
    best = max(
        (min(a * l1.way_size // (mr * s), (usable - a) * l1.way_size // (nr * s))
         for a in range(1, usable)),
        default=0,
    )
    return best or None


def blis_blocking(
    machine: Machine, *, dtype_size: int, mr: int, nr: int, closed_form: bool = False,
    kc: int | None = None,
) -> Blocking:
    """Block sizes for an mr x nr micro-kernel on `machine` with `dtype_size`-byte elements.

    kc (L1): the kc x nr B sliver stays in L1 while mr x kc A slivers stream past it; one way is
    left for C and streaming data, so A and B slivers together get at most W1 - 1 ways. By default
    kc is the largest value meeting that in whole ways (`_kc_exact`); `closed_form=True` uses the
    paper's / Polly's formula C_Ar = floor((W1-1)/(1+nr/mr)), kc = C_Ar*sets1*line1/(mr*S).

    mc (L2): the packed mc x kc A block stays in L2 while B slivers stream through it. B takes
    C_Br = ceil(nr*kc*S / way2) ways, one way is left for C, so A gets C_Ac = W2 - 1 - C_Br ways
    and mc = C_Ac * sets2 * line2 / (kc*S). (Polly writes this as Cac = kc*S*W2/L2size,
    mc = floor((W2 - 2) / Cac), i.e. it fixes C_Br at one way.)

    nc (L3): the kc x nc B panel gets the L3 ways not taken by the A block and one for C,
    C_Bc = W3 - 1 - ceil(mc*kc*S / way3), divided among the cores sharing L3 (each may pack its
    own panel); nc = that budget / (kc*S), capped at NC_MAX.

    A given ``kc`` (an ISA's measured one, ``Isa.gemm_kc``) replaces the L1 model: B
    slivers that long do not stay in L1, so the blocking turns around
    (``_rows_outside_blocking``): the small A sliver stays in L1 and the B panel in L2;
    on the vendors of ``L3_PANEL_VENDORS`` the panel is in L3 instead
    (``_l3_panel_blocking``), and where the vector pipes take whole 512-bit vectors each B
    sliver is held in L2 (``_b_sliver_in_l2``).

    Then kc is rounded down to a multiple of the unroll (4) within [64, 1024], mc to a multiple
    of mr within [mr, 1024], nc to a multiple of nr within [nr, 4096]. Missing cache levels use
    DEFAULT_CACHES.
    """
    for name, value in (("dtype_size", dtype_size), ("mr", mr), ("nr", nr)):
        if not isinstance(value, int) or value <= 0:
            raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    s = dtype_size
    l1, l2, l3 = _level(machine, 1), _level(machine, 2), _level(machine, 3)
    if kc is not None:
        if machine.vendor in L3_PANEL_VENDORS:
            return _l3_panel_blocking(l1, l2, l3, s, mr, nr, machine.vector_datapath)
        return _rows_outside_blocking(l2, s, mr, nr, kc)
    kc = (_kc_closed_form if closed_form else _kc_exact)(l1, s, mr, nr)
    if kc is None:  # associativity too low for the model: give the two slivers half of L1
        kc = l1.size // (2 * (mr + nr) * s)
    kc = min(max(kc, KC_MIN), KC_MAX)
    kc -= kc % KC_UNROLL

    c_ac = l2.associativity - 1 - _ceil_div(nr * kc * s, l2.way_size)
    a_budget = c_ac * l2.way_size if c_ac > 0 else l2.size // 2
    mc = min(a_budget // (kc * s), MC_MAX)
    mc = max(mc - mc % mr, mr)

    c_bc = l3.associativity - 1 - _ceil_div(mc * kc * s, l3.way_size)
    b_budget = (c_bc * l3.way_size if c_bc > 0 else l3.size // 2) // max(l3.shared_by, 1)
    nc = min(b_budget // (kc * s), NC_MAX)
    nc = max(nc - nc % nr, nr)
    return Blocking(mc=mc, kc=kc, nc=nc)


#: Columns of the B panel when rows of tiles run outside: each further panel packs all of
#: A again, so the panel is as wide as a thousand-column product. Measured on the Xeon
#: (docs/blocking.md, "Rows of tiles outside"): 1000^3 f32 207 GFLOPS with panels 1024
#: wide at kc = 256, 199 with 512 at kc = 384.
ROWS_OUTSIDE_NC = 1024

#: The shortest kc when rows of tiles run outside: with less L2 the panel narrows
#: instead, since every k block reads and writes C once more. On the Xeon, panels of
#: 512 KiB (as half of a 1 MiB L2 would hold), 2048^3 f64: kc 128 x nc 512 98.0 GFLOPS,
#: kc 64 x nc 1024 96.8.
ROWS_OUTSIDE_KC_MIN = 128

#: A slivers per A block when rows of tiles run outside: each sliver is used across the
#: whole panel while it sits in L1, so the block only sets how much is packed at once
#: (48 to 192 rows ran alike).
ROWS_OUTSIDE_SLIVERS = 16


def _rows_outside_blocking(l2: CacheLevel, s: int, mr: int, nr: int, kc_max: int) -> Blocking:
    """Blocking for a kc too long for the B sliver to stay in L1 (an ISA's measured kc):
    ir outside jr. The mr x kc A sliver stays in L1 while the B slivers of a kc x nc panel,
    held in half of L2, stream past it; the panel is ``ROWS_OUTSIDE_NC`` columns wide and
    kc what then fits in that half (at most ``kc_max``, at least ``ROWS_OUTSIDE_KC_MIN``,
    the panel narrower where that does not fit), so f32 and f64 panels have rows of the
    same bytes. mc is ``ROWS_OUTSIDE_SLIVERS`` slivers."""
    budget = l2.size // 2
    kc = min(max(budget // (ROWS_OUTSIDE_NC * s), ROWS_OUTSIDE_KC_MIN), kc_max, KC_MAX)
    return _rows_outside(kc, budget, s, mr, nr)


def _rows_outside(kc: int, budget: int, s: int, mr: int, nr: int) -> Blocking:
    """Rows of tiles outside: kc rounded down to the unroll, the B panel as many whole
    slivers wide as ``budget`` bytes hold, and ``ROWS_OUTSIDE_SLIVERS`` A slivers."""
    kc -= kc % KC_UNROLL
    return Blocking(mc=ROWS_OUTSIDE_SLIVERS * mr, kc=kc, nc=_panel_width(kc, budget, s, nr),
                    rows_outside=True)


def _panel_width(kc: int, budget: int, s: int, nr: int) -> int:
    """Columns of a kc x nc B panel in ``budget`` bytes: whole slivers, at most NC_MAX."""
    nc = min(budget // (kc * s), NC_MAX)
    return max(nc - nc % nr, nr)


#: Vendors whose L3 feeds a core's L2 fast enough to stream the B panel to the AVX-512
#: micro-kernel (AMD Zen: an L3 per core complex, 32 bytes a cycle to each L2). There the
#: panel lives in L3 and kc is as long as L1 holds an A sliver: fewer passes over C, fewer
#: packings of A. Zen 4, 1 MiB L2, 2048^3: f32 102.3 -> 110.4 GFLOPS, f64 50.2 -> 54.9
#: (the panel in half of L2 against kc 512, nc 2048; docs/blocking.md, "AVX-512 on AMD:
#: the B panel in L3"). On the Xeon a 3 MiB panel halved f64 (52.6 GFLOPS against 103.6).
L3_PANEL_VENDORS = frozenset({"AuthenticAMD"})


def _l3_panel_blocking(l1: CacheLevel, l2: CacheLevel, l3: CacheLevel, s: int, mr: int,
                       nr: int, datapath: int) -> Blocking:
    """The kc x nc B panel in half of this core's share of L3.

    Where 512-bit FMAs take the 256-bit pipes twice (``datapath`` 256, Zen 4), the kernel
    reads 11 bytes of B a cycle and B slivers stream from L3 past the A sliver in L1 (rows
    of tiles outside, ``ROWS_OUTSIDE_SLIVERS`` A slivers; kc the longest mr x kc A sliver
    that fits the L1 ways but one). At two whole 512-bit FMAs a cycle (Zen 5) it would
    read 21 of the 32 bytes a cycle L3 gives: there each kc x nr B sliver stays in L2
    while the A slivers of a small block pass it (columns of tiles outside,
    `_b_sliver_in_l2`). Nothing of a micro call then stays in L1, so kc is
    ``KC_MAX``: the fewer k blocks, the fewer passes over C."""
    budget = l3.size // max(l3.shared_by, 1) // 2
    if datapath:
        kc = min(max((l1.associativity - 1) * l1.way_size // (mr * s), KC_MIN), KC_MAX)
        return _rows_outside(kc, budget, s, mr, nr)
    return _b_sliver_in_l2(l2, KC_MAX, budget, s, mr, nr)


def _b_sliver_in_l2(l2: CacheLevel, kc: int, budget: int, s: int, mr: int, nr: int) -> Blocking:
    """Columns of tiles outside with both slivers of a micro call in L2: the B sliver in use
    and the next one, streaming in from the L3 panel, take ``ceil(nr*kc*S / way2)`` ways
    each, one way is left for C, and the mc x kc A block gets the rest. mc from 24 to 96
    rows ran alike on Zen 5 (f64 kc 936), all 4-6% above rows of tiles outside."""
    kc -= kc % KC_UNROLL
    a_ways = l2.associativity - 1 - 2 * _ceil_div(nr * kc * s, l2.way_size)
    mc = min(max(a_ways, 1) * l2.way_size // (kc * s), MC_MAX)
    mc = max(mc - mc % mr, mr)
    return Blocking(mc=mc, kc=kc, nc=_panel_width(kc, budget, s, nr))
