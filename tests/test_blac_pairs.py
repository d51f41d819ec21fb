"""Two rows per vector (``OpSchedule.pairs``): outputs half a vector wide (4 f32 or 2 f64
columns on AVX2), or sums on lanes over half a vector (``y = A*x``, A n x 4 f32),
computed two rows per 256-bit register.

* the half-vector IR nodes (``Halves``, ``HalfSplat``, ``Half``) in the interpreter, the
  printer, the C backend and the LLVM backend, against each other;
* every pair candidate of the products with such outputs, odd row counts, reductions
  that are not multiples of the half width, leading dimensions and column-major
  operands, through the interpreter on buffers with no slack (a read or write one
  element outside an operand raises);
* the same kernels compiled (gcc, and the LLVM JIT) and called on operands that touch
  PROT_NONE guard pages, before and after, so any out-of-bounds access kills the child;
* the cost model picks pairs where they halve the FMAs.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import blacc
from blacc.backend import c as c_backend
from blacc.backend import jit
from blacc.backend import llvm as llvm_backend
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.ir import interp, printer
from blacc.ir import kernel as k
from blacc.ir.walk import nodes_of
from blacc.target.isa import AVX2, GENERIC
from blacc.target.machine import detect_machine
from blacc.transform.blac import OpSchedule, build_module, candidates
from guard import guarded_array, run_isolated
from test_blac_programs import (
    NP,
    assert_matches,
    make_values,
    run_interp,
    seed_of,
)

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
CC = shutil.which("cc")
HAS_AVX2 = detect_machine().has("avx2", "fma")
needs_native = pytest.mark.skipif(CC is None or not HAS_AVX2,
                                  reason="needs a C compiler and a CPU with AVX2 and FMA")
HALF = {"f32": 4, "f64": 2}


# ----------------------------------------------------------------------------- IR nodes


def _node_module(dtype: str) -> k.Module:
    """out[0:2h] = halves(x[0:h], x[h:2h]); out[2h:4h] = every half-splat lane of
    x[0:2h] summed with weights; out[4h:5h] = high half of dup(x[0:h]) + low half."""
    h, n = HALF[dtype], 2 * HALF[dtype]
    x = k.Load("x", k.Const(0), dtype, n)
    acc = k.Var("acc", dtype, n)
    body = [k.Store("out", k.Const(0), k.Halves(k.Load("x", k.Const(0), dtype, h),
                                                k.Load("x", k.Const(h), dtype, h))),
            k.Decl(acc, k.Broadcast(k.Const(0.0, dtype), n))]
    for lane in range(h):
        w = k.Broadcast(k.Const(float(lane + 1), dtype), n)
        body.append(k.Assign(acc, k.Fma(k.HalfSplat(x, lane), w, acc)))
    body.append(k.Store("out", k.Const(n), acc))
    dup = k.Var("dup", dtype, n)
    body.append(k.Decl(dup, k.Halves(k.Load("x", k.Const(1), dtype, h),
                                     k.Load("x", k.Const(1), dtype, h))))
    body.append(k.Store("out", k.Const(2 * n), k.Bin("+", k.Half(dup, 1), k.Half(dup, 0))))
    body.append(k.Store("out", k.Const(2 * n + h), k.Half(acc, 1)))
    params = (k.Param("x", dtype, pointer=True, const=True), k.Param("out", dtype, pointer=True))
    return k.Module((k.Function("f", params, tuple(body), exported=True),), "f")


def _node_expected(dtype: str, x: np.ndarray) -> np.ndarray:
    h = HALF[dtype]
    lo, hi = x[:h], x[h:2 * h]
    acc = np.concatenate([sum((lane + 1) * np.full(h, lo[lane]) for lane in range(h)),
                          sum((lane + 1) * np.full(h, hi[lane]) for lane in range(h))])
    return np.concatenate([x[:2 * h], acc, 2 * x[1:1 + h], acc[h:]]).astype(NP[dtype])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_half_nodes_in_the_interpreter_and_printer(dtype):
    module = _node_module(dtype)
    x = np.arange(1, 2 * HALF[dtype] + 2, dtype=NP[dtype]) / 3
    out = np.zeros(6 * HALF[dtype], NP[dtype])
    interp.run(module, {"x": x, "out": out})
    np.testing.assert_allclose(out, _node_expected(dtype, x), rtol=1e-6)
    text = printer.module(module)
    assert "halves" in text and "halfsplat(" in text and "half(dup" in text and "dup" in text


def test_half_nodes_check_their_shapes():
    x8 = k.Load("x", k.Const(0), "f32", 8)
    with pytest.raises(ValueError, match="lane 4"):
        k.HalfSplat(x8, 4)
    with pytest.raises(ValueError, match="even"):
        k.Half(k.Load("x", k.Const(0), "f32", 1), 0)
    with pytest.raises(ValueError, match="Halves"):
        k.Halves(x8, k.Load("x", k.Const(0), "f32", 4))
    assert k.Halves(k.Load("x", k.Const(0), "f32", 4), k.Load("x", k.Const(4), "f32", 4)).lanes \
        == 8


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_half_nodes_render_as_avx2_intrinsics(dtype):
    src = c_backend.render(_node_module(dtype), AVX2)
    s = "ps" if dtype == "f32" else "pd"
    assert f"_mm256_permute_{s}(" in src and f"_mm256_broadcast_{s}(" in src
    assert f"_mm256_extractf128_{s}(" in src and f"_mm256_cast{s}256_{s}128(" in src
    assert "_mm256_set_m128" in src
    with pytest.raises(ScheduleError):
        c_backend.render(_node_module(dtype), GENERIC)


@needs_native
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_half_nodes_compiled_by_c_and_llvm(tmp_path, dtype):
    module = _node_module(dtype)
    x = np.arange(1, 2 * HALF[dtype] + 2, dtype=NP[dtype]) / 3
    want = _node_expected(dtype, x)
    fns = [_c_function(tmp_path, module), _llvm_function(module)]
    text = llvm_backend.render(module, AVX2)
    assert "shufflevector" in text
    for fn in fns:
        out = np.zeros(6 * HALF[dtype], NP[dtype])
        fn(x.ctypes.data, out.ctypes.data)
        np.testing.assert_allclose(out, want, rtol=1e-6)


# ----------------------------------------------------------------------------- programs

#: name -> (source, declarations from (rows, k, dtype, ld padding)); the output is
#: ``rows`` x half-width (row-major: pairs of rows; column-major: pairs of columns).
PROGRAMS = {
    "matmul": ("C = A*B", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt), B=M(kk, h, dt), C=M(m, h, dt))),
    "matmul_ld": ("C = A*B", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt, ld=kk + pad), B=M(kk, h, dt, ld=h + pad), C=M(m, h, dt, ld=h + pad))),
    "gemm": ("C = alpha*A*B + beta*C", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt), B=M(kk, h, dt), C=M(m, h, dt), alpha=S(dt), beta=S(dt))),
    "gemm_ld": ("C = alpha*A*B + beta*C", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt, ld=kk + pad), B=M(kk, h, dt), C=M(m, h, dt, ld=h + pad),
        alpha=S(dt), beta=S(dt))),
    "sum_t_gemm": ("C = alpha*(A0 + A1)'*B + beta*C", lambda m, kk, h, dt, pad: dict(
        A0=M(kk, m, dt), A1=M(kk, m, dt), B=M(kk, h, dt), C=M(m, h, dt), alpha=S(dt),
        beta=S(dt))),
    "matmul_nt": ("C = A*B' - C", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt), B=M(h, kk, dt), C=M(m, h, dt))),
    "outer": ("C = x*y' + C", lambda m, kk, h, dt, pad: dict(
        x=V(m, dt), y=V(h, dt), C=M(m, h, dt))),
    "col_out": ("C = A'*B", lambda m, kk, h, dt, pad: dict(
        A=M(kk, h, dt), B=M(kk, m, dt), C=M(h, m, dt, layout="col", ld=h + pad))),
    "col_a": ("C = A*B + C", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt, layout="col", ld=m + pad), B=M(kk, h, dt), C=M(m, h, dt))),
    "chain": ("D = A*B*C", lambda m, kk, h, dt, pad: dict(
        A=M(m, kk, dt), B=M(kk, h, dt), C=M(h, h, dt), D=M(m, h, dt))),
    # rows of A half a vector long, summed on lanes: two rows per vector in the sums
    "matvec": ("y = A*x", lambda m, kk, h, dt, pad: dict(
        A=M(m, h, dt), x=V(h, dt), y=V(m, dt))),
    "gesummv_ld": ("y = alpha*A*x + beta*B*x - y", lambda m, kk, h, dt, pad: dict(
        A=M(m, h, dt, ld=h + pad), B=M(m, h, dt), x=V(h, dt), y=V(m, dt), alpha=S(dt),
        beta=S(dt))),
}


def _decls(name: str, m: int, kk: int, dtype: str, pad: int = 3) -> dict:
    return PROGRAMS[name][1](m, kk, HALF[dtype], dtype, pad)


def pair_schedules(p) -> list[tuple]:
    """Each operation's pair candidates in turn, the others at the planned schedule."""
    out = []
    for n, op in enumerate(p.indexed.ops):
        for sched in candidates(p.indexed, op, AVX2):
            if sched.pairs:
                out.append((*p.schedule[:n], sched, *p.schedule[n + 1:]))
    return out


INTERP_CASES = [(name, m, kk, dt) for name in PROGRAMS for dt in ("f32", "f64")
                for m, kk in ((2, 1), (3, 4), (5, 3), (7, 8), (1, 4), (13, 5), (4, 17), (6, 2),
                              (4, 3), (6, 5))]


@pytest.mark.parametrize(("name", "m", "kk", "dtype"), INTERP_CASES,
                         ids=[f"{n}-{d}-{m}x{kk}" for n, m, kk, d in INTERP_CASES])
def test_every_pair_schedule_in_the_interpreter(name, m, kk, dtype):
    decls = _decls(name, m, kk, dtype)
    p = plan(PROGRAMS[name][0], target="avx2", **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of(name, m, kk, dtype)))
    scheds = pair_schedules(p)
    if m == 1 and name not in ("col_out",):
        assert not scheds, "one row cannot be paired"
    built = 0
    for schedule in [p.schedule, *scheds]:
        try:
            module = build_module(p.indexed, p.specs, schedule, AVX2, "pairs")
        except ScheduleError:
            continue
        built += 1
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{name} {m}x{kk} {dtype} {schedule}")
    # B' has no unit stride along C's rows: nothing vectorizes them, paired or not; A'
    # (col_out) has none along its sum, where a one-row output is offered pairs
    unbuildable = name == "matmul_nt" or (name == "col_out" and m == 1)
    assert built >= 1 + (len(scheds) > 0 and not unbuildable)


def test_pairs_are_offered_only_for_half_width_outputs():
    for rows, cols, dtype, want in ((6, 4, "f32", True), (6, 2, "f64", True),
                                    (6, 8, "f32", False), (6, 3, "f32", False),
                                    (6, 4, "f64", False), (1, 4, "f32", False)):
        p = plan("C = A*B", target="avx2", A=M(rows, 5, dtype), B=M(5, cols, dtype),
                 C=M(rows, cols, dtype))
        got = any(s.pairs for s in candidates(p.indexed, p.indexed.ops[0], AVX2))
        assert got == want, (rows, cols, dtype)
        assert not any(s.pairs for s in candidates(p.indexed, p.indexed.ops[0], GENERIC))
    p = plan("C = A*B", target="avx2", A=M(6, 5), B=M(5, 8), C=M(6, 8))
    with pytest.raises(ScheduleError, match="two rows per vector"):
        build_module(p.indexed, p.specs, (OpSchedule("j", (2, 1), pairs=True),), AVX2, "x")


def test_pairs_on_sums_are_offered_only_for_half_width_rows():
    for rows, cols, dtype, want in ((6, 4, "f32", True), (6, 2, "f64", True),
                                    (6, 8, "f32", False), (6, 3, "f32", False),
                                    (6, 4, "f64", False), (1, 4, "f32", False)):
        p = plan("y = A*x", target="avx2", A=M(rows, cols, dtype), x=V(cols, dtype),
                 y=V(rows, dtype))
        op = p.indexed.ops[0]
        got = any(s.pairs for s in candidates(p.indexed, op, AVX2))
        assert got == want, (rows, cols, dtype)
        assert not any(s.pairs for s in candidates(p.indexed, op, GENERIC))
        if not want and rows > 1:
            vector = op.body.index  # the sum's index on lanes
            with pytest.raises(ScheduleError, match="two rows per vector"):
                build_module(p.indexed, p.specs, (OpSchedule(vector, (2, 1), pairs=True),),
                             AVX2, "x")


@pytest.mark.parametrize(("m", "kk", "dtype"), [(16, 4, "f32"), (4, 4, "f32"), (48, 4, "f32"),
                                                (4, 2, "f64"), (9, 4, "f32")])
def test_the_model_pairs_rows_of_narrow_products(m, kk, dtype):
    """C = A*B with 4 (f32) or 2 (f64) columns: two rows per FMA beat one row per 128-bit
    FMA, and a contiguous A gives one load per two rows and 4 elements."""
    h = HALF[dtype]
    p = plan("C = A*B", target="avx2", A=M(m, kk, dtype), B=M(kk, h, dtype), C=M(m, h, dtype))
    assert p.schedule[0].pairs, p.schedule
    src = p.source
    assert "_mm256_permute_p" in src and "_mm256_broadcast_p" in src


@pytest.mark.parametrize(("m", "dtype"), [(16, "f32"), (64, "f32"), (100, "f32"), (64, "f64")])
def test_the_model_pairs_rows_of_short_sums(m, dtype):
    """y = A*x with rows half a vector long: two rows per multiply, one 256-bit load of
    contiguous rows, and eight (f32) or four (f64) rows summed by one transpose."""
    h = HALF[dtype]
    p = plan("y = A*x", target="avx2", A=M(m, h, dtype), x=V(h, dtype), y=V(m, dtype))
    assert p.schedule[0].pairs and p.schedule[0].vector not in ("i", "j"), p.schedule
    assert AVX2.op("sum_halves", dtype).split("(")[0] in p.source


# ----------------------------------------------------------------------------- compiled

COMPILED_CASES = [
    ("matmul", 7, 4, "f32"), ("matmul", 5, 3, "f32"), ("matmul", 3, 2, "f64"),
    ("matmul", 4, 3, "f32"), ("matmul", 6, 3, "f64"), ("gemm", 6, 7, "f32"),
    ("matmul_ld", 5, 8, "f32"), ("matmul_ld", 7, 3, "f64"), ("gemm", 9, 4, "f32"),
    ("gemm_ld", 5, 5, "f32"), ("gemm_ld", 3, 2, "f64"), ("sum_t_gemm", 5, 4, "f32"),
    ("outer", 5, 1, "f32"), ("col_out", 7, 3, "f32"), ("col_out", 5, 2, "f64"),
    ("col_a", 5, 4, "f32"), ("chain", 7, 4, "f64"), ("matmul", 37, 4, "f32"),
    ("gemm", 23, 17, "f64"), ("matvec", 19, 0, "f32"), ("matvec", 9, 0, "f64"),
    ("gesummv_ld", 13, 0, "f32"), ("gesummv_ld", 6, 0, "f64"),
    ("sum_t_gemm", 7, 3, "f64"), ("col_a", 6, 5, "f64"),
]


def _c_function(tmp_path: Path, module: k.Module):
    src = tmp_path / f"{module.entry}_{abs(hash(module)) % 10**8}.c"
    src.write_text(c_backend.render(module, AVX2), encoding="utf-8")
    lib = src.with_suffix(".so")
    cmd = [CC, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-mavx2", "-mfma", "-fPIC",
           "-shared", str(src), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    fn = getattr(ctypes.CDLL(str(lib)), module.entry)
    fn.restype, fn.argtypes = ctypes.c_int, _argtypes(module)
    return fn


def _argtypes(module: k.Module) -> list:
    ctype = {"f32": ctypes.c_float, "f64": ctypes.c_double}
    return [ctypes.c_void_p if q.pointer else ctype[q.dtype]
            for q in module.function(module.entry).params]


def _llvm_function(module: k.Module, isa=AVX2):
    lib = jit.JitLibrary(jit.emit_object(llvm_backend.render(module, isa)))
    fn = ctypes.CFUNCTYPE(ctypes.c_int, *_argtypes(module))(lib.address(module.entry))
    fn._lib = lib  # keep the code alive as long as the function
    return fn


def _guarded(s, value, dtype: str, side: str) -> np.ndarray:
    """Operand ``s`` against a guard page, laid out as its spec says."""
    order = "C" if s.layout == "row" else "F"
    natural = s.cols if s.layout == "row" else s.rows
    return guarded_array((s.rows, s.cols), NP[dtype], order, side=side,
                         ld_pad=s.leading_dimension - natural,
                         fill=np.asarray(value).reshape(s.rows, s.cols), pad_fill=-7777.0)


def _call_guarded(fn, p, values: dict, side: str) -> dict:
    dtype = p.typed.dtype
    args, arrays = [], {}
    for s in p.specs:
        if s.kind == "scalar":
            if s.role == "in":
                args.append(values[s.name])
            else:
                arrays[s.name] = np.array([values.get(s.name, 0.0)], NP[dtype])
                args.append(arrays[s.name].ctypes.data)
            continue
        value = values.get(s.name, np.zeros((s.rows, s.cols)))
        arrays[s.name] = a = _guarded(s, value, dtype, side)
        args.append(a.__array_interface__["data"][0])
    fn(*args)
    return {s.name: (float(arrays[s.name][0]) if s.kind == "scalar" else
                     np.array(arrays[s.name]))
            for s in p.specs if s.role != "in"}


@needs_native
@pytest.mark.parametrize(("name", "m", "kk", "dtype"), COMPILED_CASES,
                         ids=[f"{n}-{d}-{m}x{kk}" for n, m, kk, d in COMPILED_CASES])
def test_pair_kernels_compiled_against_guard_pages(tmp_path, name, m, kk, dtype):
    """The planned schedule and the pair schedules with the smallest and largest blocks,
    compiled by gcc and by the LLVM JIT, on operands that touch guard pages."""
    decls = _decls(name, m, kk, dtype)
    p = plan(PROGRAMS[name][0], target="avx2", **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("g", name, m, kk, dtype)))
    modules = {}
    for schedule in pair_schedules(p):
        try:
            modules[schedule] = build_module(p.indexed, p.specs, schedule, AVX2, "pk")
        except ScheduleError:
            continue
    assert modules
    first, last = list(modules)[0], list(modules)[-1]
    modules = {p.schedule: build_module(p.indexed, p.specs, p.schedule, AVX2, "pk"),
               first: modules[first], last: modules[last]}
    fns = []
    for schedule, module in modules.items():
        fns.append((schedule, "c", _c_function(tmp_path, module)))
        if not (any(isinstance(x, k.Local) for x in module.function("pk").body)
                or nodes_of(module, (k.Reduce, k.SumLanes, k.SumRows))):
            # (the LLVM backend, used for GEMM, has no stack temporaries, which chained
            # products use, and no horizontal sums)
            fns.append((schedule, "llvm", _llvm_function(module)))

    check_guarded(fns, p, values, f"{name} {m}x{kk} {dtype}")


def candidate_modules(p, isa, wanted) -> list[tuple[tuple[OpSchedule, ...], k.Module | None]]:
    """For each candidate schedule that ``wanted`` accepts, of each operation of plan
    ``p`` (the other operations as planned): the whole schedule and its module, None
    where it does not build."""
    out: list[tuple[tuple[OpSchedule, ...], k.Module | None]] = []
    for i, op in enumerate(p.indexed.ops):
        for sched in candidates(p.indexed, op, isa):
            if not wanted(sched):
                continue
            schedule = (*p.schedule[:i], sched, *p.schedule[i + 1:])
            try:
                module = build_module(p.indexed, p.specs, schedule, isa, "cand")
            except ScheduleError:
                module = None
            out.append((schedule, module))
    return out


def interpret_candidates(p, isa, wanted, values: dict, context: str) -> int:
    """Run each candidate that ``wanted`` accepts and that builds (``candidate_modules``)
    through the interpreter on buffers with no slack, against NumPy; how many built."""
    built = 0
    for schedule, module in candidate_modules(p, isa, wanted):
        if module is None:
            continue
        built += 1
        got = run_interp(module, p.specs, p.typed, values, slack=0)
        assert_matches(p.typed, values, got, f"{context} {schedule}")
    return built


def check_guarded(fns: list, p, values: dict, context: str) -> None:
    """Call each (schedule, backend, function) of ``fns`` on operands against a guard page
    after them and before them, in a child process, and check the results."""

    def body() -> None:
        for schedule, backend, fn in fns:
            for side in ("after", "before"):
                got = _call_guarded(fn, p, values, side)
                assert_matches(p.typed, values, got,
                               f"{context} {backend} {side} {schedule}")

    run_isolated(body)


@needs_native
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_compiled_kernel_with_pairs(dtype):
    """blacc.compile end to end on a planned pair schedule (odd rows, beta*C)."""
    h = HALF[dtype]
    decls = dict(A=M(11, 4, dtype), B=M(4, h, dtype), C=M(11, h, dtype), alpha=S(dtype),
                 beta=S(dtype))
    source = "C = alpha*A*B + beta*C"
    assert plan(source, target="avx2", **decls).schedule[0].pairs
    kern = blacc.compile(source, target="avx2", **decls)
    rng = np.random.default_rng(5)
    a, b, c = (rng.uniform(-1, 1, s).astype(NP[dtype]) for s in ((11, 4), (4, h), (11, h)))
    want = 1.5 * a.astype(np.float64) @ b - 0.5 * c
    got = kern(A=a, B=b, C=c.copy(), alpha=1.5, beta=-0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
