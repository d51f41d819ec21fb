"""Which of blacc's two code paths computes a fixed-size program that is GEMMs.

The small path (``strategy.small``) fuses a program into register-tiled loops over the
operands as they lie: nothing is packed, and nothing is blocked for the caches, which
is what small operands want. Once A, B and C no longer fit near L1, the spine's GEMM
(``strategy.gemm``: cache blocks, packed panels, or its own in-place tiles for skinny
shapes) runs faster. The small path's speed over the spine's, C = A*B + C, one core of
the Xeon of CPU model 167 (L1 48 KiB; ``benchmarks/fixed_vs_spine.py``, MxNxK; against
blacc.gemm where the small path is kept): f32 96^3 (2.3 L1s) 1.00x, 112^3 (3.1) 0.82x,
128^3 0.74x, 600^3 0.61x; f64 64^3 (2.0) 1.00x, 80^3 (3.1) 0.79x, 600^3 0.29x;
1000 x 1000 x 8 f32 0.95x. Products of a matrix and a
vector are not GEMMs here: the small path streams the matrix as fast as the spine does
(y = A*x + y, 1000 x 1000 f32, through Python: 1.02x).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..frontend.typed import TypedProgram
from ..ir.dtypes import itemsize
from ..target.machine import Machine
from ..transform.as_gemm import GemmProgram, GemmStatement

#: A GEMM (a program's step) goes to the spine when its A, B and C together take more
#: bytes than this many L1 data caches (between the measurements above).
SPINE_L1_MULTIPLE = 2.5
#: A program with other matrices added (``D = alpha*A*B + beta*C``) sums them into the
#: output in a pass of its own before the GEMM adds the product, where the small path
#: fuses it; that pass costs as much as a short product saves, so such a program goes
#: to the spine only where k is at least this. The spine's speed over the small path's,
#: same core: 1000 x 1000 x k f32 k = 32 0.79x, 64 0.98x, 96 1.08x, 128 1.15x; f64 64
#: 0.87x, 96 0.99x, 128 1.13x; 600^3 2.00x, 3.32x (``benchmarks/fixed_vs_spine.py``);
#: with the small path's long rows as loops (``transform.blac.LONG_ROW_VECTORS``) k = 96
#: 1.08x and 0.99x, 128 1.19x and 1.10x. An operand of the product that is a sum of
#: matrices is computed into a scratch array the same way, a pass over op(A) (m x k) that
#: n must outweigh (over op(B), m), and the same limit holds: C = alpha*(A0 + A1)'*B +
#: beta*C 600 x 600 x n, n = 32 1.01x and 1.02x, 64 0.93x and 1.12x, 96 1.15x and 1.39x,
#: 128 1.14x and 1.50x (f32, f64).
PASS_MIN_EXTENT = 96
#: L1's size where the machine does not say.
DEFAULT_L1_BYTES = 32 * 1024
#: In plain C (the 'generic' target) a short k keeps the small path: its unrolled sum
#: leaves loops along C's rows that the compiler vectorizes itself, where the spine's
#: scalar micro-kernel does not get vectorized. Emitted C = A*B + C, ``cc -O2``, the
#: spine's speed over the small path's, 1000 x 1000 x k: f32 k = 8 0.34x, 16 0.46x, 32
#: 1.92x, 128 2.21x; f64 0.45x, 0.59x, 1.23x, 1.34x; 600^3 2.46x, 2.04x
#: (``benchmarks/emitted_gemm.py``, Xeon of CPU model 167).
PLAIN_C_MIN_K = 32


def to_spine(stmt: GemmStatement, shapes: Mapping[str, tuple[int, int]], dtype: str,
             machine: Machine, vectors: bool = True) -> bool:
    """Whether the spine's GEMM, not the small path, should compute ``stmt`` (arrays of
    ``shapes`` by name); ``vectors``: whether the target has SIMD instructions."""
    m, n, k = stmt.extents(shapes)
    passes = ((stmt.addends and stmt.beta is None, k), (len(stmt.a) > 1, n),
              (len(stmt.b) > 1, m))
    if any(needed and extent < PASS_MIN_EXTENT for needed, extent in passes):
        return False
    if not vectors and k < PLAIN_C_MIN_K:
        return False
    l1 = machine.cache(1)
    l1_bytes = l1.size if l1 is not None else DEFAULT_L1_BYTES
    elements = m * k + k * n + m * n
    return elements * itemsize(dtype) > SPINE_L1_MULTIPLE * l1_bytes


def program_to_spine(gemms: GemmProgram, program: TypedProgram, machine: Machine,
                     vectors: bool = True) -> bool:
    """Whether the spine computes the program's GEMMs: where the steps it should compute
    (``to_spine``) hold at least half of their multiplies. The others then run on the
    spine as well, small GEMMs at about the small path's speed (see above). Statements
    that are not GEMMs (``Others``) run on the small path between them."""
    shapes = gemms.shapes(program)
    work = [(math.prod(s.extents(shapes)),
             to_spine(s, shapes, program.dtype, machine, vectors)) for s in gemms.gemms]
    return 2 * sum(w for w, spine in work if spine) >= sum(w for w, _ in work) > 0
