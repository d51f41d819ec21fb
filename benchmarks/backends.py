"""blacc's C backend vs its LLVM backend vs NumPy: GEMM speed and cold compile time.

Run from anywhere with blacc installed; see README.md in this folder:

    python benchmarks/backends.py --quick            # 4 shapes x f32/f64, then compile times
    python benchmarks/backends.py --json backends.json
    python benchmarks/backends.py --no-compile --shapes 1000x1000x1000 --dtype float64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blacc.bench.backends import (
    DEFAULT_SHAPES,
    QUICK_SHAPES,
    backends_to_json,
    format_backend_table,
    format_compile_table,
    measure_cold_compile,
    run_backend_bench,
)
from blacc.bench.gemm import parse_shape
from blacc.runtime.gemm import host_target


def _progress(case: str) -> None:
    print(f"running {case} ...", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Verify, time and print both tables; exit status 1 when any result is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 shapes, 5 samples each")
    parser.add_argument("--shapes", type=parse_shape, nargs="+", metavar="MxNxK")
    parser.add_argument("--dtype", choices=("float32", "float64", "both"), default="both")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    parser.add_argument("--no-compile", action="store_true", help="skip cold compile times")
    parser.add_argument("--compile-only", action="store_true", help="only cold compile times")
    parser.add_argument("--compile-repeats", type=int, default=3, metavar="N")
    args = parser.parse_args(argv)

    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    tgt = host_target()
    print(f"machine: {tgt.machine.name} [{tgt.machine.arch}], isa {tgt.isa.name}\n")
    rows = []
    if not args.compile_only:
        shapes = args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
        rows = run_backend_bench(shapes, dtypes, samples=5 if args.quick else 7,
                                 progress=_progress)
        print(format_backend_table(rows), "\n", sep="", flush=True)
    compile_rows = []
    if not args.no_compile:
        short = tuple({"float32": "f32", "float64": "f64"}[d] for d in dtypes)
        compile_rows = measure_cold_compile(short, repeats=args.compile_repeats,
                                            progress=_progress)
        print(format_compile_table(compile_rows))
    if args.json is not None:
        args.json.write_text(backends_to_json(rows, compile_rows) + "\n", encoding="utf-8")
    return 0 if all(r.verified for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
