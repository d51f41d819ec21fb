"""Leftover vectors of a known count (``Load``/``Store`` with a constant ``count``) move with
plain stores of their first lanes where the ISA has them (``Isa.partial_pieces``), not with
masked stores (microcoded on AMD cores), and with one narrower load where that can do it
(``Isa.plain_moves``).

* the decomposition into moves, per ISA, dtype, width and count;
* one node of every width and count through the interpreter, the C backend and the LLVM
  backend, on buffers with sentinels around them and PROT_NONE guard pages at both ends:
  a load reads only its first ``count`` lanes and zeros the others, a store writes only
  its first ``count`` lanes;
* whole programs whose rows end in such leftovers, compiled both ways, against guard pages
  with sentinel-filled padding between rows, and no masked move left in the code;
* the cost model charges them as plain moves.
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
from blacc.ir.walk import nodes_of
from blacc.strategy import small
from blacc.target.isa import AVX2, AVX512, GENERIC
from blacc.transform.blac import build_module
from guard import guarded_array, run_isolated
from test_blac_columns import CC, NATIVE, _compiled
from test_blac_pairs import _c_function, _guarded, _llvm_function, needs_native
from test_blac_programs import NP, assert_matches, make_values, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
SENTINEL = -7777.0  # also what test_blac_pairs._guarded fills the padding with
WIDTHS = [("f32", 8), ("f32", 4), ("f64", 4), ("f64", 2)]


def test_partial_pieces_avx2():
    pieces = {(dt, n): [AVX2.partial_pieces(dt, n, c) for c in range(n + 1)] for dt, n in WIDTHS}
    assert pieces[("f32", 8)] == [None, (1,), (2,), (2, 1), (4,), (4, 1), (4, 2), (4, 2, 1),
                                  None]
    assert pieces[("f32", 4)] == [None, (1,), (2,), (2, 1), None]
    assert pieces[("f64", 4)] == [None, (1,), (2,), (2, 1), None]
    assert pieces[("f64", 2)] == [None, (1,), None]
    assert AVX2.partial_pieces("f32", 8, -1) is None and AVX2.partial_pieces("f32", 8, 9) is None
    assert GENERIC.partial_pieces("f32", 8, 3) is None


def test_plain_moves_stores_always_loads_as_one_move():
    """Loads of a buffer the kernel also stores into (read back) are the stores' pieces,
    so that each is forwarded from one store; with mask registers loads stay masked but
    where one narrower vector holds the lanes (2 of 8 f64 a 128-bit load)."""
    for dt, n in WIDTHS:
        for c in range(1, n):
            pieces = AVX2.partial_pieces(dt, n, c)
            assert AVX2.plain_moves("store", dt, n, c) == pieces
            single = len(pieces) == 1
            assert (AVX2.plain_moves("load", dt, n, c) is not None) == single, (dt, n, c)
            assert AVX2.plain_moves("load", dt, n, c, read_back=True) == pieces
    for dt in ("f32", "f64"):
        n = AVX512.lanes(dt)
        for c in range(1, n):
            for read_back in (False, True):
                got = AVX512.plain_moves("load", dt, n, c, read_back=read_back)
                assert got == ((c,) if c in _one_plain_load(dt) else None), (dt, c)
    assert AVX512.plain_moves("load", "f64", 8, 2) == (2,)
    assert AVX512.plain_moves("load", "f64", 8, 1) == (1,)  # vmovsd
    assert AVX512.plain_moves("load", "f32", 16, 8) == (8,)
    assert AVX512.plain_moves("load", "f32", 16, 12) is None  # 8 + 4: masked


def _one_plain_load(dtype: str) -> set[int]:
    """Counts of the first lanes of an AVX-512 vector that one plain load moves: a
    narrower vector, or the first lanes of 128 bits by a ``load_first`` template."""
    return {1, 2, 4, 8} if dtype == "f32" else {1, 2, 4}


# ----------------------------------------------------------------------------- one node


def _node_module(dtype: str, lanes: int, count: int) -> k.Module:
    """full[0:lanes] = x[1 : 1+count] then zeros (a partial load stored whole);
    out[1 : 1+count] = 2 * that (a partial store)."""
    v = k.Var("v", dtype, lanes)
    body = (k.Decl(v, k.Load("x", k.Const(1), dtype, lanes, k.Const(count))),
            k.Store("full", k.Const(0), v),
            k.Store("out", k.Const(1), k.Bin("+", v, v), k.Const(count)))
    params = (k.Param("x", dtype, pointer=True, const=True),
              k.Param("full", dtype, pointer=True), k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def _expected(dtype: str, lanes: int, count: int, x: np.ndarray) -> tuple[np.ndarray, ...]:
    full = np.zeros(lanes, NP[dtype])
    full[:count] = x[1:1 + count]
    out = np.full(lanes + 2, SENTINEL, NP[dtype])
    out[1:1 + count] = 2 * x[1:1 + count]
    return full, out


NODE_CASES = [(dt, n, c) for dt, n in WIDTHS for c in range(1, n)]


@pytest.mark.parametrize(("dtype", "lanes", "count"), NODE_CASES)
def test_partial_node_in_the_interpreter(dtype, lanes, count):
    x = np.arange(1, count + 2, dtype=NP[dtype]) / 3  # exactly the lanes read, no slack
    full = np.zeros(lanes, NP[dtype])
    out = np.full(lanes + 2, SENTINEL, NP[dtype])
    interp.run(_node_module(dtype, lanes, count), {"x": x, "full": full, "out": out})
    want_full, want_out = _expected(dtype, lanes, count, x)
    np.testing.assert_array_equal(full, want_full)
    np.testing.assert_array_equal(out, want_out)


@pytest.mark.parametrize(("dtype", "lanes", "count"), NODE_CASES)
def test_partial_node_renders_plain_moves(dtype, lanes, count):
    """No masked store; a masked load only where one narrower load cannot do it."""
    module = _node_module(dtype, lanes, count)
    src, ir = c_backend.render(module, AVX2), llvm_backend.render(module, AVX2)
    assert "maskstore" not in src and "llvm.masked.store" not in ir, src
    masked_load = AVX2.plain_moves("load", dtype, lanes, count) is None
    assert ("maskload" in src) == masked_load, src
    assert ("llvm.masked.load" in ir) == masked_load, ir


def _every_count_compiled(tmp_path, make, dtype: str, lanes: int) -> list:
    """(count, backend, function) of ``make(dtype, lanes, count)`` for every count, by gcc
    and the LLVM JIT."""
    fns = []
    for count in range(1, lanes):
        module = make(dtype, lanes, count)
        fns += [(count, "c", _c_function(tmp_path, module)),
                (count, "llvm", _llvm_function(module))]
    return fns


def _check_partial_nodes_guarded(fns: list, dtype: str, lanes: int) -> None:
    """Call each (count, backend, function) of ``_node_module`` with x ending at a guard
    page one element after the last lane read (or starting one before the first), and
    out surrounded by sentinels and guard pages, in a child process."""

    def body() -> None:
        for count, backend, fn in fns:
            xv = np.arange(1, count + 2, dtype=NP[dtype]) / 3
            for side in ("after", "before"):
                x = guarded_array((1, count + 1), NP[dtype], side=side, fill=xv[None, :])
                full = np.zeros(lanes, NP[dtype])
                out = guarded_array((1, lanes + 2), NP[dtype], side=side, fill=SENTINEL)
                fn(x.ctypes.data, full.ctypes.data, out.ctypes.data)
                want_full, want_out = _expected(dtype, lanes, count, xv)
                where = f"{backend} {dtype} {lanes} lanes count {count} {side}"
                np.testing.assert_array_equal(full, want_full, err_msg=where)
                np.testing.assert_array_equal(out[0], want_out, err_msg=where)

    run_isolated(body)


@needs_native
@pytest.mark.parametrize(("dtype", "lanes"), WIDTHS)
def test_partial_nodes_compiled_against_guard_pages(tmp_path, dtype, lanes):
    """Every count, gcc and the LLVM JIT: x ends at a guard page one element after the
    last lane read, and out is surrounded by sentinels and guard pages."""
    fns = _every_count_compiled(tmp_path, _node_module, dtype, lanes)
    _check_partial_nodes_guarded(fns, dtype, lanes)


def _update_module(dtype: str, lanes: int, count: int) -> k.Module:
    """io[1 : 1+count] = 2 * io[1 : 1+count]: a buffer read back, its partial load and
    store in the same pieces."""
    v = k.Var("v", dtype, lanes)
    body = (k.Decl(v, k.Load("io", k.Const(1), dtype, lanes, k.Const(count))),
            k.Store("io", k.Const(1), k.Bin("+", v, v), k.Const(count)))
    return k.Module((k.Function("f", (k.Param("io", dtype, pointer=True),), body,
                                exported=True),), "f")


@pytest.mark.parametrize(("dtype", "lanes", "count"), NODE_CASES)
def test_a_buffer_read_back_loads_as_it_was_stored(dtype, lanes, count):
    """AVX2 loads the first lanes of a buffer it stores into in the stores' plain pieces;
    AVX-512 stores them in pieces and loads them masked, or by one plain load where one
    moves them."""
    module = _update_module(dtype, lanes, count)
    src, ir = c_backend.render(module, AVX2), llvm_backend.render(module, AVX2)
    assert "mask" not in src and "llvm.masked" not in ir, src
    wide = AVX512.lanes(dtype)
    src = c_backend.render(_update_module(dtype, wide, count), AVX512)
    plain = count in _one_plain_load(dtype)
    assert "_mask_storeu_" not in src and ("_maskz_loadu_" in src) != plain, src
    io = np.arange(1, count + 2, dtype=NP[dtype]) / 3  # exactly the lanes read, no slack
    want = io.copy()
    want[1:] *= 2
    interp.run(module, {"io": io})
    np.testing.assert_array_equal(io, want)


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_avx512_partial_loads_compiled_against_guard_pages(tmp_path, dtype):
    """AVX-512: a partial 512-bit load is one plain load zero-extended where one moves
    its lanes (1, 2 or 4 of 8 f64; 1, 2, 4 or 8 of 16 f32), else masked; every count by gcc
    (always) and the LLVM JIT, run against guard pages where the CPU has AVX-512."""
    lanes = AVX512.lanes(dtype)
    fns = []
    for count in range(1, lanes):
        module = _node_module(dtype, lanes, count)
        src = c_backend.render(module, AVX512)
        plain = count in _one_plain_load(dtype)
        assert ("_maskz_loadu_" in src) != plain, (count, src)
        fns += [(count, "c", _compiled(module, AVX512, tmp_path / f"p{count}")),
                (count, "llvm", _llvm_function(module, AVX512))]
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    _check_partial_nodes_guarded(fns, dtype, lanes)


@needs_native
@pytest.mark.parametrize(("dtype", "lanes"), WIDTHS)
def test_read_back_nodes_compiled_against_guard_pages(tmp_path, dtype, lanes):
    """Every count, gcc and the LLVM JIT: io ends at a guard page one element after the
    last lane, or starts at one before the first, with sentinels around the lanes."""
    fns = _every_count_compiled(tmp_path, _update_module, dtype, lanes)

    def body() -> None:
        for count, backend, fn in fns:
            xv = np.arange(1, count + 2, dtype=NP[dtype]) / 3
            for side in ("after", "before"):
                io = guarded_array((1, count + 1), NP[dtype], side=side, fill=xv[None, :])
                fn(io.ctypes.data)
                want = xv.copy()
                want[1:] *= 2
                where = f"{backend} {dtype} {lanes} lanes count {count} {side}"
                np.testing.assert_array_equal(io[0], want, err_msg=where)

    run_isolated(body)


# ----------------------------------------------------------------------------- programs

#: (source, declarations for width n): rows of n elements end in leftovers; the padded
#: leading dimensions put sentinels right after each row.
PROGRAMS = {
    "gemm": ("C = A*B + C", lambda n, dt: dict(
        A=M(3, 2, dt), B=M(2, n, dt, ld=n + 3), C=M(3, n, dt, ld=n + 3))),
    "axpy": ("y = alpha*x + y", lambda n, dt: dict(x=V(n, dt), y=V(n, dt), alpha=S(dt))),
    "scale": ("C = alpha*A", lambda n, dt: dict(
        A=M(5, n, dt, ld=n + 1), C=M(5, n, dt, ld=n + 2), alpha=S(dt))),
}
PROGRAM_CASES = [(name, dt, n) for name in PROGRAMS
                 for dt, ns in (("f32", (2, 3, 5, 6, 7, 11, 14, 15)), ("f64", (1, 2, 3, 5, 6, 7)))
                 for n in ns]


def _counted(module: k.Module) -> int:
    """Loads and stores with a count in ``module``."""
    return sum(x.count is not None for x in nodes_of(module, (k.Load, k.Store)))


def _padding_untouched(a: np.ndarray) -> bool:
    """The elements of a guarded array's region outside the array still hold SENTINEL."""
    flat = a
    while flat.base is not None and flat.ndim != 1:
        flat = flat.base
    inside = np.zeros(flat.shape, bool)
    start = (a.__array_interface__["data"][0] - flat.__array_interface__["data"][0])
    idx = (start + np.add.outer(np.arange(a.shape[0]) * a.strides[0],
                                np.arange(a.shape[1]) * a.strides[1])) // a.itemsize
    inside[idx.ravel()] = True
    return bool(np.all(flat[~inside] == SENTINEL))


@needs_native
@pytest.mark.parametrize(("name", "dtype", "n"), PROGRAM_CASES)
def test_programs_with_leftovers_against_guard_pages(tmp_path, name, dtype, n):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n, dtype)
    p = plan(source, target="avx2", **decls)
    module = build_module(p.indexed, p.specs, p.schedule, AVX2, "pk")
    if dtype == "f32" and n % 4 in (2, 3):
        assert _counted(module), "the f32 rows should end in counted leftovers"
    if _counted(module):
        assert "maskstore" not in c_backend.render(module, AVX2)
        assert "llvm.masked.store" not in llvm_backend.render(module, AVX2)
    fns = [("c", _c_function(tmp_path, module)), ("llvm", _llvm_function(module))]
    values = make_values(decls, dtype, np.random.default_rng(seed_of("left", name, n, dtype)))

    def body() -> None:
        for backend, fn in fns:
            for side in ("after", "before"):
                where = f"{name} n={n} {dtype} {backend} {side}"
                got, arrays = _call(fn, p, values, side)
                assert_matches(p.typed, values, got, where)
                for a in arrays.values():
                    assert _padding_untouched(a), f"{where}: a write between rows"

    run_isolated(body)


# rows ending in whole 256- and 128-bit vectors on AVX-512 (16k + 4, 8, 12 f32; 8k + 2, 4,
# 6 f64), and in a masked or scalar leftover (16 + 3 f32, 8 + 2 + 1 f64)
AVX512_CASES = [(name, dt, n) for name in PROGRAMS
                for dt, ns in (("f32", (4, 12, 20, 28, 19)), ("f64", (2, 6, 10, 11)))
                for n in ns]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
@pytest.mark.parametrize(("name", "dtype", "n"), AVX512_CASES)
def test_avx512_rows_end_in_narrow_vectors(tmp_path, name, dtype, n):
    """AVX-512's leftovers take its 256- and 128-bit vectors whole (12 f32 as 8 + 4): no
    masked move where the row is a multiple of four f32 or two f64 (unless the model
    chose one masked tail, ``OpSchedule.one_tail``), and the rows agree with NumPy
    against guard pages where this CPU runs AVX-512."""
    source, decls_of = PROGRAMS[name]
    decls = decls_of(n, dtype)
    p = plan(source, target="avx512", **decls)
    module = build_module(p.indexed, p.specs, p.schedule, AVX512, "pk")
    text = c_backend.render(module, AVX512)
    if n % (2 if dtype == "f64" else 4) == 0 and not any(s.one_tail for s in p.schedule):
        assert "mask_" not in text, text
        if n % 8 in (2, 4, 6):  # a 128-bit vector at the end of each row
            assert "_mm_storeu_" in text, text
    fn = _compiled(module, AVX512, tmp_path / "k")
    if not NATIVE["avx512"]:
        pytest.skip("compiled only: this CPU cannot run AVX-512")
    values = make_values(decls, dtype, np.random.default_rng(seed_of("left512", name, n)))

    def body() -> None:
        for side in ("after", "before"):
            got, arrays = _call(fn, p, values, side)
            assert_matches(p.typed, values, got, f"{name} n={n} {dtype} {side}")
            for a in arrays.values():
                assert _padding_untouched(a), f"{name} n={n}: a write between rows"

    run_isolated(body)


def _call(fn, p, values: dict, side: str) -> tuple[dict, dict]:
    """Call ``fn`` on guarded operands; (outputs, the guarded arrays)."""
    dtype = p.typed.dtype
    args, arrays, scalars = [], {}, {}
    for s in p.specs:
        if s.kind == "scalar":
            assert s.role == "in", "these programs have no scalar outputs"
            args.append(values[s.name])
            continue
        value = values.get(s.name, np.zeros((s.rows, s.cols)))
        arrays[s.name] = a = _guarded(s, value, dtype, side)
        args.append(a.__array_interface__["data"][0])
    fn(*args)
    got = {s.name: np.array(arrays[s.name]) for s in p.specs if s.role != "in"}
    return {**got, **scalars}, arrays


def test_padding_check_sees_a_write():
    a = guarded_array((2, 3), np.float64, ld_pad=2, fill=1.0, pad_fill=SENTINEL)
    assert _padding_untouched(a)
    a.base[3] = 0.0  # the first padding element, after row 0
    assert not _padding_untouched(a)


def test_model_charges_known_counts_as_plain_moves():
    """C = A*B with 6 x 6 f32: each row ends in a 2-element leftover; with plain moves the
    modelled cost is well below the masked stores' (12 cycles each)."""
    decls = dict(A=M(6, 6, "f32"), B=M(6, 6, "f32"), C=M(6, 6, "f32"))
    p = plan("C = A*B", target="avx2", **decls)
    module = build_module(p.indexed, p.specs, p.schedule, AVX2, "pk")
    assert _counted(module)
    cost = small.model_cost(module, 0, AVX2)
    assert cost < 6 * small.MASKED_STORE, cost


def test_tails_into_scratch_arrays_are_stored_as_plain_pieces():
    """With mask registers (AVX-512) a masked store is one fast instruction, but loads are
    not forwarded from it: a tail stored into scratch that the kernel reads back is
    stored as plain pieces (``Isa.plain_moves``). t0 = A0 + A1 (7 x 7 f32) written by
    rows of 4 + 3 of 4 lanes (the 3 as 2 + 1), then read element by element by C =
    t0'*B: no masked store into t0, and the model charges the pieces of its stores like
    those of any operand read back, plus the wait of reading a temporary back
    (``SCRATCH_ROUND_TRIP``)."""
    from dataclasses import replace

    from blacc.blacs import _typed
    from blacc.target.isa import AVX512
    from blacc.transform.blac import candidates
    from blacc.transform.index_notation import arg_specs, forms

    decls = dict(A0=M(7, 7, "f32"), A1=M(7, 7, "f32"), B=M(7, 7, "f32"), C=M(7, 7, "f32"))
    typed = _typed("C = (A0 + A1)'*B", decls)
    specs = arg_specs(typed)
    form = next(f for f in forms(typed) if len(f.ops) == 2)
    by_rows = next(s for s in candidates(form, form.ops[0], AVX512)
                   if s.vector == "j" and s.block == (1, 1))
    rest = small.options(form, specs, AVX512)[1][0][1]
    module = build_module(form, specs, (by_rows, rest), AVX512, "scratch")
    entry = module.function(module.entry)
    scratch = {s.buf for s in entry.body if isinstance(s, k.Local)}
    tails = [s for s in nodes_of(module, k.Store) if s.buf in scratch and s.count is not None]
    assert len(tails) == 7
    text = c_backend.render(module, AVX512)
    (t0,) = scratch
    assert not any(f"_mask_storeu_ps({a}" in text for a in (t0, f"&{t0}["))
    assert sum(f"_mm_store_ss(({a}" in line for line in text.splitlines()
               for a in (t0, f"&{t0}[")) == 7
    # the same code with t0 not known as scratch
    unknown = replace(entry, body=tuple(s for s in entry.body if not isinstance(s, k.Local)))
    plain = replace(module, functions=tuple(unknown if f is entry else f
                                            for f in module.functions))
    charged, cheap = small.model_cost(module, 0, AVX512), small.model_cost(plain, 0, AVX512)
    assert charged == pytest.approx(cheap + small.SCRATCH_ROUND_TRIP), (charged, cheap)
