"""The ``blacc`` command: benchmark, explain a kernel plan, or show the detected machine.

Only argument parsing and printing live here; the work is done by `blacc.bench`,
`blacc.explain` and `blacc.target`, so everything is also usable from Python.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from blacc.errors import ArgumentError, BlaccError

__all__ = ["build_parser", "main"]

_DTYPES = {"f32": ("float32",), "f64": ("float64",), "both": ("float32", "float64")}


def _shape(text: str) -> tuple[int, int, int]:
    from blacc.bench.gemm import parse_shape

    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive size")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand (separate from main() so tests can probe it)."""
    parser = argparse.ArgumentParser(prog="blacc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = sub.add_parser(
        "bench",
        help="verify and time blacc.gemm against NumPy on one thread",
        description="Verify blacc.gemm against a float64 reference, then time it against "
        "NumPy's BLAS: same process, single thread, interleaved samples, medians. "
        "Exits 1 if any result is wrong.",
    )
    bench.add_argument("--quick", action="store_true", help="fewer shapes, shorter samples")
    bench.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    bench.add_argument("--dtype", choices=tuple(_DTYPES), default="both")
    bench.add_argument(
        "--shape",
        type=_shape,
        nargs="+",
        action="extend",
        metavar="MxNxK",
        help="shapes to run instead of the default list (C[M,N] = A[M,K] @ B[K,N])",
    )

    explain = sub.add_parser("explain", help="show the plan blacc picks for one GEMM")
    explain.add_argument("--m", type=_positive_int, required=True)
    explain.add_argument("--n", type=_positive_int, required=True)
    explain.add_argument("--k", type=_positive_int, required=True)
    explain.add_argument("--dtype", choices=("f32", "f64"), default="f32")
    explain.add_argument("--trans-a", action="store_true", help="A is stored transposed")
    explain.add_argument("--trans-b", action="store_true", help="B is stored transposed")
    for p in (bench, explain):
        p.add_argument("--backend", choices=("c", "llvm", "auto"), default=None,
                       help="code generator: system C compiler, LLVM JIT, or auto "
                       "(default: $BLACC_BACKEND or auto)")

    emit = sub.add_parser(
        "emit",
        help="write a standalone C function for a fixed-size program",
        description="Compile a program of the expression language (e.g. 'y = A*x + y') "
        "into OUT.c and OUT.h: one C function with no dependency on blacc.",
    )
    emit.add_argument("source", help="the program, e.g. \"y = alpha*A*x + y\"")
    emit.add_argument("--decl", action="append", default=[], metavar="NAME=KIND(...)",
                      help="an operand: A=Matrix(5,9[,layout=col][,ld=12]), x=Vector(9), "
                      "alpha=Scalar; repeat for each operand")
    emit.add_argument("--dtype", choices=("f32", "f64"), default="f64")
    emit.add_argument("-o", "--output", required=True, help="output path without suffix")
    emit.add_argument("--name", help="the C function's name (default: from --output)")
    emit.add_argument("--target", choices=("host", "avx512", "avx2", "generic"),
                      default="host", help="instruction set: this machine's, AVX-512 "
                      "(F, DQ, VL), AVX2+FMA, or plain C99")
    emit.add_argument("--search", choices=("model", "exhaustive", "random"), default="model",
                      help="how the schedule is chosen: the cost model (default), or by "
                      "timing candidate kernels here in a C loop (a few seconds)")

    info = sub.add_parser("info", help="show the detected machine and C compiler")
    info.add_argument("--peak", action="store_true", help="also measure peak flops/s")
    return parser


def _bench(args: argparse.Namespace) -> int:
    from blacc.bench import gemm
    from blacc.bench.peak import measure_peak

    shapes = args.shape or (gemm.QUICK_SHAPES if args.quick else gemm.DEFAULT_SHAPES)
    peak = measure_peak()
    rows = gemm.run_gemm_bench(
        shapes,
        _DTYPES[args.dtype],
        quick=args.quick,
        peak=peak,
        backend=args.backend,
        progress=lambda case: print(f"running {case} ...", file=sys.stderr, flush=True),
    )
    print(gemm.format_table(rows, peak))
    if args.json is not None:
        args.json.write_text(gemm.rows_to_json(rows, peak) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    failed = [r for r in rows if not r.verified]
    for r in failed:
        print(f"blacc: {r.dtype} {r.m}x{r.n}x{r.k}: wrong result", file=sys.stderr)
    return 1 if failed else 0


def _explain(args: argparse.Namespace) -> int:
    import numpy as np

    import blacc

    result = blacc.explain(
        m=args.m,
        n=args.n,
        k=args.k,
        dtype=np.dtype(_DTYPES[args.dtype][0]),
        trans_a=args.trans_a,
        trans_b=args.trans_b,
        backend=args.backend,
    )
    print(str(result))
    return 0


def _print_mapping(mapping: Mapping[str, object]) -> None:
    width = max((len(key) for key in mapping), default=0)
    for key, value in mapping.items():
        if isinstance(value, list | tuple) and value and isinstance(value[0], Mapping):
            print(f"{key}:")
            for item in value:
                print("  " + ", ".join(f"{k}={v}" for k, v in item.items()))
        elif isinstance(value, list | tuple | frozenset | set):
            print(f"{key.ljust(width)}  {' '.join(sorted(map(str, value)))}")
        else:
            print(f"{key.ljust(width)}  {value}")


def _info(args: argparse.Namespace) -> int:
    from blacc.backend.compiler import find_compiler
    from blacc.target.machine import detect_machine

    machine = detect_machine()
    to_dict = getattr(machine, "to_dict", None)
    shown = dict(to_dict() if callable(to_dict) else vars(machine))
    compiler = find_compiler(os.environ.get("CC"))
    shown["compiler"] = f"{' '.join(compiler.command)} ({compiler.version})"
    from blacc.blacs import host_isas
    from blacc.target.isa import isa_for

    small = " or ".join(isa.name for isa in host_isas())
    shown["isa"] = f"{isa_for(machine).name} (GEMM), {small} (fixed-size programs)"
    if args.peak:
        from blacc.bench.peak import measure_peak

        peak = measure_peak()
        for name, fps in peak.flops_per_s.items():
            shown[f"peak {name}"] = f"{fps / 1e9:.1f} GFLOPS per core ({peak.isa})"
        for name, hz in (peak.implied_clock_hz or {}).items():
            shown[f"clock {name}"] = f"{hz / 1e9:.2f} GHz implied by the measured peak"
    _print_mapping(shown)
    return 0


def _emit(args: argparse.Namespace) -> int:
    import blacc
    from blacc.frontend.declare import parse_declaration

    operands = dict(parse_declaration(text, args.dtype) for text in args.decl)
    try:
        c_path, h_path = blacc.emit(args.source, args.output, name=args.name,
                                    target=args.target, search=args.search, **operands)
    except OSError as exc:  # the output path
        raise ArgumentError(f"cannot write {exc.filename}: {exc.strerror}") from exc
    print(f"wrote {c_path} and {h_path}")
    return 0


_COMMANDS = {"bench": _bench, "explain": _explain, "emit": _emit, "info": _info}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``blacc`` command line; returns the process exit status."""
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except BlaccError as exc:
        print(f"blacc: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
