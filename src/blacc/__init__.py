"""blacc — a basic linear algebra compiler: fast native kernels from Python.

    import blacc
    C = blacc.gemm(A, B)                    # BLAS semantics, float32/float64
    print(blacc.explain(m=1000, n=1000, k=1000, dtype="f32"))
"""

__version__ = "0.1.0"

from .api import Explanation, explain, gemm, matmul  # noqa: E402
from .errors import (  # noqa: E402
    AliasingError,
    ArgumentError,
    BlaccError,
    CompilerError,
    CompilerNotFoundError,
    DTypeError,
    ScheduleError,
    ShapeError,
)

__all__ = [
    "AliasingError", "ArgumentError", "BlaccError", "CompilerError", "CompilerNotFoundError",
    "DTypeError", "Explanation", "ScheduleError", "ShapeError", "explain", "gemm", "matmul",
]
