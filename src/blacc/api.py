"""The public Python API: BLAS-style calls on NumPy arrays, and ``explain``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import printer
from .ir.dtypes import float_type_of
from .ir.structured import Contraction
from .ir.structured import matmul as matmul_op
from .runtime.build import resolve_backend
from .runtime.gemm import check_gemm, gemm_kernel, host_target, repeat, route, run_gemm
from .strategy.gemm import Plan, choose
from .transform.schedule import Schedule, show


def gemm(A: np.ndarray, B: np.ndarray, C: np.ndarray | None = None, *, alpha: float = 1.0,
         beta: float = 0.0, trans_a: bool = False, trans_b: bool = False,
         backend: str | None = None, strategy: str = "auto") -> np.ndarray:
    """C = alpha * op(A) @ op(B) + beta * C, op(X) = X.T when trans_X; float32 or float64.

    When C is given it is updated in place and returned; otherwise a new C-ordered array
    is returned (and beta is irrelevant). beta == 0 never reads C. Raises a subclass of
    ``blacc.BlaccError`` naming the problem, before anything is written, for bad shapes,
    dtypes, a read-only C or a C that overlaps A or B.

    ``backend``: 'c' (system C compiler), 'llvm' (in-process JIT through llvmlite) or
    'auto' (LLVM when llvmlite loads, else C); default ``$BLACC_BACKEND`` or 'auto'.
    ``strategy``: 'auto' (chosen per shape), or one of seed 000's: 'blis' (Tiling+Packing),
    'tiling' (register tiles over the operands in place), 'intrinsic' (the whole product
    as LLVM matrix-multiply calls, compiled for this exact shape), 'tiling-intrinsic'."""
    path = route(backend, strategy)
    if (done := repeat(path, A, B, C, alpha, beta, trans_a, trans_b)) is not None:
        return done
    return _checked(path, A, B, C, alpha, beta, trans_a, trans_b, backend, strategy)


def matmul(A: np.ndarray, B: np.ndarray, out: np.ndarray | None = None, *,
           backend: str | None = None) -> np.ndarray:
    """``A @ B`` for 2-D float32/float64 arrays, like ``numpy.matmul``; ``out`` if given."""
    path = route(backend, "auto")  # gemm's steps inline: a small product spares a call
    if (done := repeat(path, A, B, out, 1.0, 0.0, False, False)) is not None:
        return done
    return _checked(path, A, B, out, 1.0, 0.0, False, False, backend, "auto")


def _checked(path: int, A: object, B: object, C: object, alpha: object, beta: object,
             trans_a: bool, trans_b: bool, backend: str | None, strategy: str) -> np.ndarray:
    """A call the fast path did not take: checked, run, and remembered under ``path``."""
    chosen = resolve_backend(backend)
    call = check_gemm(A, B, C, alpha, beta, trans_a, trans_b)
    return run_gemm(call, backend=chosen, strategy=strategy, remember=(path, A, B, C))


@dataclass(frozen=True)
class Explanation:
    """What blacc does for one GEMM: strategy, every IR level, the C source."""

    shape: tuple[int, int, int]
    dtype: str
    target: str
    backend: str
    plan: Plan
    contraction: Contraction
    schedule: Schedule
    levels: tuple[tuple[str, str], ...]
    source: str
    library: str

    def __str__(self) -> str:
        m, n, k = self.shape
        parts = [
            f"GEMM {m}x{n}x{k} {self.dtype} on {self.target}, {self.backend} backend",
            f"strategy: {self.plan.describe()}",
            "",
            "== structured operation ==",
            str(self.contraction),
            "",
            "== schedule ==",
            show(self.schedule),
        ]
        for name, text in self.levels:
            parts += ["", f"== kernel IR: {name} ==", text]
        title = "C" if self.backend == "c" else "LLVM IR"
        parts += ["", f"== {title} ==", self.source, f"(artifact: {self.library})"]
        return "\n".join(parts)


def explain(A: np.ndarray | None = None, B: np.ndarray | None = None, *, m: int | None = None,
            n: int | None = None, k: int | None = None, dtype: object = "f32",
            trans_a: bool = False, trans_b: bool = False,
            backend: str | None = None) -> Explanation:
    """Show the strategy, its parameters, each IR level and the C for a GEMM of these
    operands (or of size m x n x k, with C-ordered operands)."""
    if A is not None and B is not None:
        call = check_gemm(A, B, None, 1.0, 0.0, trans_a, trans_b)
        (m, k), n, dt = call.a.shape, call.b.shape[1], call.dtype
        size = call.b.itemsize
        a_unit = call.a.strides[1] == size
        b_unit, b_rows = call.b.strides[1] == size, call.b.strides[0] == size
    else:
        if m is None or n is None or k is None:
            raise TypeError("explain needs A and B, or m, n and k")
        dt = float_type_of(dtype)
        a_unit, b_unit, b_rows = not trans_a, not trans_b, trans_b or n == 1
    tgt = host_target()
    plan = choose(m, n, k, dt, machine=tgt.machine, isa=tgt.isa, b_unit_cols=b_unit,
                  a_unit_cols=a_unit, b_unit_rows=b_rows)
    chosen = resolve_backend(backend)
    kern = gemm_kernel(dt, plan, tgt.isa, chosen)
    levels = tuple((name, printer.module(mod)) for name, mod in kern.levels)
    return Explanation((m, n, k), dt, f"{tgt.machine.name} ({tgt.isa.name})", chosen, plan,
                       matmul_op(dt, trans_a=trans_a, trans_b=trans_b), plan.schedule, levels,
                       kern.native.source, kern.native.artifact)
