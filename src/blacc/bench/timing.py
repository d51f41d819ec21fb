"""Measurement discipline for comparing implementations fairly.

Timings of two implementations are only comparable when taken under the same
conditions. So every candidate runs in the same process, single-threaded, with its
samples interleaved (A B A B ...) so that drift in clock speed, temperature or
background load hits all candidates alike. Each sample batches enough calls to last at
least ``min_sample_s`` (timer resolution and call overhead then vanish), and the median
over samples is reported because it ignores the occasional interrupted sample.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from threadpoolctl import threadpool_limits

__all__ = ["Stats", "calibrate", "measure_interleaved", "single_thread"]

Clock = Callable[[], float]

#: Calibration stops growing the batch here; guards against a zero-duration clock.
_MAX_REPEATS = 1 << 30


@dataclass(frozen=True)
class Stats:
    """Seconds per call of one candidate: median and min over samples, plus the samples.

    ``repeats`` is how many calls each sample batched.
    """

    median: float
    min: float
    samples: tuple[float, ...]
    repeats: int


def _time_batch(fn: Callable[[], object], repeats: int, clock: Clock) -> float:
    """Seconds for ``repeats`` back-to-back calls of ``fn``."""
    start = clock()
    for _ in range(repeats):
        fn()
    return clock() - start


def calibrate(
    fn: Callable[[], object], min_sample_s: float, *, clock: Clock = time.perf_counter
) -> int:
    """Smallest tried repeat count whose batch of calls lasts at least ``min_sample_s``.

    Starts from one call and extrapolates from the last batch's duration (with 20%
    headroom, and at least doubling), so slow functions cost one call to calibrate.
    """
    repeats = 1
    while True:
        elapsed = _time_batch(fn, repeats, clock)
        if elapsed >= min_sample_s or repeats >= _MAX_REPEATS:
            return repeats
        if elapsed > 0:
            estimate = math.ceil(repeats * min_sample_s * 1.2 / elapsed)
        else:
            estimate = repeats * 10
        repeats = min(_MAX_REPEATS, max(2 * repeats, estimate))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Keep garbage collection pauses out of the timed samples."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def measure_interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    min_sample_s: float = 0.05,
    samples: int = 7,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
) -> dict[str, Stats]:
    """Time each function with samples interleaved across functions.

    Every function is warmed up ``warmup`` times (first-call costs: page faults, lazy
    compilation, caches) and calibrated to a repeat count so one sample lasts at least
    ``min_sample_s``. Then ``samples`` rounds run, each taking one sample of every
    function in ``fns`` order. Returns seconds per call for each name.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if min_sample_s < 0:
        raise ValueError(f"min_sample_s must be non-negative, got {min_sample_s}")
    repeats: dict[str, int] = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        repeats[name] = calibrate(fn, min_sample_s, clock=clock)
    taken: dict[str, list[float]] = {name: [] for name in fns}
    with _gc_paused():
        for _ in range(samples):
            for name, fn in fns.items():
                n = repeats[name]
                taken[name].append(_time_batch(fn, n, clock) / n)
    return {
        name: Stats(
            median=statistics.median(values),
            min=min(values),
            samples=tuple(values),
            repeats=repeats[name],
        )
        for name, values in taken.items()
    }


@contextmanager
def single_thread() -> Iterator[None]:
    """Limit NumPy's BLAS (and any OpenMP pool) to one thread while the block runs.

    blacc kernels run on one core, so NumPy must too for the comparison to be fair.
    """
    with threadpool_limits(limits=1):
        yield
