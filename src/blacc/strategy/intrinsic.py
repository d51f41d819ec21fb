"""Seed 000's strategies around LLVM's matrix-multiply intrinsic, as ``Plan``s.

* ``intrinsic(m, n, k)`` — "Intrinsic": a fixed-size product (the contraction has integer
  extents) computed as unrolled intrinsic calls, by default one ``m x k @ k x n`` call;
  ``mr``, ``nr``, ``kr`` split it into a grid of smaller calls. For tiny sizes.
* ``tiling_intrinsic(mr, nr, kr)`` — "Tiling": register tiles straight over the operands
  (optionally inside mc/kc/nc cache blocks), each tile a loop of intrinsic calls.
* "Tiling+Packing" is ``strategy.gemm.blis``.

The schedule language has no record for "lower this register tile with the matrix
intrinsic": the choice travels in the plan's strategy name and its ``kr``, which
``matrix_kr(plan)`` reads for ``transform.pipeline.lower(..., matrix_kr=...)``:

    plan = intrinsic(8, 8, 8)                 # Plan('intrinsic', m=8, n=8, k=8, mr=8, ...)
    op = plan_contraction(plan, "f32")        # C[8,8] = A[8,8] @ B[8,8], integer extents
    module = apply(op, plan.schedule, known_strides=dict(plan.known_strides))
    final, _ = lower(module, isa, backend="llvm", matrix_kr=matrix_kr(plan))

Every plan here needs a row-major C and A and B with unit column stride (``A_s1``,
``B_s1``, ``C_s1`` fixed to 1). The entry of an ``intrinsic`` plan has no extent
parameters: it is ``name(alpha, A, A_s0, A_s1, B, B_s0, B_s1, beta, C, C_s0, C_s1)``.
"""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir.structured import REDUCTION, Access, Contraction, Dim, matmul
from ..transform.schedule import Schedule, Tile, Vectorize
from .gemm import Plan

INTRINSIC = "intrinsic"
TILING_INTRINSIC = "tiling-intrinsic"
MATRIX_STRATEGIES = (INTRINSIC, TILING_INTRINSIC)

#: The strides every matrix-intrinsic plan fixes at compile time.
UNIT_STRIDES = (("A_s1", 1), ("B_s1", 1), ("C_s1", 1))


def _positive(**sizes: int | None) -> None:
    for name, v in sizes.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ScheduleError(f"{name} must be a positive integer, got {v!r}")


def _register_tile(mr: int, nr: int, lanes: int) -> Schedule:
    """The register tile; ``Vectorize`` (for the outer-product edge tiles) when the lanes
    divide nr."""
    vec = (Vectorize("j", lanes),) if lanes > 1 and nr % lanes == 0 else ()
    return (Tile((("i", mr), ("j", nr))), *vec)


def fixed_matmul(dtype: str, m: int, n: int, k: int) -> Contraction:
    """``structured.matmul`` with integer extents: C[m,n] = A[m,k] @ B[k,n]."""
    _positive(m=m, n=n, k=k)
    return Contraction(
        name="gemm",
        domain=(Dim("i", m), Dim("j", n), Dim("k", k, REDUCTION)),
        inputs=(Access("A", ("i", "k")), Access("B", ("k", "j"))),
        output=Access("C", ("i", "j")),
        dtype=dtype,
    )


def intrinsic(m: int, n: int, k: int, mr: int | None = None, nr: int | None = None,
              kr: int | None = None, *, lanes: int = 1) -> Plan:
    """The "Intrinsic" strategy for an ``m x n x k`` product known at compile time: the
    whole product as unrolled intrinsic calls (``mr x nr`` tiles, ``kr`` per call;
    default one tile and one call). ``lanes`` vectorizes the outer-product fallback."""
    mr, nr, kr = mr or m, nr or n, kr or k
    _positive(m=m, n=n, k=k, mr=mr, nr=nr, kr=kr, lanes=lanes)
    params = (("m", m), ("n", n), ("k", k), ("mr", mr), ("nr", nr), ("kr", kr))
    return Plan(INTRINSIC, params, _register_tile(mr, nr, lanes), UNIT_STRIDES)


def tiling_intrinsic(mr: int, nr: int, kr: int = 1, *, mc: int | None = None,
                     kc: int | None = None, nc: int | None = None, lanes: int = 1) -> Plan:
    """The "Tiling" strategy: loops over ``mr x nr`` register tiles (inside nc / kc / mc
    blocks where given, Goto's order without packing), each tile a loop of intrinsic calls
    of ``kr`` reduction steps. ``kr=1`` (a rank-1 update per call, like POWER10's f32 MMA
    instruction) lets LLVM fuse each product into the accumulator: the loop is the
    outer-product micro kernel. With ``kr > 1`` LLVM sums each product apart and then adds
    it, which costs adds and registers."""
    _positive(mr=mr, nr=nr, kr=kr, mc=mc, kc=kc, nc=nc, lanes=lanes)
    blocks = [Tile(((dim, size),)) for dim, size in (("j", nc), ("k", kc), ("i", mc)) if size]
    params = (("mr", mr), ("nr", nr), ("kr", kr),
              *((name, v) for name, v in (("mc", mc), ("kc", kc), ("nc", nc)) if v))
    return Plan(TILING_INTRINSIC, params, (*blocks, *_register_tile(mr, nr, lanes)),
                UNIT_STRIDES)


def matrix_kr(plan: Plan) -> int | None:
    """The ``kr`` to lower ``plan`` with (``lower(..., matrix_kr=...)``); None for plans
    that use blacc's outer products."""
    if plan.strategy not in MATRIX_STRATEGIES:
        return None
    return dict(plan.params)["kr"]


def plan_contraction(plan: Plan, dtype: str) -> Contraction:
    """The contraction ``plan`` schedules: fixed-size for ``intrinsic``, else ``matmul``."""
    if plan.strategy == INTRINSIC:
        p = dict(plan.params)
        return fixed_matmul(dtype, p["m"], p["n"], p["k"])
    return matmul(dtype)
