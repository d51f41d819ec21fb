"""Fixed-size programs that are GEMMs, ``C = A*B + C``, ``D = alpha*A*B + beta*C``,
``E = A*B*F`` and ``D = (A*B + C)*F`` (F n x n), and one with a statement that is not,
``C = A*B; y = C*x``: blacc.compile's kernel (the small path or the spine's GEMMs,
whichever ``strategy.route`` picks) against the small path forced, blacc.gemm (for D,
after ``D = beta*C`` in NumPy; for E, twice, in the association with fewer multiplies,
which blacc takes and whose flops count; for (A*B + C)*F, into a copy of C, then times
F; for y, then NumPy's matmul) and NumPy (``multi_dot`` for E), on one core. See
"Programs that are GEMMs" in benchmarks/README.md.

    python benchmarks/fixed_vs_spine.py                        # the shapes below, f32 and f64
    python benchmarks/fixed_vs_spine.py --shapes 600x600x600 --dtype float64
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import blacc
from blacc.bench.gemm import shape_table
from blacc.bench.timing import measure_interleaved, single_thread
from blacc.strategy import route

SHAPES = ("64x64x64", "80x80x80", "96x96x96", "112x112x112", "128x128x128",
          "200x200x200", "400x400x400", "600x600x600", "1000x1000x8", "300x300x50",
          "8x8x1000")
HEADER = ("dtype    program     shape (MxNxK) path  compile   small    gemm   numpy  /small  /gemm "
          "/numpy  planned in s (compile, small)\n(GFLOPS, median of interleaved samples)")
ALPHA, BETA = 0.5, 2.0


def _compile(source: str, decls: dict, multiple: float) -> tuple[object, float]:
    """blacc.compile's kernel with ``route.SPINE_L1_MULTIPLE`` set to ``multiple``, and
    the seconds it took."""
    saved = route.SPINE_L1_MULTIPLE
    route.SPINE_L1_MULTIPLE = multiple
    try:
        start = time.perf_counter()
        kernel = blacc.compile(source, **decls)
        return kernel, time.perf_counter() - start
    finally:
        route.SPINE_L1_MULTIPLE = saved


def _programs(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, f: np.ndarray,
              x: np.ndarray) -> list[tuple]:
    """(label, source, arguments, the float64 result (of the last statement), blacc.gemm's
    call, NumPy's call, flops) for each program, on these operands (the first updates a
    copy of c)."""
    a64, c64 = a.astype(np.float64), c.astype(np.float64)
    t, c1 = a.dtype.type, c.copy()
    (m, k), n = a.shape, b.shape[1]
    e, y, t_ab = np.empty_like(c), np.empty(m, a.dtype), np.empty_like(c)
    # E = A*B*F as blacc computes it, in the association with fewer multiplies; the
    # peers so too (NumPy's multi_dot chooses alike)
    if k * n * n + m * k * n < m * k * n + m * n * n:
        bf = np.empty((k, n), a.dtype)
        chain, chain_flops = (lambda: blacc.gemm(a, blacc.gemm(b, f, bf), e),
                              2.0 * (k * n * n + m * k * n))
    else:
        ab = np.empty_like(c)
        chain, chain_flops = (lambda: blacc.gemm(blacc.gemm(a, b, ab), f, e),
                              2.0 * (m * k * n + m * n * n))
    return [
        ("C+=AB", "C = A*B + C", dict(A=a, B=b, C=c1), a64 @ b + c64,
         lambda: blacc.gemm(a, b, c1, beta=1.0), lambda: np.add(np.matmul(a, b), c1, out=c1),
         2.0 * m * n * k),
        ("D=aAB+bC", "D = alpha*A*B + beta*C", dict(A=a, B=b, C=c, D=d, alpha=ALPHA, beta=BETA),
         ALPHA * (a64 @ b) + BETA * c64,
         lambda: blacc.gemm(a, b, np.multiply(c, t(BETA), out=d), alpha=ALPHA, beta=1.0),
         lambda: np.add(np.multiply(np.matmul(a, b), t(ALPHA)), np.multiply(c, t(BETA)),
                        out=d), 2.0 * m * n * k),
        ("E=ABF", "E = A*B*F", dict(A=a, B=b, F=f, E=e), a64 @ b @ f, chain,
         lambda: np.linalg.multi_dot([a, b, f], out=e), chain_flops),
        ("D=(AB+C)F", "D = (A*B + C)*F", dict(A=a, B=b, C=c, F=f, D=d), (a64 @ b + c64) @ f,
         lambda: blacc.gemm(blacc.gemm(a, b, np.copyto(t_ab, c) or t_ab, beta=1.0), f, d),
         lambda: np.matmul(np.add(np.matmul(a, b), c), f, out=d),
         2.0 * m * n * (k + n)),
        ("C=AB,y=Cx", "C = A*B\ny = C*x", dict(A=a, B=b, C=e, x=x, y=y), a64 @ b @ x,
         lambda: np.matmul(blacc.gemm(a, b, e), x, out=y),
         lambda: np.matmul(np.matmul(a, b, out=e), x, out=y), 2.0 * m * n * (k + 1)),
    ]


def _row(dtype: np.dtype, label: str, shape: str, source: str, decls: dict, args: dict,
         expected: np.ndarray, gemm: Callable[[], object], numpy: Callable[[], object],
         flops: float) -> str:
    routed, routed_s = _compile(source, decls, route.SPINE_L1_MULTIPLE)
    small, small_s = _compile(source, decls, float("inf"))
    out = source.splitlines()[-1].split()[0]
    bound = _bound(source, args)
    for name, kernel in (("compile", routed), ("small path", small)):
        trial = {n: (v.copy() if isinstance(v, np.ndarray) else v) for n, v in args.items()}
        kernel(**trial)
        if not (np.abs(trial[out] - expected) <= bound).all():
            raise SystemExit(f"{name} gave a wrong result for {source} {shape} {dtype.name}")
    calls = {"compile": lambda: routed(**args), "small": lambda: small(**args), "gemm": gemm,
             "numpy": numpy}
    with single_thread():
        stats = measure_interleaved(calls, min_sample_s=0.05, samples=7, warmup=1)
    gflops = {name: flops / s.median / 1e9 for name, s in stats.items()}
    path = "spine" if "blacc_gemm_" in routed.source else "small"
    ratios = " ".join(f"{gflops['compile'] / gflops[peer]:5.2f}x"
                      for peer in ("small", "gemm", "numpy"))
    return (f"{dtype.name:8s} {label:11s} {shape:13s} {path:5s} {gflops['compile']:7.1f} "
            f"{gflops['small']:7.1f} {gflops['gemm']:7.1f} {gflops['numpy']:7.1f}  "
            f"{ratios}  {routed_s:5.1f} {small_s:5.1f}")


def _bound(source: str, args: dict) -> np.ndarray:
    """What rounding allows in each element of the program's result: 8 eps times the
    inner extents and the scale of every term, computed on absolute values."""
    a, b = (np.abs(args[n].astype(np.float64)) for n in "AB")
    eps = float(np.finfo(args["A"].dtype).eps)
    if "F" in args and "C" in args:  # (A*B + C)*F
        f, c = (np.abs(args[n].astype(np.float64)) for n in "FC")
        return 8 * eps * (a.shape[1] + f.shape[0]) * ((a @ b + c) @ f)
    for second in "Fx":
        if second in args:
            f = np.abs(args[second].astype(np.float64))
            return 8 * eps * (a.shape[1] + f.shape[0]) * (a @ b @ f)
    return 8 * a.shape[1] * eps * BETA * (a @ b + np.abs(args["C"].astype(np.float64)))


def bench(dtype: np.dtype, m: int, n: int, k: int) -> str:
    dt = "f32" if dtype == np.float32 else "f64"
    decls = dict(A=blacc.Matrix(m, k, dt), B=blacc.Matrix(k, n, dt), C=blacc.Matrix(m, n, dt),
                 D=blacc.Matrix(m, n, dt), E=blacc.Matrix(m, n, dt), F=blacc.Matrix(n, n, dt),
                 x=blacc.Vector(n, dt), y=blacc.Vector(m, dt), alpha=blacc.Scalar(dt),
                 beta=blacc.Scalar(dt))
    rng = np.random.default_rng([m, n, k])
    a = rng.uniform(-1, 1, (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (k, n)).astype(dtype)
    c = rng.uniform(-1, 1, (m, n)).astype(dtype)
    f = rng.uniform(-1, 1, (n, n)).astype(dtype)
    x = rng.uniform(-1, 1, n).astype(dtype)
    d = np.empty_like(c)
    rows = []
    for label, source, args, expected, gemm, numpy, flops in _programs(a, b, c, d, f, x):
        used = {name: decls[name] for name in args}
        rows.append(_row(dtype, label, f"{m}x{n}x{k}", source, used, args, expected, gemm,
                         numpy, flops))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    return shape_table(__doc__.splitlines()[0], SHAPES, HEADER, bench, argv)


if __name__ == "__main__":
    raise SystemExit(main())
