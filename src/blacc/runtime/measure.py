"""Time kernels of one signature against each other in a C loop.

A fixed-size kernel runs for a few nanoseconds; called from Python, each call costs
~100 ns more, so timings taken there rank the call, not the kernel. Here each kernel gets
a timer in its own translation unit, a C loop that calls it back to back, directly, as a
user's program calls an external function (through a function pointer, a 2 x 2 product
that takes 0.76 ns ran 0.97 ns, as slow as one that takes 0.97 ns called directly). The
kernel is kept out of line, so the loop cannot hoist its work. Batches last at least
``min_batch_s``; they are taken round-robin over the kernels for ``rounds`` rounds, so
that drift hits all alike, and the operands a kernel reads and writes are restored
before each. The result is each kernel's median over the rounds.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backend import c as c_backend
from ..errors import ArgumentError
from ..ir import kernel as k
from ..target.isa import Isa
from .build import load_c
from .signature import INOUT, ArgSpec

__all__ = ["time_kernels", "timing_unit"]

_NP_TYPE = {"f32": np.float32, "f64": np.float64}
#: Calibration stops growing a batch here.
_MAX_REPEATS = 1 << 28


def _prototype(name: str, specs: Sequence[ArgSpec], status: bool = True) -> str:
    """``int name(<operands a0, a1, ...>)`` (``void`` without ``status``), printed as the
    C backend prints an entry."""
    params = tuple(k.Param(f"a{i}", s.dtype, pointer=s.by_pointer, const=not s.written)
                   for i, s in enumerate(specs))
    return c_backend.signature(k.Function(name, params, (), exported=True, status=status))


def timing_unit(source: str, entries: Sequence[str], specs: Sequence[ArgSpec],
                status: bool | Mapping[str, bool] = True) -> str:
    """``source`` (C defining the functions ``entries``, each taking ``specs``; returning
    an int, or nothing without ``status``, given for all or by entry) with a timer per
    entry: ``double blacc_time_<entry>(long reps, <operands>)``, the seconds ``reps``
    back-to-back calls take (thread CPU time)."""
    if any(s.dtype not in _NP_TYPE for s in specs):
        raise ArgumentError("kernels are timed on float32 and float64 operands only")

    def returns(entry: str) -> bool:
        return status if isinstance(status, bool) else status[entry]

    timer = _prototype("blacc_time", specs)
    params = timer[timer.index("(") + 1:-1]
    args = ", ".join(f"a{i}" for i in range(len(specs)))
    head = "\n".join([
        "#define _POSIX_C_SOURCE 199309L",
        "#include <time.h>",
        # GCC's noipa also keeps what it learns of the kernel out of the timing loop
        "#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8",
        "#define BLACC_OUT_OF_LINE __attribute__((noinline, noipa))",
        "#elif defined(__GNUC__)",
        "#define BLACC_OUT_OF_LINE __attribute__((noinline))",
        "#else",
        "#define BLACC_OUT_OF_LINE",
        "#endif",
        *(f"BLACC_OUT_OF_LINE {_prototype(e, specs, returns(e))};" for e in entries),
        "static double blacc_seconds(void) {",
        "    struct timespec t;",
        "    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);",
        "    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;",
        "}"])
    # The timer starts on a cache line, and so does its loop; it calls the kernel
    # directly, through a hidden alias: in a shared object a call to an exported
    # function goes through the PLT. Both as a user's program linking the kernel calls
    # it (C = A*B 4 x 4 x 4 f32, AVX-512's kernel 1.0 ns a call there and AVX2's 1.5:
    # timed here 1.47-2.12 and 2.05-2.45 ns over four seeds before, 1.27-1.54 and
    # 2.00-2.06 in one run after and 1.29-1.66 and 1.58-1.67 in another).
    tail = "\n".join([
        "#if defined(__GNUC__) && !defined(__clang__)",
        '#define BLACC_TIMER __attribute__((aligned(64), optimize("align-loops=64")))',
        "#elif defined(__GNUC__)",
        "#define BLACC_TIMER __attribute__((aligned(64)))",
        "#else",
        "#define BLACC_TIMER",
        "#endif",
        *(line for e in entries for line in (
            "#if defined(__GNUC__) && defined(__ELF__)",
            f"extern __typeof__({e}) blacc_direct_{e}",
            f'    __attribute__((alias("{e}"), visibility("hidden")));',
            "#else",
            f"#define blacc_direct_{e} {e}",
            "#endif"))])
    timers = "\n".join(
        f"BLACC_TIMER double blacc_time_{e}(long reps, {params}) {{\n"
        f"    double start = blacc_seconds();\n"
        f"    for (long q = 0; q < reps; q++)\n"
        f"        blacc_direct_{e}({args});\n"
        f"    return blacc_seconds() - start;\n"
        f"}}" for e in entries)
    return f"{head}\n{source}\n{tail}\n{timers}\n"


def _operand(s: ArgSpec, rng: np.random.Generator) -> np.ndarray | float:
    """Uniform values in [-1, 1); arrays start on a 64-byte boundary, like the operands
    of a C program that aligns its data."""
    if not s.by_pointer:
        return 0.75
    dt = _NP_TYPE[s.dtype]
    per_line = 64 // np.dtype(dt).itemsize
    raw = np.empty(s.extent + per_line, dt)
    skip = (-raw.ctypes.data % 64) // np.dtype(dt).itemsize
    a = raw[skip:skip + s.extent]
    a[:] = rng.uniform(-1, 1, s.extent)
    return a


def time_kernels(kernels: Sequence[tuple[str, str, Isa]], specs: Sequence[ArgSpec], *,
                 rounds: int = 7, min_batch_s: float = 2e-3, seed: int = 0,
                 status: bool | Mapping[str, bool] = True) -> list[float]:
    """Median seconds per call of each kernel: ``kernels`` are (C source, function name,
    ISA), each function taking parameters ``specs`` (and returning an int status, or
    nothing without ``status``, given for all or by function name); kernels may share a
    source (one translation unit defining several). Each source is compiled with its
    timers (``timing_unit``; in parallel, through the kernel cache), and the kernels timed
    interleaved."""
    if not kernels:
        return []
    units = {}
    for source, entry, isa in kernels:
        units.setdefault((source, isa), []).append(entry)
    texts = [(timing_unit(source, entries, specs, status), isa)
             for (source, isa), entries in units.items()]
    with ThreadPoolExecutor(max_workers=min(len(texts), os.cpu_count() or 1)) as pool:
        libs = dict(zip(units, pool.map(lambda unit: load_c(*unit), texts), strict=True))
    timers = []
    for source, entry, isa in kernels:
        timer = getattr(libs[source, isa], f"blacc_time_{entry}")
        timer.restype = ctypes.c_double
        timers.append(timer)
    rng = np.random.default_rng(seed)
    operands = [_operand(s, rng) for s in specs]
    args = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray)
            else np.ctypeslib.as_ctypes_type(_NP_TYPE[s.dtype])(a)
            for a, s in zip(operands, specs, strict=True)]
    restore = [(a, a.copy()) for a, s in zip(operands, specs, strict=True) if s.role == INOUT]

    def batch(i: int, reps: int) -> float:
        for a, saved in restore:
            np.copyto(a, saved)
        return timers[i](ctypes.c_long(reps), *args)

    reps = 1
    while reps < _MAX_REPEATS:
        seconds = batch(0, reps)
        if seconds >= min_batch_s:
            break
        reps = max(2 * reps, int(reps * 1.2 * min_batch_s / max(seconds, 1e-9)))
    times = np.zeros((rounds, len(kernels)))
    for r in range(rounds):
        for j in range(len(kernels)):
            i = (j + r) % len(kernels)  # each round starts with another kernel
            times[r, i] = batch(i, reps) / reps
    return np.median(times, axis=0).tolist()
