"""LGen (CGO'14) section 5 on this machine: cases, code generation, build and run.

This module knows the benchmark cases (the BLACs of the paper's Figures 4-7 and their
shapes), writes for each *series* (one BLAC, one shape family, one dtype; e.g. ``y = A*x``
with A n x 4 in f32, for all n) a directory with

* ``bl_<case>.c/.h``  blacc's standalone kernel per case (``blacc.emit``),
* ``loops.c``         straightforward fixed-size C loops per case (the "handwritten,
                      fixed size" code of the paper) and a double-precision reference,
* ``eigen.cpp``       Eigen with fixed-size ``Map``s and ``noalias`` (optional peer),
* ``harness.c``       the driver: OpenBLAS (cblas) and LIBXSMM calls inline (optional
                      peers), verification of every implementation against the float64
                      reference loops, then calibrated, interleaved timing, JSON lines out,

compiles and links it into one executable, and runs it. ``run.py`` is the command line.

Every implementation is called through an opaque call (a separate translation unit or
a library) inside a timing loop in C, so nothing is hoisted out of the loop and no Python
overhead is measured.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

IMPLS = ("blacc", "loops", "openblas", "eigen", "libxsmm")
PEERS = ("openblas", "eigen", "libxsmm")

CTYPE = {"f32": "float", "f64": "double"}
EPS = {"f32": "FLT_EPSILON", "f64": "DBL_EPSILON"}
SIZEOF = {"f32": 4, "f64": 8}
BLAS = {"f32": "s", "f64": "d"}

NATIVE = ["-O3", "-march=native"]
#: Every function the harness builds starts on a cache line, as blacc's kernels do: how
#: fast a call of a few nanoseconds runs depends on how many 64-byte fetch blocks its
#: code spans (the loops' C = A*B 4 x 4 x 4 f32 ran 1.02-1.03 ns starting 1 or 16 bytes
#: into a line and 1.25-1.29 at 32 or 48), and so, without this, on where the linker
#: happened to put it.
ALIGNED = ["-falign-functions=64"]

# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """One operand of a BLAC. Arrays are row-major ``rows x cols``; vectors have cols 1."""

    name: str
    rows: int = 1
    cols: int = 1
    role: str = "in"  # in | out | inout
    kind: str = "matrix"  # matrix | vector | scalar

    @property
    def size(self) -> int:
        return self.rows * self.cols

    @property
    def written(self) -> bool:
        return self.role != "in"


# blac -> (program text, description)
BLACS = {
    "smv": ("y = A*x", "y = A x"),
    "smm": ("C = A*B", "C = A B"),
    "axpy": ("y = alpha*x + y", "y = alpha x + y"),
    "gemv": ("y = alpha*A*x + beta*y", "y = alpha A x + beta y"),
    "gemm": ("C = alpha*A*B + beta*C", "C = alpha A B + beta C"),
    "gesummv": ("y = alpha*A*x + beta*B*x", "y = alpha A x + beta B x"),
    "blinf": ("alpha = x'*A*y", "alpha = x' A y"),
    "gemam": ("C = alpha*(A0 + A1)'*B + beta*C", "C = alpha (A0 + A1)' B + beta C"),
}

# series -> (group, blac, shape function n -> (M, K, N), shape label)
# For products, op(A) is M x K and B is K x N; for matrix-vector BLACs A is M x K.
SERIES: dict[str, tuple[str, str, object, str]] = {
    # Figure 4: simple BLACs
    "smv_nx4": ("simple", "smv", lambda n: (n, 4, 1), "A: n x 4"),
    "smv_4xn": ("simple", "smv", lambda n: (4, n, 1), "A: 4 x n"),
    "smm_nx4_4x4": ("simple", "smm", lambda n: (n, 4, 4), "A: n x 4, B: 4 x 4"),
    "smm_4x4_4xn": ("simple", "smm", lambda n: (4, 4, n), "A: 4 x 4, B: 4 x n"),
    "smm_4xn_nx4": ("simple", "smm", lambda n: (4, n, 4), "A: 4 x n, B: n x 4"),
    "smm_nx4_4xn": ("simple", "smm", lambda n: (n, 4, n), "A: n x 4, B: 4 x n"),
    # Figure 5: BLACs that closely match BLAS
    "axpy": ("blas", "axpy", lambda n: (n, 1, 1), "x, y: n"),
    "gemv_nx4": ("blas", "gemv", lambda n: (n, 4, 1), "A: n x 4"),
    "gemv_4xn": ("blas", "gemv", lambda n: (4, n, 1), "A: 4 x n"),
    "gemm_nx4_4x4": ("blas", "gemm", lambda n: (n, 4, 4), "A: n x 4, B: 4 x 4"),
    "gemm_4x4_4xn": ("blas", "gemm", lambda n: (4, 4, n), "A: 4 x 4, B: 4 x n"),
    "gemm_4xn_nx4": ("blas", "gemm", lambda n: (4, n, 4), "A: 4 x n, B: n x 4"),
    "gemm_nx4_4xn": ("blas", "gemm", lambda n: (n, 4, n), "A: n x 4, B: 4 x n"),
    # Figure 6: BLACs that need more than one BLAS call
    "gesummv_nx4": ("multi", "gesummv", lambda n: (n, 4, 1), "A, B: n x 4"),
    "gesummv_4xn": ("multi", "gesummv", lambda n: (4, n, 1), "A, B: 4 x n"),
    "blinf_nx4": ("multi", "blinf", lambda n: (n, 4, 1), "A: n x 4"),
    "blinf_4xn": ("multi", "blinf", lambda n: (4, n, 1), "A: 4 x n"),
    "gemam_nx4_4x4": ("multi", "gemam", lambda n: (n, 4, 4), "(A0+A1)': n x 4, B: 4 x 4"),
    "gemam_4x4_4xn": ("multi", "gemam", lambda n: (4, 4, n), "(A0+A1)': 4 x 4, B: 4 x n"),
    "gemam_4xn_nx4": ("multi", "gemam", lambda n: (4, n, 4), "(A0+A1)': 4 x n, B: n x 4"),
    "gemam_nx4_4xn": ("multi", "gemam", lambda n: (n, 4, n), "(A0+A1)': n x 4, B: 4 x n"),
    # Figure 7: micro BLACs, all matrices n x n
    "micro_smv": ("micro", "smv", lambda n: (n, n, 1), "A: n x n"),
    "micro_smm": ("micro", "smm", lambda n: (n, n, n), "A, B: n x n"),
    "micro_gesummv": ("micro", "gesummv", lambda n: (n, n, 1), "A, B: n x n"),
    "micro_blinf": ("micro", "blinf", lambda n: (n, n, 1), "A: n x n"),
    "micro_gemam": ("micro", "gemam", lambda n: (n, n, n), "A0, A1, B: n x n"),
}

GROUPS = {
    "simple": "Simple BLACs (LGen Fig. 4)",
    "blas": "BLACs that closely match BLAS (LGen Fig. 5)",
    "multi": "BLACs that need more than one BLAS call (LGen Fig. 6)",
    "micro": "Micro BLACs, n x n operands (LGen Fig. 7)",
}

SIZES_FULL = (4, 8, 12, 16, 24, 32, 48, 64, 80, 100)
SIZES_QUICK = (4, 16, 48, 100)
MICRO_FULL = tuple(range(2, 11))
MICRO_QUICK = (2, 4, 7, 10)


@dataclass(frozen=True)
class Case:
    series: str
    n: int
    dtype: str

    @property
    def group(self) -> str:
        return SERIES[self.series][0]

    @property
    def blac(self) -> str:
        return SERIES[self.series][1]

    @property
    def dims(self) -> tuple[int, int, int]:
        return SERIES[self.series][2](self.n)

    @property
    def cid(self) -> str:
        return f"{self.series}_n{self.n}_{self.dtype}"

    @property
    def program(self) -> str:
        return BLACS[self.blac][0]

    @property
    def operands(self) -> tuple[Operand, ...]:
        M, K, N = self.dims
        s = lambda name, role="in": Operand(name, role=role, kind="scalar")  # noqa: E731
        v = lambda name, n, role="in": Operand(name, n, 1, role, "vector")  # noqa: E731
        m = lambda name, r, c, role="in": Operand(name, r, c, role, "matrix")  # noqa: E731
        b = self.blac
        if b == "smv":
            return (m("A", M, K), v("x", K), v("y", M, "out"))
        if b == "smm":
            return (m("A", M, K), m("B", K, N), m("C", M, N, "out"))
        if b == "axpy":
            return (s("alpha"), v("x", M), v("y", M, "inout"))
        if b == "gemv":
            return (s("alpha"), m("A", M, K), v("x", K), s("beta"), v("y", M, "inout"))
        if b == "gemm":
            return (s("alpha"), m("A", M, K), m("B", K, N), s("beta"), m("C", M, N, "inout"))
        if b == "gesummv":
            return (s("alpha"), m("A", M, K), m("B", M, K), s("beta"), v("x", K),
                    v("y", M, "out"))
        if b == "blinf":
            return (v("x", M), m("A", M, K), v("y", K), s("alpha", "out"))
        if b == "gemam":
            return (s("alpha"), m("A0", K, M), m("A1", K, M), m("B", K, N), s("beta"),
                    m("C", M, N, "inout"))
        raise ValueError(b)

    @property
    def flops(self) -> int:
        """Arithmetic of the BLAC as LGen counts it (adds + mults, scalars applied once
        per output element)."""
        M, K, N = self.dims
        return {
            "smv": 2 * M * K,
            "smm": 2 * M * N * K,
            "axpy": 2 * M,
            "gemv": 2 * M * K + 3 * M,
            "gemm": 2 * M * N * K + 3 * M * N,
            "gesummv": 4 * M * K + 3 * M,
            "blinf": 2 * M * K + 2 * M,
            "gemam": M * K + 2 * M * N * K + 3 * M * N,
        }[self.blac]

    @property
    def depth(self) -> int:
        """Longest chain of roundings per output element, for the error bound."""
        M, K, N = self.dims
        return {"smv": K, "smm": K, "axpy": 2, "gemv": K + 2, "gemm": K + 2,
                "gesummv": K + 3, "blinf": M + K, "gemam": K + 3}[self.blac]

    @property
    def xsmm_ok(self) -> bool:
        """LIBXSMM 1.17's JIT does C = 1*A*B + {0,1}*C only: the plain products."""
        return self.blac in ("smm", "smv")

    def meta(self) -> dict:
        M, K, N = self.dims
        return {"case": self.cid, "series": self.series, "group": self.group,
                "blac": self.blac, "program": self.program, "n": self.n, "dtype": self.dtype,
                "M": M, "K": K, "N": N, "flops": self.flops}


def all_cases(quick: bool = False, dtypes: Sequence[str] = ("f32", "f64"),
              series: Iterable[str] | None = None) -> list[Case]:
    chosen = list(SERIES) if not series else list(series)
    out = []
    for dt in dtypes:
        for s in chosen:
            if s not in SERIES:
                raise ValueError(f"unknown series {s!r}")
            sizes = ((MICRO_QUICK if quick else MICRO_FULL) if SERIES[s][0] == "micro"
                     else (SIZES_QUICK if quick else SIZES_FULL))
            out += [Case(s, n, dt) for n in sizes]
    return out


def select(cases: list[Case], patterns: Sequence[str] | None) -> list[Case]:
    """Keep cases whose series, group, blac or case id matches one of ``patterns``
    (``fnmatch`` wildcards allowed)."""
    if not patterns:
        return cases
    from fnmatch import fnmatch

    return [c for c in cases
            if any(fnmatch(key, p) for p in patterns
                   for key in (c.series, c.group, c.blac, c.cid, f"{c.series}_n{c.n}"))]


# --------------------------------------------------------------------------------------
# Straightforward loops (and the float64 reference, which is the same loops in double)
# --------------------------------------------------------------------------------------


def _params(case: Case, T: str, prefix: str = "") -> str:
    ps = []
    for o in case.operands:
        if o.kind == "scalar" and not o.written:
            ps.append(f"{T} {o.name}")
        elif o.written:
            ps.append(f"{T} *restrict {prefix}{o.name}")
        else:
            ps.append(f"const {T} *restrict {prefix}{o.name}")
    return ", ".join(ps)


def loops_body(case: Case, T: str) -> str:
    M, K, N = case.dims
    b = case.blac
    if b == "smv":
        return (f"for (int i = 0; i < {M}; i++) {{\n  {T} t = 0;\n"
                f"  for (int k = 0; k < {K}; k++) t += A[i*{K} + k] * x[k];\n  y[i] = t;\n}}")
    if b == "smm":
        return (f"for (int i = 0; i < {M}; i++)\n for (int j = 0; j < {N}; j++) {{\n"
                f"  {T} t = 0;\n  for (int k = 0; k < {K}; k++) t += A[i*{K} + k] * B[k*{N} + j];\n"
                f"  C[i*{N} + j] = t;\n }}")
    if b == "axpy":
        return f"for (int i = 0; i < {M}; i++) y[i] = alpha * x[i] + y[i];"
    if b == "gemv":
        return (f"for (int i = 0; i < {M}; i++) {{\n  {T} t = 0;\n"
                f"  for (int k = 0; k < {K}; k++) t += A[i*{K} + k] * x[k];\n"
                f"  y[i] = alpha * t + beta * y[i];\n}}")
    if b == "gemm":
        return (f"for (int i = 0; i < {M}; i++)\n for (int j = 0; j < {N}; j++) {{\n"
                f"  {T} t = 0;\n  for (int k = 0; k < {K}; k++) t += A[i*{K} + k] * B[k*{N} + j];\n"
                f"  C[i*{N} + j] = alpha * t + beta * C[i*{N} + j];\n }}")
    if b == "gesummv":
        return (f"for (int i = 0; i < {M}; i++) {{\n  {T} t = 0, u = 0;\n"
                f"  for (int k = 0; k < {K}; k++) {{ t += A[i*{K} + k] * x[k];"
                f" u += B[i*{K} + k] * x[k]; }}\n  y[i] = alpha * t + beta * u;\n}}")
    if b == "blinf":
        return (f"{T} s = 0;\nfor (int i = 0; i < {M}; i++) {{\n  {T} t = 0;\n"
                f"  for (int k = 0; k < {K}; k++) t += A[i*{K} + k] * y[k];\n"
                f"  s += x[i] * t;\n}}\n*alpha = s;")
    if b == "gemam":
        return (f"for (int i = 0; i < {M}; i++)\n for (int j = 0; j < {N}; j++) {{\n"
                f"  {T} t = 0;\n  for (int k = 0; k < {K}; k++)\n"
                f"   t += (A0[k*{M} + i] + A1[k*{M} + i]) * B[k*{N} + j];\n"
                f"  C[i*{N} + j] = alpha * t + beta * C[i*{N} + j];\n }}")
    raise ValueError(b)


def loops_source(cases: Sequence[Case]) -> str:
    parts = ["/* Straightforward fixed-size loops (scalar, not unrolled: the compiler does\n"
             " * what it can with -O3 -march=native) and float64 references. */\n"]
    for c in cases:
        T = CTYPE[c.dtype]
        body = "\n".join("    " + ln for ln in loops_body(c, T).splitlines())
        parts.append(f"void lp_{c.cid}({_params(c, T)}) {{\n{body}\n}}\n")
        body = "\n".join("    " + ln for ln in loops_body(c, "double").splitlines())
        parts.append(f"void ref_{c.cid}({_params(c, 'double')}) {{\n{body}\n}}\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------
# Eigen: fixed-size Maps, noalias, the BLAC written as an Eigen expression
# --------------------------------------------------------------------------------------

EIGEN_EXPR = {
    "smv": "y.noalias() = A * x;",
    "smm": "C.noalias() = A * B;",
    "axpy": "y += alpha * x;",
    "gemv": "y.noalias() = alpha * (A * x) + beta * y;",
    "gemm": "C.noalias() = alpha * (A * B) + beta * C;",
    "gesummv": "y.noalias() = alpha * (A * x) + beta * (B * x);",
    "blinf": "*p_alpha = (x.transpose() * A * y).value();",
    "gemam": "C.noalias() = alpha * ((A0 + A1).transpose() * B) + beta * C;",
}


def eigen_source(cases: Sequence[Case]) -> str:
    parts = ["#include <Eigen/Dense>\nusing namespace Eigen;\n"]
    for c in cases:
        T = CTYPE[c.dtype]
        maps = []
        for o in c.operands:
            if o.kind == "scalar":
                continue
            order = "ColMajor" if o.cols == 1 else "RowMajor"
            mt = f"Matrix<{T}, {o.rows}, {o.cols}, {order}>"
            const = "" if o.written else "const "
            maps.append(f"    Map<{const}{mt}> {o.name}(p_{o.name});")
        params = []
        for o in c.operands:
            if o.kind == "scalar" and not o.written:
                params.append(f"{T} {o.name}")
            else:
                params.append(f"{'' if o.written else 'const '}{T} *__restrict p_{o.name}")
        parts.append(f'extern "C" void eig_{c.cid}({", ".join(params)}) {{\n'
                     + "\n".join(maps) + f"\n    {EIGEN_EXPR[c.blac]}\n}}\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------
# OpenBLAS (cblas) and LIBXSMM call sequences, as a user writes them
# --------------------------------------------------------------------------------------


def openblas_calls(case: Case) -> tuple[str, int]:
    """(C statements, temporary elements needed) for one call of the BLAC."""
    M, K, N = case.dims
    p = BLAS[case.dtype]
    R, NT, TR = "CblasRowMajor", "CblasNoTrans", "CblasTrans"
    b = case.blac
    if b == "smv":
        return f"cblas_{p}gemv({R}, {NT}, {M}, {K}, 1, A, {K}, x, 1, 0, y, 1);", 0
    if b == "smm":
        return (f"cblas_{p}gemm({R}, {NT}, {NT}, {M}, {N}, {K}, 1, A, {K}, B, {N}, 0, C, {N});",
                0)
    if b == "axpy":
        return f"cblas_{p}axpy({M}, alpha, x, 1, y, 1);", 0
    if b == "gemv":
        return f"cblas_{p}gemv({R}, {NT}, {M}, {K}, alpha, A, {K}, x, 1, beta, y, 1);", 0
    if b == "gemm":
        return (f"cblas_{p}gemm({R}, {NT}, {NT}, {M}, {N}, {K}, alpha, A, {K}, B, {N}, "
                f"beta, C, {N});", 0)
    if b == "gesummv":
        return (f"cblas_{p}gemv({R}, {NT}, {M}, {K}, alpha, A, {K}, x, 1, 0, y, 1); "
                f"cblas_{p}gemv({R}, {NT}, {M}, {K}, beta, B, {K}, x, 1, 1, y, 1);", 0)
    if b == "blinf":
        return (f"cblas_{p}gemv({R}, {NT}, {M}, {K}, 1, A, {K}, y, 1, 0, tmp, 1); "
                f"*alpha = cblas_{p}dot({M}, x, 1, tmp, 1);", M)
    if b == "gemam":
        # T = A0 + A1 (copy + axpy), then C = alpha*T'*B + beta*C (gemm, T transposed)
        return (f"cblas_{p}copy({K * M}, A0, 1, tmp, 1); "
                f"cblas_{p}axpy({K * M}, 1, A1, 1, tmp, 1); "
                f"cblas_{p}gemm({R}, {TR}, {NT}, {M}, {N}, {K}, alpha, tmp, {M}, B, {N}, "
                f"beta, C, {N});", K * M)
    raise ValueError(b)


def xsmm_dispatch(case: Case) -> tuple[tuple[int, ...], str]:
    """((m, n, k, lda, ldb, ldc), call) for LIBXSMM's column-major C = A*B: a row-major
    C = A*B is the column-major C' = B'*A'; y = A*x is the 1 x M row y' = x'*A'."""
    M, K, N = case.dims
    if case.blac == "smm":
        return (N, M, K, N, K, N), "B, A, C"
    if case.blac == "smv":
        return (1, M, K, 1, K, 1), "x, A, y"
    raise ValueError(case.blac)


# --------------------------------------------------------------------------------------
# The harness
# --------------------------------------------------------------------------------------

HARNESS_PRELUDE = r"""
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#if HAVE_OPENBLAS
#include <cblas.h>
#endif
#if HAVE_LIBXSMM
#include <libxsmm.h>
#endif

#define MAXROUNDS 64
static double TARGET_S = 0.02;   /* one batch of calls lasts at least this long */
static int ROUNDS = 7;           /* batches per implementation, interleaved */
static const char *ONLY = NULL;  /* run only cases whose id contains this */
/* "--page-ends": every array ends where a page that cannot be accessed begins, in
   every round (guard_slot_ends), instead of at the round's offset (place_offset) */
static int PAGE_ENDS = 0;
/* CPU time of this thread by default: on a shared machine, time spent descheduled is not
   the kernel's; "--clock wall" uses CLOCK_MONOTONIC instead. */
static clockid_t CLOCK = CLOCK_THREAD_CPUTIME_ID;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static unsigned long long rng_state = 0x9E3779B97F4A7C15ULL;
static double uniform(void) { /* in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    memset(p, 0, (bytes + 63) / 64 * 64);
    return p;
}

/* Where the arrays of a case sit, round by round. A load whose address matches an
   earlier store's in bits 0-11 (on another page) waits for it (4K aliasing), which can
   cost a small kernel a third of its speed, and which cases meet it would otherwise
   depend on where the allocator happens to put the arrays. So each round places every
   array of the case at another offset in its own pages (a multiple of 64 bytes, at other
   distances from each other), the same for every implementation, and a median over
   rounds is a median over placements. */
static size_t place_offset(int round, int array) {
    /* the array's step (2 round + 1) * 23 is odd: the distances between the arrays, not
       only where the first one sits, differ from round to round */
    unsigned r = (unsigned)round, a = (unsigned)array;
    return (size_t)((a * (2u * r + 1u) * 23u + r * 37u) % 64u) * 64u;
}

/* An array's end at the start of the last page of its slot, made inaccessible: a masked
   move whose masked-off lanes reach past the array costs a microcode assist there
   (about 140 ns on Zen 5; benchmarks/lgen/README.md), and any move that reads or
   writes past it faults. */
static void guard_slot_ends(unsigned char *arena, const size_t *ends, int n, int prot) {
    for (int j = 0; j < n; j++)
        if (mprotect(arena + ends[j], 4096, prot)) {
            perror("mprotect");
            exit(2);
        }
}

static void *page_alloc(size_t bytes) {
    void *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

typedef struct {
    const char *name;
    void (*run)(long reps);
    const char *skip;    /* non-NULL: not run, and why */
    int ok;
    double err;          /* max |got - ref| / tolerance over all outputs */
    long reps;
    double t[MAXROUNDS]; /* seconds per call, one per batch */
} impl_t;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double batch(impl_t *im, long reps, void (*restore)(void)) {
    restore();
    double t0 = now();
    im->run(reps);
    return now() - t0;
}

/* Verify each implementation (one call on fresh operands), then calibrate a repeat
   count per implementation and time ROUNDS batches of each, interleaved, the arrays
   placed anew for each round (place_offset). */
static void bench(const char *cid, impl_t *im, int n, void (*restore)(void),
                  double (*check)(void), void (*place)(int)) {
    place(0);
    for (int i = 0; i < n; i++) {
        if (im[i].skip) continue;
        restore();
        im[i].run(1);
        im[i].err = check();
        im[i].ok = im[i].err <= 1.0;
    }
    for (int i = 0; i < n; i++) {
        if (im[i].skip || !im[i].ok) continue;
        long reps = 1;
        batch(&im[i], 16, restore); /* warm up */
        for (;;) {
            double dt = batch(&im[i], reps, restore);
            if (dt >= TARGET_S) break;
            if (dt < TARGET_S / 64) reps *= 16;
            else reps = (long)((double)reps * TARGET_S * 1.2 / dt) + 1;
        }
        im[i].reps = reps;
    }
    for (int r = 0; r < ROUNDS; r++) {
        place(r);
        for (int j = 0; j < n; j++) {
            impl_t *p = &im[(j + r) % n];
            if (p->skip || !p->ok) continue;
            p->t[r] = batch(p, p->reps, restore) / (double)p->reps;
        }
    }
    for (int i = 0; i < n; i++) {
        impl_t *p = &im[i];
        printf("{\"case\": \"%s\", \"impl\": \"%s\"", cid, p->name);
        if (p->skip) {
            printf(", \"skipped\": \"%s\"}\n", p->skip);
            continue;
        }
        printf(", \"verified\": %s, \"err\": %.4g", p->ok ? "true" : "false",
               isfinite(p->err) ? p->err : 1e300);
        if (p->ok) {
            double s[MAXROUNDS];
            memcpy(s, p->t, sizeof(double) * ROUNDS);
            qsort(s, ROUNDS, sizeof(double), cmp_d);
            printf(", \"reps\": %ld, \"rounds\": %d, \"best_ns\": %.6g, \"q1_ns\": %.6g"
                   ", \"median_ns\": %.6g, \"q3_ns\": %.6g, \"worst_ns\": %.6g",
                   p->reps, ROUNDS, 1e9 * s[0], 1e9 * s[ROUNDS / 4],
                   1e9 * (ROUNDS % 2 ? s[ROUNDS / 2] : 0.5 * (s[ROUNDS / 2 - 1] + s[ROUNDS / 2])),
                   1e9 * s[(3 * ROUNDS) / 4], 1e9 * s[ROUNDS - 1]);
            printf(", \"t_ns\": [");
            for (int r = 0; r < ROUNDS; r++) printf("%s%.6g", r ? ", " : "", 1e9 * p->t[r]);
            printf("]");
        }
        printf("}\n");
    }
    fflush(stdout);
}
"""


@dataclass
class Series:
    """One executable: the cases of one series and dtype."""

    name: str
    cases: list[Case]
    impls: tuple[str, ...]
    blacc_protos: dict[str, tuple[str, list[str]]] = field(default_factory=dict)


def _case_block(c: Case, impls: Sequence[str], blacc_call: tuple[str, list[str]] | None) -> str:
    T = CTYPE[c.dtype]
    cid = c.cid
    ops = c.operands
    out = []
    L = out.append
    L(f"/* ---- {cid}: {c.program}  (M={c.dims[0]} K={c.dims[1]} N={c.dims[2]}) ---- */")
    for o in ops:
        L(f"static {T} *{cid}_{o.name};")
        if o.written:
            L(f"static {T} *{cid}_{o.name}_init;")
            L(f"static double *{cid}_{o.name}_ref, *{cid}_{o.name}_mag;")
        else:
            L(f"static {T} *{cid}_{o.name}_src;")
    L(f"static unsigned char *{cid}_arena;")
    tmp_n = openblas_calls(c)[1] if "openblas" in impls else 0
    if tmp_n:
        L(f"static {T} *{cid}_tmp;")
    if "libxsmm" in impls and c.xsmm_ok:
        L(f"static libxsmm_{BLAS[c.dtype]}mmfunction {cid}_xk;")
    # restore outputs
    L(f"static void {cid}_restore(void) {{")
    for o in ops:
        if o.written:
            L(f"    memcpy({cid}_{o.name}, {cid}_{o.name}_init, sizeof({T}) * {o.size});")
    L("}")
    # placement: each array in pages of its own, at the round's offset or (--page-ends)
    # ending where the last page of its slot begins; inputs copied from their sources
    # (outputs are restored before every batch)
    slot = [(-(-(o.size * SIZEOF[c.dtype]) // 4096) + 1) * 4096 for o in ops]
    ends = [sum(slot[:j + 1]) - 4096 for j in range(len(ops))]
    L(f"static const size_t {cid}_ends[] = {{{', '.join(map(str, ends))}}};")
    L(f"static void {cid}_place(int round) {{")
    for j, o in enumerate(ops):
        L(f"    {cid}_{o.name} = ({T} *)({cid}_arena + (PAGE_ENDS ? {ends[j]}"
          f" - sizeof({T}) * {o.size} : {sum(slot[:j])} + place_offset(round, {j})));")
        if not o.written:
            L(f"    memcpy({cid}_{o.name}, {cid}_{o.name}_src, sizeof({T}) * {o.size});")
    L("}")
    # locals: the operands under their own names
    loc = []
    for o in ops:
        if o.kind == "scalar" and not o.written:
            loc.append(f"    const {T} {o.name} = {cid}_{o.name}[0];")
        else:
            loc.append(f"    {T} *const {o.name} = {cid}_{o.name};")
    if tmp_n:
        loc.append(f"    {T} *const tmp = {cid}_tmp; (void)tmp;")
    loc = "\n".join(loc)
    names = ", ".join(o.name for o in ops)

    def runner(impl: str, stmt: str) -> None:
        L(f"static void {cid}_run_{impl}(long reps) {{\n{loc}\n"
          f"    for (long r = 0; r < reps; r++) {{ {stmt} }}\n}}")

    runners = []
    if "blacc" in impls and blacc_call is not None:
        fname, params = blacc_call
        runner("blacc", f"{fname}({', '.join(params)});")
        runners.append("blacc")
    if "loops" in impls:
        runner("loops", f"lp_{cid}({names});")
        runners.append("loops")
    if "openblas" in impls:
        runner("openblas", openblas_calls(c)[0])
        runners.append("openblas")
    if "eigen" in impls:
        runner("eigen", f"eig_{cid}({names});")
        runners.append("eigen")
    if "libxsmm" in impls:
        if c.xsmm_ok:
            runner("libxsmm", f"{cid}_xk({xsmm_dispatch(c)[1]});")
        runners.append("libxsmm")
    # check
    L(f"static double {cid}_check(void) {{\n    double worst = 0;")
    for o in ops:
        if o.written:
            L(f"    for (int i = 0; i < {o.size}; i++) {{\n"
              f"        double got = (double){cid}_{o.name}[i], ref = {cid}_{o.name}_ref[i];\n"
              f"        double tol = {4 * (c.depth + 2)} * {EPS[c.dtype]} * {cid}_{o.name}_mag[i]"
              f" + 1e-300;\n"
              f"        double e = fabs(got - ref) / tol;\n"
              f"        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;\n    }}")
    L("    return worst;\n}")
    # the case driver
    L(f"static void case_{cid}(void) {{")
    L(f'    if (ONLY && !strstr("{cid}", ONLY)) return;')
    L(f"    {cid}_arena = page_alloc({sum(slot)});")
    L(f"    if (PAGE_ENDS) guard_slot_ends({cid}_arena, {cid}_ends, {len(ops)}, PROT_NONE);")
    for o in ops:
        if not o.written:
            L(f"    {cid}_{o.name}_src = xalloc(sizeof({T}) * {o.size});")
        else:
            L(f"    {cid}_{o.name}_init = xalloc(sizeof({T}) * {o.size});")
            L(f"    {cid}_{o.name}_ref = xalloc(sizeof(double) * {o.size});")
            L(f"    {cid}_{o.name}_mag = xalloc(sizeof(double) * {o.size});")
    if tmp_n:
        L(f"    {cid}_tmp = xalloc(sizeof({T}) * {tmp_n});")
    L("    rng_state = 0x9E3779B97F4A7C15ULL;")
    # inputs: uniform in [-1, 1); scalars fixed; pure outputs hold garbage (must not be read)
    for o in ops:
        if o.kind == "scalar" and not o.written:
            val = "0.75" if o.name == "alpha" else "0.5"
            L(f"    {cid}_{o.name}_src[0] = ({T}){val};")
        elif o.role == "out":
            L(f"    for (int i = 0; i < {o.size}; i++) {cid}_{o.name}_init[i] = ({T})777.0;")
        elif o.role == "inout":
            L(f"    for (int i = 0; i < {o.size}; i++) {cid}_{o.name}_init[i] = ({T})uniform();")
        else:
            L(f"    for (int i = 0; i < {o.size}; i++) {cid}_{o.name}_src[i] = ({T})uniform();")
    # references: the loops in double, on the values and on their magnitudes
    L("    {")
    args_v, args_m = [], []
    for o in ops:
        if o.kind == "scalar" and not o.written:
            args_v.append(f"(double){cid}_{o.name}_src[0]")
            args_m.append(f"fabs((double){cid}_{o.name}_src[0])")
            continue
        L(f"        double *v_{o.name} = xalloc(sizeof(double) * {o.size});")
        L(f"        double *m_{o.name} = xalloc(sizeof(double) * {o.size});")
        src = f"{cid}_{o.name}_init" if o.written else f"{cid}_{o.name}_src"
        L(f"        for (int i = 0; i < {o.size}; i++) {{ v_{o.name}[i] = (double){src}[i];"
          f" m_{o.name}[i] = fabs(v_{o.name}[i]); }}")
        args_v.append(f"v_{o.name}")
        args_m.append(f"m_{o.name}")
    L(f"        ref_{cid}({', '.join(args_v)});")
    L(f"        ref_{cid}({', '.join(args_m)});")
    for o in ops:
        if o.written:
            L(f"        memcpy({cid}_{o.name}_ref, v_{o.name}, sizeof(double) * {o.size});")
            L(f"        for (int i = 0; i < {o.size}; i++) {cid}_{o.name}_mag[i] ="
              f" fabs(m_{o.name}[i]);")
    for o in ops:
        if not (o.kind == "scalar" and not o.written):
            L(f"        free(v_{o.name}); free(m_{o.name});")
    L("    }")
    if "libxsmm" in impls and c.xsmm_ok:
        (m, n, k, lda, ldb, ldc), _ = xsmm_dispatch(c)
        p = BLAS[c.dtype]
        L(f"    {{ {T} one = 1, zero = 0; int flags = LIBXSMM_GEMM_FLAG_NONE,"
          f" pf = LIBXSMM_GEMM_PREFETCH_NONE;\n"
          f"      libxsmm_blasint m = {m}, n = {n}, k = {k}, lda = {lda}, ldb = {ldb},"
          f" ldc = {ldc};\n"
          f"      {cid}_xk = libxsmm_{p}mmdispatch(m, n, k, &lda, &ldb, &ldc, &one, &zero,"
          f" &flags, &pf); }}")
    L("    impl_t im[] = {")
    for r in runners:
        if r == "libxsmm" and not c.xsmm_ok:
            L('        {"libxsmm", 0, "not a plain product: LIBXSMM 1.17 JIT has no kernel"},')
        elif r == "libxsmm":
            L(f'        {{"libxsmm", {cid}_run_libxsmm, {cid}_xk ? 0 : "dispatch returned NULL"}},')
        else:
            L(f'        {{"{r}", {cid}_run_{r}, 0}},')
    L("    };")
    L(f'    bench("{cid}", im, (int)(sizeof im / sizeof im[0]), {cid}_restore, {cid}_check,'
      f' {cid}_place);')
    L(f"    if (PAGE_ENDS) guard_slot_ends({cid}_arena, {cid}_ends, {len(ops)},"
      f" PROT_READ | PROT_WRITE);")
    L(f"    free({cid}_arena);")
    for o in ops:
        if not o.written:
            L(f"    free({cid}_{o.name}_src);")
        else:
            L(f"    free({cid}_{o.name}_init); free({cid}_{o.name}_ref);"
              f" free({cid}_{o.name}_mag);")
    if tmp_n:
        L(f"    free({cid}_tmp);")
    L("}")
    return "\n".join(out)


def harness_source(series: Series) -> str:
    parts = [f"/* LGen section 5 harness, series {series.name}; generated by "
             f"benchmarks/lgen/harness.py */", HARNESS_PRELUDE]
    for c in series.cases:
        T = CTYPE[c.dtype]
        if "blacc" in series.impls and c.cid in series.blacc_protos:
            parts.append(f'#include "bl_{c.cid}.h"')
        parts.append(f"void lp_{c.cid}({_params(c, T)});")
        parts.append(f"void ref_{c.cid}({_params(c, 'double')});")
        if "eigen" in series.impls:
            params = _params(c, T).replace("restrict ", "")
            parts.append(f"void eig_{c.cid}({params});")
    for c in series.cases:
        parts.append(_case_block(c, series.impls, series.blacc_protos.get(c.cid)))
    main = ["int main(int argc, char **argv) {",
            "    for (int i = 1; i < argc; i++) {",
            '        if (!strcmp(argv[i], "--target-ms") && i + 1 < argc)'
            " TARGET_S = atof(argv[++i]) / 1e3;",
            '        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)'
            " ROUNDS = atoi(argv[++i]);",
            '        else if (!strcmp(argv[i], "--only") && i + 1 < argc) ONLY = argv[++i];',
            '        else if (!strcmp(argv[i], "--page-ends")) PAGE_ENDS = 1;',
            '        else if (!strcmp(argv[i], "--clock") && i + 1 < argc)'
            ' CLOCK = strcmp(argv[++i], "wall") ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;',
            "    }",
            "    if (ROUNDS < 1) ROUNDS = 1;",
            "    if (ROUNDS > MAXROUNDS) ROUNDS = MAXROUNDS;"]
    if "openblas" in series.impls:
        main.append("    openblas_set_num_threads(1);")
    if "libxsmm" in series.impls:
        main.append("    libxsmm_init();")
    main += [f"    case_{c.cid}();" for c in series.cases]
    if "libxsmm" in series.impls:
        main.append("    libxsmm_finalize();")
    main += ["    return 0;", "}"]
    parts.append("\n".join(main))
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------
# blacc
# --------------------------------------------------------------------------------------


def blacc_fingerprint() -> str:
    """A hash of blacc's sources: emitted kernels are reused only while it is unchanged."""
    from blacc.runtime.plan_cache import source_fingerprint

    return source_fingerprint()


def _decls(case: Case) -> dict:
    import blacc

    dt = case.dtype
    d = {}
    for o in case.operands:
        if o.kind == "scalar":
            d[o.name] = blacc.Scalar(dt)
        elif o.kind == "vector":
            d[o.name] = blacc.Vector(o.rows, dt)
        else:
            d[o.name] = blacc.Matrix(o.rows, o.cols, dt)
    return d


def parse_blacc_header(text: str) -> tuple[str, list[str], list[str]]:
    """(function name, parameter names in order, compiler flags the header asks for)."""
    import re

    m = re.search(r"^(?:void|int)\s+(\w+)\s*\(([^)]*)\)\s*;", text, re.M)
    if not m:
        raise ValueError("no prototype in blacc header")
    params = [re.findall(r"\w+", p)[-1] for p in m.group(2).split(",") if p.strip()]
    fm = re.search(r"needs <[^>]+> and ([^.\n]*)\.", text)
    flags = fm.group(1).split() if fm else []
    return m.group(1), params, flags


def emit_blacc(case: Case, directory: Path, fingerprint: str, search: str = "model",
               target: str = "host") -> tuple[str, list[str], list[str]]:
    """Write bl_<cid>.c/.h with blacc.emit (reused when the key file matches)."""
    import blacc

    stem = directory / f"bl_{case.cid}"
    key = json.dumps({"program": case.program, "dims": case.dims, "dtype": case.dtype,
                      "blacc": fingerprint} | ({"search": search} if search != "model" else {})
                     | ({"target": target} if target != "host" else {}))
    key_path = stem.with_suffix(".key")
    h_path, c_path = stem.with_suffix(".h"), stem.with_suffix(".c")
    if not (key_path.exists() and key_path.read_text() == key and h_path.exists()
            and c_path.exists()):
        blacc.emit(case.program, stem, name=f"bl_{case.cid}", target=target, search=search,
                   **_decls(case))
        key_path.write_text(key)
    return parse_blacc_header(h_path.read_text())


def _emit_worker(args):
    """(case id, emit_blacc's result or None, error or None, seconds)."""
    import time

    case, directory, fingerprint, search, target = args
    t0 = time.process_time()
    try:
        return (case.cid, emit_blacc(case, Path(directory), fingerprint, search, target), None,
                time.process_time() - t0)
    except Exception as e:  # noqa: BLE001 - reported, the case runs without blacc
        return case.cid, None, f"{type(e).__name__}: {e}", time.process_time() - t0


# --------------------------------------------------------------------------------------
# Toolchain and peers
# --------------------------------------------------------------------------------------


@dataclass
class Toolchain:
    cc: str
    cxx: str | None
    eigen_include: str | None = None
    peers: dict[str, str] = field(default_factory=dict)  # available peer -> note
    missing: dict[str, str] = field(default_factory=dict)  # unavailable peer -> why
    link: list[str] = field(default_factory=list)

    def libs(self, impls: Sequence[str]) -> list[str]:
        libs = []
        if "libxsmm" in impls:
            libs += ["-lxsmm"] + ([] if "openblas" in impls or "openblas" in self.peers
                                  else ["-lxsmmnoblas"])
        if "openblas" in impls or ("libxsmm" in impls and "openblas" in self.peers):
            libs += ["-lopenblas"]
        return libs + ["-lpthread", "-lrt", "-ldl", "-lm"]


def find_compilers() -> tuple[str | None, str | None]:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    return cc, cxx


def _try_build(compiler: str, src: str, suffix: str, flags: list[str], run: bool = False
               ) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"t{suffix}"
        p.write_text(src)
        exe = Path(d) / "t"
        r = subprocess.run([compiler, str(p), "-o", str(exe), *flags], capture_output=True,
                           text=True)
        if r.returncode != 0:
            return False, (r.stderr.strip().splitlines() or ["compile failed"])[0]
        if run:
            r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                return False, f"test program exited {r.returncode}: {r.stdout}{r.stderr}"
        return True, ""


def detect(wanted: Sequence[str] = IMPLS) -> Toolchain:
    """Find compilers and which peers build and link here."""
    cc, cxx = find_compilers()
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc, or $CC) found")
    tc = Toolchain(cc, cxx)
    if "openblas" in wanted:
        ok, why = _try_build(cc, "#include <cblas.h>\nint main(void){float a=1,b=1,c=0;"
                             "openblas_set_num_threads(1);"
                             "cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,1,1,1,1,"
                             "&a,1,&b,1,0,&c,1);return c!=1;}\n", ".c", ["-lopenblas"], run=True)
        (tc.peers if ok else tc.missing)["openblas"] = "cblas + -lopenblas" if ok else why
    if "eigen" in wanted:
        if cxx is None:
            tc.missing["eigen"] = "no C++ compiler"
        else:
            why = "Eigen headers not found"
            for inc in [os.environ.get("EIGEN_INCLUDE", ""), "/usr/include/eigen3",
                        "/usr/local/include/eigen3"]:
                if inc and Path(inc, "Eigen", "Dense").exists():
                    ok, why = _try_build(cxx, "#include <Eigen/Dense>\nint main(){"
                                         "Eigen::Matrix<float,4,4> a; a.setOnes();"
                                         "return (a*a)(0,0)!=4;}\n", ".cpp", [f"-I{inc}"],
                                         run=True)
                    if ok:
                        tc.eigen_include = inc
                        tc.peers["eigen"] = f"Eigen in {inc}"
                        break
            if tc.eigen_include is None:
                tc.missing["eigen"] = why
    if "libxsmm" in wanted:
        src = ("#include <libxsmm.h>\nint main(void){libxsmm_init(); float o=1,z=0;"
               "int f=LIBXSMM_GEMM_FLAG_NONE,p=LIBXSMM_GEMM_PREFETCH_NONE;"
               "libxsmm_blasint m=4,l=4;"
               "libxsmm_smmfunction k=libxsmm_smmdispatch(m,m,m,&l,&l,&l,&o,&z,&f,&p);"
               "libxsmm_finalize(); return k==0;}\n")
        libs = ["-lxsmm"] + (["-lopenblas"] if "openblas" in tc.peers else ["-lxsmmnoblas"])
        ok, why = _try_build(cc, src, ".c", libs + ["-lpthread", "-lrt", "-ldl", "-lm"],
                             run=True)
        if ok:
            from contextlib import suppress

            ver = ""
            with suppress(OSError):
                for ln in Path("/usr/include/libxsmm_version.h").read_text().splitlines():
                    if "LIBXSMM_CONFIG_VERSION " in ln:
                        ver = ln.split()[-1].strip('"')
            tc.peers["libxsmm"] = f"LIBXSMM {ver} JIT".replace("  ", " ")
        else:
            tc.missing["libxsmm"] = why
    return tc


# --------------------------------------------------------------------------------------
# Build and run one series
# --------------------------------------------------------------------------------------


def _compile(cmd: list[str], cwd: Path | None = None) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr[-4000:]}")


def build_series(name: str, cases: list[Case], impls: Sequence[str], tc: Toolchain,
                 build_dir: Path, *, jobs: int = 1, log=print,
                 blacc_results: dict | None = None) -> Path:
    """Generate and compile one executable for ``cases`` (one series, one dtype)."""
    d = build_dir / name
    d.mkdir(parents=True, exist_ok=True)
    impls = tuple(i for i in IMPLS if i in impls)
    series = Series(name, cases, impls)
    objs: list[tuple[list[str], Path]] = []
    if "blacc" in impls:
        fp = blacc_fingerprint()
        results = blacc_results or {}
        for c in cases:
            res = results.get(c.cid)
            if res is None and blacc_results is None:  # else emitting failed: reported
                _, res, err, _ = _emit_worker((c, str(d), fp, "model", "host"))
                if err:
                    log(f"  blacc could not compile {c.cid}: {err}")
            if res is None:
                continue
            fname, params, flags = res
            series.blacc_protos[c.cid] = (fname, params)
            objs.append(([tc.cc, *NATIVE, *flags, "-c", f"bl_{c.cid}.c", "-o",
                          f"bl_{c.cid}.o"], d / f"bl_{c.cid}.o"))
    (d / "loops.c").write_text(loops_source(cases))
    objs.append(([tc.cc, *NATIVE, *ALIGNED, "-c", "loops.c", "-o", "loops.o"], d / "loops.o"))
    if "eigen" in impls:
        (d / "eigen.cpp").write_text(eigen_source(cases))
        objs.append(([tc.cxx, *NATIVE, *ALIGNED, "-DNDEBUG", f"-I{tc.eigen_include}", "-c",
                      "eigen.cpp", "-o", "eigen.o"], d / "eigen.o"))
    (d / "harness.c").write_text(harness_source(series))
    defs = [f"-DHAVE_OPENBLAS={int('openblas' in impls)}",
            f"-DHAVE_LIBXSMM={int('libxsmm' in impls)}"]
    # the timing loops too: each calls one implementation back to back
    objs.append(([tc.cc, "-O2", "-march=native", *ALIGNED, "-falign-loops=64", *defs, "-c",
                  "harness.c", "-o", "harness.o"], d / "harness.o"))

    def run_in(cmd: list[str]) -> None:
        _compile(cmd, cwd=d)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(run_in, [cmd for cmd, _ in objs]))
    exe = d / "bench"
    linker = tc.cxx if ("eigen" in impls and tc.cxx) else tc.cc
    run_in([linker, *[p.name for _, p in objs], "-o", "bench", *tc.libs(impls)])
    return exe


def run_series(exe: Path, cases: Sequence[Case], *, target_ms: float = 20.0, rounds: int = 7,
               clock: str = "cpu", timeout: float | None = None,
               processes: int = 1, page_ends: bool = False) -> list[dict]:
    """Run a built series; return one dict per (case, implementation) with the case's
    metadata and the derived GFLOPS. With ``processes`` > 1 the rounds are split over
    that many runs of the executable, one after another, and each implementation's
    statistics are taken over the rounds of all of them: a call of about a nanosecond
    runs at one speed for a whole process and may run at another in the next (C = A*B 2
    x 2 x 2 f32 on Zen 5: 1.17-1.21 ns in every round of one run, medians of 0.99-1.08 in
    six runs after it; the loops 0.93-1.04 in all)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    meta = {c.cid: c.meta() for c in cases}
    merged: dict[tuple[str, str], dict] = {}
    for share in _split(rounds, processes):
        r = subprocess.run([str(exe), "--target-ms", str(target_ms), "--rounds", str(share),
                            "--clock", clock, *(["--page-ends"] if page_ends else [])],
                           capture_output=True, text=True, env=env, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{exe} exited {r.returncode}:\n{r.stderr[-4000:]}")
        for line in r.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                _merge(merged.setdefault((row["case"], row["impl"]), {}), row)
    rows = []
    for (cid, _), row in merged.items():
        row = {**meta[cid], **row}
        if row.get("verified") and row.get("t_ns"):
            row.update(_statistics(row["t_ns"]))
            row["gflops"] = row["flops"] / row["median_ns"]
            row["gflops_best"] = row["flops"] / row["best_ns"]
        rows.append(row)
    return rows


def _split(rounds: int, processes: int) -> list[int]:
    """``rounds`` as nearly equal shares for ``processes`` runs (none empty)."""
    n = max(1, min(processes, rounds))
    return [rounds // n + (i < rounds % n) for i in range(n)]


def _merge(into: dict, row: dict) -> None:
    """One run's row of an implementation into its row of the runs before: the times of
    the rounds and the rounds add up, the largest error is kept, and a failure or a skip
    in any run stands (with no times)."""
    timed = bool(row.get("verified")) and "t_ns" in row
    if not into:
        into.update(row)
        if timed:
            into["t_ns"] = list(row["t_ns"])
    elif "t_ns" not in into:  # failed or skipped before
        pass
    elif not timed:
        into.clear()
        into.update(row)
    else:
        into["t_ns"] += row["t_ns"]
        into["rounds"] += row["rounds"]
        into["err"] = max(into["err"], row["err"])


def _statistics(times: Sequence[float]) -> dict:
    """Best, quartiles, median and worst of per-call times, as the C harness takes them
    (the lower quartile at index n/4 of the sorted times, the upper at 3n/4)."""
    s, n = sorted(times), len(times)
    median = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    return {"best_ns": s[0], "q1_ns": s[n // 4], "median_ns": median,
            "q3_ns": s[(3 * n) // 4], "worst_ns": s[-1]}


CLOCK_SRC = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    /* a chain of dependent register adds: one per cycle on any x86 of the last 20 years
       (not adds of an immediate: Intel's Golden Cove executes those at rename, several
       a cycle, which read as a clock of 20 GHz) */
    double best = 1e30;
    for (int rep = 0; rep < 15; rep++) {
        long n = 20000000, x = 0;
        double t0 = now();
        for (long i = 0; i < n; i++)
            __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                             "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
                             : "+r"(x) : "r"(n));
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("%.4f\n", 8 * 20000000.0 / best / 1e9);
    return 0;
}
"""


def measure_clock_ghz(cc: str) -> float | None:
    """The core clock in GHz from a dependent-add chain (None where that cannot run)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "clock.c", Path(d) / "clock"
        src.write_text(CLOCK_SRC)
        r = subprocess.run([cc, "-O1", str(src), "-o", str(exe)], capture_output=True)
        if r.returncode != 0:
            return None
        r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
        try:
            return float(r.stdout.strip())
        except ValueError:
            return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def group_by_series(cases: Sequence[Case]) -> dict[str, list[Case]]:
    out: dict[str, list[Case]] = {}
    for c in cases:
        out.setdefault(f"{c.series}_{c.dtype}", []).append(c)
    return out


if __name__ == "__main__":  # pragma: no cover - convenience: python harness.py
    sys.exit("use benchmarks/lgen/run.py")
