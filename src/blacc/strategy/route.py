"""Which of blacc's two code paths computes a fixed-size program that is one GEMM.

The small path (``strategy.small``) fuses a program into register-tiled loops over the
operands as they lie: nothing is packed, and nothing is blocked for the caches, which
is what small operands want. Once A, B and C no longer fit near L1, the spine's GEMM
(``strategy.gemm``: cache blocks, packed panels, or its own in-place tiles for skinny
shapes) runs faster. The small path's speed over the spine's, C = A*B + C, one core of
the Xeon of CPU model 167 (L1 48 KiB; ``benchmarks/fixed_vs_spine.py``, MxNxK): f32
96^3 (2.3 L1s) 0.98x, 112^3 (3.1) 0.85x, 128^3 0.72x, 600^3 0.59x; f64 64^3 (2.0)
1.01x, 80^3 (3.1) 0.81x, 600^3 0.34x; 1000 x 1000 x 8 f32 0.96x, and 9.7 s to plan
against 0.7. Products of a matrix and a vector are not GEMMs here: the small path
streams the matrix as fast as the spine does (y = A*x + y, 1000 x 1000 f32: 1.02x).
"""

from __future__ import annotations

from ..frontend.typed import TypedProgram
from ..ir.dtypes import itemsize
from ..target.machine import Machine
from ..transform.as_gemm import GemmStatement

#: A one-GEMM program goes to the spine when its A, B and C together take more bytes
#: than this many L1 data caches (between the measurements above).
SPINE_L1_MULTIPLE = 2.5
#: L1's size where the machine does not say.
DEFAULT_L1_BYTES = 32 * 1024


def to_spine(stmt: GemmStatement, program: TypedProgram, machine: Machine) -> bool:
    """Whether the spine's GEMM, not the small path, should compute ``stmt``."""
    decls = program.decls
    elements = sum(decls[n].shape[0] * decls[n].shape[1]
                   for n in dict.fromkeys((stmt.a, stmt.b, stmt.out)))
    l1 = machine.cache(1)
    l1_bytes = l1.size if l1 is not None else DEFAULT_L1_BYTES
    return elements * itemsize(program.dtype) > SPINE_L1_MULTIPLE * l1_bytes
