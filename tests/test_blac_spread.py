"""Rows held two or four to a vector where A's elements of those rows lie side by side
in memory (A' of a row-major A, a column-major A): one load of them, each spread over
its half or quarter (``k.Spread``), instead of a broadcast per row joined by shuffles.

* ``Spread`` in the interpreter, the printer and both backends, every template: compiled
  by gcc for its ISA, run (and JIT-compiled by LLVM) where the CPU has it;
* the lowering reads such rows with it, for pairs and quads;
* the model takes it for C = alpha*(A0 + A1)'*B + beta*C with C n x 4 on AVX2, and not
  from a temporary stored in wider vectors, whose loads wait on the stores. (With A0
  n x 4 and C 4 x 4 it now folds the sum into the parts of vectors instead:
  ``test_blac_folds``.)

Every candidate of such programs also runs through the interpreter and compiled against
guard pages in ``test_blac_pairs`` (AVX2) and ``test_blac_output_parts`` (AVX-512).
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.backend import llvm as llvm_backend
from blacc.blacs import plan
from blacc.ir import interp, printer
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import OpSchedule, build_module
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import _llvm_function

M = blacc.Matrix
NP = {"f32": np.float32, "f64": np.float64}
#: (ISA, dtype, elements spread): every spread template
TEMPLATES = [(AVX2, "f32", 2), (AVX2, "f64", 2), (AVX512, "f32", 4), (AVX512, "f64", 2),
             (AVX512, "f32", 2), (AVX512, "f64", 4)]
IDS = [f"{isa.name}-{dt}-{parts}" for isa, dt, parts in TEMPLATES]


def _spread_module(isa, dtype: str, parts: int) -> k.Module:
    """out = spread(x[1..]) | spread(x[1 + parts..]): unaligned loads, one after another."""
    lanes = isa.lanes(dtype)
    body = tuple(k.Store("out", k.Const(n * lanes),
                         k.Spread(k.Load("x", k.Const(1 + n * parts), dtype, parts), lanes))
                 for n in range(2))
    params = (k.Param("x", dtype, pointer=True, const=True),
              k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("spread", params, body, exported=True),), "spread")


def _expected(x: np.ndarray, lanes: int, parts: int) -> np.ndarray:
    return np.concatenate([np.repeat(x[1 + n * parts:1 + (n + 1) * parts], lanes // parts)
                           for n in range(2)])


@pytest.mark.parametrize(("isa", "dtype", "parts"), TEMPLATES, ids=IDS)
def test_spread_node(isa, dtype, parts):
    lanes = isa.lanes(dtype)
    module = _spread_module(isa, dtype, parts)
    x = np.arange(1, 2 * parts + 2, dtype=NP[dtype])
    out = np.zeros(2 * lanes, NP[dtype])
    interp.run(module, {"x": x, "out": out})
    np.testing.assert_array_equal(out, _expected(x, lanes, parts))
    assert f"spread{lanes}(" in printer.module(module)
    head = isa.op(f"spread{parts}", dtype).split("(")[0]  # the outer shuffle
    assert c_backend.render(module, isa).count(head) == 2
    mask = ", ".join(f"i32 {q}" for q in range(parts) for _ in range(lanes // parts))
    assert mask in llvm_backend.render(module, isa)


def test_spread_checks_its_load():
    load = k.Load("x", k.Const(0), "f32", 4)
    assert k.Spread(load, 16).parts == 4
    for bad, lanes in ((k.Load("x", k.Const(0), "f32", 3), 12),
                       (k.Load("x", k.Const(0), "f32", 4, k.Const(3)), 16),
                       (load, 4), (load, 10)):
        with pytest.raises(ValueError, match="Spread"):
            k.Spread(bad, lanes)


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("isa", "dtype", "parts"), TEMPLATES, ids=IDS)
def test_spread_compiled_by_c_and_llvm(tmp_path, isa, dtype, parts):
    """Each template compiles with -Wall -Wextra -Werror; where the CPU has the ISA, the C
    and LLVM functions give what the interpreter gives."""
    module = _spread_module(isa, dtype, parts)
    c_fn = _compiled(module, isa, tmp_path / "spread")
    if not NATIVE[isa.name]:
        pytest.skip(f"compiled only: this CPU cannot run {isa.name}")
    lanes = isa.lanes(dtype)
    x = np.arange(1, 2 * parts + 2, dtype=NP[dtype]) / 3
    for fn in (c_fn, _llvm_function(module, isa)):
        out = np.zeros(2 * lanes, NP[dtype])
        fn(x.ctypes.data, out.ctypes.data)
        np.testing.assert_array_equal(out, _expected(x, lanes, parts))


def _gemam(n: int, dtype: str, cols: int = 4) -> dict:
    """C = alpha*(A0 + A1)'*B + beta*C with A0, A1 n x 4: C 4 x ``cols``, A0[k, i..i+3]
    the elements of C's rows i..i+3 for one k."""
    return dict(A0=M(n, 4, dtype), A1=M(n, 4, dtype), B=M(n, cols, dtype),
                C=M(4, cols, dtype), alpha=blacc.Scalar(dtype), beta=blacc.Scalar(dtype))


GEMAM = "C = alpha*(A0 + A1)'*B + beta*C"
#: (ISA, dtype, rows per vector, columns of C): rows half or a quarter of a vector wide
HELD = [(AVX2, "f32", 2, 4), (AVX2, "f64", 2, 2), (AVX512, "f32", 4, 4), (AVX512, "f64", 2, 4)]


@pytest.mark.parametrize(("isa", "dtype", "rows", "cols"), HELD,
                         ids=[f"{i.name}-{d}" for i, d, _, _ in HELD])
def test_rows_side_by_side_are_spread(isa, dtype, rows, cols):
    """The fused form with rows held together reads A0 and A1 with one spread each per k
    and row group, and broadcasts nothing but alpha and beta; the interpreter gives what
    NumPy does."""
    kk = 5
    p = plan(GEMAM, target=isa.name, **_gemam(kk, dtype, cols))
    fused = next(f for f in blacc.blacs.forms(p.typed) if len(f.ops) == 1)
    sched = OpSchedule("j", (4, 1), quads=rows == 4, pairs=rows == 2)
    module = build_module(fused, p.specs, (sched,), isa, "g")
    spreads = nodes_of(module, k.Spread)
    assert len(spreads) == 2 * kk * (4 // rows)  # A0 and A1, per k and row group
    assert {s.x.buf for s in spreads} == {"A0", "A1"}
    assert all(b.value.buf in ("alpha", "beta") for b in nodes_of(module, k.Broadcast)
               if isinstance(b.value, k.Load))
    rng = np.random.default_rng(3)
    a0, a1 = rng.uniform(-1, 1, (2, kk, 4)).astype(NP[dtype])
    b = rng.uniform(-1, 1, (kk, cols)).astype(NP[dtype])
    c = rng.uniform(-1, 1, (4, cols)).astype(NP[dtype])
    want = 0.5 * (a0 + a1).astype(np.float64).T @ b + 2.0 * c
    values = {"A0": a0.ravel().copy(), "A1": a1.ravel().copy(), "B": b.ravel().copy(),
              "C": c.ravel().copy(), "alpha": NP[dtype](0.5), "beta": NP[dtype](2.0)}
    interp.run(module, values)
    np.testing.assert_allclose(values["C"].reshape(4, cols), want,
                               rtol=1e-5 if dtype == "f32" else 1e-12, atol=1e-6)


def test_avx2_spreads_rows_of_a_long_transposed_sum():
    """C = alpha*(A0 + A1)'*B + beta*C, A0 4 x 48 f32, on AVX2: two rows of C per vector,
    the sum spread (from a temporary in 256-bit vectors, whose round trip a long kernel
    pays; Zen 5 with BLACC_ISA=avx2: 24.2 ns in the LGen harness, against 28.5 for the
    column tiles with a transpose per tile)."""
    p = plan(GEMAM, target="avx2", A0=M(4, 48, "f32"), A1=M(4, 48, "f32"),
             B=M(4, 4, "f32"), C=M(48, 4, "f32"), alpha=blacc.Scalar("f32"),
             beta=blacc.Scalar("f32"))
    assert p.schedule[-1].pairs, p.schedule
    assert nodes_of(p.module, k.Spread)


def test_no_spread_from_a_temporary_in_wider_vectors():
    """C = alpha*(A0 + A1)'*B + beta*C with A0 4 x 16 and C 16 x 4: the sum in a temporary
    stored in 512-bit vectors, then spread 128 bits at a time, ran 7.7 ns on Zen 5,
    against 4.4 for the fused columns (a measuring search's timings); a spread from a
    temporary pays its round trip (``strategy.small.SCRATCH_ROUND_TRIP``) like a
    broadcast from one."""
    p = plan(GEMAM, target="avx512", A0=M(4, 16, "f32"), A1=M(4, 16, "f32"),
             B=M(4, 4, "f32"), C=M(16, 4, "f32"), alpha=blacc.Scalar("f32"),
             beta=blacc.Scalar("f32"))
    body = p.module.function(p.module.entry).body
    local = {s.buf for s in body if isinstance(s, k.Local)}
    assert not any(s.x.buf in local for s in nodes_of(p.module, k.Spread)), p.schedule
