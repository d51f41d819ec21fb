"""Compare GEMM blocking / prefetch settings against each other and NumPy.

Every candidate is compiled first, then all are timed in one process, interleaved,
single thread, medians of samples of at least 50 ms (blacc.bench.timing):

    python benchmarks/tune_gemm.py --dtype f32 --shape 1000x1000x1000 \\
        --cand mc=144,kc=256 --cand mc=96,kc=256,pfa=16,pfb=8

Keys of a candidate: mc, kc, nc, mr, nr, ku, pfa, pfb (prefetch distances of A and B in k
steps; 0 = none), bal (1: k blocks of equal length, the default; 0: kc-long blocks and a
shorter last one), edges (1: the last column tile only as wide as it needs, the default;
0: the full tile over padding), io (1: rows of register tiles outside, each A sliver
staying in L1 while the B panel streams past it; 0: columns of tiles outside), place (1:
register tiles mr x nr over the operands in place, no packing, with mr, nr, ku, edges and
jo, 1 for columns of tiles outside; 0: packed, the default); unspecified keys take the
machine model's values. Kernels are called through blacc's CPython extension
where it builds (ctypes otherwise), as blacc.gemm calls them.
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np

from blacc.bench.gemm import parse_shape
from blacc.bench.timing import measure_interleaved, single_thread
from blacc.runtime.gemm import gemm_kernel, host_target
from blacc.runtime.gemmcall import gemm_caller
from blacc.strategy.gemm import Plan, blis, choose, no_packing, packed_tile


def candidate_plan(text: str, dtype: str, shape: tuple[int, int, int]) -> Plan:
    tgt = host_target()
    base = dict(choose(*shape, dtype, machine=tgt.machine, isa=tgt.isa, b_unit_cols=True).params)
    mr, nr, lanes = packed_tile(dtype, tgt.isa)
    values = {"mc": base.get("mc", 144), "kc": base.get("kc", 256),
              "nc": base.get("nc", 4080), "ku": 4, "pfa": 0, "pfb": 0, "mr": mr, "nr": nr, "bal": 1,
              "edges": 1, "place": 0, "jo": 0,
              "io": base.get("rows_outside", 0)}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in values:
            raise SystemExit(f"unknown candidate key {key!r} in {text!r}")
        values[key] = int(value)
    v = values
    params = tuple(sorted(v.items()))
    if v["place"]:
        schedule = no_packing(v["mr"], v["nr"], v["ku"], lanes, j_outer=bool(v["jo"]),
                              narrow_edges=bool(v["edges"]))
        strides = (("B_s1", 1), ("C_s1", 1)) if lanes > 1 else (("C_s1", 1),)
        return Plan("no_packing", params, schedule, strides)
    schedule = blis(v["mc"], v["kc"], v["nc"], v["mr"], v["nr"], v["ku"], lanes,
                    prefetch_a=v["pfa"], prefetch_b=v["pfb"], balanced=bool(v["bal"]),
                    narrow_edges=bool(v["edges"]), rows_outside=bool(v["io"]))
    return Plan("blis", params, schedule, (("C_s1", 1),))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("f32", "f64"), default="f32")
    ap.add_argument("--shape", type=parse_shape, default=(1000, 1000, 1000))
    ap.add_argument("--cand", action="append", default=[], help="e.g. mc=144,kc=256,pfa=16")
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--backend", action="append", choices=("c", "llvm"),
                    help="compile every candidate with these backends (default: c)")
    args = ap.parse_args()
    m, n, k = args.shape
    npdt = np.float32 if args.dtype == "f32" else np.float64
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (m, k)).astype(npdt)
    b = rng.uniform(-1, 1, (k, n)).astype(npdt)
    c = np.zeros((m, n), npdt)
    isa = host_target().isa
    extension = (gemm_caller() or {}).get(args.dtype)
    fns = {}
    backends = args.backend or ["c"]
    for text in args.cand or [""]:
        for backend in backends:
            plan = candidate_plan(text, args.dtype, args.shape)
            fn = gemm_kernel(args.dtype, plan, isa, backend).native
            address = ctypes.cast(fn.function, ctypes.c_void_p).value

            def call(fn=fn, address=address) -> None:
                if extension is not None:  # sized kernels (m, n, k are arguments)
                    extension(address, True, 1.0, a, b, 0.0, c)
                else:
                    fn(m, n, k, 1.0, a.ctypes.data, k, 1, b.ctypes.data, n, 1, 0.0,
                       c.ctypes.data, n, 1)

            label = text or "model"
            fns[label if len(backends) == 1 else f"{label} [{backend}]"] = call
    fns["numpy"] = lambda: np.matmul(a, b, out=c)
    with single_thread():
        stats = measure_interleaved(fns, samples=args.samples)
    flops = 2 * m * n * k
    ref = stats["numpy"].median
    for name, st in stats.items():
        print(f"{name:40s} {flops / st.median / 1e9:7.1f} GFLOPS  {ref / st.median:5.2f}x numpy")


if __name__ == "__main__":
    main()
