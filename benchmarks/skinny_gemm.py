"""Skinny GEMM shapes: blacc's choice (register tiles in place) against its packed plan
and NumPy's BLAS, on one core; see "When blacc does not pack" in docs/blocking.md.

    python benchmarks/skinny_gemm.py                       # the shapes below, f32 and f64
    python benchmarks/skinny_gemm.py --shapes 1000x8x1000 --dtype float64
"""

from __future__ import annotations

import numpy as np

import blacc
from blacc.bench.gemm import shape_table, verify_gemm
from blacc.bench.timing import measure_interleaved, single_thread

SHAPES = ("1000x1x1000", "4000x1x4000", "1000x8x1000", "1000x16x1000", "4000x4x4000",
          "2000x24x300", "1000x8x100", "1x1000x1000", "2x1000x1000", "3x1000x64",
          "8x1000x1000", "16x1000x1000", "32x1000x1000", "5x2000x500", "40x40x40")
HEADER = ("dtype    shape (MxNxK)       blacc  packed   numpy  /packed /numpy  blacc's plan"
          "  (GFLOPS, median of interleaved samples)")


def bench(dtype: np.dtype, m: int, n: int, k: int) -> str:
    rng = np.random.default_rng([m, n, k])
    a = rng.uniform(-1, 1, (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype)
    c = np.full((m, n), np.nan, dtype)
    calls = {
        "blacc": lambda: blacc.gemm(a, b, c),
        "packed": lambda: blacc.gemm(a, b, c, strategy="blis"),
        "numpy": lambda: np.matmul(a, b, out=c),
    }
    for name in ("blacc", "packed"):
        calls[name]()
        if not verify_gemm(c, a, b):
            raise SystemExit(f"{name} gave a wrong result for {m}x{n}x{k} {dtype.name}")
    with single_thread():
        stats = measure_interleaved(calls, min_sample_s=0.05, samples=7, warmup=1)
    gflops = {name: 2.0 * m * n * k / s.median / 1e9 for name, s in stats.items()}
    plan = blacc.explain(m=m, n=n, k=k, dtype=dtype).plan.describe()
    shape = f"{m}x{n}x{k}"
    return (f"{dtype.name:8s} {shape:17s} {gflops['blacc']:7.1f} "
            f"{gflops['packed']:7.1f} {gflops['numpy']:7.1f}  "
            f"{gflops['blacc'] / gflops['packed']:5.2f}x {gflops['blacc'] / gflops['numpy']:5.2f}x"
            f"  {plan}")


def main(argv: list[str] | None = None) -> int:
    return shape_table(__doc__.splitlines()[0], SHAPES, HEADER, bench, argv)


if __name__ == "__main__":
    raise SystemExit(main())
