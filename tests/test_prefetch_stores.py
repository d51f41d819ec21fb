"""Write prefetches ahead of interleaved stores into large outputs
(``transform.prefetch_stores``):

* a loop that stores into several rows of an output larger than L1 gets one write
  prefetch per row, ahead of its store and clamped to the operand;
* outputs that fit L1, outputs the kernel also reads, a single stream of stores and
  scalar stores get none;
* kernels with prefetches agree with NumPy through the interpreter, and emitted as C
  (strict flags) and run, with every prefetch address inside its operand: planned ones,
  and where a plan takes whole rows per step (one stream, no prefetches), the same
  schedule in blocks of 2 rows;
* only machines that gain from them get them (none on AMD's cores).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import blacc
from blacc import blacs
from blacc.blacs import Plan, plan, write_standalone
from blacc.ir import kernel as k
from blacc.ir.walk import map_bodies, nodes_of
from blacc.runtime.gemm import host_target
from blacc.transform.blac import build_module
from blacc.transform.prefetch_stores import AHEAD_BYTES, L1_BYTES, prefetch_stores
from test_blac_emit import TARGETS, emit_and_run, run_emitted
from test_blac_programs import assert_matches, make_values, run_interp

M, S = blacc.Matrix, blacc.Scalar


def _host_of(monkeypatch, vendor: str, **machine: object) -> None:
    """Plans made here are tuned for a host from ``vendor`` (and ``machine``'s other
    ``Machine`` fields)."""
    target = host_target()
    tuned = dataclasses.replace(target.machine, vendor=vendor, **machine)
    monkeypatch.setattr(blacs, "host_target",
                        lambda: dataclasses.replace(target, machine=tuned))


@pytest.fixture(autouse=True)
def _intel_host(monkeypatch):
    """The prefetches are for machines that gain from them (a Xeon's, say)."""
    _host_of(monkeypatch, "GenuineIntel")


def _rows_kernel(n: int, rows: int, *, read_c: bool = False,
                 lanes: int = 4) -> tuple[k.Stmt, ...]:
    """C (n x n f64, row-major) = a broadcast times B's rows, ``rows`` rows of C per
    block: for i (step rows): for j (step ``lanes``): one store of ``lanes`` elements
    into each of the rows."""
    i, j = k.Var("i", "i64"), k.Var("j", "i64")
    body: list[k.Stmt] = []
    for r in range(rows):
        row = k.add(k.mul(k.add(i, k.Const(r)), k.Const(n)), j)
        value: k.Expr = k.Load("B", j, "f64", lanes)
        if read_c:
            value = k.Bin("+", value, k.Load("C", row, "f64", lanes))
        body.append(k.Store("C", row, value))
    inner = k.For(j, k.Const(0), k.Const(n), lanes, tuple(body))
    return (k.For(i, k.Const(0), k.Const(n), rows, (inner,)),)


def _prefetches(body: tuple[k.Stmt, ...]) -> list[k.Prefetch]:
    return nodes_of(body, k.Prefetch)


def _value(e: k.Expr, env: dict[str, int]) -> int:
    if isinstance(e, k.Const):
        return int(e.value)
    if isinstance(e, k.Var):
        return env[e.name]
    a, b = _value(e.a, env), _value(e.b, env)
    return {"+": a + b, "-": a - b, "*": a * b, "min": min(a, b), "max": max(a, b)}[e.op]


def _prefetched(body: tuple[k.Stmt, ...], env: dict[str, int] | None = None):
    """(buffer, element) of every prefetch the code issues, loop by loop."""
    env = env or {}
    for s in body:
        if isinstance(s, k.For):
            for v in range(_value(s.start, env), _value(s.stop, env), s.step):
                yield from _prefetched(s.body, {**env, s.var.name: v})
        elif isinstance(s, k.Prefetch):
            yield s.buf, _value(s.index, env)


def test_interleaved_rows_of_a_large_output_are_prefetched_for_writing():
    n = 100  # 80 KB of f64: more than L1
    assert n * n * 8 > L1_BYTES
    body = prefetch_stores(_rows_kernel(n, rows=4), {"B": n, "C": n * n})
    inner = body[0].body[0]
    got = inner.body[:4]
    assert all(isinstance(p, k.Prefetch) and p.buf == "C" and p.write for p in got)
    assert inner.body[4:] == _rows_kernel(n, rows=4)[0].body[0].body
    ahead = AHEAD_BYTES // 8
    env = {"i": 8, "j": 12}
    assert [_value(p.index, env) for p in got] == [(8 + r) * n + 12 + ahead
                                                   for r in range(4)]
    # the last rows' prefetches are clamped to C's last element
    addresses = [at for _, at in _prefetched(body)]
    assert max(addresses) == n * n - 1 and min(addresses) == ahead


def test_outputs_that_fit_l1_are_left_alone():
    body = _rows_kernel(64, rows=4)  # 32 KB
    assert prefetch_stores(body, {"B": 64, "C": 64 * 64}) == body


def test_outputs_also_read_are_left_alone():
    body = _rows_kernel(100, rows=4, read_c=True)  # the loads of C are prefetched
    assert prefetch_stores(body, {"B": 100, "C": 100 * 100}) == body


def test_interleaved_scalar_stores_are_left_alone():
    """Plain C's rows of scalar stores would take a prefetch per element: the generic
    target's C = A*B 80 x 4 x 80 f64 ran 2x as fast without (gcc -O2), 4.4x with -O3
    -march=native, which vectorizes the loop."""
    body = _rows_kernel(100, rows=4, lanes=1)
    assert prefetch_stores(body, {"B": 100, "C": 100 * 100}) == body


def test_a_single_stream_of_stores_is_left_alone():
    body = _rows_kernel(100, rows=1)  # row after row: the hardware prefetches it
    assert prefetch_stores(body, {"B": 100, "C": 100 * 100}) == body


def test_stores_close_together_make_one_stream():
    """Two vectors of one row per step are one stream: one prefetch per row."""
    n = 100
    i, j = k.Var("i", "i64"), k.Var("j", "i64")
    stores = tuple(k.Store("C", k.add(k.add(k.mul(k.add(i, k.Const(r)), k.Const(n)), j),
                                      k.Const(half * 4)), k.Load("B", j, "f64", 4))
                   for r in range(2) for half in range(2))
    body = (k.For(i, k.Const(0), k.Const(n), 2,
                  (k.For(j, k.Const(0), k.Const(96), 8, stores),)),)
    assert len(_prefetches(prefetch_stores(body, {"B": n, "C": n * n}))) == 2


DECLS = [
    pytest.param("C = A*B", dict(A=M(100, 4), B=M(4, 100), C=M(100, 100)), "f64",
                 id="100x4x100-f64"),
    pytest.param("C = A*B", dict(A=M(90, 4), B=M(4, 90), C=M(90, 90, ld=97)), "f64",
                 id="90x4x90-f64-ld"),
    pytest.param("C = A*B", dict(A=M(131, 3, "f32"), B=M(3, 131, "f32"),
                                 C=M(131, 131, "f32")), "f32", id="131x3x131-f32"),
    pytest.param("C = alpha*A*B", dict(A=M(100, 5), B=M(5, 100), C=M(100, 100), alpha=S()),
                 "f64", id="alpha-100x5x100-f64"),
]


def _interleaving(p: Plan) -> Plan:
    """``p``, or where its kernel takes whole rows of C per step (Intel's AVX2 plans of
    these Cs: 4 rows of 25 vectors, straight-line, one stream), the kernel of blocks of
    2 rows along the columns that the prefetches are for."""
    if p.isa.name == "generic" or _prefetches(p.module.function(p.module.entry).body):
        return p
    schedule = tuple(dataclasses.replace(s, block=(2, 1)) for s in p.schedule)
    return dataclasses.replace(p, schedule=schedule, module=build_module(
        p.indexed, p.specs, schedule, p.isa, p.module.entry))


# The generic target's kernels of these (scalar stores, no prefetches) are emitted and run
# below.
@pytest.mark.parametrize("target", ["avx2", "avx512"])
@pytest.mark.parametrize(("source", "decls", "dtype"), DECLS)
def test_kernels_with_prefetches_agree_with_numpy(source, decls, dtype, target):
    p = _interleaving(plan(source, target=target, **decls))
    body = p.module.function(p.module.entry).body
    extents = {s.name: s.extent for s in p.specs}
    seen = list(_prefetched(body))
    assert seen, p.schedule  # blocks of rows along the columns
    assert all(0 <= at < extents[buf] for buf, at in seen)
    values = make_values(decls, dtype, np.random.default_rng(3))
    got = run_interp(p.module, p.specs, p.typed, values)
    assert_matches(p.typed, values, got, f"{source} {target} {p.schedule}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("source", "decls", "dtype"), DECLS[:3])
def test_emitted_kernels_with_prefetches_compile_strictly_and_run(tmp_path, source, decls,
                                                                  dtype, target):
    c_path, _, planned = emit_and_run(tmp_path, source, decls, dtype, target, misalign=True)
    p = _interleaving(planned)
    if p is not planned:  # the kernel of blocks of rows, emitted the same way
        c_path, _ = write_standalone(p, tmp_path / "blocks")
        run_emitted(c_path, p, decls, dtype, target, p.module.entry, misalign=True,
                    context=f"{source} {p.schedule}")
    # vectors: blocks of rows along the columns; generic: scalar stores, never prefetched
    if target != "generic":
        assert "BLACC_PREFETCH(&C[" in c_path.read_text()
    else:
        assert "BLACC_PREFETCH(&" not in c_path.read_text()


def test_prefetches_sit_beside_their_stores():
    """Prefetches of a planned kernel sit in innermost loops beside the stores they run
    ahead of, at most one per store."""
    p = plan("C = A*B", target="avx512", A=M(100, 4), B=M(4, 100), C=M(100, 100))
    body = p.module.function(p.module.entry).body
    loops = [f for f in nodes_of(body, k.For) if not nodes_of(f.body, k.For)]
    assert len(_prefetches(body)) == sum(len(_prefetches(f.body)) for f in loops)
    for loop in loops:
        fetched = _prefetches(loop.body)
        rows = {s.index for s in nodes_of(loop.body, k.Store)}
        assert len(fetched) <= len(rows)
    assert any(_prefetches(f.body) for f in loops)


@pytest.mark.parametrize("target", ["avx2", "avx512"])
def test_amd_hosts_get_no_prefetches(monkeypatch, target):
    """On Zen 3 C = A*B 100 x 4 x 100 f64 ran 1.3-1.5x as fast without the prefetches
    (``Machine.prefetches_store_streams``): kernels planned there have none, and are
    otherwise the kernels their schedules make with them."""
    _host_of(monkeypatch, "AuthenticAMD")
    amd = plan("C = A*B", target=target, A=M(100, 4), B=M(4, 100), C=M(100, 100))
    body = amd.module.function(amd.module.entry).body
    assert not _prefetches(body)
    with_them = build_module(amd.indexed, amd.specs, amd.schedule, amd.isa, amd.module.entry)
    fetching = with_them.function(with_them.entry).body
    assert _prefetches(fetching)
    assert _without_prefetches(fetching) == body


def _without_prefetches(body: tuple[k.Stmt, ...]) -> tuple[k.Stmt, ...]:
    return tuple(map_bodies(s, _without_prefetches) if isinstance(s, (k.For, k.If)) else s
                 for s in body if not isinstance(s, k.Prefetch))
