"""The most flops per cycle any code can reach on a case on this core: a throughput bound.

Three resources bound the time of one call from below, whatever the code does:

* multiplies: every scalar product inside the BLAC's matrix and vector products needs a
  multiply on an FMA pipe (a multiply-add counts once); ``FP_PIPES`` vector FMAs issue
  per cycle, ``lanes`` products each;
* loads: every element of every array the BLAC reads is loaded at least once;
  ``FULL_VECTOR_LOADS`` full vectors per cycle;
* stores: every element of every array it writes is stored at least once;
  ``STORE_PORTS`` full vectors per cycle.

The bound is the case's flops over the largest of the three cycle counts. It is
optimistic by construction (full vectors, no latency, no call, adds and scalings for
free), so no implementation beats it, and an aim above it cannot be met by anyone. The
FMA pipes and store ports are the ones blacc's cost model uses for this core
(``blacc.strategy.small``); the lanes are those of the detected instruction set.
"""

from __future__ import annotations

from blacc.strategy.small import FP_PIPES, STORE_PORTS

#: Loads of the widest vectors per cycle: Zen 3 loads two of 256 bits, Golden Cove two of
#: 512 (the cost model counts three load pipes, for narrower loads).
FULL_VECTOR_LOADS = 2

#: Scalar multiplies of the BLAC's products, from (M, K, N) as in ``harness.SERIES``.
PRODUCTS = {
    "smv": lambda M, K, N: M * K,
    "smm": lambda M, K, N: M * N * K,
    "axpy": lambda M, K, N: M,
    "gemv": lambda M, K, N: M * K,
    "gemm": lambda M, K, N: M * N * K,
    "gesummv": lambda M, K, N: 2 * M * K,
    "blinf": lambda M, K, N: M * K,
    "gemam": lambda M, K, N: M * N * K,
}


def cycles(case, lanes: int) -> dict[str, float]:
    """Lower bounds on the cycles of one call of ``case`` (a ``harness.Case``), per resource."""
    arrays = [o for o in case.operands if o.kind != "scalar"]
    read = sum(o.size for o in arrays if o.role != "out")
    written = sum(o.size for o in arrays if o.written)
    return {"multiplies": PRODUCTS[case.blac](*case.dims) / (FP_PIPES * lanes),
            "loads": read / (FULL_VECTOR_LOADS * lanes),
            "stores": written / (STORE_PORTS * lanes)}


def flops_per_cycle(case, lanes: int) -> tuple[float, str]:
    """The bound in flops per cycle and the resource that sets it."""
    c = cycles(case, lanes)
    limit = max(c, key=c.get)
    return case.flops / c[limit], limit
