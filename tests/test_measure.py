"""runtime.measure: candidate kernels timed against each other in a C loop (what the
measuring searches of blacc.compile rank by)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from blacc.errors import ArgumentError
from blacc.runtime.build import load_c
from blacc.runtime.measure import time_kernels, timing_unit
from blacc.runtime.signature import ArgSpec
from blacc.target.isa import GENERIC

SPECS = (ArgSpec("alpha", "scalar", "f32", "in"), ArgSpec("x", "array", "f32", "in", 3, 1),
         ArgSpec("y", "array", "f32", "inout", 3, 1))
PARAMS = "float alpha, const float *restrict x, float *restrict y"

# y = alpha*x + y, and the same after a chain of 400 dependent multiply-adds on y[0]
# (hundreds of cycles, where the first takes a few)
FAST = f"int kern({PARAMS}) {{ for (int i = 0; i < 3; i++) y[i] += alpha * x[i]; return 0; }}"
SLOW = (f"int kern({PARAMS}) {{ float t = y[0];"
        " for (int i = 0; i < 400; i++) t = t * 0.5f + x[i % 3];"
        " y[0] = t; for (int i = 1; i < 3; i++) y[i] += alpha * x[i]; return 0; }")


def test_a_slow_kernel_is_timed_slower():
    both = FAST + SLOW.replace("kern(", "slow(")  # one translation unit, two kernels
    fast, slow, fast_again = time_kernels(
        [(FAST, "kern", GENERIC), (both, "slow", GENERIC), (both, "kern", GENERIC)],
        SPECS, rounds=3, min_batch_s=1e-3)
    assert 0 < fast < 1e-6 and 0 < fast_again < 1e-6
    assert slow > 10 * max(fast, fast_again)


def test_nothing_to_time():
    assert time_kernels([], SPECS) == []


def test_operands_read_and_written_are_restored_before_each_batch():
    """A kernel adding 1 to y[0] (in and out) on every call sees y[0] grow by at most one
    batch's calls over its first value: y is put back before each batch."""
    count = ("static long calls; static float first, most;\n"
             f"int kern({PARAMS}) {{ (void)alpha; (void)x;\n"
             "    if (calls++ == 0) first = most = y[0];\n"
             "    y[0] += 1.0f; if (y[0] > most) most = y[0]; return 0; }\n"
             "long calls_made(void) { return calls; }\n"
             "double growth(void) { return (double)most - (double)first; }")
    rounds = 5
    time_kernels([(count, "kern", GENERIC)], SPECS, rounds=rounds, min_batch_s=1e-4)
    lib = load_c(timing_unit(count, ["kern"], SPECS), GENERIC)  # the library just timed
    lib.growth.restype = ctypes.c_double
    calls = lib.calls_made()
    assert calls > 2 * rounds
    assert 1 <= lib.growth() <= calls / rounds


def test_the_timer_calls_the_kernel_reps_times():
    count = ("static long calls;\n"
             f"int kern({PARAMS}) {{ (void)alpha; (void)x; (void)y; calls++; return 0; }}\n"
             "long calls_made(void) { return calls; }")
    lib = load_c(timing_unit(count, ["kern"], SPECS), GENERIC)
    x, y = np.zeros(3, np.float32), np.zeros(3, np.float32)
    timer = lib.blacc_time_kern
    timer.restype = ctypes.c_double
    assert timer(ctypes.c_long(1000), ctypes.c_float(1.0), ctypes.c_void_p(x.ctypes.data),
                 ctypes.c_void_p(y.ctypes.data)) >= 0
    assert lib.calls_made() == 1000


def test_the_timer_starts_on_a_cache_line_and_calls_the_kernel_directly():
    """As a program linking the kernel would: not through the shared object's PLT, and
    from code whose place in a cache line is fixed (calls of a nanosecond or two ranked
    differently by where the timer happened to start)."""
    # the timer follows a function that starts on a line and ends 20 bytes into it,
    # which leaves the next 16-byte boundary (gcc's default) 32 bytes into the line
    pad = '__attribute__((aligned(64))) void pad(void) { __asm__(".skip 19"); }\n'
    text = timing_unit(FAST + "\n" + pad, ["kern"], SPECS)
    assert 'alias("kern")' in text and "blacc_direct_kern(a0, a1, a2);" in text
    lib = load_c(text, GENERIC)
    assert ctypes.cast(lib.pad, ctypes.c_void_p).value % 64 == 0
    assert ctypes.cast(lib.blacc_time_kern, ctypes.c_void_p).value % 64 == 0


def test_only_floating_operands():
    with pytest.raises(ArgumentError, match="float32 and float64"):
        timing_unit("", ["kern"], (ArgSpec("n", "scalar", "i64", "in"),))
