"""blacc.gemm against NumPy's BLAS: verified first, then timed under the same conditions.

Shapes are ``(m, n, k)``: ``C[m, n] = A[m, k] @ B[k, n]``, so one call costs ``2*m*n*k``
flops. A speed number for a wrong answer is worthless, so every shape is checked against
a float64 reference before it is timed. Both libraries then run in this process, on one
thread, with samples interleaved (see `blacc.bench.timing`), and each result is also
given as a fraction of this core's measured peak (see `blacc.bench.peak`).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_info

from blacc.bench.peak import Peak, measure_peak
from blacc.bench.timing import measure_interleaved, single_thread
from blacc.target.machine import Machine, detect_machine

__all__ = [
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
    "Row",
    "Shape",
    "format_table",
    "shape_table",
    "parse_shape",
    "rows_to_json",
    "run_gemm_bench",
    "verify_gemm",
]

Shape = tuple[int, int, int]  # (m, n, k)

#: Powers of two, plus sizes that are not multiples of any kernel tile, plus a
#: rectangular one; all (m, n, k).
DEFAULT_SHAPES: tuple[Shape, ...] = (
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (1000, 1000, 1000),
    (1531, 1531, 1531),
    (777, 1234, 555),
)

#: A subset that runs in seconds; still covers a ragged and a rectangular shape.
QUICK_SHAPES: tuple[Shape, ...] = (
    (256, 256, 256),
    (512, 512, 512),
    (1000, 1000, 1000),
    (777, 1234, 555),
)

SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "float64")

_METHOD = "single thread, same process, GFLOPS from the median of interleaved samples"


@dataclass(frozen=True)
class _Timing:
    min_sample_s: float
    samples: int
    warmup: int


_FULL = _Timing(min_sample_s=0.05, samples=7, warmup=1)
_QUICK = _Timing(min_sample_s=0.02, samples=5, warmup=1)


@dataclass(frozen=True)
class Row:
    """One (dtype, shape) result. Peak fractions are of one core's measured peak."""

    dtype: str
    m: int
    n: int
    k: int
    blacc_gflops: float
    numpy_gflops: float
    ratio: float  # blacc / numpy: above 1 means blacc is faster
    blacc_peak_fraction: float
    numpy_peak_fraction: float
    verified: bool


def parse_shape(text: str) -> Shape:
    """Parse 'MxNxK' (e.g. '777x1234x555') into ``(m, n, k)``; ValueError if malformed."""
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) != 3:
        raise ValueError(f"shape {text!r} is not of the form MxNxK")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"shape {text!r} is not of the form MxNxK with integer sizes") from None
    if min(m, n, k) < 1:
        raise ValueError(f"shape {text!r} has a size below 1")
    return m, n, k


def shape_table(description: str, shapes: Sequence[str], header: str,
                bench: Callable[[np.dtype, int, int, int], str],
                argv: list[str] | None = None) -> int:
    """A benchmark script's ``main``: ``--shapes`` (MxNxK, default ``shapes``) and
    ``--dtype`` (float32, float64 or both) from ``argv``; prints ``header``, then
    ``bench(dtype, m, n, k)``'s line for every dtype and shape."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shapes", type=parse_shape, nargs="+", metavar="MxNxK",
                        default=[parse_shape(s) for s in shapes])
    parser.add_argument("--dtype", choices=("float32", "float64", "both"), default="both")
    args = parser.parse_args(argv)
    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    print(header)
    for dtype in dtypes:
        for m, n, k in args.shapes:
            print(bench(np.dtype(dtype), m, n, k), flush=True)
    return 0


def verify_gemm(
    result: npt.NDArray[np.floating], a: npt.NDArray[np.floating], b: npt.NDArray[np.floating]
) -> bool:
    """True when ``result`` matches ``a @ b`` to the accuracy a k-term dot product allows.

    The float64 reference error bound per element is ``8 * k * eps(dtype) * (|A| @ |B|)``,
    the classic forward error bound of a dot product with a safety factor, so it holds
    for any summation order a blocked kernel picks.
    """
    if result.shape != (a.shape[0], b.shape[1]) or result.dtype != a.dtype:
        return False
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    bound = 8 * a.shape[1] * np.finfo(a.dtype).eps * scale + np.finfo(a.dtype).tiny
    error = np.abs(result.astype(np.float64) - reference)
    return bool(np.all(np.isfinite(result)) and np.all(error <= bound))


def _gflops(m: int, n: int, k: int, seconds: float) -> float:
    return 2.0 * m * n * k / seconds / 1e9


def _bench_one(dtype: np.dtype, shape: Shape, timing: _Timing, peak: Peak,
               backend: str | None) -> Row:
    import blacc  # late: formatting and parsing work without the compiler stack loaded

    m, n, k = shape
    rng = np.random.default_rng([m, n, k, dtype.itemsize])
    a = rng.uniform(-1.0, 1.0, size=(m, k)).astype(dtype)
    b = rng.uniform(-1.0, 1.0, size=(k, n)).astype(dtype)
    c = np.full((m, n), np.nan, dtype=dtype)  # beta=0 must not read C, NaN or not
    result = blacc.gemm(a, b, c, beta=0.0, backend=backend)
    verified = verify_gemm(np.asarray(result), a, b) and verify_gemm(c, a, b)
    with single_thread():
        stats = measure_interleaved(
            {
                "blacc": lambda: blacc.gemm(a, b, c, beta=0.0, backend=backend),
                "numpy": lambda: np.matmul(a, b, out=c),
            },
            min_sample_s=timing.min_sample_s,
            samples=timing.samples,
            warmup=timing.warmup,
        )
    blacc_gflops = _gflops(m, n, k, stats["blacc"].median)
    numpy_gflops = _gflops(m, n, k, stats["numpy"].median)
    peak_gflops = peak.of(dtype) / 1e9
    return Row(
        dtype=dtype.name,
        m=m,
        n=n,
        k=k,
        blacc_gflops=blacc_gflops,
        numpy_gflops=numpy_gflops,
        ratio=blacc_gflops / numpy_gflops,
        blacc_peak_fraction=blacc_gflops / peak_gflops,
        numpy_peak_fraction=numpy_gflops / peak_gflops,
        verified=verified,
    )


def run_gemm_bench(
    shapes: Iterable[Shape],
    dtypes: Iterable[npt.DTypeLike],
    *,
    quick: bool,
    peak: Peak | None = None,
    progress: Callable[[str], None] | None = None,
    backend: str | None = None,
) -> list[Row]:
    """Verify and time blacc.gemm against NumPy for every dtype and ``(m, n, k)`` shape.

    ``quick`` takes fewer, shorter samples. ``peak`` defaults to this core's measured
    peak; ``progress`` is told which case starts, for long runs.
    """
    timing = _QUICK if quick else _FULL
    cases: list[Shape] = [(int(m), int(n), int(k)) for m, n, k in shapes]
    resolved = [np.dtype(d) for d in dtypes]
    for dtype in resolved:
        if dtype.name not in SUPPORTED_DTYPES:
            raise ValueError(f"unsupported dtype {dtype.name}; use one of {SUPPORTED_DTYPES}")
    peak = peak if peak is not None else measure_peak()
    rows = []
    for dtype in resolved:
        for shape in cases:
            if progress is not None:
                progress(f"{dtype.name} {'x'.join(map(str, shape))}")
            rows.append(_bench_one(dtype, shape, timing, peak, backend))
    return rows


def _short(dtype_name: str) -> str:
    return {"float32": "f32", "float64": "f64"}.get(dtype_name, dtype_name)


def _header(peak: Peak, machine: Machine) -> str:
    peaks = ", ".join(f"{_short(name)} {fps / 1e9:.1f}" for name, fps in peak.flops_per_s.items())
    clock = peak.implied_clock_hz
    clock_text = ""
    if clock:
        clock_text = (
            " (implied clock "
            + ", ".join(f"{_short(name)} {hz / 1e9:.2f} GHz" for name, hz in clock.items())
            + ")"
        )
    return (
        f"machine: {machine.name} [{machine.arch}]\n"
        f"measured peak per core, {peak.isa}: {peaks} GFLOPS{clock_text}"
    )


def format_table(rows: Sequence[Row], peaks: Peak, machine: Machine | None = None) -> str:
    """An aligned text table of ``rows`` under a header naming the machine and peaks."""
    machine = machine if machine is not None else detect_machine()
    headings = (
        "dtype",
        "shape (MxNxK)",
        "blacc GFLOPS",
        "numpy GFLOPS",
        "blacc/numpy",
        "blacc %peak",
        "numpy %peak",
        "check",
    )
    body = [
        (
            _short(r.dtype),
            f"{r.m}x{r.n}x{r.k}",
            f"{r.blacc_gflops:.1f}",
            f"{r.numpy_gflops:.1f}",
            f"{r.ratio:.2f}x",
            f"{100 * r.blacc_peak_fraction:.1f}%",
            f"{100 * r.numpy_peak_fraction:.1f}%",
            "ok" if r.verified else "FAILED",
        )
        for r in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headings, *body, strict=False)]

    def line(cells: Sequence[str]) -> str:
        # Text columns (dtype, shape) align left, numbers right.
        return "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    table = [line(headings), rule, *(line(cells) for cells in body)]
    footer = _METHOD
    return "\n".join([_header(peaks, machine), "", *table, "", footer])


def _blas_info() -> list[dict[str, object]]:
    """Which BLAS NumPy uses (name, version, threading layer), for reproducibility."""
    keep = ("internal_api", "version", "threading_layer", "architecture")
    return [
        {key: info.get(key) for key in keep}
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]


def rows_to_json(rows: Sequence[Row], peaks: Peak, machine: Machine | None = None) -> str:
    """The results as a JSON document with machine, peaks and library versions."""
    machine = machine if machine is not None else detect_machine()
    document = {
        "machine": machine.to_dict(),
        "peak": peaks.to_dict(),
        "python": platform.python_version(),
        "numpy": {"version": np.__version__, "blas": _blas_info()},
        "shape_order": "m, n, k: C[m, n] = A[m, k] @ B[k, n]",
        "method": _METHOD,
        "rows": [asdict(r) for r in rows],
    }
    return json.dumps(document, indent=2)
