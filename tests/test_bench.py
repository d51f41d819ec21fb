"""Tests of the benchmark harness and the CLI. None asserts how fast anything ran."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import blacc.bench.gemm as bench_gemm
import blacc.bench.peak as bench_peak
from blacc.bench.gemm import Row, format_table, parse_shape, rows_to_json, verify_gemm
from blacc.bench.peak import Peak, select_variant
from blacc.bench.timing import calibrate, measure_interleaved, single_thread
from blacc.cli import build_parser, main
from blacc.errors import CompilerError
from blacc.target.machine import Machine


class FakeClock:
    """A clock that only moves when a fake workload says it took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float):
        def fn() -> None:
            self.now += seconds

        return fn


# --- timing -------------------------------------------------------------------------


def test_calibrate_reaches_min_sample_length() -> None:
    clock = FakeClock()
    fn = clock.work(0.001)
    repeats = calibrate(fn, 0.0105, clock=clock)
    assert repeats * 0.001 >= 0.0105
    assert calibrate(clock.work(1.0), 0.0105, clock=clock) == 1  # slow fn: one call suffices


def test_samples_last_at_least_min_sample_s() -> None:
    clock = FakeClock()
    stats = measure_interleaved(
        {"a": clock.work(0.003), "b": clock.work(0.0007)},
        min_sample_s=0.05,
        samples=4,
        clock=clock,
    )
    for name, per_call in (("a", 0.003), ("b", 0.0007)):
        s = stats[name]
        assert len(s.samples) == 4
        assert all(math.isclose(v, per_call) for v in s.samples)
        assert s.repeats * per_call >= 0.05
        assert math.isclose(s.median, per_call) and math.isclose(s.min, per_call)


def test_samples_are_interleaved() -> None:
    log: list[str] = []
    fns = {name: (lambda name=name: log.append(name)) for name in ("A", "B", "C")}
    samples = 5
    stats = measure_interleaved(fns, min_sample_s=1e-5, samples=samples, warmup=2)
    one_round = [name for name in fns for _ in range(stats[name].repeats)]
    sampled = log[len(log) - samples * len(one_round) :]
    assert sampled == one_round * samples
    # warm-up and calibration come first, one function at a time, in order
    assert log[:2] == ["A", "A"]


def test_real_clock_stats_are_consistent() -> None:
    stats = measure_interleaved({"sum": lambda: sum(range(50))}, min_sample_s=1e-4, samples=3)
    s = stats["sum"]
    assert len(s.samples) == 3 and s.repeats >= 1
    assert s.min <= s.median <= max(s.samples)


def test_rejects_zero_samples() -> None:
    with pytest.raises(ValueError):
        measure_interleaved({"x": lambda: None}, samples=0)


def test_single_thread_limits_blas() -> None:
    with single_thread():
        blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        assert all(i["num_threads"] == 1 for i in blas)


# --- peak ---------------------------------------------------------------------------


def _machine(arch: str = "x86_64", features: tuple[str, ...] = ("avx2", "fma")) -> Machine:
    return Machine(name="Test CPU 9000", arch=arch, features=frozenset(features), cores=4)


def test_variant_follows_isa(monkeypatch) -> None:
    monkeypatch.delenv("BLACC_ISA", raising=False)  # the widest each machine runs
    assert select_variant(_machine()).name == "avx2+fma"
    assert select_variant(_machine(features=("avx", "sse2"))).name == "sse2"
    assert select_variant(_machine(arch="aarch64", features=("neon",))).flops_per_cycle is None
    avx2 = select_variant(_machine())
    assert avx2.flops_per_cycle == {"float32": 32, "float64": 16}
    assert "-mfma" in avx2.flags
    avx512 = select_variant(_machine(features=("avx2", "fma", "avx512f", "avx512dq",
                                               "avx512vl")))
    assert avx512.name == "avx512" and avx512.flops_per_cycle == {"float32": 64, "float64": 32}
    zen4 = replace(_machine(features=("avx2", "fma", "avx512f", "avx512dq", "avx512vl")),
                   vendor="AuthenticAMD", family=25)
    split = select_variant(zen4)  # 512-bit FMAs over two 256-bit pipes
    assert split.name == "avx512" and split.flops_per_cycle == {"float32": 32, "float64": 16}
    assert split.flags == avx512.flags


def _peak() -> Peak:
    return Peak(
        isa="avx2+fma",
        flops_per_s={"float32": 96e9, "float64": 48e9},
        flops_per_cycle={"float32": 32, "float64": 16},
    )


def test_peak_accessors() -> None:
    peak = _peak()
    assert peak.of(np.float32) == 96e9 and peak.of("float64") == 48e9
    assert peak.implied_clock_hz == {"float32": 3e9, "float64": 3e9}
    assert json.loads(json.dumps(peak.to_dict()))["isa"] == "avx2+fma"


def test_measure_peak_gives_both_dtypes() -> None:
    try:
        peak = bench_peak.measure_peak()
    except CompilerError as exc:
        pytest.skip(f"no working C compiler: {exc}")
    assert set(peak.flops_per_s) == {"float32", "float64"}
    assert all(math.isfinite(v) and v > 0 for v in peak.flops_per_s.values())


# --- gemm bench helpers -------------------------------------------------------------


def _rows() -> list[Row]:
    return [
        Row("float32", 256, 256, 256, 80.0, 90.0, 80 / 90, 80 / 96, 90 / 96, True),
        Row("float64", 777, 1234, 555, 40.5, 39.0, 40.5 / 39, 40.5 / 48, 39 / 48, False),
    ]


def test_parse_shape() -> None:
    assert parse_shape("777x1234x555") == (777, 1234, 555)
    assert parse_shape("2X3X4") == (2, 3, 4)
    for bad in ("3x4", "axbxc", "0x1x1", "1x2x3x4", ""):
        with pytest.raises(ValueError):
            parse_shape(bad)


def test_verify_gemm() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (33, 17)).astype(np.float32)
    b = rng.uniform(-1, 1, (17, 9)).astype(np.float32)
    good = a @ b
    assert verify_gemm(good, a, b)
    bad = good.copy()
    bad[3, 4] += 0.01
    assert not verify_gemm(bad, a, b)
    bad[3, 4] = np.nan
    assert not verify_gemm(bad, a, b)
    assert not verify_gemm(good.astype(np.float64), a, b)  # wrong dtype
    assert not verify_gemm(good[:, :8], a, b)  # wrong shape


def test_format_table() -> None:
    text = format_table(_rows(), _peak(), _machine())
    lines = text.splitlines()
    assert "Test CPU 9000" in lines[0]
    assert "96.0" in lines[1] and "48.0" in lines[1] and "3.00 GHz" in lines[1]
    table = [line for line in lines if line.startswith(("dtype", "f32", "f64", "---"))]
    assert len(table) == 4
    heading = table[0]
    for column in ("blacc GFLOPS", "numpy GFLOPS", "blacc %peak", "numpy %peak"):
        assert column in heading
    # right-aligned numeric columns end at the same place in every line
    end = heading.index("numpy GFLOPS") + len("numpy GFLOPS")
    assert table[2][:end].endswith("90.0") and table[3][:end].endswith("39.0")
    assert "777x1234x555" in table[3] and "FAILED" in table[3] and table[2].endswith("ok")
    assert "83.3%" in table[2] and "0.89x" in table[2]


def test_rows_to_json() -> None:
    doc = json.loads(rows_to_json(_rows(), _peak(), _machine()))
    assert doc["machine"]["name"] == "Test CPU 9000"
    assert doc["peak"]["flops_per_s"]["float64"] == 48e9
    assert doc["rows"] == [asdict(r) for r in _rows()]
    assert doc["numpy"]["version"] == np.__version__


def test_run_rejects_unsupported_dtype() -> None:
    with pytest.raises(ValueError):
        bench_gemm.run_gemm_bench([(2, 2, 2)], ["int32"], quick=True, peak=_peak())


# --- CLI ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["bench"], ["explain"], ["info"]])
def test_help_exits_zero(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    assert "usage: blacc" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["bench", "--shape", "3x4"],
        ["bench", "--dtype", "f16"],
        ["explain", "--m", "4", "--n", "4"],
        ["explain", "--m", "0", "--n", "4", "--k", "4"],
    ],
)
def test_bad_arguments_exit_two(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_bench_arguments() -> None:
    args = build_parser().parse_args(
        ["bench", "--quick", "--dtype", "f64", "--shape", "2x3x4", "5x6x7", "--shape", "8x9x10"]
    )
    assert args.quick and args.dtype == "f64"
    assert args.shape == [(2, 3, 4), (5, 6, 7), (8, 9, 10)]
    defaults = build_parser().parse_args(["bench"])
    assert not defaults.quick and defaults.dtype == "both" and defaults.shape is None


def test_bench_command_exit_status_and_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def fake_run(shapes, dtypes, *, quick, peak=None, progress=None, backend=None):
        calls.append((list(shapes), tuple(dtypes), quick, backend))
        return _rows()

    monkeypatch.setattr(bench_gemm, "run_gemm_bench", fake_run)
    monkeypatch.setattr(bench_peak, "measure_peak", _peak)
    out = tmp_path / "r.json"
    status = main(["bench", "--quick", "--dtype", "f32", "--shape", "4x5x6", "--json", str(out),
                   "--backend", "llvm"])
    assert status == 1  # the second fake row failed verification
    assert calls == [([(4, 5, 6)], ("float32",), True, "llvm")]
    assert "777x1234x555" in capsys.readouterr().out
    assert json.loads(out.read_text())["rows"][0]["m"] == 256

    monkeypatch.setattr(bench_gemm, "run_gemm_bench", lambda *a, **k: _rows()[:1])
    assert main(["bench", "--quick"]) == 0


def test_explain_command(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import blacc

    seen = {}

    def fake_explain(**kwargs):
        seen.update(kwargs)
        return "PLAN"

    monkeypatch.setattr(blacc, "explain", fake_explain, raising=False)
    assert main(["explain", "--m", "64", "--n", "32", "--k", "16", "--trans-b"]) == 0
    assert capsys.readouterr().out.strip() == "PLAN"
    assert seen == {
        "m": 64,
        "n": 32,
        "k": 16,
        "dtype": np.dtype(np.float32),
        "trans_a": False,
        "trans_b": True,
        "backend": None,
    }


def test_info_command(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["info"])
    out = capsys.readouterr().out
    if status == 2:  # main() reports a missing C compiler as a usage-level error
        pytest.skip("no working C compiler")
    assert status == 0 and "arch" in out and "compiler" in out
    from blacc.blacs import host_isas
    from blacc.runtime.gemm import host_target

    isa_line = next(line for line in out.splitlines() if line.startswith("isa "))
    small = " or ".join(isa.name for isa in host_isas()).split()
    assert isa_line.split()[1:] == [host_target().isa.name, "(GEMM),", *small,
                                    "(fixed-size", "programs)"], isa_line


def test_bench_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    blacc = pytest.importorskip("blacc")
    if not callable(getattr(blacc, "gemm", None)):
        pytest.skip("blacc.gemm is not available yet")
    status = main(["bench", "--quick", "--dtype", "f32", "--shape", "64x48x32"])
    out = capsys.readouterr().out
    assert "64x48x32" in out
    assert status == 0
