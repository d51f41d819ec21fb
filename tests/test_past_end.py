"""Masked moves whose masked-off lanes may lie past the end of an operand
(``transform.past_end``): such a move takes a ~140-ns microcode assist where those lanes
fall on a page that is not mapped, so loads are shifted (``k.ShiftDown``) or moved in
plain pieces, and stores in plain pieces.

* the bounds of an index over its loops, and which moves reach past the end;
* the pass on hand-made kernels: shifted, flagged, or left masked;
* ``ShiftDown`` of every width and shift in the interpreter, by gcc and by the LLVM JIT;
* a masked load and store of every count at the very end of their operands: no mask
  left in the code, and the right lanes with guard pages after the operands;
* planned programs whose rows end in leftovers: no masked move reaching past the end of
  an operand, and NumPy's results.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.backend import llvm as llvm_backend
from blacc.blacs import plan
from blacc.ir import interp
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of, simplify
from blacc.target.isa import AVX2, AVX512
from blacc.transform.past_end import bounds, mark_past_end, reaches_past
from guard import guarded_array, run_isolated
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import _llvm_function
from test_blac_programs import NP, assert_matches, make_values, run_interp, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
ISAS = {"avx2": AVX2, "avx512": AVX512}
#: (isa, dtype, lanes) of every vector width of the two ISAs
WIDTHS = [(name, dt, n) for name, isa in ISAS.items() for dt in ("f32", "f64")
          for n in isa.widths(dt)[:-1]]


def _id(case: tuple) -> str:
    return "-".join(map(str, case))


# ----------------------------------------------------------------------------- bounds


def test_bounds_over_loops():
    i, j = k.Var("i"), k.Var("j")
    ranges = {"i": (0, 3), "j": (2, 10)}
    assert bounds(i * 12 + j, ranges) == (2, 46)
    assert bounds(k.Const(7) - i, ranges) == (4, 7)
    assert bounds(k.Bin("min", i, j), ranges) == (0, 3)
    assert bounds(i * k.Var("n"), ranges) is None  # a size known at run time
    assert bounds(k.Bin("%", i, k.Const(2)), ranges) is None
    assert not reaches_past(k.Const(32), 16, 48, {})
    assert reaches_past(k.Const(36), 16, 48, {})  # 12 lanes of the last row of 4 x 12
    assert reaches_past(i * 12, 16, 48, ranges)  # its last iteration does
    assert not reaches_past(i * 12, 16, 52, ranges)
    assert reaches_past(k.Var("n"), 4, 100, ranges)  # not bounded: assumed to


def _function(body: tuple[k.Stmt, ...], extent: int, dtype: str = "f32") -> k.Module:
    params = (k.Param("x", dtype, pointer=True, const=True, extent=extent),
              k.Param("out", dtype, pointer=True, extent=extent))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def _copy(at: int, lanes: int, count: int, dtype: str = "f32") -> k.Stmt:
    """out[at : at+count] = x[at : at+count], masked."""
    return k.Store("out", k.Const(at), k.Load("x", k.Const(at), dtype, lanes,
                                              k.Const(count)), k.Const(count))


@pytest.mark.parametrize(("isa", "lanes"), [(AVX2, 4), (AVX2, 8), (AVX512, 4), (AVX512, 8),
                                            (AVX512, 16)], ids=lambda x: getattr(x, "name", x))
def test_the_pass_shifts_flags_or_leaves(isa, lanes):
    """Rows of 3/4 of a vector (4 x 3 f32 in 128-bit vectors, 4 x 6 in 256-bit, 4 x 12
    in 512-bit): rows 0-2 stay masked; the last row's load starts a quarter vector
    earlier and is shifted down where the ISA has the shift (128 bits), else flagged;
    its store is flagged; an array shorter than a vector (3 of 4 lanes) has its load
    flagged too."""
    row = lanes * 3 // 4
    body = tuple(_copy(row * r, lanes, row) for r in range(4))
    marked = mark_past_end(_function(body, 4 * row), isa)
    stores = nodes_of(marked, k.Store)
    assert [s.past_end for s in stores] == [False, False, False, True]
    loads = nodes_of(marked, k.Load)
    if lanes == 4:
        (shift,) = nodes_of(marked, k.ShiftDown)
        assert shift == k.ShiftDown(k.Load("x", k.Const(3 * row - 1), "f32", lanes), 1)
        assert not any(e.past_end for e in loads)
    else:
        assert not nodes_of(marked, k.ShiftDown)
        assert [e.past_end for e in loads] == [False, False, False, True]
    short = mark_past_end(_function((_copy(0, 4, 3),), 3), isa)
    (load,) = nodes_of(short, k.Load)
    assert load.past_end and not nodes_of(short, k.ShiftDown)
    # parameters of no known extent (GEMM's, sized at run time) are left alone
    params = tuple(k.Param(p.name, p.dtype, p.pointer, p.const)
                   for p in _function(body, 0).function("f").params)
    unknown = k.Module((k.Function("f", params, body, exported=True),), "f")
    assert mark_past_end(unknown, isa) == unknown


def test_a_buffer_read_back_is_not_shifted():
    """io updated in place: a shifted load would overlap the earlier stores of io in part
    and wait for them, so the last row is loaded in pieces, as it is stored."""
    v = k.Var("v", "f32", 8)
    body = []
    for r in range(3):
        body += [k.Decl(v, k.Load("io", k.Const(5 * r), "f32", 8, k.Const(5)))
                 if r == 0 else k.Assign(v, k.Load("io", k.Const(5 * r), "f32", 8, k.Const(5))),
                 k.Store("io", k.Const(5 * r), k.Bin("+", v, v), k.Const(5))]
    params = (k.Param("io", "f32", pointer=True, extent=15),)
    module = k.Module((k.Function("f", params, tuple(body), exported=True),), "f")
    marked = mark_past_end(module, AVX512)
    assert not nodes_of(marked, k.ShiftDown)
    assert [e.past_end for e in nodes_of(marked, k.Load)] == [False, False, True]
    src = c_backend.render(marked, AVX512)
    assert src.count("_mm256_maskz_loadu_ps") == 2, src


def test_a_loop_whose_last_iteration_reaches_past_is_flagged():
    i = k.Var("i")
    load = k.Load("x", i * 12, "f32", 16, k.Const(12))
    loop = k.For(i, k.Const(0), k.Const(4), 1, (k.Store("out", i * 12, load, k.Const(12)),))
    marked = mark_past_end(_function((loop,), 48), AVX512)
    (store,) = nodes_of(marked, k.Store)
    (load,) = nodes_of(marked, k.Load)
    assert store.past_end and load.past_end  # 512 bits: in pieces, not shifted
    inside = mark_past_end(_function((loop,), 52), AVX512)
    assert not any(x.past_end for x in nodes_of(inside, (k.Load, k.Store)))


# ----------------------------------------------------------------------------- ShiftDown


def _shift_module(dtype: str, lanes: int, by: int) -> k.Module:
    """out[0:lanes] = x[0:lanes] moved down ``by`` lanes, zeros above."""
    body = (k.Store("out", k.Const(0), k.ShiftDown(k.Load("x", k.Const(0), dtype, lanes), by)),)
    params = (k.Param("x", dtype, pointer=True, const=True),
              k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def _shifted(x: np.ndarray, by: int) -> np.ndarray:
    return np.concatenate([x[by:], np.zeros(by, x.dtype)])


def test_shift_down_checks_its_shift():
    x = k.Load("x", k.Const(0), "f32", 4)
    for by in (0, 4, -1):
        with pytest.raises(ValueError, match="ShiftDown"):
            k.ShiftDown(x, by)


@pytest.mark.parametrize(("isa", "dtype", "lanes"), WIDTHS, ids=map(_id, WIDTHS))
def test_shift_down_everywhere(tmp_path, isa, dtype, lanes):
    """Every shift of every width: the interpreter, the LLVM JIT and, where the ISA has a
    template for it (128 bits), gcc (-Wall -Wextra -Werror); run where the CPU runs the
    ISA."""
    x = np.arange(1, lanes + 1, dtype=NP[dtype]) / 3
    fns = []
    for by in range(1, lanes):
        module = _shift_module(dtype, lanes, by)
        out = np.full(lanes, -1, NP[dtype])
        interp.run(module, {"x": x.copy(), "out": out})
        np.testing.assert_array_equal(out, _shifted(x, by))
        if CC is not None:
            fns.append((by, "llvm", _llvm_function(module, ISAS[isa])))
            if ISAS[isa].has_op("shift_down", dtype, lanes):
                fns.append((by, "c", _compiled(module, ISAS[isa], tmp_path / f"s{by}")))
    if CC is None or not NATIVE[isa]:
        pytest.skip(f"compiled only: needs a C compiler and a CPU with {isa}")
    for by, backend, fn in fns:
        out = np.full(lanes, -1, NP[dtype])
        assert fn(x.ctypes.data, out.ctypes.data) == 0
        np.testing.assert_array_equal(out, _shifted(x, by), err_msg=f"{backend} by {by}")


# ----------------------------------------------------------------------------- at the end


def _at_the_end(dtype: str, lanes: int, count: int, start: int) -> k.Module:
    """out[start : start+count] = 2 * x[start : start+count], both ``start + count``
    elements long: the masked-off lanes of both moves lie past the end."""
    v = k.Var("v", dtype, lanes)
    load = k.Load("x", k.Const(start), dtype, lanes, k.Const(count))
    body = (k.Decl(v, load), k.Store("out", k.Const(start), k.Bin("+", v, v), k.Const(count)))
    return _function(body, start + count, dtype)


END_CASES = [(isa, dt, n, c, start) for isa, dt, n in WIDTHS for c in range(1, n)
             for start in sorted({0, n - c})]


@pytest.mark.parametrize(("isa", "dtype", "lanes", "count", "start"), END_CASES,
                         ids=map(_id, END_CASES))
def test_moves_at_the_end_are_not_masked(tmp_path, isa, dtype, lanes, count, start):
    """No masked move in the C or the LLVM IR; with room before it (``start``) a 128-bit
    load is one vector shifted, unless one plain load moves its lanes. Compiled, x and
    out end at a guard page where the CPU runs the ISA."""
    target = ISAS[isa]
    module = mark_past_end(_at_the_end(dtype, lanes, count, start), target)
    shifts = (target.has_op("shift_down", dtype, lanes) and start >= lanes - count
              and target.plain_moves("load", dtype, lanes, count) is None)
    assert bool(nodes_of(module, k.ShiftDown)) == shifts
    src, ir = c_backend.render(module, target), llvm_backend.render(module, target)
    assert "mask" not in src.split("int f(")[1] and "llvm.masked" not in ir, src
    x = np.arange(1, start + count + 1, dtype=NP[dtype]) / 3
    want = np.full(start + count, -7777.0, NP[dtype])
    want[start:] = 2 * x[start:]
    out = np.full(start + count, -7777.0, NP[dtype])
    interp.run(module, {"x": x.copy(), "out": out})
    np.testing.assert_array_equal(out, want)
    if CC is None:
        pytest.skip("needs a C compiler")
    fns = [("c", _compiled(module, target, tmp_path / "end")),
           ("llvm", _llvm_function(module, target))]
    if not NATIVE[isa]:
        pytest.skip(f"compiled only: this CPU cannot run {isa}")

    def body() -> None:
        for backend, fn in fns:
            xg = guarded_array((1, start + count), NP[dtype], fill=x[None, :])
            og = guarded_array((1, start + count), NP[dtype], fill=-7777.0)
            assert fn(xg.ctypes.data, og.ctypes.data) == 0
            np.testing.assert_array_equal(og[0], want, err_msg=backend)

    run_isolated(body)


# ----------------------------------------------------------------------------- programs

PROGRAMS = [
    ("C = A*B", dict(A=(3, 3), B=(3, 3), C=(3, 3))),
    ("C = A*B", dict(A=(4, 4), B=(4, 12), C=(4, 12))),
    ("C = A*B", dict(A=(7, 5), B=(5, 7), C=(7, 7))),
    ("y = A*x", dict(A=(9, 9), x=(9,), y=(9,))),
    ("y = A*x", dict(A=(4, 12), x=(12,), y=(4,))),
    ("y = alpha*A*x + beta*B*x", dict(A=(12, 4), B=(12, 4), x=(4,), y=(12,), alpha=(),
                                      beta=())),
    ("alpha = x'*A*y", dict(A=(5, 5), x=(5,), y=(5,), alpha=())),
    ("C = alpha*(A0 + A1)'*B + beta*C", dict(A0=(3, 3), A1=(3, 3), B=(3, 3), C=(3, 3),
                                             alpha=(), beta=())),
]
PROGRAM_CASES = [(isa, dt, i) for isa in ISAS for dt in ("f32", "f64")
                 for i in range(len(PROGRAMS))]


def _declared(shapes: dict, dtype: str) -> dict:
    return {n: (S(dtype) if s == () else V(s[0], dtype) if len(s) == 1 else M(*s, dtype))
            for n, s in shapes.items()}


def _masked_past_the_end(module: k.Module) -> list:
    """The masked moves of ``module`` at a constant index whose lanes reach past the end
    of their parameter and that are still masked (not ``past_end``)."""
    (entry,) = module.functions
    extents = {p.name: p.extent for p in entry.params if p.extent is not None}
    found = []
    for x in nodes_of(entry.body, (k.Load, k.Store)):
        lanes = x.lanes if isinstance(x, k.Load) else x.value.lanes
        at = k.const_value(simplify(x.index))
        if (x.count is not None and lanes > 1 and not x.past_end and x.buf in extents
                and at is not None and at + lanes > extents[x.buf]):
            found.append(x)
    return found


@pytest.mark.parametrize(("isa", "dtype", "index"), PROGRAM_CASES,
                         ids=map(_id, PROGRAM_CASES))
def test_programs_mask_nothing_past_the_end(isa, dtype, index):
    source, shapes = PROGRAMS[index]
    decls = _declared(shapes, dtype)
    p = plan(source, target=isa, **decls)
    assert not _masked_past_the_end(p.module), p.source
    values = make_values(decls, dtype, np.random.default_rng(seed_of("past_end", index)))
    assert_matches(p.typed, values, run_interp(p.module, p.specs, p.typed, values, slack=0))
