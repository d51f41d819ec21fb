"""The LGen section 5 benchmark (benchmarks/lgen): the generator builds a harness that
compiles, runs and verifies. Only blacc and the fixed-size loops are used, so neither
OpenBLAS, Eigen nor LIBXSMM needs to be installed. No timing is asserted."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LGEN = HERE.parent / "benchmarks" / "lgen"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, LGEN / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


harness = _load("harness")
bound = _load("bound")


def test_cases_and_selection():
    quick = harness.all_cases(quick=True, dtypes=("f32",))
    assert {c.series for c in quick} == set(harness.SERIES)
    micro = harness.select(quick, ["micro"])
    assert micro and all(c.group == "micro" and 2 <= c.n <= 10 for c in micro)
    c = harness.Case("gemm_nx4_4x4", 8, "f64")
    assert c.dims == (8, 4, 4) and c.flops == 2 * 8 * 4 * 4 + 3 * 8 * 4
    assert harness.Case("gemam_4xn_nx4", 12, "f32").dims == (4, 12, 4)
    assert harness.select(quick, ["gemm_4x4_4xn_n16"])[0].cid == "gemm_4x4_4xn_n16_f32"
    # LIBXSMM only for the plain products; OpenBLAS chains calls for the multi-call BLACs
    assert c.xsmm_ok is False and harness.Case("micro_smm", 3, "f32").xsmm_ok
    assert "cblas_ddot" in harness.openblas_calls(harness.Case("blinf_nx4", 4, "f64"))[0]


def test_throughput_bound():
    # C(4x4) = A(4x4) B(4x4) f32, 8 lanes: 64 multiplies on 2 FMA pipes take 4 cycles;
    # 32 elements read on 2 load ports 2 cycles; 16 written on 1 store port 2 cycles
    smm = harness.Case("smm_4x4_4xn", 4, "f32")
    assert bound.cycles(smm, 8) == {"multiplies": 4.0, "loads": 2.0, "stores": 2.0}
    assert bound.flops_per_cycle(smm, 8) == (32.0, "multiplies")  # the FMA peak
    # alpha = x'*A*y with A 4 x 64: reading A, x and y (324 floats) takes 20.25 cycles
    blinf = harness.Case("blinf_4xn", 64, "f32")
    assert bound.flops_per_cycle(blinf, 8) == (blinf.flops / 20.25, "loads")
    # y = alpha*x + y reads x and y, writes y: 2n / 16 load cycles, n / 8 store cycles
    axpy = harness.Case("axpy", 16, "f64")
    assert bound.cycles(axpy, 4) == {"multiplies": 2.0, "loads": 4.0, "stores": 4.0}
    # adds and scalings are free in the bound, so it passes the FMA peak only by their
    # share of the flops: none for the plain products, at most x 1.5 (gemam at K = 4)
    for c in harness.all_cases(quick=True):
        lanes = 8 if c.dtype == "f32" else 4
        fpc, _ = bound.flops_per_cycle(c, lanes)
        assert 0 < fpc <= 4 * lanes * (1.0 if c.blac in ("smm", "smv") else 1.5)


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler")
def test_tiny_case_builds_runs_and_verifies(tmp_path):
    tc = harness.detect(wanted=())  # no peers probed: blacc + loops only
    cases = [harness.Case("micro_blinf", 3, "f32")]
    exe = harness.build_series("micro_blinf_f32", cases, ("blacc", "loops"), tc, tmp_path,
                               log=lambda *_: None)
    d = tmp_path / "micro_blinf_f32"
    loops = (d / "loops.c").read_text()
    assert "void lp_micro_blinf_n3_f32(" in loops and "void ref_micro_blinf_n3_f32(" in loops
    assert (d / "bl_micro_blinf_n3_f32.h").exists()
    rows = harness.run_series(exe, cases, target_ms=0.2, rounds=3, processes=2)
    by_impl = {r["impl"]: r for r in rows}
    assert set(by_impl) == {"blacc", "loops"}
    for r in by_impl.values():
        assert r["verified"] is True and r["err"] <= 1.0
        assert r["case"] == "micro_blinf_n3_f32" and r["flops"] == 2 * 3 * 3 + 2 * 3
        assert r["median_ns"] > 0 and r["gflops"] > 0
        # three rounds from two runs (2 + 1), their statistics over all three
        assert r["rounds"] == 3 and len(r["t_ns"]) == 3
        assert r["median_ns"] == sorted(r["t_ns"])[1] and r["best_ns"] == min(r["t_ns"])
    # every array ending where an inaccessible page begins: nothing reads or writes past
    # an array (the run would fault), and the results verify
    rows = harness.run_series(exe, cases, target_ms=0.2, rounds=1, page_ends=True)
    assert {r["impl"] for r in rows if r.get("verified")} == {"blacc", "loops"}


def test_runs_of_a_series_are_merged():
    """The rounds of several runs of a series: times and rounds add up, the worst error
    is kept, a failure in any run stands, and the statistics are the C harness's."""
    ok = {"case": "c", "impl": "i", "verified": True, "err": 0.1, "reps": 9, "rounds": 2,
          "t_ns": [2.0, 1.0], "median_ns": 1.5}
    row: dict = {}
    for run in (ok, {**ok, "err": 0.4, "rounds": 1, "t_ns": [3.0]}):
        harness._merge(row, run)
    assert row["t_ns"] == [2.0, 1.0, 3.0] and row["rounds"] == 3 and row["err"] == 0.4
    failed: dict = {}
    for run in (ok, {"case": "c", "impl": "i", "verified": False, "err": 7.0}, ok):
        harness._merge(failed, run)
    assert failed == {"case": "c", "impl": "i", "verified": False, "err": 7.0}
    assert harness._statistics([5, 1, 3, 2, 4, 9, 7, 8, 6]) == {
        "best_ns": 1, "q1_ns": 3, "median_ns": 5, "q3_ns": 7, "worst_ns": 9}
    assert harness._statistics([4, 1, 3, 2])["median_ns"] == 2.5
    assert harness._split(9, 3) == [3, 3, 3] and harness._split(5, 3) == [2, 2, 1]
    assert harness._split(2, 3) == [1, 1]


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler")
def test_model_fit_collects_and_judges_the_model(tmp_path, capsys):
    """benchmarks/lgen/model_fit.py: one case's pool timed and written, then read back,
    modelled again and judged: the regret is the pick's time over the fastest's."""
    model_fit = _load("model_fit")
    pools = tmp_path / "pools.jsonl"
    model_fit.collect(pools, ["micro_smv_n2_f64"])
    model_fit.collect(pools, ["micro_smv_n2_f64"])  # done already: not timed again
    (entry,) = model_fit.load(pools)
    assert entry["case"] == "micro_smv_n2_f64" and entry["candidates"]
    assert all(c["ns"] > 0 for c in entry["candidates"])
    model_fit.evaluate([entry], {"WINDOW": 0.0})
    assert "regret" in capsys.readouterr().out
    model_fit.evaluate([entry], {}, generic=True)  # the constants' pipes on any machine
    assert "(generic pipes)" in capsys.readouterr().out
    # two ISAs, the model right on one and wrong on the other, and the rule's choice
    # (isa_cost: as modelled for the choice between ISAs, here the same)
    fake = {"candidates": [{"isa": "avx2", "cost": 10.0, "ns": 2.0},
                           {"isa": "avx2", "cost": 12.0, "ns": 1.0},
                           {"isa": "avx512", "cost": 5.0, "ns": 1.5}]}
    for c in fake["candidates"]:
        c["isa_cost"] = c["cost"]
    got = model_fit.regrets([fake], call=0.0, gain=1.5)
    assert got["avx2"] == [2.0] and got["avx512"] == [1.0]
    assert got["rule"] == [1.5] and got["oracle ISA"] == [1.5]
    assert model_fit.regrets([fake], call=0.0, gain=2.5)["rule"] == [2.0]
