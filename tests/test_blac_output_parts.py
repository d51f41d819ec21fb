"""Rows held several to an AVX-512 vector: four rows of 4 f32 columns of an output, one
in each 128-bit quarter (``OpSchedule.quads`` on an output dimension), and two rows of 4
f64, one in each 256-bit half (``OpSchedule.pairs``: columns of an output, or sums on
lanes). A row of B is loaded into every part, A[i.., k] is splatted within the parts
from one load of the rows.

* ``HalfSplat`` of four parts in the interpreter, the printer and both backends;
* every such candidate of several programs, over row counts that are and are not
  multiples of the rows per vector, through the interpreter on buffers with no slack (a
  read or write outside an operand raises);
* compiled by gcc and, on a CPU with AVX-512, run on operands against guard pages;
* the model takes them for C = A*B with A n x 4 and B 4 x 4.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.backend import llvm as llvm_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import interp, printer
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, AVX512
from blacc.transform.blac import OpSchedule, build_module, candidates
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import PROGRAMS, candidate_modules, check_guarded, interpret_candidates
from test_blac_programs import make_values, seed_of

M = blacc.Matrix


def _splat_module() -> k.Module:
    """out[4q + r] = x[4q + lane] for each quarter q, once per lane (0..3)."""
    x = k.Load("x", k.Const(0), "f32", 16)
    body = tuple(k.Store("out", k.Const(16 * lane), k.HalfSplat(x, lane, 4))
                 for lane in range(4))
    params = (k.Param("x", "f32", pointer=True, const=True), k.Param("out", "f32", pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def test_quarter_splat_node():
    x = np.arange(16, dtype=np.float32)
    out = np.zeros(64, np.float32)
    interp.run(_splat_module(), {"x": x, "out": out})
    want = np.concatenate([np.repeat(x.reshape(4, 4)[:, lane], 4) for lane in range(4)])
    np.testing.assert_array_equal(out, want)
    assert "quartersplat(" in printer.module(_splat_module())
    assert "_mm512_permute_ps(" in c_backend.render(_splat_module(), AVX512)
    mask = ", ".join(f"i32 {4 * (i // 4) + 2}" for i in range(16))
    assert mask in llvm_backend.render(_splat_module(), AVX512)
    with pytest.raises(ValueError, match="lane 4"):
        k.HalfSplat(k.Load("x", k.Const(0), "f32", 16), 4, 4)
    with pytest.raises(ValueError, match="parts"):
        k.HalfSplat(k.Load("x", k.Const(0), "f32", 6), 0, 4)


#: (program of ``test_blac_pairs.PROGRAMS``, dtype): outputs 4 columns wide
NAMES = ("matmul", "matmul_ld", "gemm", "gemm_ld", "sum_t_gemm", "col_a", "chain", "outer",
         "matvec", "gesummv_ld")
ROWS = (1, 3, 4, 5, 7, 8, 13, 17, 33)
INTERP_CASES = [(name, n, kk, dt) for name in NAMES for n in ROWS for kk in (4, 5)
                for dt in ("f32", "f64")]


def _decls(name: str, n: int, dtype: str, kk: int = 4) -> dict:
    return PROGRAMS[name][1](n, kk, 4, dtype, 3)


def _parts(s: OpSchedule) -> bool:
    return s.quads or s.pairs


@pytest.mark.parametrize(("name", "n", "kk", "dtype"), INTERP_CASES,
                         ids=[f"{a}-{n}x{kk}-{d}" for a, n, kk, d in INTERP_CASES])
def test_every_candidate_in_the_interpreter(name, n, kk, dtype):
    """(Four rows of A are one load only where A is 4 columns wide and contiguous, and
    two rows of f64 are read in halves only where a whole 4-element group of each row
    lies in A: other products refuse them.)"""
    decls = _decls(name, n, dtype, kk)
    p = plan(PROGRAMS[name][0], target="avx512", **decls)
    values = make_values(decls, dtype,
                         np.random.default_rng(seed_of("parts", name, n, kk, dtype)))
    built = interpret_candidates(p, AVX512, _parts, values, f"{name} {n} {dtype}")
    if n >= 4 and name in ("matmul", "gemm", "chain") and kk == 4:
        assert built, "no candidate with rows held several to a vector builds"


def test_offered_only_for_outputs_a_quarter_or_half_wide():
    def offered(cols: int, dtype: str, isa=AVX512) -> set[str]:
        p = plan("C = A*B", target=isa.name, A=M(16, 4, dtype), B=M(4, cols, dtype),
                 C=M(16, cols, dtype))
        return {("quads" if s.quads else "pairs") for s in
                candidates(p.indexed, p.indexed.ops[0], isa) if _parts(s)}

    assert offered(4, "f32") == {"quads"}
    assert offered(4, "f64") == {"pairs"}
    assert offered(8, "f32") == set()  # half an AVX-512 f32 vector: no splat within halves
    assert offered(2, "f64") == {"pairs"}  # on the sums over 4 f64: half a vector
    assert offered(4, "f32", AVX2) == {"pairs"}
    p = plan("C = A*B", target="avx512", A=M(16, 4, "f32"), B=M(4, 4, "f32"),
             C=M(16, 4, "f32"))
    # rows of A 7 apart: four rows are not one load, but two vectors hold them (one
    # permute each); 12 apart they span 40 lanes, more than two vectors
    def spaced(ld: int) -> tuple:
        return tuple(s.__class__(**{**s.__dict__, "ld": ld}) if s.name == "A" else s
                     for s in p.specs)

    quads = (OpSchedule("j", (8, 1), quads=True),)
    assert nodes_of(build_module(p.indexed, spaced(7), quads, AVX512, "x"), k.Permute)
    with pytest.raises(ScheduleError, match="rows that two vectors hold"):
        build_module(p.indexed, spaced(12), quads, AVX512, "x")
    # A 8 x 5 f64: element 4 of a row has no whole group of 4 to load with the next row's,
    # and joining two broadcasts into 512 bits ran 0.65x as fast
    q = plan("C = A*B", target="avx512", A=M(8, 5, "f64"), B=M(5, 4, "f64"),
             C=M(8, 4, "f64"))
    with pytest.raises(ScheduleError, match="512-bit vector read A"):
        build_module(q.indexed, q.specs, (OpSchedule("j", (8, 1), pairs=True),), AVX512, "x")
    # a temporary is read back an element at a time: its rows are not held four together
    chain = plan("D = A*B*C", target="avx512", A=M(16, 4, "f32"), B=M(4, 4, "f32"),
                 C=M(4, 4, "f32"), D=M(16, 4, "f32"))
    form = next(f for f in blacc.blacs.forms(chain.typed) if len(f.ops) == 2)
    first, second = form.ops
    assert form.operand(first.out).temporary
    assert not any(s.quads for s in candidates(form, first, AVX512))
    assert any(s.quads for s in candidates(form, second, AVX512))
    chain64 = plan("D = A*B*C", target="avx512", A=M(16, 4, "f64"), B=M(4, 4, "f64"),
                   C=M(4, 4, "f64"), D=M(16, 4, "f64"))
    form = next(f for f in blacc.blacs.forms(chain64.typed) if len(f.ops) == 2)
    first, second = form.ops

    def output_pairs(op, isa) -> bool:  # (pairs on the sums over 4 f64 stay)
        return any(s.pairs and s.vector in op.dims for s in candidates(form, op, isa))

    assert not output_pairs(first, AVX512) and output_pairs(second, AVX512)


COMPILED_CASES = [("matmul", 32, "f32"), ("gemm", 13, "f32"), ("gemm_ld", 17, "f64"),
                  ("matmul", 100, "f64"), ("chain", 12, "f32"), ("matvec", 13, "f64"),
                  # A's elements of the rows side by side: spread (``k.Spread``)
                  ("sum_t_gemm", 13, "f32"), ("sum_t_gemm", 9, "f64"), ("col_a", 11, "f32"),
                  ("col_a", 6, "f64")]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "n", "dtype"), COMPILED_CASES,
                         ids=[f"{a}-{n}-{d}" for a, n, d in COMPILED_CASES])
def test_compiled_against_guard_pages(tmp_path, name, n, dtype):
    """Each candidate with rows held several to a vector, compiled by gcc (always) and
    run where the CPU has AVX-512, on operands that touch guard pages."""
    decls = _decls(name, n, dtype)
    p = plan(PROGRAMS[name][0], target="avx512", **decls)
    fns = [(schedule, "c", _compiled(module, AVX512, tmp_path / f"p{i}"))
           for i, (schedule, module) in enumerate(candidate_modules(p, AVX512, _parts))
           if module is not None]
    assert fns
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("pg", name, n, dtype)))
    check_guarded(fns, p, values, f"{name} {n} {dtype}")


@pytest.mark.parametrize(("n", "dtype"), [(32, "f32"), (100, "f32"), (16, "f64"), (64, "f64")])
def test_the_model_holds_rows_of_narrow_products_together(n, dtype):
    """C = A*B, A n x 4, B 4 x 4 on AVX-512: a row of B in every part and A splatted
    within them (Zen 5, n = 32 f32: 4.4 ns in a measuring search's timings; the
    transposes through permutes ran 8.9 ns in the LGen harness, 9.2 in the search's)."""
    p = plan("C = A*B", target="avx512", A=M(n, 4, dtype), B=M(4, 4, dtype),
             C=M(n, 4, dtype))
    assert p.schedule[0].rows_per_vector == (4 if dtype == "f32" else 2), p.schedule
    assert nodes_of(p.module, k.HalfSplat)
    assert not nodes_of(p.module, (k.Zip, k.Unzip))
