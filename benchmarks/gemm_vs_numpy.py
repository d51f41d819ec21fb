"""Benchmark blacc.gemm against NumPy's BLAS on one core; see README.md in this folder.

Run from anywhere with blacc installed:  python benchmarks/gemm_vs_numpy.py --quick
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blacc.bench.gemm import (
    DEFAULT_SHAPES,
    QUICK_SHAPES,
    format_table,
    parse_shape,
    rows_to_json,
    run_gemm_bench,
)
from blacc.bench.peak import measure_peak


def main(argv: list[str] | None = None) -> int:
    """Verify, time and print; exit status 1 when any result is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes, shorter samples")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    parser.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        metavar="MxNxK",
        help="shapes (m, n, k) to run instead of the default list",
    )
    parser.add_argument("--dtype", choices=("float32", "float64", "both"), default="both")
    args = parser.parse_args(argv)

    shapes = args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    peak = measure_peak()
    rows = run_gemm_bench(
        shapes,
        dtypes,
        quick=args.quick,
        peak=peak,
        progress=lambda case: print(f"running {case} ...", file=sys.stderr, flush=True),
    )
    print(format_table(rows, peak))
    if args.json is not None:
        args.json.write_text(rows_to_json(rows, peak) + "\n", encoding="utf-8")
    return 0 if all(r.verified for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
