"""Outputs only written, by programs whose operands about fill L1, in straight-line rows
(``transform.blac.writes_near_l1``, ``Machine.straight_rows_near_l1``):

* the band is the call's operands against L1 (``NEAR_L1``), and only outputs that no
  operation reads (not C in C = alpha*A*B + beta*C, not a temporary) are in it;
* with the flag a block of rows stores its vectors in straight-line code, without it in a
  loop along the row; the same values either way (interpreter, odd sizes, masked
  leftovers, both dtypes);
* only the core it was measured on (a Xeon of CPU model 167) plans them, and those
  kernels, emitted as C and run, agree with NumPy and write nothing outside C.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.strategy.small import OpSchedule
from blacc.target.isa import AVX2, AVX512
from blacc.target.machine import Machine
from blacc.transform.blac import NEAR_L1, build_module, writes_near_l1
from blacc.transform.index_notation import forms
from blacc.transform.prefetch_stores import L1_BYTES
from test_blac_emit import TARGETS, emit_and_run
from test_blac_programs import assert_matches, make_values, run_interp
from test_prefetch_stores import _host_of

M, S = blacc.Matrix, blacc.Scalar


def _product(n: int, dtype: str, source: str = "C = A*B"):
    decls = dict(A=M(n, 4, dtype), B=M(4, n, dtype), C=M(n, n, dtype))
    if "alpha" in source:
        decls.update(alpha=S(dtype), beta=S(dtype))
    return source, decls


def _footprint(n: int, dtype: str) -> float:
    """C = A*B n x 4 x n's operands, in multiples of L1."""
    return (n * n + 8 * n) * (4 if dtype == "f32" else 8) / L1_BYTES


@pytest.mark.parametrize("n, dtype, near", [(80, "f64", True), (76, "f64", True),
                                            (100, "f32", True), (64, "f64", False),
                                            (100, "f64", False), (96, "f32", False),
                                            (4, "f32", False)])
def test_the_band_is_the_operands_against_l1(n, dtype, near):
    """C = A*B 80 x 4 x 80 f64 (1.15 L1) and 100 x 4 x 100 f32 (0.88) are in it;
    64 x 4 x 64 f64 (0.75), 100 x 4 x 100 f64 (1.76) and 96 x 4 x 96 f32 (0.81) not."""
    source, decls = _product(n, dtype)
    p = plan(source, target="avx2", **decls)
    (op,) = p.indexed.ops
    assert writes_near_l1(p.indexed, op) == near
    low, high = NEAR_L1
    assert near == (low < _footprint(n, dtype) <= high)


def test_outputs_also_read_or_temporary_are_not_in_the_band():
    """C = alpha*A*B + beta*C reads C (ran the same either way); a temporary lives in the
    kernel. C = (A0 + A1)*B 76 x 4 x 76 f64 with A0 + A1 as a temporary (1.14 L1): only
    C is in the band."""
    source, decls = _product(80, "f64", "C = alpha*A*B + beta*C")
    p = plan(source, target="avx2", **decls)
    assert not any(writes_near_l1(p.indexed, op) for op in p.indexed.ops)
    decls = dict(A0=M(76, 4, "f64"), A1=M(76, 4, "f64"), B=M(4, 76, "f64"),
                 C=M(76, 76, "f64"))
    p = plan("C = (A0 + A1)*B", target="avx2", **decls)
    form = next(f for f in forms(p.typed) if any(o.temporary for o in f.operands))
    near = {op.out: writes_near_l1(form, op) for op in form.ops}
    assert near.pop("C") and near and not any(near.values()), near


def _row_loops(module: k.Module) -> list[k.For]:
    """Loops along a row: those inside another loop (the blocks of rows)."""
    body = module.function(module.entry).body
    return [inner for outer in nodes_of(body, k.For) for inner in nodes_of(outer.body, k.For)]


@pytest.mark.parametrize("n, dtype, isa, block", [
    (80, "f64", AVX512, (4, 1)), (76, "f64", AVX512, (4, 1)), (100, "f32", AVX512, (4, 1)),
    (104, "f32", AVX512, (4, 2)), (80, "f64", AVX2, (2, 1)), (77, "f64", AVX2, (2, 2))])
def test_straight_rows_compute_the_same(n, dtype, isa, block):
    """Blocks of rows: a loop along the row (its broadcasts hoisted out of it) without
    the flag, straight-line code with it; both agree with NumPy (76, 77 and 104 end in a
    part of a vector, 77 in a shorter block of rows)."""
    source, decls = _product(n, dtype)
    p = plan(source, target=isa.name, **decls)
    schedule = (OpSchedule("j", block),)
    looped = build_module(p.indexed, p.specs, schedule, isa, "looped", write_prefetches=False)
    straight = build_module(p.indexed, p.specs, schedule, isa, "straight",
                            write_prefetches=False, straight_near_l1=True)
    assert _row_loops(looped) and not _row_loops(straight)
    values = make_values(decls, dtype, np.random.default_rng(n))
    for module in (looped, straight):
        got = run_interp(module, p.specs, p.typed, values)
        assert_matches(p.typed, values, got, f"{n} {dtype} {module.entry}")


def test_only_the_core_measured_plans_them():
    assert Machine("x", "x86_64", vendor="GenuineIntel", family=6,
                   model=167).straight_rows_near_l1
    for other in (dict(vendor="GenuineIntel", family=6, model=207),
                  dict(vendor="AuthenticAMD", family=25, model=167),
                  dict(vendor="GenuineIntel", family=6)):
        assert not Machine("x", "x86_64", **other).straight_rows_near_l1


@pytest.mark.parametrize("target", TARGETS)
def test_planned_straight_rows_run_against_numpy(monkeypatch, tmp_path, target):
    """On the core measured, C = A*B 80 x 4 x 80 f64 is planned in straight-line rows;
    emitted, built with strict flags and run on sentinel-padded buffers it agrees with
    NumPy. Elsewhere the same schedule loops along the row on AVX-512 (the model's
    AVX2 kernel is straight-line code anyway)."""
    source, decls = _product(80, "f64")
    _host_of(monkeypatch, "GenuineIntel", family=6, model=167)
    _, _, p = emit_and_run(tmp_path, source, decls, "f64", target, "straight")
    if target != "generic":  # scalar code: its loops are over blocks along the row
        assert not _row_loops(p.module)
    _host_of(monkeypatch, "GenuineIntel", family=6, model=None)
    other = plan(source, name="straight", target=target, **decls)
    assert other.schedule == p.schedule
    if target == "generic":  # scalar code is the same either way
        assert other.module == p.module
    else:
        assert bool(_row_loops(other.module)) == (target == "avx512")
