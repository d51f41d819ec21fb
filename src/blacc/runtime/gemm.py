"""GEMM at run time: check the arguments, bring them to a layout the kernels take
without copying where possible, pick a plan, and call the compiled kernel.

Layouts used in place: any 2-D view whose strides are whole elements and one of
them is 1 (C order, Fortran order, transposed views, sub-matrices with a leading
dimension). Anything else (e.g. ``X[::2, ::3]``) is copied once into C order; an
output copied that way is written back after the call.

The kernels compute with a unit column stride in C; a C with a unit row stride is
handled as C^T = op(B)^T op(A)^T, which only swaps views.

A call whose arguments look like an earlier successful one (same dtypes, shapes, strides,
transposes, backend and strategy) takes a fast path (``repeat``): the compiled extension
(``gemmcall``) finds the earlier call in its table, gets the user's arrays as they are,
checks what memory safety depends on, and calls the kernel the earlier call chose.
Anything unusual (C possibly overlapping A or B, a read-only C, alpha == 0) falls back to
the checked path, which raises the errors.
"""

from __future__ import annotations

import ctypes
import functools
import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import AliasingError, ArgumentError, DTypeError, ShapeError
from ..ir.dtypes import float_type_of
from ..ir.kernel import Module
from ..ir.structured import Contraction
from ..strategy.gemm import STRATEGIES, Plan, plan_for
from ..strategy.intrinsic import matrix_kr, plan_contraction
from ..target.isa import Isa, isa_for
from ..target.machine import Machine, detect_machine
from ..transform.apply import apply
from ..transform.pipeline import lower
from .build import NativeKernel, build
from .gemmcall import (
    CHECK_OVERLAP,
    SWAP,
    TRANS_A,
    TRANS_B,
    UNIT_A,
    UNIT_B,
    UNIT_B_ROWS,
    UNIT_C,
    extension,
    gemm_caller,
)


@dataclass(frozen=True)
class Target:
    machine: Machine
    isa: Isa


@functools.cache
def host_target() -> Target:
    machine = detect_machine()
    return Target(machine, isa_for(machine))


@dataclass(frozen=True)
class GemmKernel:
    """One compiled GEMM kernel with every level it went through."""

    dtype: str
    plan: Plan
    op: Contraction
    levels: tuple[tuple[str, object], ...]  # (level name, Module)
    native: NativeKernel


def lowered_gemm(dtype: str, plan: Plan, isa: Isa, backend: str = "c", suffix: str = ""
                 ) -> tuple[Contraction, tuple[tuple[str, object], ...], Module]:
    """Apply the plan's schedule and lower it for ``isa`` and ``backend`` ('c' or
    'llvm'): the operation, every level it went through, and the final module. Its
    functions' names end in ``suffix``, but for the packing routines, which depend on
    the dtype and panel width only."""
    op = plan_contraction(plan, dtype)
    name = f"blacc_gemm_{dtype}_{plan.strategy.replace('-', '_')}{suffix}"
    scheduled = apply(op, plan.schedule, name=name, known_strides=dict(plan.known_strides))
    final, passes = lower(scheduled, isa, backend=backend, matrix_kr=matrix_kr(plan))
    return op, (("schedule", scheduled), *passes), final


@functools.lru_cache(maxsize=64)
def gemm_kernel(dtype: str, plan: Plan, isa: Isa, backend: str = "c") -> GemmKernel:
    """``lowered_gemm``, compiled with ``backend`` (memoized)."""
    op, levels, final = lowered_gemm(dtype, plan, isa, backend)
    return GemmKernel(dtype, plan, op, levels, build(final, isa, backend=backend))


# ----------------------------------------------------------------------------- arguments


def _matrix(x: object, name: str) -> np.ndarray:
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    if arr.ndim != 2:
        raise ShapeError(f"{name} must be a 2-D array, got {arr.ndim}-D with shape {arr.shape}")
    return arr


_NP_FLOAT_TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _float_type(d: np.dtype) -> str:
    """float_type_of with a dictionary hit for the two dtypes blacc computes in."""
    return _NP_FLOAT_TYPES.get(d) or float_type_of(d)


def _scalar(x: object, name: str) -> float:
    if type(x) is float:  # the common case, without the ABC check below
        return x
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise ArgumentError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
    return float(x)


def _usable_in_place(x: np.ndarray) -> bool:
    size = x.itemsize
    s0, s1 = x.strides
    return s0 % size == 0 and s1 % size == 0 and size in (abs(s0), abs(s1)) and (
        s0 == size or s1 == size)


def _unit(x: np.ndarray, dim: int) -> bool:
    """Whether ``x`` steps one element along ``dim``; a dimension of extent 1 is never
    stepped along, so any stride there counts (NumPy leaves such strides arbitrary, even in
    what ``ascontiguousarray`` returns)."""
    return x.strides[dim] == x.itemsize or x.shape[dim] == 1


def _in_place_or_copy(x: np.ndarray) -> np.ndarray:
    return x if _usable_in_place(x) else np.ascontiguousarray(x)


def _check_alias(c: np.ndarray, x: np.ndarray, name: str) -> None:
    if not np.may_share_memory(c, x):
        return
    try:
        overlap = np.shares_memory(c, x, max_work=100_000)
    except np.exceptions.TooHardError:
        overlap = True
    if overlap:
        raise AliasingError(f"C shares memory with {name}: the output must not overlap an input")


@dataclass(frozen=True)
class GemmCall:
    """A checked GEMM: C = alpha * a @ b + beta * C with ``a``, ``b`` = op(A), op(B) views."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    alpha: float
    beta: float
    dtype: str
    trans_a: bool
    trans_b: bool


def check_gemm(A: object, B: object, C: np.ndarray | None, alpha: object, beta: object,
               trans_a: bool, trans_b: bool) -> GemmCall:
    """Validate everything before anything is written; allocate C when it is None."""
    a, b = _matrix(A, "A"), _matrix(B, "B")
    alpha_f, beta_f = _scalar(alpha, "alpha"), _scalar(beta, "beta")
    dtype = _float_type(a.dtype)
    _float_type(b.dtype)
    if a.dtype != b.dtype:
        raise DTypeError(f"A is {a.dtype} but B is {b.dtype}: blacc does not mix dtypes")
    opa = a.T if trans_a else a
    opb = b.T if trans_b else b
    (m, ka), (kb, n) = opa.shape, opb.shape
    if ka != kb:
        raise ShapeError(f"op(A) is {m}x{ka} but op(B) is {kb}x{n}: inner dimensions "
                         f"{ka} and {kb} differ (A {a.shape}, B {b.shape}, "
                         f"trans_a={trans_a}, trans_b={trans_b})")
    if C is None:
        return GemmCall(opa, opb, np.empty((m, n), dtype=a.dtype), alpha_f, 0.0, dtype,
                        bool(trans_a), bool(trans_b))
    if not isinstance(C, np.ndarray):
        raise ArgumentError(f"C must be a NumPy array, got {type(C).__name__}")
    c = _matrix(C, "C")
    _float_type(c.dtype)
    if c.dtype != a.dtype:
        raise DTypeError(f"C is {c.dtype} but A and B are {a.dtype}: blacc does not mix dtypes")
    if c.shape != (m, n):
        raise ShapeError(f"C has shape {c.shape} but op(A) @ op(B) is {m}x{n}")
    if not c.flags.writeable:
        raise ArgumentError("C is read-only: gemm writes its result into C")
    _check_alias(c, a, "A")
    _check_alias(c, b, "B")
    return GemmCall(opa, opb, c, alpha_f, beta_f, dtype, bool(trans_a), bool(trans_b))


# ----------------------------------------------------------------------------- execution


def _ptr(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]  # cheaper than x.ctypes.data


#: (target, backend, strategy, dtype, m, n, k, unit column strides of A and B) -> compiled
#: kernel, so the per-call cost of choosing is one dict lookup. Bounded: cleared past the
#: limit. The key holds the target's id (hashing a Target costs microseconds); the targets
#: keyed are kept alive in ``_KEYED_TARGETS``, so that no other target can take that id.
_DISPATCH: dict[tuple, tuple[NativeKernel, bool, int, int | None]] = {}
_KEYED_TARGETS: dict[int, Target] = {}
_DISPATCH_LIMIT = 4096

_PACKING_FAILED = "blacc: the GEMM kernel could not allocate its packing buffers"

#: The extension's flags for the strides a plan fixes (all of them unit column strides).
_UNIT_FLAGS = {("A_s1", 1): UNIT_A, ("B_s1", 1): UNIT_B, ("C_s1", 1): UNIT_C,
               ("B_s0", 1): UNIT_B_ROWS}


def _unit_flags(plan: Plan) -> int | None:
    """The extension's flags that check the strides ``plan`` compiled in; None if it fixes
    one the extension cannot check."""
    flags = 0
    for known in plan.known_strides:
        if known not in _UNIT_FLAGS:
            return None
        flags |= _UNIT_FLAGS[known]
    return flags


def dispatch(tgt: Target, backend: str, strategy: str, dtype: str, m: int, n: int, k: int,
             a_unit: bool, b_unit: bool, b_unit_rows: bool = False
             ) -> tuple[NativeKernel, bool, int, int | None]:
    """The compiled kernel for one problem shape on ``tgt`` with ``backend``, whether its
    entry takes the extents (fixed-size kernels have them compiled in), its address, and
    the extension's flags that check the strides it was compiled for."""
    key = (id(tgt), backend, strategy, dtype, m, n, k, a_unit, b_unit, b_unit_rows)
    found = _DISPATCH.get(key)
    if found is None:
        plan = plan_for(strategy, m, n, k, dtype, machine=tgt.machine, isa=tgt.isa,
                        a_unit_cols=a_unit, b_unit_cols=b_unit, b_unit_rows=b_unit_rows)
        kernel = gemm_kernel(dtype, plan, tgt.isa, backend).native
        entry = kernel.module.function(kernel.module.entry)
        address = ctypes.cast(kernel.function, ctypes.c_void_p).value or 0
        found = (kernel, entry.params[0].dtype == "i64", address, _unit_flags(plan))
        if len(_DISPATCH) >= _DISPATCH_LIMIT:
            _DISPATCH.clear()
            _KEYED_TARGETS.clear()
        _KEYED_TARGETS[id(tgt)] = tgt
        _DISPATCH[key] = found
    return found


class Remembered(NamedTuple):
    """What a remembered call holds (``gemmcall.extension().remember``): the kernel, so
    that the code at ``address`` stays loaded while the call can be repeated."""

    kernel: NativeKernel
    address: int


#: Routes: the backend and strategy a call asks for, numbered for the extension's table;
#: 0 is the defaults ($BLACC_BACKEND, read once, and 'auto').
_ROUTES: dict[tuple[object, object], int] = {(None, "auto"): 0}


def route(backend: object, strategy: object) -> int:
    """The number of a (backend, strategy) request; the same for the same request."""
    if backend is None and strategy == "auto":
        return 0
    try:
        return _ROUTES.setdefault((backend, strategy), len(_ROUTES))
    except TypeError:  # unhashable: refused later by the checked path
        return -1


def repeat(path: int, A: object, B: object, C: object, alpha: object, beta: object,
           trans_a: object, trans_b: object) -> np.ndarray | None:
    """C (or a new array) computed the way an earlier call with the same route, transposes,
    dtypes, shapes and strides was, in one extension call; None when the checked path must
    run: no such call, a C that may overlap A or B or is read-only, alpha == 0, arguments
    of other types. Nothing is written then."""
    ext = extension()
    if ext is None:
        return None
    done = ext.fast(path, A, B, C, alpha, beta, trans_a, trans_b)
    if type(done) is int:
        raise MemoryError(_PACKING_FAILED)
    return done


def remembered(A: np.ndarray, B: np.ndarray, C: np.ndarray | None, trans_a: bool = False,
               trans_b: bool = False, *, backend: str | None = None,
               strategy: str = "auto") -> Remembered | None:
    """The remembered call ``repeat`` would repeat for these arguments, or None."""
    ext = extension()
    return None if ext is None else ext.lookup(route(backend, strategy), A, B, C, trans_a,
                                               trans_b)


def forget_calls() -> None:
    """Forget every remembered call (after the target or backend changed)."""
    if (ext := extension()) is not None:
        ext.forget()


def run_gemm(call: GemmCall, target: Target | None = None, backend: str = "c",
             strategy: str = "auto",
             remember: tuple[int, object, object, object] | None = None) -> np.ndarray:
    """Execute a checked call with ``backend`` ('c' or 'llvm') and ``strategy`` (one of
    ``strategy.gemm.STRATEGIES``); returns the user's C. ``remember``: the call's route and
    its A, B and C as given (C None when it was allocated), under which ``repeat`` can
    redo it when no copy was needed."""
    if strategy not in STRATEGIES:
        raise ArgumentError(f"unknown strategy {strategy!r}: choose one of "
                            f"{', '.join(STRATEGIES)}")
    a, b, c = call.a, call.b, call.c
    m, n = c.shape
    k = a.shape[1]
    if m == 0 or n == 0:
        return c
    if k == 0 or call.alpha == 0:
        # Nothing to multiply: C = beta * C, never reading C when beta == 0.
        if call.beta == 0:
            c[...] = 0
        elif call.beta != 1:
            np.multiply(c, c.dtype.type(call.beta), out=c)
        return c
    out = c
    if not _usable_in_place(c):
        out = np.ascontiguousarray(c) if call.beta != 0 else np.empty(c.shape, c.dtype)
    swap = not _unit(out, 1)
    if swap:  # unit row stride: compute C^T = B^T A^T
        a, b, out_k = b.T, a.T, out.T
    else:
        out_k = out
    a_in, b_in = _in_place_or_copy(a), _in_place_or_copy(b)
    copied = a_in is not a or b_in is not b or out is not c
    a, b = a_in, b_in
    mk, nk = out_k.shape
    size = a.itemsize
    kernel, takes_extents, address, unit = dispatch(
        target or host_target(), backend, strategy, call.dtype, mk, nk, k,
        _unit(a, 1), _unit(b, 1), _unit(b, 0))
    callers = gemm_caller()
    if callers is not None:
        # the extension checks the strides the kernel was compiled for, as a repeat will
        status = callers[call.dtype](address, takes_extents, call.alpha, a, b, call.beta, out_k,
                                     unit or 0)
        if status == 0 and remember is not None and unit is not None and not copied:
            # the overlap check is a few comparisons in C; a fresh C always passes it
            flags = (unit | CHECK_OVERLAP | (TRANS_A if call.trans_a else 0)
                     | (TRANS_B if call.trans_b else 0) | (SWAP if swap else 0))
            path, A, B, C = remember
            extension().remember(path, A, B, C, call.trans_a, call.trans_b,
                                 Remembered(kernel, address), address, takes_extents, flags,
                                 c.dtype)
    else:  # no C compiler for the extension: ctypes
        extents = (mk, nk, k) if takes_extents else ()
        status = kernel.function(*extents, call.alpha, _ptr(a), a.strides[0] // size,
                                 a.strides[1] // size, _ptr(b), b.strides[0] // size,
                                 b.strides[1] // size, call.beta, _ptr(out_k),
                                 out_k.strides[0] // size, out_k.strides[1] // size)
    if status != 0:
        raise MemoryError(_PACKING_FAILED)
    if out is not c:
        c[...] = out
    return c
