"""blacc's two code generators against each other and NumPy: run time and cold compile time.

Run time: the public ``blacc.gemm(A, B, C, beta=0, backend=...)`` with ``backend`` 'c'
(system C compiler) and 'llvm' (llvmlite JIT), and ``np.matmul(A, B, out=C)``; each result
checked against a float64 reference first, then all three timed in this process on one
thread with interleaved samples (`blacc.bench.timing`).

Compile time: one GEMM kernel (the blis plan ``blacc.gemm`` picks for a large problem)
built in a fresh Python process whose ``BLACC_CACHE_DIR`` is a new empty directory, so
neither the in-memory nor the disk cache can help. Reported per build: the one-time
backend set-up of a process (C: finding and probing the compiler; LLVM: target
initialization), the schedule and lowering passes, and ``runtime.build.build`` (render +
compile + load), the part that differs between backends.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blacc.bench.gemm import DEFAULT_SHAPES, QUICK_SHAPES, Shape, parse_shape
from blacc.bench.strategies import reference_checker, text_table
from blacc.bench.timing import measure_interleaved, single_thread

__all__ = [
    "DEFAULT_SHAPES", "QUICK_SHAPES", "BackendRow", "CompileRow", "backends_to_json",
    "format_backend_table", "format_compile_table", "measure_cold_compile",
    "run_backend_bench",
]

BACKENDS = ("c", "llvm")
_SHORT = {"float32": "f32", "float64": "f64"}
#: The problem whose kernel is compiled: large enough that blacc.gemm picks blis.
COMPILE_SHAPE: Shape = (1000, 1000, 1000)


@dataclass(frozen=True)
class BackendRow:
    """One (dtype, shape): GFLOPS of each backend and NumPy, and their ratios."""

    dtype: str
    m: int
    n: int
    k: int
    c_gflops: float
    llvm_gflops: float
    numpy_gflops: float
    llvm_over_c: float
    c_over_numpy: float
    llvm_over_numpy: float
    verified_c: bool
    verified_llvm: bool
    verified_numpy: bool

    @property
    def verified(self) -> bool:
        return self.verified_c and self.verified_llvm and self.verified_numpy


def _operands(dtype: np.dtype, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    m, n, k = shape
    rng = np.random.default_rng([m, n, k, dtype.itemsize])
    a = rng.uniform(-1.0, 1.0, size=(m, k)).astype(dtype)
    b = rng.uniform(-1.0, 1.0, size=(k, n)).astype(dtype)
    return a, b


def bench_shape(dtype: np.dtype, shape: Shape, *, min_sample_s: float = 0.05,
                samples: int = 7) -> BackendRow:
    """Verify, then time blacc.gemm on both backends and np.matmul at one shape."""
    import blacc  # late: the table helpers work without the compiler stack loaded

    m, n, k = shape
    a, b = _operands(dtype, shape)
    check = reference_checker(a, b)
    c = np.empty((m, n), dtype)
    fns: dict[str, Callable[[], object]] = {
        backend: (lambda backend=backend: blacc.gemm(a, b, c, beta=0.0, backend=backend))
        for backend in BACKENDS}
    fns["numpy"] = lambda: np.matmul(a, b, out=c)
    verified = {}
    with single_thread():
        for name, fn in fns.items():
            c.fill(np.nan)  # beta=0 must not read C, NaN or not
            fn()
            verified[name] = check(c)
        stats = measure_interleaved(fns, min_sample_s=min_sample_s, samples=samples)
    gflops = {name: 2.0 * m * n * k / st.median / 1e9 for name, st in stats.items()}
    return BackendRow(
        dtype.name, m, n, k, gflops["c"], gflops["llvm"], gflops["numpy"],
        gflops["llvm"] / gflops["c"], gflops["c"] / gflops["numpy"],
        gflops["llvm"] / gflops["numpy"], verified["c"], verified["llvm"], verified["numpy"])


def run_backend_bench(shapes: Iterable[Shape], dtypes: Iterable[str], *,
                      min_sample_s: float = 0.05, samples: int = 7,
                      progress: Callable[[str], None] | None = None) -> list[BackendRow]:
    """``bench_shape`` for every dtype and shape."""
    rows = []
    for dtype in map(np.dtype, dtypes):
        for shape in shapes:
            if progress is not None:
                progress(f"{dtype.name} {'x'.join(map(str, shape))}")
            rows.append(bench_shape(dtype, shape, min_sample_s=min_sample_s, samples=samples))
    return rows


def format_backend_table(rows: Sequence[BackendRow]) -> str:
    """GFLOPS of c, llvm, numpy and the three ratios per (dtype, shape)."""
    body = [
        (_SHORT.get(r.dtype, r.dtype), f"{r.m}x{r.n}x{r.k}", f"{r.c_gflops:.1f}",
         f"{r.llvm_gflops:.1f}", f"{r.numpy_gflops:.1f}", f"{r.llvm_over_c:.2f}",
         f"{r.c_over_numpy:.2f}", f"{r.llvm_over_numpy:.2f}",
         "ok" if r.verified else "FAILED")
        for r in rows
    ]
    headings = ("dtype", "shape (MxNxK)", "c GFLOPS", "llvm GFLOPS", "numpy GFLOPS", "llvm/c",
                "c/numpy", "llvm/numpy", "check")
    return (text_table(headings, body, left=2) + "\n\nblacc.gemm(A, B, C, beta=0, backend=...)"
            " vs np.matmul(A, B, out=C); single thread, same process, interleaved samples, "
            "GFLOPS from medians")


# ----------------------------------------------------------------------------- compile time


@dataclass(frozen=True)
class CompileRow:
    """Cold build of one kernel, medians over ``repeats`` fresh processes (seconds)."""

    backend: str
    dtype: str
    kernel: str
    init_s: float  # once per process: compiler probe (C) or LLVM target set-up
    lower_s: float  # schedule + lowering passes (the same for both backends)
    build_s: float  # render + compile + load, wall clock
    build_cpu_s: float  # the same in CPU time of the process and its compiler: less noisy
    build_samples: tuple[float, ...]
    repeats: int
    source_chars: int


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the C compiler)."""
    try:
        import resource
    except ImportError:  # not POSIX: this process only
        return time.process_time()
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _child(dtype: str, backend: str, shape: Shape = COMPILE_SHAPE) -> dict[str, Any]:
    """In a fresh process: build the blis kernel cold and say how long each step took."""
    from blacc.ir.structured import matmul
    from blacc.runtime.build import build, host_compiler
    from blacc.runtime.gemm import host_target
    from blacc.strategy.gemm import choose
    from blacc.transform.apply import apply
    from blacc.transform.pipeline import lower

    if backend == "llvm":
        from blacc.backend import jit, llvm  # noqa: F401  imports are not compile time
    cache = Path(os.environ["BLACC_CACHE_DIR"])
    if any(cache.iterdir()):
        raise SystemExit(f"cache {cache} is not empty: the build would not be cold")
    tgt = host_target()
    plan = choose(*shape, dtype, machine=tgt.machine, isa=tgt.isa, b_unit_cols=True)
    t0 = time.perf_counter()
    if backend == "llvm":
        jit.cpu_id()
        jit.host_target_machine()
    else:
        host_compiler()
    t1 = time.perf_counter()
    scheduled = apply(matmul(dtype), plan.schedule, name=f"blacc_gemm_{dtype}_{plan.strategy}",
                      known_strides=dict(plan.known_strides))
    final, _ = lower(scheduled, tgt.isa)
    t2, cpu2 = time.perf_counter(), _cpu_s()
    native = build(final, tgt.isa, backend=backend)
    t3, cpu3 = time.perf_counter(), _cpu_s()
    _smoke_test(native, dtype)
    return {"init_s": t1 - t0, "lower_s": t2 - t1, "build_s": t3 - t2,
            "build_cpu_s": cpu3 - cpu2,
            "kernel": plan.describe(), "source_chars": len(native.source),
            "cache_files": sum(1 for p in cache.rglob("*") if p.is_file())}


def _smoke_test(native: Any, dtype: str) -> None:
    """The freshly built kernel computes a small product right (outside the timings)."""
    npdt = np.float32 if dtype == "f32" else np.float64
    a = np.arange(12, dtype=npdt).reshape(3, 4)
    b = np.arange(20, dtype=npdt).reshape(4, 5)
    c = np.full((3, 5), np.nan, npdt)
    native.function(3, 5, 4, 1.0, a.ctypes.data, 4, 1, b.ctypes.data, 5, 1, 0.0,
                    c.ctypes.data, 5, 1)
    if not np.array_equal(c, a @ b):
        raise SystemExit("the freshly built kernel computed a wrong product")


def _cold_build(dtype: str, backend: str, shape: Shape = COMPILE_SHAPE) -> dict[str, Any]:
    """Run ``_child`` in a new interpreter with a new, empty cache directory."""
    cache = tempfile.mkdtemp(prefix="blacc-cold-")
    try:
        env = {**os.environ, "BLACC_CACHE_DIR": cache}
        proc = subprocess.run(
            [sys.executable, "-m", "blacc.bench.backends", "--child", dtype, backend,
             "--shape", "x".join(map(str, shape))],
            env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"cold build of {dtype} on {backend} failed:\n{proc.stderr}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def measure_cold_compile(dtypes: Sequence[str] = ("f32", "f64"),
                         backends: Sequence[str] = BACKENDS, repeats: int = 3,
                         progress: Callable[[str], None] | None = None,
                         shape: Shape = COMPILE_SHAPE) -> list[CompileRow]:
    """Median over ``repeats`` cold builds per (backend, dtype), interleaved across them;
    the kernel is the one ``blacc.gemm`` picks for ``shape`` (blis by default)."""
    cases = [(backend, dtype) for backend in backends for dtype in dtypes]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {case: [] for case in cases}
    for i in range(repeats):
        for backend, dtype in cases:
            if progress is not None:
                progress(f"cold build {i + 1}/{repeats}: {dtype} on {backend}")
            runs[backend, dtype].append(_cold_build(dtype, backend, shape))
    rows = []
    for (backend, dtype), taken in runs.items():
        def median(field: str, taken: list[dict[str, Any]] = taken) -> float:
            return statistics.median(run[field] for run in taken)

        rows.append(CompileRow(backend, dtype, taken[0]["kernel"], median("init_s"),
                               median("lower_s"), median("build_s"), median("build_cpu_s"),
                               tuple(run["build_s"] for run in taken), len(taken),
                               taken[0]["source_chars"]))
    return rows


def format_compile_table(rows: Sequence[CompileRow]) -> str:
    """Cold build times per (backend, dtype)."""
    body = [(r.backend, r.dtype, f"{r.build_s:.3f}", f"{min(r.build_samples):.3f}",
             f"{r.build_cpu_s:.3f}", f"{r.init_s:.3f}", f"{r.lower_s:.3f}",
             f"{r.init_s + r.lower_s + r.build_s:.3f}", f"{r.source_chars}") for r in rows]
    headings = ("backend", "dtype", "build s", "build s (min)", "build cpu s", "+ init s",
                "+ lower s", "total s", "source chars")
    kernel = rows[0].kernel if rows else ""
    return (text_table(headings, body, left=2) + f"\n\nkernel: {kernel}; each build in a fresh "
            f"process with an empty BLACC_CACHE_DIR; median of {rows[0].repeats if rows else 0}"
            " (wall clock unless cpu); build = render + compile + load; cpu = CPU time of the "
            "process and its compiler; init = once per process (C: compiler probe, LLVM: "
            "target set-up)")


def backends_to_json(rows: Sequence[BackendRow], compile_rows: Sequence[CompileRow]) -> str:
    """Both tables with the environment they were measured in."""
    from blacc.runtime.gemm import host_target

    tgt = host_target()
    document = {
        "machine": tgt.machine.to_dict(), "isa": tgt.isa.name,
        "python": platform.python_version(), "numpy": np.__version__,
        "runtime": [{**asdict(r), "verified": r.verified} for r in rows],
        "compile": [asdict(r) for r in compile_rows],
    }
    return json.dumps(document, indent=2)


def _main(argv: Sequence[str]) -> int:
    """The child entry: ``python -m blacc.bench.backends --child f32 llvm``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=2, metavar=("DTYPE", "BACKEND"), required=True)
    parser.add_argument("--shape", type=parse_shape, default=COMPILE_SHAPE)
    args = parser.parse_args(argv)
    print(json.dumps(_child(*args.child, args.shape)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
