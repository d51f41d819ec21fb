"""The seed's Figures 4-9 on this machine: SGEMM strategies as speedups over naive loops.

Intrinsic, Tiling (no_packing), Tiling+Packing (blis) on the C and LLVM backends, and
NumPy's BLAS, against the plain triple loop; see README.md in this folder.

    python benchmarks/strategies_vs_naive.py --quick      # well under 2 minutes
    python benchmarks/strategies_vs_naive.py              # 16 ... 2048, several minutes
    python benchmarks/strategies_vs_naive.py --full       # adds 4096 (naive: many minutes)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blacc.bench.strategies import (
    DEFAULT_GROUPS,
    FULL_GROUPS,
    FULL_TIMING,
    QUICK_GROUPS,
    QUICK_TIMING,
    STRATEGY_ORDER,
    Timing,
    format_tables,
    intrinsic_status,
    measure_overheads,
    plot_gflops,
    plot_speedups,
    results_to_json,
    run_strategies,
)
from blacc.runtime.gemm import host_target

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _progress(case: str) -> None:
    print(f"running {case} ...", file=sys.stderr, flush=True)


def _groups(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    groups = QUICK_GROUPS if args.quick else FULL_GROUPS if args.full else DEFAULT_GROUPS
    if args.sizes:
        return {"custom": tuple(args.sizes)}
    return dict(groups)


def _notes(timing: Timing, baseline: str, overheads: dict[str, float], direct: bool,
           intrinsic_max: int) -> list[str]:
    """What the reader must know to interpret the numbers."""
    ctypes_cost = ", ".join(f"{b} {s * 1e6:.2f} us" for b, s in overheads.items() if b != "numpy")
    calls = ("one ctypes call per kernel call" if direct else
             "a JIT-compiled loop making 2^22 // N^3 kernel calls per ctypes call, as if "
             "called from compiled code")
    notes = [
        f"baseline: {baseline} = naive triple loop (generic ISA, no tiling/vectorization "
        "directives) compiled at -O3",
        f"blacc kernels are called through their compiled entry point ({calls}), not through "
        f"blacc.gemm; one empty ctypes call costs {ctypes_cost}; one np.matmul call of 1x1 "
        f"matrices costs {overheads.get('numpy', float('nan')) * 1e6:.2f} us, paid on every "
        "NumPy call",
        "each result verified against a float64 reference before timing; single thread, same "
        f"process; fast candidates interleaved, samples >= {timing.min_sample_s * 1e3:.0f} ms, "
        f"median of {timing.samples}",
        f"calls slower than {timing.slow_call_s:g} s (naive loops at large sizes) are timed "
        f"apart: median of up to {timing.slow_samples} call(s) within "
        f"{timing.slow_budget_s:g} s, the verified call counted",
        f"Intrinsic = the whole product as one fully unrolled N x N x N matrix-intrinsic "
        f"call (the seed's definition); its compile time grows with N^3, so it runs only up "
        f"to N = {intrinsic_max} (--intrinsic-max)",
        "Tiling+Intrinsic = the seed's Tiling: Goto's mc/kc/nc blocks, no packing, register "
        "tiles as intrinsic calls; Tiling = blacc's no_packing (register tiles of outer "
        "products, no cache blocks); Tiling+Packing = blacc's blis",
        "on the C backend the intrinsic strategies run blacc's generic lowering of the "
        "intrinsic (llvm.matrix.multiply exists only in LLVM)",
    ]
    skipped = intrinsic_status()
    if skipped:
        notes.append(skipped)
    return notes


def main(argv: list[str] | None = None) -> int:
    """Run, print the tables, write JSON and plots; exit 1 when any result is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="16, 32, 64, 256, 1024; short")
    mode.add_argument("--full", action="store_true", help="also 4096 (naive takes minutes)")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N", help="M=N=K sizes instead")
    parser.add_argument("--backends", nargs="+", choices=("c", "llvm"), default=["c", "llvm"])
    parser.add_argument("--baseline", help="candidate key to divide by (default naive[c])")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for JSON + plots")
    parser.add_argument("--direct", action="store_true",
                        help="one ctypes call per kernel call (no compiled repeat loop)")
    parser.add_argument("--intrinsic-max", type=int, metavar="N",
                        help="largest size for Intrinsic (default 32; 16 with --quick)")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGY_ORDER[1:],
                        help="run only these (naive loops always run: the baseline)")
    parser.add_argument("--no-plots", action="store_true", help="skip matplotlib figures")
    args = parser.parse_args(argv)

    timing = QUICK_TIMING if args.quick else FULL_TIMING
    intrinsic_max = args.intrinsic_max or (16 if args.quick else 32)
    baseline = args.baseline or f"naive[{args.backends[0]}]"
    skipped = intrinsic_status()
    if skipped:
        print(f"note: {skipped}", file=sys.stderr)
    overheads = measure_overheads(args.backends, timing)
    results = run_strategies(
        _groups(args), backends=args.backends, timing=timing, baseline=baseline,
        direct=args.direct, intrinsic_max=intrinsic_max, strategies=args.strategies,
        progress=_progress)
    tgt = host_target()
    machine = f"{tgt.machine.name} ({tgt.isa.name})"
    notes = _notes(timing, baseline, overheads, args.direct, intrinsic_max)
    print(f"SGEMM strategies vs naive loops on {machine}\n")
    print(format_tables(results))
    print("\n".join(f"note: {n}" for n in notes))
    builds = [f"{r.key} N={r.size}: {r.build_s:.1f} s" for r in results
              if r.strategy == "Intrinsic" and r.build_s == r.build_s]
    if builds:
        print("note: Intrinsic build times this run (cold unless cached): " + ", ".join(builds))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": tgt.machine.to_dict(), "isa": tgt.isa.name, "dtype": "float32",
            "baseline": baseline, "call_overhead_s": overheads,
            "calls": "direct ctypes" if args.direct else "compiled repeat loop", "notes": notes,
            "mode": "quick" if args.quick else "full" if args.full else "default",
            "intrinsic_max": intrinsic_max}
    json_path = args.out / "strategies.json"
    json_path.write_text(results_to_json(results, meta) + "\n", encoding="utf-8")
    print(f"\nwrote {json_path}")
    if not args.no_plots:
        try:
            paths = [*plot_speedups(results, args.out, baseline, machine),
                     plot_gflops(results, args.out, machine)]
        except ImportError:
            print("matplotlib missing: pip install -e '.[bench]' for plots", file=sys.stderr)
        else:
            print("\n".join(f"wrote {p}" for p in paths))
    return 0 if all(r.error != "wrong result" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
