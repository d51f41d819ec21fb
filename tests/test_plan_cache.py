"""The cost model's choice of form and schedules is remembered in the kernel cache
(runtime.plan_cache): a second plan of the same program models nothing, and an entry that
is damaged, malformed or does not fit is never used."""

from __future__ import annotations

import json

import numpy as np
import pytest

import blacc
from blacc import blacs
from blacc.runtime import plan_cache
from blacc.runtime.cache import KernelCache
from blacc.transform.blac import OpSchedule

GEMAM = "C = alpha*(A0 + A1)'*B + beta*C"


def _operands(n: int = 6, dtype: str = "f64") -> dict:
    return dict(alpha=blacc.Scalar(dtype), beta=blacc.Scalar(dtype), A0=blacc.Matrix(n, n, dtype),
                A1=blacc.Matrix(n, n, dtype), B=blacc.Matrix(n, 5, dtype),
                C=blacc.Matrix(n, 5, dtype))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, and a new KernelCache for each 'process' (``restart``)."""
    state = {"cache": KernelCache(tmp_path)}
    monkeypatch.setattr(plan_cache, "default_cache", lambda: state["cache"])

    def restart() -> None:
        state["cache"] = KernelCache(tmp_path)

    return tmp_path, restart


@pytest.fixture
def modelled(monkeypatch):
    """Counts how often the forms are modelled (the expensive part of planning)."""
    calls = []
    real = blacs.cheapest_form

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(blacs, "cheapest_form", counting)
    return calls


def _entries(root):
    return sorted(root.rglob("*.plan.json"))


def test_second_plan_reuses_the_choice_in_another_process(cache, modelled):
    root, restart = cache
    first = blacs.plan(GEMAM, target="avx2", **_operands())
    assert len(modelled) == 1 and len(_entries(root)) == 1
    restart()
    second = blacs.plan(GEMAM, target="avx2", **_operands())
    assert len(modelled) == 1  # nothing modelled the second time
    assert second.schedule == first.schedule and second.indexed == first.indexed
    assert second.source == first.source


def test_other_shapes_dtypes_targets_and_sources_are_other_entries(cache, modelled, monkeypatch):
    root, _ = cache
    blacs.plan(GEMAM, target="avx2", **_operands(6))
    blacs.plan(GEMAM, target="avx2", **_operands(7))
    blacs.plan(GEMAM, target="avx2", **_operands(6, "f32"))
    blacs.plan(GEMAM, target="generic", **_operands(6))
    blacs.plan("C = alpha*(A0 - A1)'*B + beta*C", target="avx2", **_operands(6))
    assert len(modelled) == 5 and len(_entries(root)) == 5
    monkeypatch.setattr(plan_cache, "source_fingerprint", lambda: "changed-planner")
    blacs.plan(GEMAM, target="avx2", **_operands(6))
    assert len(modelled) == 6 and len(_entries(root)) == 6


def test_cores_with_other_pipes_are_other_entries(cache, modelled, monkeypatch):
    """The model prices Intel's cores with their own pipes (``strategy.small.core_for``),
    so a choice made for one core is not reused on another; on the same core it is."""
    from dataclasses import replace

    from blacc.runtime import gemm as gemm_runtime
    from blacc.target.isa import AVX512

    root, _ = cache
    host = gemm_runtime.host_target()
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        machine = replace(host.machine, vendor=vendor)
        monkeypatch.setattr(blacs, "host_target",
                            lambda m=machine: gemm_runtime.Target(m, AVX512))
        for _ in range(2):
            blacs.plan(GEMAM, target="avx512", **_operands())
            blacs.plan(GEMAM, target="avx2", **_operands())
    assert len(modelled) == 4 and len(_entries(root)) == 4


def test_measuring_searches_are_not_cached(cache, modelled):
    root, _ = cache
    blacs.plan(GEMAM, target="avx2", search="exhaustive",
               measure_with=lambda pool: [0.0] * len(pool), **_operands())
    assert _entries(root) == []


def test_a_tampered_entry_is_not_trusted(cache, modelled):
    root, restart = cache
    first = blacs.plan(GEMAM, target="avx2", **_operands())
    (entry,) = _entries(root)
    entry.write_text(entry.read_text() + " ")  # the manifest's SHA-256 no longer matches
    restart()
    again = blacs.plan(GEMAM, target="avx2", **_operands())
    assert len(modelled) == 2
    assert again.schedule == first.schedule


@pytest.mark.parametrize("bad", [
    {"form": 7, "schedules": None},
    {"form": 0, "schedules": []},
    {"form": 9, "schedules": [{"vector": "j", "block": [1, 1], "unroll": 16, "split": 1,
                               "pairs": False}]},
], ids=["malformed", "no-schedules", "form-out-of-range"])
def test_a_choice_that_does_not_fit_is_decided_again(cache, modelled, monkeypatch, bad):
    monkeypatch.setattr(plan_cache, "_load", lambda path: plan_cache._decode(bad))
    _, restart = cache
    first = blacs.plan(GEMAM, target="avx2", **_operands())
    restart()
    again = blacs.plan(GEMAM, target="avx2", **_operands())
    assert len(modelled) == 2 and again.schedule == first.schedule


@pytest.mark.parametrize("wrong", [
    OpSchedule("no_such_index", (1, 1)), OpSchedule("i", (0, 1)), OpSchedule("i", (1, 1), 0, 0),
    OpSchedule("i", (1, 1), 16, 1, True),
], ids=["unknown-index", "empty-block", "no-unroll", "pairs"])
def test_a_cached_schedule_the_model_could_not_choose_is_decided_again(cache, modelled,
                                                                      monkeypatch, wrong):
    _, restart = cache
    first = blacs.plan("y = A*x", target="avx2", A=blacc.Matrix(8, 8), x=blacc.Vector(8),
                       y=blacc.Vector(8))
    monkeypatch.setattr(plan_cache, "_load", lambda path: (0, (wrong,)))
    restart()
    again = blacs.plan("y = A*x", target="avx2", A=blacc.Matrix(8, 8), x=blacc.Vector(8),
                       y=blacc.Vector(8))
    assert len(modelled) == 2 and again.schedule == first.schedule


@pytest.mark.parametrize("data", [
    None, [], "x", {"form": 0}, {"form": -1, "schedules": []}, {"form": True, "schedules": []},
    {"form": 0, "schedules": [{"vector": "j"}]},
    {"form": 0, "schedules": [{"vector": 3, "block": [1, 1], "unroll": 16, "split": 1,
                               "pairs": False}]},
    {"form": 0, "schedules": [{"vector": "j", "block": [1], "unroll": 16, "split": 1,
                               "pairs": False}]},
    {"form": 0, "schedules": [{"vector": "j", "block": [1, "2"], "unroll": 16, "split": 1,
                               "pairs": False}]},
    {"form": 0, "schedules": [{"vector": "j", "block": [1, 2], "unroll": 16.0, "split": 1,
                               "pairs": False}]},
    {"form": 0, "schedules": [{"vector": "j", "block": [1, 2], "unroll": 16, "split": 1,
                               "pairs": 0}]},
    {"form": 0, "schedules": [{"vector": "j", "block": [1, 2], "unroll": 16, "split": 1,
                               "pairs": False, "extra": 1}]},
], ids=lambda d: json.dumps(d)[:40])
def test_decode_rejects_anything_but_the_expected_fields(data):
    assert plan_cache._decode(data) is None


def test_decode_reads_what_encode_wrote():
    choice = (1, (OpSchedule("j", (2, 3), 16, 2, False), OpSchedule(None, (1, 1), 8, 1, True)))
    assert plan_cache._decode(json.loads(plan_cache._encode(choice))) == choice


def test_compiled_kernels_agree_with_numpy_with_a_cached_choice(cache):
    _, restart = cache
    rng = np.random.default_rng(5)
    arrays = {name: rng.uniform(-1, 1, (6, 6) if name.startswith("A") else (6, 5))
              for name in ("A0", "A1", "B", "C")}
    want = 0.5 * (arrays["A0"] + arrays["A1"]).T @ arrays["B"] - 2.0 * arrays["C"]
    for _ in range(2):  # decided, then from the cache
        restart()
        kernel = blacc.compile(GEMAM, **_operands())
        c = arrays["C"].copy()
        kernel(alpha=0.5, beta=-2.0, A0=arrays["A0"], A1=arrays["A1"], B=arrays["B"], C=c)
        np.testing.assert_allclose(c, want, rtol=1e-12, atol=1e-12)
