"""The seed's Figures 4-9 on this machine: SGEMM strategies against naive loops and NumPy.

Strategies (seed 000, Section 4), each on the C and the LLVM backend: *Intrinsic* (the
whole GEMM as one fully unrolled matrix-multiply intrinsic call; on the C backend its
generic lowering), *Tiling+Intrinsic* (the seed's Tiling: cache blocks without packing
around intrinsic register tiles), *Tiling* (blacc's ``no_packing``: register tiles of outer
products straight over the operands), *Tiling+Packing* (``blis``), and NumPy's BLAS; each
as a speedup over *naive loops*: the plain i/j/k triple loop (``Tile((("i", 1), ("j",
1)))`` and nothing else) for the generic ISA, i.e. straightforward loops compiled at -O3
like the seed's baseline.

Kernels are called straight through their compiled entry point, never ``blacc.gemm``
(whose argument checks would dominate tiny sizes). By default a small JIT-compiled loop
calls the kernel ``inner_repeats(size)`` times per ctypes call, so even the ~2-4 us of one
ctypes call is spread over many kernel calls, as when the seed's kernels are called from
compiled code; ``direct=True`` makes one ctypes call per kernel call instead (arguments
converted once). NumPy is called as ``np.matmul(A, B, out=C)``, with its own per-call
overhead (measured and reported). Every candidate's result is checked against a float64
reference before it is timed. Fast candidates are timed together (same process, one
thread, interleaved, medians; see `blacc.bench.timing`); a candidate whose single call
takes longer than ``Timing.slow_call_s`` (naive loops at large sizes) is timed apart with
a few calls, or just its verified call.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from blacc.bench.timing import measure_interleaved, single_thread
from blacc.runtime.build import NativeKernel
from blacc.strategy.gemm import Plan, blis, no_packing, register_tile
from blacc.target.blocking import Blocking, blis_blocking
from blacc.target.isa import GENERIC, Isa
from blacc.transform.schedule import Tile

__all__ = [
    "DEFAULT_GROUPS", "FULL_GROUPS", "FULL_TIMING", "QUICK_GROUPS", "QUICK_TIMING",
    "STRATEGY_ORDER", "Candidate", "Result", "Timing", "candidates", "format_tables",
    "inner_repeats", "intrinsic_plans", "intrinsic_status", "kernel_call",
    "measure_overheads", "naive_plan", "packing_plan", "plot_gflops", "plot_speedups",
    "reference_checker", "results_to_json", "run_size", "run_strategies", "text_table",
    "tiling_plan",
]

Groups = Mapping[str, Sequence[int]]

#: The seed's size groups (Figures 4-6 and 7-9): M = N = K.
DEFAULT_GROUPS: dict[str, tuple[int, ...]] = {
    "small": (16, 32, 64, 128), "medium": (256, 384, 512), "large": (1024, 2048)}
#: With 4096, where naive loops take minutes per call.
FULL_GROUPS: dict[str, tuple[int, ...]] = {**DEFAULT_GROUPS, "large": (1024, 2048, 4096)}
QUICK_GROUPS: dict[str, tuple[int, ...]] = {"small": (16, 32, 64), "medium": (256,),
                                            "large": (1024,)}

#: Strategy labels, in plot order.
NAIVE, INTRINSIC, TILING_INTRINSIC = "Naive", "Intrinsic", "Tiling+Intrinsic"
TILING, PACKING, NUMPY = "Tiling", "Tiling+Packing", "NumPy"
STRATEGY_ORDER = (NAIVE, INTRINSIC, TILING_INTRINSIC, TILING, PACKING, NUMPY)

#: Reduction steps per intrinsic call in Tiling+Intrinsic (blacc's k unroll).
INTRINSIC_KR = 4

DTYPE = "f32"
_NP_DTYPE = np.float32


@dataclass(frozen=True)
class Timing:
    """How long to measure. Calls slower than ``slow_call_s`` are timed apart: up to
    ``slow_samples`` calls (the verified one first) within ``slow_budget_s``."""

    min_sample_s: float = 0.05
    samples: int = 7
    warmup: int = 1
    slow_call_s: float = 1.0
    slow_samples: int = 3
    slow_budget_s: float = 60.0


FULL_TIMING = Timing()
QUICK_TIMING = Timing(samples=3, slow_samples=1)


@dataclass(frozen=True)
class Candidate:
    """One thing to time: a strategy compiled by one backend (or NumPy)."""

    key: str  # e.g. "tiling[llvm]"
    strategy: str
    backend: str  # "c", "llvm" or "numpy"
    plan: Plan | None
    isa: Isa | None
    error: str = ""  # why it cannot be built (then plan is None)


@dataclass(frozen=True)
class Result:
    """One candidate at one size. ``seconds`` is per call (NaN when not timed)."""

    group: str
    size: int
    key: str
    strategy: str
    backend: str
    seconds: float
    gflops: float
    speedup: float  # baseline seconds / seconds
    verified: bool
    calls_timed: int  # samples (interleaved) or calls (timed apart)
    interleaved: bool
    inner_repeats: int  # kernel calls per ctypes call (1 for NumPy and direct calls)
    build_s: float  # seconds to get the kernel: a cold compile, or a cache hit
    error: str = ""


# ----------------------------------------------------------------------------- plans


def naive_plan() -> Plan:
    """The plain triple loop: one C element per (i, j), a k loop inside, nothing else."""
    return Plan("naive", (), (Tile((("i", 1), ("j", 1))),), (("C_s1", 1),))


def tiling_plan(isa: Isa) -> Plan:
    """Tiling: blacc's ``no_packing``, register tiles over the unpacked operands."""
    mr, nr, lanes = register_tile(DTYPE, isa)
    ku = 4
    strides = (("B_s1", 1), ("C_s1", 1)) if lanes > 1 else (("C_s1", 1),)
    return Plan("no_packing", (("mr", mr), ("nr", nr), ("ku", ku)),
                no_packing(mr, nr, ku, lanes), strides)


def _blocking(isa: Isa) -> Blocking:
    """mc, kc, nc of the host's caches for the register tile of ``isa``."""
    from blacc.runtime.gemm import host_target

    mr, nr, _ = register_tile(DTYPE, isa)
    return blis_blocking(host_target().machine, dtype_size=4, mr=mr, nr=nr)


def packing_plan(isa: Isa) -> Plan:
    """Seed's Tiling+Packing: the BLIS layers with the machine model's blocking."""
    mr, nr, lanes = register_tile(DTYPE, isa)
    blk = _blocking(isa)
    params = (("mc", blk.mc), ("kc", blk.kc), ("nc", blk.nc), ("mr", mr), ("nr", nr), ("ku", 4))
    return Plan("blis", params, blis(blk.mc, blk.kc, blk.nc, mr, nr, 4, lanes), (("C_s1", 1),))


def _intrinsic_module() -> tuple[ModuleType | None, str]:
    """blacc.strategy.intrinsic if it imports, else None and why not."""
    try:
        return importlib.import_module("blacc.strategy.intrinsic"), ""
    except ModuleNotFoundError as exc:
        if exc.name == "blacc.strategy.intrinsic":
            return None, "blacc.strategy.intrinsic does not exist"
        return None, f"blacc.strategy.intrinsic failed to import: {exc}"
    except Exception as exc:  # a module under construction may fail in any way
        return None, f"blacc.strategy.intrinsic failed to import: {exc!r}"


def intrinsic_status() -> str:
    """'' when the Intrinsic strategy is available, else a note saying why it is skipped."""
    module, why = _intrinsic_module()
    if module is None:
        return f"Intrinsic skipped: {why}"
    return ""


def intrinsic_plans(size: int, isa: Isa, intrinsic_max: int) -> dict[str, Plan | str]:
    """{label: plan, or why there is none} for the intrinsic strategies at M = N = K = size.

    Intrinsic is the seed's single ``size x size x size`` intrinsic call, fully unrolled,
    so its compile time grows with size**3: only up to ``intrinsic_max``. Tiling+Intrinsic
    is the seed's Tiling: Goto's mc/kc/nc blocks without packing around register tiles
    that are intrinsic calls of ``INTRINSIC_KR`` reduction steps.
    """
    module, _ = _intrinsic_module()
    if module is None:
        return {}
    mr, nr, lanes = register_tile(DTYPE, isa)
    blk = _blocking(isa)
    makers: dict[str, Callable[[], Plan]] = {
        TILING_INTRINSIC: lambda: module.tiling_intrinsic(
            mr, nr, INTRINSIC_KR, mc=blk.mc, kc=blk.kc, nc=blk.nc, lanes=lanes)}
    if size <= intrinsic_max:
        makers = {INTRINSIC: lambda: module.intrinsic(size, size, size, lanes=lanes), **makers}
    plans: dict[str, Plan | str] = {}
    for label, make in makers.items():
        try:
            plans[label] = make()
        except Exception as exc:  # an API under construction: report, do not crash
            plans[label] = f"{type(exc).__name__}: {exc}"
    return plans


def candidates(size: int, backends: Sequence[str], isa: Isa, intrinsic_max: int = 32,
               strategies: Collection[str] | None = None) -> list[Candidate]:
    """Everything timed at one size: each strategy on each backend, then NumPy; only the
    ``strategies`` labels named (naive loops always: they are the baseline)."""
    plans: list[tuple[str, Plan | str, Isa]] = [(NAIVE, naive_plan(), GENERIC)]
    plans += [(label, plan, isa) for label, plan in intrinsic_plans(size, isa,
                                                                     intrinsic_max).items()]
    plans += [(TILING, tiling_plan(isa), isa), (PACKING, packing_plan(isa), isa)]
    out = [Candidate(f"{label.lower()}[{backend}]", label, backend,
                     plan if isinstance(plan, Plan) else None, plan_isa,
                     plan if isinstance(plan, str) else "")
           for label, plan, plan_isa in plans for backend in backends]
    out.append(Candidate("numpy", NUMPY, "numpy", None, None))
    keep = None if strategies is None else {NAIVE, *strategies}
    return [c for c in out if keep is None or c.strategy in keep]


# ----------------------------------------------------------------------------- checks


def reference_checker(a: npt.NDArray[np.floating],
                      b: npt.NDArray[np.floating]) -> Callable[[np.ndarray], bool]:
    """A check of results against ``a @ b``, with the float64 reference computed once.

    Same bound as `blacc.bench.gemm.verify_gemm`: ``8 k eps(dtype) (|A| @ |B|)``.
    """
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with single_thread():
        reference = a64 @ b64
        bound = 8 * a.shape[1] * np.finfo(a.dtype).eps * (np.abs(a64) @ np.abs(b64))
    bound += np.finfo(a.dtype).tiny

    def check(result: np.ndarray) -> bool:
        if result.shape != reference.shape or result.dtype != a.dtype:
            return False
        error = np.abs(result.astype(np.float64) - reference)
        return bool(np.all(np.isfinite(result)) and np.all(error <= bound))

    return check


# ----------------------------------------------------------------------------- timing


_IR_TYPES = {ctypes.c_int64: "i64", ctypes.c_int32: "i32", ctypes.c_float: "float",
             ctypes.c_double: "double", ctypes.c_void_p: "ptr"}


@functools.cache
def _repeat_driver(argtypes: tuple[Any, ...]) -> Any:
    """``int repeat(fn, reps, args...)``: calls ``fn(args...)`` reps times from machine code
    and ORs the statuses; JIT-compiled with llvmlite (no C compiler needed)."""
    from blacc.backend import jit

    args = ", ".join(f"{_IR_TYPES[t]} %a{i}" for i, t in enumerate(argtypes))
    ir = f"""
define i32 @blacc_repeat(ptr %fn, i64 %reps, {args}) {{
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%next, %body]
  %acc = phi i32 [0, %entry], [%acc2, %body]
  %done = icmp sge i64 %i, %reps
  br i1 %done, label %exit, label %body
body:
  %s = call i32 %fn({args})
  %acc2 = or i32 %acc, %s
  %next = add i64 %i, 1
  br label %head
exit:
  ret i32 %acc
}}
"""
    lib = jit.JitLibrary(jit.emit_object(ir))
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, *argtypes)
    return proto(lib.address("blacc_repeat"))


def inner_repeats(size: int) -> int:
    """Kernel calls per ctypes call in loop mode: about 4M multiply-adds' worth."""
    return max(1, (1 << 22) // size**3)


def _arguments(native: NativeKernel, a: np.ndarray, b: np.ndarray,
               c: np.ndarray) -> list[Any]:
    """The entry's arguments for C = A @ B (C-ordered arrays), by parameter name, converted
    to ctypes once; kernels of fixed-size plans take no m, n, k."""
    (m, k), n = a.shape, b.shape[1]
    values = {"m": m, "n": n, "k": k, "alpha": 1.0, "beta": 0.0,
              "A": a.ctypes.data, "A_s0": k, "A_s1": 1, "B": b.ctypes.data, "B_s0": n,
              "B_s1": 1, "C": c.ctypes.data, "C_s0": n, "C_s1": 1}
    params = native.module.function(native.module.entry).params
    types = native.function.argtypes
    return [t(values[p.name]) for t, p in zip(types, params, strict=True)]


def kernel_call(native: NativeKernel, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                repeats: int = 1) -> Callable[[], int]:
    """C = A @ B through the kernel's ctypes function, arguments converted once; with
    ``repeats`` > 1, one ctypes call runs the kernel that many times in a compiled loop."""
    fn = native.function
    converted = _arguments(native, a, b, c)
    if repeats == 1:
        return functools.partial(fn, *converted)
    driver = _repeat_driver(tuple(fn.argtypes))
    address = ctypes.cast(fn, ctypes.c_void_p)
    return functools.partial(driver, address, ctypes.c_int64(repeats), *converted)


def _overhead_s(call: Callable[[], Any], timing: Timing) -> float:
    stats = measure_interleaved({"call": call}, min_sample_s=timing.min_sample_s,
                                samples=timing.samples, warmup=timing.warmup)
    return stats["call"].median


def measure_overheads(backends: Sequence[str], timing: Timing) -> dict[str, float]:
    """Seconds per call that do no work: one ctypes call of each backend's naive kernel
    with m = n = k = 0, and ``np.matmul`` of 1x1 matrices."""
    x = np.zeros((1, 1), _NP_DTYPE)
    y = np.zeros((0, 0), _NP_DTYPE)
    out = {}
    for backend in backends:
        native = _native(Candidate("", NAIVE, backend, naive_plan(), GENERIC))
        out[backend] = _overhead_s(kernel_call(native, y, y, y), timing)
    out["numpy"] = _overhead_s(lambda: np.matmul(x, x, out=x), timing)
    return out


@functools.cache
def _matrix_kernel(plan: Plan, isa: Isa, backend: str) -> NativeKernel:
    """Build an intrinsic plan: its own contraction (fixed-size for Intrinsic) and the
    matrix-intrinsic lowering (expanded generically for backends other than LLVM)."""
    from blacc.runtime.build import build
    from blacc.transform.apply import apply
    from blacc.transform.pipeline import lower

    module = importlib.import_module("blacc.strategy.intrinsic")
    name = f"blacc_gemm_{DTYPE}_{plan.strategy.replace('-', '_')}"
    scheduled = apply(module.plan_contraction(plan, DTYPE), plan.schedule, name=name,
                      known_strides=dict(plan.known_strides))
    final, _ = lower(scheduled, isa, backend=backend, matrix_kr=module.matrix_kr(plan))
    return build(final, isa, backend=backend)


def _native(cand: Candidate) -> NativeKernel:
    """The compiled kernel of a candidate (memoized by blacc's caches)."""
    from blacc.runtime.gemm import gemm_kernel

    assert cand.plan is not None and cand.isa is not None
    module, _ = _intrinsic_module()
    if module is not None and cand.plan.strategy in getattr(module, "MATRIX_STRATEGIES", ()):
        return _matrix_kernel(cand.plan, cand.isa, cand.backend)
    return gemm_kernel(DTYPE, cand.plan, cand.isa, cand.backend).native


@dataclass
class _Prepared:
    cand: Candidate
    fn: Callable[[], Any] | None
    repeats: int  # kernel calls per call of fn
    verified: bool
    first_s: float  # seconds per kernel call of the verified run
    build_s: float = math.nan
    error: str = ""


def _prepare(cand: Candidate, a: np.ndarray, b: np.ndarray, c: np.ndarray,
             check: Callable[[np.ndarray], bool], repeats: int) -> _Prepared:
    """Compile (timed: cold, or from blacc's caches), run once on a NaN-filled C (timed)
    and verify."""
    build_s = 0.0
    if cand.error:
        return _Prepared(cand, None, repeats, False, math.nan, error=cand.error)
    if cand.backend == "numpy":
        fn: Callable[[], Any] = lambda: np.matmul(a, b, out=c)  # noqa: E731
        repeats = 1
    else:
        start = time.perf_counter()
        try:
            fn = kernel_call(_native(cand), a, b, c, repeats)
        except Exception as exc:  # a strategy that cannot build here is reported, not fatal
            return _Prepared(cand, None, repeats, False, math.nan,
                             error=f"{type(exc).__name__}: {exc}")
        build_s = time.perf_counter() - start
    c.fill(np.nan)
    start = time.perf_counter()
    status = fn()
    first = (time.perf_counter() - start) / repeats
    if cand.backend != "numpy" and status != 0:
        return _Prepared(cand, None, repeats, False, first, build_s,
                         f"kernel returned status {status}")
    return _Prepared(cand, fn, repeats, check(c), first, build_s)


def _time_apart(p: _Prepared, timing: Timing) -> list[float]:
    """A few calls of a slow candidate, the verified one first, within the budget."""
    assert p.fn is not None
    times = [p.first_s]
    while len(times) < timing.slow_samples and sum(times) + times[-1] <= timing.slow_budget_s:
        start = time.perf_counter()
        p.fn()
        times.append((time.perf_counter() - start) / p.repeats)
    return times


def _measure(prepared: Sequence[_Prepared], timing: Timing) -> dict[str, tuple[float, int, bool]]:
    """{key: (seconds per kernel call, calls or samples, interleaved)} of verified ones."""
    out: dict[str, tuple[float, int, bool]] = {}
    fast: dict[str, Callable[[], Any]] = {}
    repeats: dict[str, int] = {}
    for p in prepared:
        if p.fn is None or not p.verified:
            continue
        if p.first_s > timing.slow_call_s:
            times = _time_apart(p, timing)
            out[p.cand.key] = (statistics.median(times), len(times), False)
        else:
            fast[p.cand.key], repeats[p.cand.key] = p.fn, p.repeats
    stats = measure_interleaved(fast, min_sample_s=timing.min_sample_s, samples=timing.samples,
                                warmup=timing.warmup)
    for key, st in stats.items():
        out[key] = (st.median / repeats[key], len(st.samples), True)
    return out


def run_size(group: str, size: int, backends: Sequence[str], isa: Isa, timing: Timing,
             baseline: str, direct: bool = False, intrinsic_max: int = 32,
             strategies: Collection[str] | None = None) -> list[Result]:
    """Verify and time every candidate at M = N = K = ``size``."""
    rng = np.random.default_rng(size)
    a = rng.uniform(-1.0, 1.0, (size, size)).astype(_NP_DTYPE)
    b = rng.uniform(-1.0, 1.0, (size, size)).astype(_NP_DTYPE)
    c = np.empty((size, size), _NP_DTYPE)
    check = reference_checker(a, b)
    repeats = 1 if direct else inner_repeats(size)
    with single_thread():
        prepared = [_prepare(cand, a, b, c, check, repeats)
                    for cand in candidates(size, backends, isa, intrinsic_max, strategies)]
        measured = _measure(prepared, timing)
    base = measured.get(baseline, (math.nan,))[0]
    results = []
    for p in prepared:
        seconds, calls, interleaved = measured.get(p.cand.key, (math.nan, 0, False))
        error = p.error or ("" if p.verified else "wrong result")
        results.append(Result(group, size, p.cand.key, p.cand.strategy, p.cand.backend,
                              seconds, 2.0 * size**3 / seconds / 1e9, base / seconds,
                              p.verified, calls, interleaved, p.repeats, p.build_s, error))
    return results


def run_strategies(groups: Groups, *, backends: Sequence[str] = ("c", "llvm"),
                   timing: Timing = FULL_TIMING, baseline: str | None = None,
                   direct: bool = False, intrinsic_max: int = 32,
                   strategies: Collection[str] | None = None,
                   progress: Callable[[str], None] | None = None) -> list[Result]:
    """Every size of every group; ``baseline`` defaults to naive loops on the first backend;
    ``direct``: one ctypes call per kernel call instead of the compiled repeat loop;
    ``intrinsic_max``: the largest size given the (fully unrolled) Intrinsic strategy;
    ``strategies``: labels to run (default all of ``STRATEGY_ORDER``)."""
    from blacc.runtime.gemm import host_target

    baseline = baseline or f"{NAIVE.lower()}[{backends[0]}]"
    isa = host_target().isa
    results: list[Result] = []
    for group, sizes in groups.items():
        for size in sizes:
            if progress is not None:
                progress(f"{group} {size}x{size}x{size}")
            results += run_size(group, size, backends, isa, timing, baseline, direct,
                                intrinsic_max, strategies)
    return results


# ----------------------------------------------------------------------------- output


def text_table(headings: Sequence[str], body: Iterable[Sequence[str]], left: int = 1) -> str:
    """Aligned columns: the first ``left`` align left, the rest right."""
    rows = [tuple(headings), *(tuple(r) for r in body)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headings))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(rows[0]), "  ".join("-" * w for w in widths),
                      *(line(r) for r in rows[1:])])


def _cell(r: Result) -> str:
    if r.error:
        return "FAILED" if r.error == "wrong result" else "n/a"
    mark = "" if r.interleaved else "*"
    return f"{r.speedup:.2f}x ({r.gflops:.1f}){mark}"


def format_tables(results: Sequence[Result]) -> str:
    """One table per size group: rows are candidates, cells 'speedup (GFLOPS)' per size."""
    out = []
    for group in dict.fromkeys(r.group for r in results):
        rows = [r for r in results if r.group == group]
        sizes = list(dict.fromkeys(r.size for r in rows))
        keys = list(dict.fromkeys(r.key for r in rows))
        by = {(r.key, r.size): r for r in rows}
        body = [[key, *(_cell(by[key, s]) if (key, s) in by else "" for s in sizes)]
                for key in keys]
        out += [f"{group} SGEMM (M=N=K)", text_table(["strategy[backend]", *map(str, sizes)],
                                                     body), ""]
    out.append("cells: speedup over the baseline (GFLOPS); * = timed apart (slow calls), "
               "not interleaved; n/a = could not be built here (see JSON)")
    return "\n".join(out)


def results_to_json(results: Sequence[Result], meta: Mapping[str, Any]) -> str:
    """A JSON document: ``meta`` (machine, baseline, notes, ...) plus every result."""
    def clean(x: Any) -> Any:
        return None if isinstance(x, float) and not math.isfinite(x) else x

    rows = [{k: clean(v) for k, v in asdict(r).items()} for r in results]
    document = {"python": platform.python_version(), "numpy": np.__version__, **meta,
                "results": rows}
    return json.dumps(document, indent=2)


def _order(results: Sequence[Result], baseline: str) -> list[str]:
    keys = list(dict.fromkeys(r.key for r in results))
    rank = {s: i for i, s in enumerate(STRATEGY_ORDER)}
    strategy = {r.key: r.strategy for r in results}
    return sorted((k for k in keys if k != baseline), key=lambda k: rank.get(strategy[k], 99))


def _style(key: str, strategy: str) -> dict[str, Any]:
    colors = {NAIVE: "0.55", INTRINSIC: "tab:purple", TILING_INTRINSIC: "tab:pink",
              TILING: "tab:blue", PACKING: "tab:green", NUMPY: "tab:red"}
    return {"color": colors.get(strategy, "tab:gray"),
            "hatch": "//" if key.endswith("[llvm]") else None}


def plot_speedups(results: Sequence[Result], out_dir: Path, baseline: str,
                  title: str = "") -> list[Path]:
    """One figure per size group, like the seed's Figures 4-9: grouped bars of the
    speedup over ``baseline`` per size (log scale). Returns the files written."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group in dict.fromkeys(r.group for r in results):
        rows = [r for r in results if r.group == group]
        sizes = list(dict.fromkeys(r.size for r in rows))
        keys = _order(rows, baseline)
        by = {(r.key, r.size): r for r in rows}
        fig = Figure(figsize=(max(6.0, 1.2 * len(sizes) + 0.25 * len(keys) * len(sizes) / 2), 4.5))
        ax = fig.add_subplot()
        width = 0.8 / max(1, len(keys))
        for i, key in enumerate(keys):
            ys = [by[key, s].speedup if (key, s) in by else math.nan for s in sizes]
            xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(sizes))]
            strategy = next(r.strategy for r in rows if r.key == key)
            ax.bar(xs, ys, width, label=key, edgecolor="black", linewidth=0.4,
                   **_style(key, strategy))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(sizes)), [f"{s}" for s in sizes])
        ax.set_xlabel("M = N = K")
        ax.set_yscale("log")
        ax.set_ylabel(f"speedup over {baseline}")
        ax.set_title(f"{group} SGEMM{': ' + title if title else ''}", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        path = out_dir / f"speedup_{group}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        written.append(path)
    return written


def plot_gflops(results: Sequence[Result], out_dir: Path, title: str = "") -> Path:
    """GFLOPS against size for every candidate (the baseline included) and NumPy."""
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    for key in _order(results, baseline=""):
        rows = sorted((r for r in results if r.key == key and math.isfinite(r.gflops)),
                      key=lambda r: r.size)
        if rows:
            style = _style(key, rows[0].strategy)
            ax.plot([r.size for r in rows], [r.gflops for r in rows], color=style["color"],
                    linestyle="--" if style["hatch"] else "-", marker="o", markersize=3,
                    label=key)
    sizes = sorted({r.size for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("GFLOPS (one core)")
    ax.set_title(f"SGEMM GFLOPS{': ' + title if title else ''}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    path = out_dir / "gflops_vs_size.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
