"""A fixed-size program that is one GEMM, ``C = A*B + C``: blacc.compile's kernel (the
small path or the spine's GEMM, whichever ``strategy.route`` picks) against the small
path forced, blacc.gemm and NumPy, on one core. See "Programs that are one GEMM" in
benchmarks/README.md.

    python benchmarks/fixed_vs_spine.py                        # the shapes below, f32 and f64
    python benchmarks/fixed_vs_spine.py --shapes 600x600x600 --dtype float64
"""

from __future__ import annotations

import time

import numpy as np

import blacc
from blacc.bench.gemm import shape_table
from blacc.bench.timing import measure_interleaved, single_thread
from blacc.strategy import route

SHAPES = ("64x64x64", "80x80x80", "96x96x96", "112x112x112", "128x128x128",
          "200x200x200", "400x400x400", "600x600x600", "1000x1000x8", "300x300x50",
          "8x8x1000")
HEADER = ("dtype    shape (MxNxK) path  compile   small    gemm   numpy  /small  /gemm "
          "/numpy  planned in s (compile, small)  (GFLOPS, median of interleaved samples)")


def _compile(m: int, n: int, k: int, dt: str, multiple: float) -> tuple[object, float]:
    """blacc.compile's kernel with ``route.SPINE_L1_MULTIPLE`` set to ``multiple``, and
    the seconds it took."""
    saved = route.SPINE_L1_MULTIPLE
    route.SPINE_L1_MULTIPLE = multiple
    try:
        start = time.perf_counter()
        kernel = blacc.compile("C = A*B + C", A=blacc.Matrix(m, k, dt),
                               B=blacc.Matrix(k, n, dt), C=blacc.Matrix(m, n, dt))
        return kernel, time.perf_counter() - start
    finally:
        route.SPINE_L1_MULTIPLE = saved


def bench(dtype: np.dtype, m: int, n: int, k: int) -> str:
    dt = "f32" if dtype == np.float32 else "f64"
    routed, routed_s = _compile(m, n, k, dt, route.SPINE_L1_MULTIPLE)
    small, small_s = _compile(m, n, k, dt, float("inf"))
    rng = np.random.default_rng([m, n, k])
    a = rng.uniform(-1, 1, (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype)
    c0 = rng.uniform(-1, 1, (m, n)).astype(dtype)
    expected = a.astype(np.float64) @ b + c0
    tolerance = 8 * k * float(np.finfo(dtype).eps) * (np.abs(a) @ np.abs(b) + np.abs(c0))
    for name, kernel in (("compile", routed), ("small path", small)):
        c = c0.copy()
        kernel(A=a, B=b, C=c)
        if not (np.abs(c - expected) <= tolerance).all():
            raise SystemExit(f"{name} gave a wrong result for {m}x{n}x{k} {dtype.name}")
    c = c0.copy()
    calls = {
        "compile": lambda: routed(A=a, B=b, C=c),
        "small": lambda: small(A=a, B=b, C=c),
        "gemm": lambda: blacc.gemm(a, b, c, beta=1.0),
        "numpy": lambda: np.add(np.matmul(a, b), c, out=c),
    }
    with single_thread():
        stats = measure_interleaved(calls, min_sample_s=0.05, samples=7, warmup=1)
    gflops = {name: 2.0 * m * n * k / s.median / 1e9 for name, s in stats.items()}
    path = "spine" if "blacc_gemm_" in routed.source else "small"
    shape = f"{m}x{n}x{k}"
    ratios = " ".join(f"{gflops['compile'] / gflops[peer]:5.2f}x"
                      for peer in ("small", "gemm", "numpy"))
    return (f"{dtype.name:8s} {shape:13s} {path:5s} {gflops['compile']:7.1f} "
            f"{gflops['small']:7.1f} {gflops['gemm']:7.1f} {gflops['numpy']:7.1f}  "
            f"{ratios}  {routed_s:5.1f} {small_s:5.1f}")


def main(argv: list[str] | None = None) -> int:
    return shape_table(__doc__.splitlines()[0], SHAPES, HEADER, bench, argv)


if __name__ == "__main__":
    raise SystemExit(main())
