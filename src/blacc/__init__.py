"""blacc — a basic linear algebra compiler: fast native kernels from Python.

    import blacc
    C = blacc.gemm(A, B)                    # BLAS semantics, float32/float64
    print(blacc.explain(m=1000, n=1000, k=1000, dtype="f32"))
    k = blacc.compile("y = A*x + y", A=blacc.Matrix(4, 4), x=blacc.Vector(4), y=blacc.Vector(4))
"""

__version__ = "0.1.0"

from .api import Explanation, explain, gemm, matmul  # noqa: E402
from .blacs import compile, emit  # noqa: E402
from .errors import (  # noqa: E402
    AliasingError,
    ArgumentError,
    BlaccError,
    CompilerError,
    CompilerNotFoundError,
    DTypeError,
    ParseError,
    ScheduleError,
    ShapeError,
    TypeCheckError,
)
from .frontend import Matrix, Scalar, Vector  # noqa: E402

__all__ = [
    "AliasingError", "ArgumentError", "BlaccError", "CompilerError", "CompilerNotFoundError",
    "DTypeError", "Explanation", "Matrix", "ParseError", "Scalar", "ScheduleError", "ShapeError",
    "TypeCheckError", "Vector", "compile", "emit", "explain", "gemm", "matmul",
]
