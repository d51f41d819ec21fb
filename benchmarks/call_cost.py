"""What a small product costs from Python: blacc.matmul and blacc.gemm against
numpy.matmul, same arrays, one process, single thread, interleaved, medians of samples of
at least 50 ms (blacc.bench.timing). At these sizes the time is mostly the call itself.

    python benchmarks/call_cost.py                 # 4, 8, 16, 32, 64; f32 and f64
    python benchmarks/call_cost.py --sizes 4 100 --dtype f64
"""

from __future__ import annotations

import argparse

import numpy as np

import blacc
from blacc.bench.timing import measure_interleaved, single_thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64],
                    help="n of the n x n x n products")
    ap.add_argument("--dtype", choices=("f32", "f64", "both"), default="both")
    ap.add_argument("--samples", type=int, default=9)
    args = ap.parse_args()
    dtypes = ("f32", "f64") if args.dtype == "both" else (args.dtype,)
    rng = np.random.default_rng(0)
    print(f"{'dtype':5s} {'n':>4s} {'blacc.matmul':>13s} {'blacc.gemm':>11s} "
          f"{'numpy.matmul':>13s} {'numpy/matmul':>13s}")
    for dt in dtypes:
        npdt = np.float32 if dt == "f32" else np.float64
        for n in args.sizes:
            a, b = (rng.uniform(-1, 1, (n, n)).astype(npdt) for _ in range(2))
            c = np.zeros((n, n), npdt)
            fns = {"matmul": lambda a=a, b=b, c=c: blacc.matmul(a, b, out=c),
                   "gemm": lambda a=a, b=b, c=c: blacc.gemm(a, b, c),
                   "numpy": lambda a=a, b=b, c=c: np.matmul(a, b, out=c)}
            with single_thread():
                st = measure_interleaved(fns, samples=args.samples)
            us = {name: s.median * 1e6 for name, s in st.items()}
            print(f"{dt:5s} {n:4d} {us['matmul']:10.2f} us {us['gemm']:8.2f} us "
                  f"{us['numpy']:10.2f} us {us['numpy'] / us['matmul']:12.2f}x")


if __name__ == "__main__":
    main()
