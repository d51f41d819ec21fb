"""blacc.emit's standalone C for programs of large GEMMs, ``C = A*B + C`` and ``E = A*B*F``
(F n x n): the file as emitted (the spine's GEMM above 2.5 L1s, ``strategy.route``)
against the small path forced, and NumPy, on one core. Each file is compiled alone as a
user would, ``cc -O2`` and the flags its header names, and called through ctypes (at
these sizes the call is noise). See "Emitted GEMMs" in benchmarks/README.md.

    python benchmarks/emitted_gemm.py                          # the shapes below, f32, f64
    python benchmarks/emitted_gemm.py --shapes 600x600x600 --dtype float64
    BLACC_EMIT_TARGET=generic python benchmarks/emitted_gemm.py   # plain C99, no intrinsics
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

import blacc
from blacc.bench.gemm import shape_table
from blacc.bench.timing import measure_interleaved, single_thread
from blacc.strategy import route

SHAPES = ("96x96x96", "128x128x128", "200x200x200", "400x400x400", "600x600x600",
          "1000x1000x8")
HEADER = ("dtype    program   shape (MxNxK) target  path  emitted   small   numpy  /small "
          "/numpy\n(GFLOPS, median of interleaved samples; cc -O2 and the header's flags)")
TARGET = os.environ.get("BLACC_EMIT_TARGET", "host")
_BUILD = Path(tempfile.mkdtemp(prefix="blacc-emitted-"))


def _built(source: str, decls: dict, multiple: float, name: str) -> tuple[object, str, bool]:
    """The emitted function (``route.SPINE_L1_MULTIPLE`` set to ``multiple``), compiled
    alone into a shared library and loaded, its C source, and whether it returns a
    status."""
    saved = route.SPINE_L1_MULTIPLE
    route.SPINE_L1_MULTIPLE = multiple
    try:
        c_path, h_path = blacc.emit(source, _BUILD / name, target=TARGET, **decls)
    finally:
        route.SPINE_L1_MULTIPLE = saved
    header = h_path.read_text()
    needs = re.search(r"needs <\S+> and (.*)\.$", header, re.M)
    flags = needs.group(1).split() if needs else []
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    lib = c_path.with_suffix(".so")
    subprocess.run([cc, "-std=c99", "-O2", *flags, "-fPIC", "-shared", str(c_path), "-o",
                    str(lib)], check=True)
    return (getattr(ctypes.CDLL(str(lib)), name), c_path.read_text(),
            "Returns 0, or 1" in header)


def _caller(built: tuple, names: list[str], args: dict):
    """A call of the function ``_built`` returned on ``args`` in the emitted parameter
    order (``names``)."""
    fn, _, status = built
    ctype = ctypes.c_float if args["A"].dtype == np.float32 else ctypes.c_double
    values = [args[n].ctypes.data_as(ctypes.c_void_p) if isinstance(args[n], np.ndarray)
              else ctype(args[n]) for n in names]
    fn.argtypes = [type(v) for v in values]
    fn.restype = ctypes.c_int if status else None

    def call() -> None:
        if fn(*values) and status:
            raise MemoryError("the emitted function could not allocate its buffers")

    return call


def bench(dtype: np.dtype, m: int, n: int, k: int) -> str:
    dt = "f32" if dtype == np.float32 else "f64"
    rng = np.random.default_rng([m, n, k])
    a, b = rng.uniform(-1, 1, (m, k)).astype(dtype), rng.uniform(-1, 1, (k, n)).astype(dtype)
    c, f = rng.uniform(-1, 1, (m, n)).astype(dtype), rng.uniform(-1, 1, (n, n)).astype(dtype)
    e = np.empty_like(c)
    eps = float(np.finfo(dtype).eps)
    a64, b64, f64 = (x.astype(np.float64) for x in (a, b, f))
    programs = [
        ("C+=AB", "C = A*B + C", ["A", "B", "C"], dict(A=a, B=b, C=c.copy()),
         a64 @ b64 + c, 8 * k * eps * (np.abs(a64) @ np.abs(b64) + np.abs(c)),
         lambda args: np.add(args["A"] @ args["B"], args["C"], out=args["C"]), 2.0 * m * n * k),
        ("E=ABF", "E = A*B*F", ["A", "B", "F", "E"], dict(A=a, B=b, F=f, E=e),
         a64 @ b64 @ f64, 8 * (k + n) * eps * (np.abs(a64) @ np.abs(b64) @ np.abs(f64)),
         lambda args: np.linalg.multi_dot([args["A"], args["B"], args["F"]], out=args["E"]),
         2.0 * min(k * n * n + m * k * n, m * k * n + m * n * n)),
    ]
    rows = []
    for label, source, names, args, expected, bound, numpy, flops in programs:
        decls = {"A": blacc.Matrix(m, k, dt), "B": blacc.Matrix(k, n, dt),
                 "C": blacc.Matrix(m, n, dt), "E": blacc.Matrix(m, n, dt),
                 "F": blacc.Matrix(n, n, dt)}
        decls = {x: decls[x] for x in names}
        tag = f"{label[0].lower()}_{dt}_{m}_{n}_{k}"
        emitted = _built(source, decls, route.SPINE_L1_MULTIPLE, f"emitted_{tag}")
        small = _built(source, decls, float("inf"), f"small_{tag}")
        out = names[-1]
        for name, fn in (("emitted", emitted), ("small path", small)):
            trial = {x: v.copy() for x, v in args.items()}
            _caller(fn, names, trial)()
            if not (np.abs(trial[out] - expected) <= bound).all():
                raise SystemExit(f"{name} gave a wrong result for {source} {m}x{n}x{k} {dt}")
        calls = {"emitted": _caller(emitted, names, args), "small": _caller(small, names, args),
                 "numpy": lambda args=args, numpy=numpy: numpy(args)}
        with single_thread():
            stats = measure_interleaved(calls, min_sample_s=0.05, samples=7, warmup=1)
        gflops = {x: flops / s.median / 1e9 for x, s in stats.items()}
        path = "spine" if "blacc_gemm_" in emitted[1] else "small"
        ratios = " ".join(f"{gflops['emitted'] / gflops[p]:5.2f}x" for p in ("small", "numpy"))
        shape = f"{m}x{n}x{k}"
        rows.append(f"{dtype.name:8s} {label:9s} {shape:13s} {TARGET:7s} {path:5s} "
                    f"{gflops['emitted']:7.1f} {gflops['small']:7.1f} {gflops['numpy']:7.1f}  "
                    f"{ratios}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    return shape_table(__doc__.splitlines()[0], SHAPES, HEADER, bench, argv)


if __name__ == "__main__":
    raise SystemExit(main())
