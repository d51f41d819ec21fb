"""Measured peak floating-point throughput of one core.

A GEMM benchmark number means little on its own; as a fraction of what the core can do
it says how much is left on the table. The peak is *measured*, not looked up: a small C
loop keeps enough independent FMA chains in flight to saturate the FMA pipes, and is
timed from Python. Comparing that with the ISA's theoretical flops per cycle also gives
the clock the core actually ran at (turbo, throttling and VMs make the nominal one
unreliable).
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from blacc.backend.compiler import compile_shared, find_compiler
from blacc.bench.timing import measure_interleaved
from blacc.target.isa import isa_for
from blacc.target.machine import Machine, detect_machine

__all__ = ["IsaVariant", "Peak", "measure_peak", "select_variant"]

#: Loop trips per call: about 2 ms on a 3 GHz AVX2 core, so ctypes overhead is negligible.
_ITERATIONS = 1 << 20

_SOURCE = r"""
/* 12 independent accumulators: FMA latency (4-5 cycles) x 2 FMA pipes needs >= 10. */
#define NACC 12
#if defined(BLACC_PEAK_AVX512)
#include <immintrin.h>
typedef __m512 vf;
typedef __m512d vd;
#define F_LANES 16
#define D_LANES 8
#define F_SET1(x) _mm512_set1_ps(x)
#define D_SET1(x) _mm512_set1_pd(x)
#define F_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define D_FMA(a, b, c) _mm512_fmadd_pd(a, b, c)
#elif defined(BLACC_PEAK_AVX2)
#include <immintrin.h>
typedef __m256 vf;
typedef __m256d vd;
#define F_LANES 8
#define D_LANES 4
#define F_SET1(x) _mm256_set1_ps(x)
#define D_SET1(x) _mm256_set1_pd(x)
#define F_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define D_FMA(a, b, c) _mm256_fmadd_pd(a, b, c)
#else
/* GCC/Clang vector extensions: SSE2 on x86-64, NEON on aarch64, scalar elsewhere. */
typedef float vf __attribute__((vector_size(16)));
typedef double vd __attribute__((vector_size(16)));
#define F_LANES 4
#define D_LANES 2
#define F_SET1(x) ((vf){x, x, x, x})
#define D_SET1(x) ((vd){x, x})
#define F_FMA(a, b, c) ((a) * (b) + (c))
#define D_FMA(a, b, c) ((a) * (b) + (c))
#endif

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

int blacc_peak_accumulators(void) { return NACC; }
int blacc_peak_lanes_f32(void) { return F_LANES; }
int blacc_peak_lanes_f64(void) { return D_LANES; }

/* acc = acc * m + a converges to a / (1 - m): values stay normal, never overflow. */
#define BODY(T, SET1, FMA, LANES, ELEM)                                   \
    T vm = SET1(m), va = SET1(a);                                         \
    REP12(DECL)                                                           \
    for (long i = 0; i < iters; ++i) {                                    \
        REP12(STEP)                                                       \
    }                                                                     \
    T total = acc0;                                                       \
    REP12(SUM)                                                            \
    ELEM out[LANES];                                                      \
    __builtin_memcpy(out, &total, sizeof out);                            \
    double s = 0.0;                                                       \
    for (int l = 0; l < LANES; ++l) s += out[l];                          \
    return s;

#define SUM(j) total = total + acc##j;

double blacc_peak_f32(long iters, float m, float a) {
#define DECL(j) vf acc##j = F_SET1((float)(j) * 0.05f);
#define STEP(j) acc##j = F_FMA(acc##j, vm, va);
    BODY(vf, F_SET1, F_FMA, F_LANES, float)
#undef DECL
#undef STEP
}

double blacc_peak_f64(long iters, double m, double a) {
#define DECL(j) vd acc##j = D_SET1((double)(j) * 0.05);
#define STEP(j) acc##j = D_FMA(acc##j, vm, va);
    BODY(vd, D_SET1, D_FMA, D_LANES, double)
#undef DECL
#undef STEP
}
"""


@dataclass(frozen=True)
class IsaVariant:
    """How to build the throughput loop for an ISA, and what that ISA can do per cycle.

    ``flops_per_cycle`` is None where the pipe count is not fixed by the ISA.
    """

    name: str
    flags: tuple[str, ...]
    flops_per_cycle: dict[str, int] | None


# AVX2+FMA: 2 FMA pipes x 8 f32 lanes x 2 flops (multiply and add) = 32; f64 has 4 lanes.
_AVX2 = IsaVariant(
    "avx2+fma", ("-O2", "-DBLACC_PEAK_AVX2", "-mavx2", "-mfma"), {"float32": 32, "float64": 16}
)
# AVX-512: 16 f32 lanes; two 512-bit FMA pipes on Xeons since Skylake-SP (Gold 6xxx,
# Platinum) and on Ice Lake and Sapphire Rapids servers. A one-pipe part (Xeon Silver,
# client cores) shows an implied clock of half its real one.
_AVX512 = IsaVariant(
    "avx512", ("-O2", "-DBLACC_PEAK_AVX512", "-mavx512f", "-mfma"),
    {"float32": 64, "float64": 32},
)
# Zen 4 runs a 512-bit FMA over its two 256-bit pipes (``Machine.vector_datapath``):
# the same 32 f32 flops a cycle as AVX2.
_AVX512_ON_256 = IsaVariant("avx512", _AVX512.flags, {"float32": 32, "float64": 16})
# x86-64 without FMA: SSE2, one multiply and one add port, 4 f32 lanes each.
_SSE2 = IsaVariant("sse2", ("-O2",), {"float32": 8, "float64": 4})
# Other architectures: vector extensions; the pipe count varies by core.
_GENERIC = IsaVariant("generic", ("-O2",), None)


def select_variant(machine: Machine) -> IsaVariant:
    """The widest throughput loop this machine can run: the ISA blacc generates code for
    (``target.isa.isa_for``), so the peak is of the code it runs."""
    isa = isa_for(machine).name
    if isa == "avx512":
        return _AVX512_ON_256 if machine.vector_datapath == 256 else _AVX512
    if isa == "avx2":
        return _AVX2
    if machine.arch.lower() in ("x86_64", "amd64"):
        return _SSE2
    return _GENERIC


@dataclass(frozen=True)
class Peak:
    """Measured peak flops/s per dtype name ('float32', 'float64') of one core."""

    isa: str
    flops_per_s: dict[str, float]
    flops_per_cycle: dict[str, int] | None

    def of(self, dtype: npt.DTypeLike) -> float:
        """Peak flops/s for ``dtype``."""
        return self.flops_per_s[np.dtype(dtype).name]

    @property
    def implied_clock_hz(self) -> dict[str, float] | None:
        """Clock the core ran at during measurement, per dtype; None if per-cycle is unknown."""
        if self.flops_per_cycle is None:
            return None
        return {name: fps / self.flops_per_cycle[name] for name, fps in self.flops_per_s.items()}

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view."""
        return {
            "isa": self.isa,
            "flops_per_s": dict(self.flops_per_s),
            "theoretical_flops_per_cycle": self.flops_per_cycle,
            "implied_clock_hz": self.implied_clock_hz,
        }


def _load(variant: IsaVariant) -> ctypes.CDLL:
    """Compile the throughput loop into a temp dir and load it (the file may go after)."""
    compiler = find_compiler(os.environ.get("CC"))
    with tempfile.TemporaryDirectory(prefix="blacc-peak-") as tmp:
        path = Path(tmp) / "peak.so"
        compile_shared(compiler, _SOURCE, path, variant.flags)
        lib = ctypes.CDLL(str(path))
    lib.blacc_peak_f32.argtypes = (ctypes.c_long, ctypes.c_float, ctypes.c_float)
    lib.blacc_peak_f32.restype = ctypes.c_double
    lib.blacc_peak_f64.argtypes = (ctypes.c_long, ctypes.c_double, ctypes.c_double)
    lib.blacc_peak_f64.restype = ctypes.c_double
    return lib


@functools.lru_cache(maxsize=1)
def measure_peak() -> Peak:
    """Measure this core's peak f32 and f64 flops/s; done once per process.

    Uses the fastest sample (not the median): peak is an upper bound, and interference
    only ever slows a sample down.
    """
    variant = select_variant(detect_machine())
    lib = _load(variant)
    m, a = 0.999, 0.001
    stats = measure_interleaved(
        {
            "float32": lambda: lib.blacc_peak_f32(_ITERATIONS, m, a),
            "float64": lambda: lib.blacc_peak_f64(_ITERATIONS, m, a),
        },
        min_sample_s=0.02,
        samples=9,
    )
    lanes = {"float32": lib.blacc_peak_lanes_f32(), "float64": lib.blacc_peak_lanes_f64()}
    accumulators = lib.blacc_peak_accumulators()
    flops = {name: _ITERATIONS * accumulators * lanes[name] * 2 / stats[name].min for name in stats}
    return Peak(isa=variant.name, flops_per_s=flops, flops_per_cycle=variant.flops_per_cycle)
