"""Tests of the strategy and backend benchmarks' helpers, and tiny end-to-end runs.

None asserts how fast anything ran: only that results are verified, complete and printed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import blacc.bench.backends as bb
import blacc.bench.strategies as bs
from blacc.bench.backends import BackendRow, CompileRow
from blacc.bench.strategies import Result, Timing

TINY = Timing(min_sample_s=0.001, samples=2, warmup=1, slow_call_s=10.0, slow_samples=1)


def _result(key: str, strategy: str, size: int, seconds: float, *, group: str = "small",
            interleaved: bool = True, error: str = "") -> Result:
    backend = key.partition("[")[2].rstrip("]") or "numpy"
    gflops = 2.0 * size**3 / seconds / 1e9
    return Result(group, size, key, strategy, backend, seconds, gflops, 1e-3 / seconds,
                  not error, 3, interleaved, 1, 0.1, error)


def _results() -> list[Result]:
    rows = []
    for size in (16, 32):
        rows += [
            _result("naive[c]", bs.NAIVE, size, 1e-3),
            _result("tiling[c]", bs.TILING, size, 1e-4),
            _result("tiling[llvm]", bs.TILING, size, 2e-4, interleaved=size == 16),
            _result("numpy", bs.NUMPY, size, 5e-4),
        ]
    rows.append(_result("naive[c]", bs.NAIVE, 1024, 2.0, group="large", interleaved=False))
    rows.append(_result("intrinsic[c]", bs.INTRINSIC, 1024, math.nan, group="large",
                        error="ScheduleError: too big"))
    return rows


# --- helpers -----------------------------------------------------------------------------


def test_text_table_aligns_columns() -> None:
    text = bs.text_table(["name", "value"], [["a", "1.0"], ["long name", "10.25"]])
    lines = text.splitlines()
    assert len(lines) == 4 and set(lines[1]) <= {"-", " "}
    assert len({len(line) for line in lines}) == 1  # right-aligned numbers: equal widths
    assert lines[2].startswith("a ") and lines[3].endswith("10.25")


def test_format_tables_one_per_group_with_marks() -> None:
    text = bs.format_tables(_results())
    assert "small SGEMM" in text and "large SGEMM" in text
    assert "10.00x" in text  # tiling[c]: 1e-3 / 1e-4
    assert "*" in text  # timed apart
    assert "n/a" in text  # could not be built
    assert text.index("small SGEMM") < text.index("large SGEMM")


def test_wrong_results_show_as_failed() -> None:
    rows = [_result("tiling[c]", bs.TILING, 16, math.nan, error="wrong result")]
    assert "FAILED" in bs.format_tables(rows)


def test_results_to_json_round_trips_and_writes_null_for_nan() -> None:
    document = json.loads(bs.results_to_json(_results(), {"baseline": "naive[c]"}))
    assert document["baseline"] == "naive[c]"
    assert len(document["results"]) == len(_results())
    failed = [r for r in document["results"] if r["error"]]
    assert failed and failed[0]["seconds"] is None and failed[0]["gflops"] is None


def test_plots_are_written(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    results = _results()
    paths = bs.plot_speedups(results, tmp_path, "naive[c]", "test")
    paths.append(bs.plot_gflops(results, tmp_path, "test"))
    assert {p.name for p in paths} == {"speedup_small.png", "speedup_large.png",
                                       "gflops_vs_size.png"}
    assert all(p.stat().st_size > 1000 for p in paths)


def test_reference_checker_catches_wrong_and_nan() -> None:
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (9, 7)).astype(np.float32)
    b = rng.uniform(-1, 1, (7, 5)).astype(np.float32)
    check = bs.reference_checker(a, b)
    good = a @ b
    assert check(good)
    wrong = good.copy()
    wrong[2, 3] += 1e-2
    assert not check(wrong)
    wrong[2, 3] = np.nan
    assert not check(wrong)
    assert not check(good.astype(np.float64))


def test_inner_repeats_spreads_call_overhead_on_small_sizes() -> None:
    assert bs.inner_repeats(16) == 1024
    assert bs.inner_repeats(128) == 2
    assert bs.inner_repeats(1024) == 1


def test_naive_plan_is_the_plain_triple_loop() -> None:
    from blacc.transform.schedule import Tile

    assert bs.naive_plan().schedule == (Tile((("i", 1), ("j", 1))),)


def test_backend_tables_and_json() -> None:
    rows = [BackendRow("float32", 256, 256, 256, 40.0, 50.0, 80.0, 1.25, 0.5, 0.625,
                       True, True, True),
            BackendRow("float64", 777, 1234, 555, 20.0, 18.0, 40.0, 0.9, 0.5, 0.45,
                       True, False, True)]
    compiled = [CompileRow("c", "f32", "blis(...)", 0.2, 0.1, 1.5, 1.2, (1.5, 1.4, 1.6), 3, 100),
                CompileRow("llvm", "f32", "blis(...)", 0.01, 0.1, 1.1, 1.0, (1.1,), 1, 500)]
    table = bb.format_backend_table(rows)
    assert "llvm/c" in table and "1.25" in table and "FAILED" in table
    assert "777x1234x555" in table
    ctable = bb.format_compile_table(compiled)
    assert "1.500" in ctable and "llvm" in ctable
    document = json.loads(bb.backends_to_json(rows, compiled))
    assert document["runtime"][1]["verified"] is False
    assert document["compile"][0]["build_samples"] == [1.5, 1.4, 1.6]


def test_measure_cold_compile_takes_medians(monkeypatch) -> None:
    runs = iter([0.3, 0.1, 0.2])

    def fake(dtype: str, backend: str, shape: tuple[int, int, int]) -> dict:
        build = next(runs)
        return {"init_s": 0.01, "lower_s": 0.02, "build_s": build, "build_cpu_s": build / 2,
                "kernel": "k", "source_chars": 10}

    monkeypatch.setattr(bb, "_cold_build", fake)
    (row,) = bb.measure_cold_compile(("f32",), ("llvm",), repeats=3)
    assert row.build_s == 0.2 and row.build_cpu_s == 0.1 and row.repeats == 3
    assert sorted(row.build_samples) == [0.1, 0.2, 0.3]


# --- tiny end-to-end runs ------------------------------------------------------------------


def test_strategies_end_to_end_tiny() -> None:
    results = bs.run_strategies({"small": (16, 24)}, timing=TINY, intrinsic_max=0,
                                strategies=(bs.TILING, bs.NUMPY))
    keys = {r.key for r in results}
    assert keys == {"naive[c]", "naive[llvm]", "tiling[c]", "tiling[llvm]", "numpy"}
    built = [r for r in results if not r.error]
    assert built and all(r.verified and r.gflops > 0 for r in built)
    assert all(r.speedup == 1.0 for r in results if r.key == "naive[c]")
    assert all(r.inner_repeats > 1 for r in built if r.backend != "numpy")
    assert "small SGEMM" in bs.format_tables(results)


def test_strategies_direct_calls_and_overheads() -> None:
    results = bs.run_strategies({"tiny": (8,)}, backends=("llvm",), timing=TINY, direct=True,
                                strategies=(bs.TILING,))
    assert {r.key for r in results} == {"naive[llvm]", "tiling[llvm]"}
    assert all(r.inner_repeats == 1 for r in results)
    assert all(r.verified for r in results if not r.error)
    overheads = bs.measure_overheads(("llvm",), TINY)
    assert set(overheads) == {"llvm", "numpy"} and all(v > 0 for v in overheads.values())


def test_unbuildable_candidate_is_reported_not_fatal(monkeypatch) -> None:
    real = bs.candidates

    def with_broken(size, backends, isa, intrinsic_max=32, strategies=None):
        broken = bs.Candidate("broken[c]", bs.TILING, "c", None, isa, "nope")
        return [*real(size, backends, isa, intrinsic_max, strategies), broken]

    monkeypatch.setattr(bs, "candidates", with_broken)
    results = bs.run_strategies({"tiny": (8,)}, backends=("c",), timing=TINY,
                                strategies=("none",))
    (broken,) = [r for r in results if r.key == "broken[c]"]
    assert broken.error == "nope" and math.isnan(broken.seconds)


def test_backends_end_to_end_tiny() -> None:
    # f32 and small: blacc.gemm picks the no_packing kernel the strategy test built already
    row = bb.bench_shape(np.dtype(np.float32), (16, 12, 8), min_sample_s=0.001, samples=2)
    assert row.verified and row.c_gflops > 0 and row.llvm_gflops > 0
    assert math.isclose(row.llvm_over_c, row.llvm_gflops / row.c_gflops)


def test_cold_build_in_a_fresh_process() -> None:
    run = bb._cold_build("f32", "llvm", (8, 8, 8))
    assert run["cache_files"] >= 1 and run["build_s"] > 0 and run["build_cpu_s"] >= 0
    assert run["kernel"].startswith("no_packing")
