"""The LGen example programs, end to end, against the frontend's float64 reference.

Three ways of running a program, from most to least expensive:

* ``blacc.compile`` -> a native kernel called with NumPy arrays (gcc per case, so only a
  selected set of sizes, both dtypes);
* ``plan(...).module`` run by the kernel IR interpreter (``ir.interp``): the very IR the C
  backend renders, no compiler, so many more sizes;
* every candidate schedule (``transform.blac.candidates`` + ``build_module``) of a few small
  cases through the interpreter: every vectorization choice, register block and leftover
  path (narrow vectors, masked vectors, scalar code).

Results are compared with ``frontend.evaluate`` elementwise, within
``c * L * eps * |reference magnitude|`` where the magnitude is the program evaluated on the
absolute values of its operands and L grows with the reduction lengths.
"""

from __future__ import annotations

import itertools
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

import blacc
from blacc.blacs import _typed, plan
from blacc.errors import ScheduleError
from blacc.frontend import evaluate
from blacc.frontend.typed import TAdd, TMul, TNeg, TNum, TRef, TSub, TTranspose, walk
from blacc.ir import interp
from blacc.target.isa import AVX2, GENERIC
from blacc.transform.blac import build_module, candidates
from blacc.transform.index_notation import arg_specs

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
NP = {"f32": np.float32, "f64": np.float64}

# ----------------------------------------------------------------------------- programs
# name -> (source, declarations from the dims m, n, k, p and the dtype)
PROGRAMS = {
    "matvec": ("y = A*x",
               lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(n, dt), y=V(m, dt))),
    "matmul": ("C = A*B",
               lambda m, n, k, p, dt: dict(A=M(m, k, dt), B=M(k, n, dt), C=M(m, n, dt))),
    "axpy": ("y = alpha*x + y",
             lambda m, n, k, p, dt: dict(x=V(n, dt), y=V(n, dt), alpha=S(dt))),
    "gemv": ("y = alpha*A*x + beta*y",
             lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(n, dt), y=V(m, dt),
                                         alpha=S(dt), beta=S(dt))),
    "gemm": ("C = alpha*A*B + beta*C",
             lambda m, n, k, p, dt: dict(A=M(m, k, dt), B=M(k, n, dt), C=M(m, n, dt),
                                         alpha=S(dt), beta=S(dt))),
    "gemv2": ("y = alpha*A*x + beta*B*x",
              lambda m, n, k, p, dt: dict(A=M(m, n, dt), B=M(m, n, dt), x=V(n, dt),
                                          y=V(m, dt), alpha=S(dt), beta=S(dt))),
    "bilinear": ("alpha = x'*A*y",
                 lambda m, n, k, p, dt: dict(x=V(m, dt), A=M(m, n, dt), y=V(n, dt),
                                             alpha=S(dt))),
    "sum_t_gemm": ("C = alpha*(A0 + A1)'*B + beta*C",
                   lambda m, n, k, p, dt: dict(A0=M(k, m, dt), A1=M(k, m, dt), B=M(k, n, dt),
                                               C=M(m, n, dt), alpha=S(dt), beta=S(dt))),
    "fused_dot": ("beta = (A*x + alpha*y)'*z + beta",
                  lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(n, dt), y=V(m, dt),
                                              z=V(m, dt), alpha=S(dt), beta=S(dt))),
    "chain": ("D = A*B*C",
              lambda m, n, k, p, dt: dict(A=M(m, k, dt), B=M(k, n, dt), C=M(n, p, dt),
                                          D=M(m, p, dt))),
    "two_statements": ("t = A*x; y = B*t + y",
                       lambda m, n, k, p, dt: dict(A=M(k, n, dt), x=V(n, dt), t=V(k, dt),
                                                   B=M(m, k, dt), y=V(m, dt))),
    "three_statements": ("u = A'*x\nv = alpha*u - z\ns = v'*v + s",
                         lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(m, dt), u=V(n, dt),
                                                     z=V(n, dt), v=V(n, dt), alpha=S(dt),
                                                     s=S(dt))),
    "matvec_t": ("y = A'*x + y",
                 lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(m, dt), y=V(n, dt))),
    "matmul_nt": ("C = A*B' - C",
                  lambda m, n, k, p, dt: dict(A=M(m, k, dt), B=M(n, k, dt), C=M(m, n, dt))),
    "outer": ("C = x*y' + C",
              lambda m, n, k, p, dt: dict(x=V(m, dt), y=V(n, dt), C=M(m, n, dt))),
    "literals": ("y = -2*A*x + 0.5*y - x2",
                 lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(n, dt), x2=V(m, dt),
                                             y=V(m, dt))),
    "vecmat": ("r = (x'*A)'",
               lambda m, n, k, p, dt: dict(x=V(m, dt), A=M(m, n, dt), r=V(n, dt))),
    "rewrite": ("y = alpha*A*x + y; y = A*x - y",
                lambda m, n, k, p, dt: dict(A=M(m, n, dt), x=V(n, dt), y=V(m, dt),
                                            alpha=S(dt))),
    "padded_out": ("C = A'*B",
                   lambda m, n, k, p, dt: dict(A=M(k, m, dt), B=M(k, n, dt),
                                               C=M(m, n, dt, layout="col",
                                                   ld=padded(m, n, 3)))),
    "col_major": ("C = A*B + C",
                  lambda m, n, k, p, dt: dict(A=M(m, k, dt, layout="col"),
                                              B=M(k, n, dt, layout="col", ld=padded(k, n, 3)),
                                              C=M(m, n, dt, ld=padded(m, n, 2)))),
}


def padded(rows: int, cols: int, extra: int) -> int | None:
    """A leading dimension with ``extra`` padding, for true matrices only: a one-row or
    one-column Matrix with ld > natural is mishandled (see test_degenerate_matrix_ld_*)."""
    if rows == 1 or cols == 1:
        return None
    return max(rows, cols) + extra


#: Sizes the brief asks for: small, primes, and around the AVX2 widths 4 (f64) and 8 (f32).
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 13, 15, 16, 17, 31, 37, 40)


def decls_of(name: str, dims: tuple[int, int, int, int], dtype: str) -> dict:
    return PROGRAMS[name][1](*dims, dtype)


def seed_of(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


# ----------------------------------------------------------------------------- reference


def make_values(decls: dict, dtype: str, rng: np.random.Generator) -> dict:
    """Random operand values exactly representable in ``dtype`` (Vectors 1-D, Matrices
    2-D, Scalars Python floats)."""
    values = {}
    for name, d in decls.items():
        if d.kind == "scalar":
            values[name] = float(NP[dtype](rng.uniform(-2, 2)))
        elif d.kind == "vector":
            values[name] = rng.uniform(-1, 1, d.n).astype(NP[dtype])
        else:
            values[name] = rng.uniform(-1, 1, d.shape).astype(NP[dtype])
    return values


def _magnitude(e, env: dict) -> np.ndarray:
    """|e| evaluated with every operand, literal and sign replaced by its absolute value."""
    if isinstance(e, TNum):
        return np.full((1, 1), abs(e.value))
    if isinstance(e, TRef):
        return env[e.name]
    if isinstance(e, TNeg):
        return _magnitude(e.x, env)
    if isinstance(e, TTranspose):
        return _magnitude(e.x, env).T
    a, b = _magnitude(e.a, env), _magnitude(e.b, env)
    if isinstance(e, (TAdd, TSub)):
        return a + b
    assert isinstance(e, TMul)
    if e.op == "scale":
        return a[0, 0] * b if e.a.shape == (1, 1) else a * b[0, 0]
    return a @ b


def tolerances(typed, values: dict) -> dict:
    """Per output, an elementwise error bound for a computation in ``typed.dtype``:
    c * L * eps * magnitude + tiny, L = all reduction lengths plus all operations."""
    env = {n: np.abs(np.asarray(values[n], np.float64)).reshape(typed.decls[n].shape)
           for n in typed.inputs}
    length = 2
    for st in typed.statements:
        env[st.target] = _magnitude(st.expr, env)
        for node in walk(st.expr):
            length += 1
            if isinstance(node, TMul) and node.op != "scale":
                length += node.a.cols
    finfo = np.finfo(NP[typed.dtype])
    return {n: 4 * length * float(finfo.eps) * env[n].reshape(-1) + 1e3 * float(finfo.tiny)
            for n in typed.outputs}


def assert_matches(typed, values: dict, got: dict, context: str = "") -> None:
    """``got`` (output name -> array or float) against evaluate(typed, values)."""
    expected = evaluate(typed, values)
    tol = tolerances(typed, values)
    assert set(got) == set(typed.outputs), (sorted(got), typed.outputs)
    for name in typed.outputs:
        g = np.asarray(got[name], np.float64).reshape(-1)
        e = np.asarray(expected[name], np.float64).reshape(-1)
        assert g.shape == e.shape, f"{name}: shape {g.shape}, expected {e.shape} [{context}]"
        err = np.abs(g - e)
        bad = ~(err <= tol[name])  # NaN counts as bad
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(
                f"{name}: {int(bad.sum())} of {bad.size} elements off [{context}]; first at "
                f"flat index {i}: got {g[i]!r}, expected {e[i]!r}, |error| {err[i]:.3e} > "
                f"tolerance {tol[name][i]:.3e}")


# ----------------------------------------------------------------------------- interpreter

SENTINEL = -7777.0  # fills padding and the slack after each buffer


def interp_buffers(specs, values: dict, dtype: str, slack: int = 3) -> dict:
    """Kernel IR arguments: each array as a 1-D buffer laid out as its spec says (padding
    and ``slack`` trailing elements hold SENTINEL), input scalars as Python floats,
    written scalars as one-element arrays."""
    args = {}
    for s in specs:
        v = values.get(s.name)
        if s.kind == "scalar":
            if s.role == "in":
                args[s.name] = v
            else:
                args[s.name] = np.array([SENTINEL if v is None else v], NP[dtype])
            continue
        buf = np.full(s.extent + slack, SENTINEL, NP[dtype])
        if v is not None:
            a = np.asarray(v).reshape(s.rows, s.cols)
            for r, c in itertools.product(range(s.rows), range(s.cols)):
                buf[flat_index(s, r, c)] = a[r, c]
        args[s.name] = buf
    return args


def flat_index(s, r: int, c: int) -> int:
    ld = s.leading_dimension
    return r * ld + c if s.layout == "row" else c * ld + r


def read_buffer(s, buf: np.ndarray) -> np.ndarray:
    return np.array([[buf[flat_index(s, r, c)] for c in range(s.cols)]
                     for r in range(s.rows)])


def check_untouched(s, buf: np.ndarray) -> None:
    """Every element of ``buf`` that is not one of s's elements still holds SENTINEL."""
    mask = np.ones(buf.shape, bool)
    for r, c in itertools.product(range(s.rows), range(s.cols)):
        mask[flat_index(s, r, c)] = False
    assert (buf[mask] == SENTINEL).all(), f"{s.name}: padding or slack was written"


def run_interp(module, specs, typed, values: dict, slack: int = 3) -> dict:
    """Run ``module`` through the interpreter; the outputs by name. ``slack``: sentinel
    elements after each array (0: buffers end at the operands' last elements)."""
    dtype = typed.dtype
    args = interp_buffers(specs, values, dtype, slack=slack)
    before = {n: a.copy() for n, a in args.items() if isinstance(a, np.ndarray)}
    interp.run(module, args)
    got = {}
    for s in specs:
        buf = args[s.name]
        if s.kind == "scalar":
            if s.role != "in":
                got[s.name] = float(buf[0])
            continue
        check_untouched(s, buf)
        if s.role == "in":
            assert np.array_equal(buf, before[s.name]), f"input {s.name} was written"
        else:
            got[s.name] = read_buffer(s, buf)
    return got


def check_plan(name: str, dims, dtype: str, target: str = "avx2") -> None:
    decls = decls_of(name, dims, dtype)
    p = plan(PROGRAMS[name][0], target=target, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of(name, dims, dtype)))
    got = run_interp(p.module, p.specs, p.typed, values)
    assert_matches(p.typed, values, got, f"{name} dims={dims} {dtype} {target} {p.schedule}")


# ----------------------------------------------------------------------------- size choices


def interp_dims(count: int, seed: int) -> list[tuple[int, int, int, int]]:
    """``count`` dims (m, n, k, p): one dimension walks through SIZES (from a start that
    depends on ``seed``, so that over all programs every size appears), the other three are
    small random sizes; the interpreter and the planner are slow on many large ones."""
    rng = np.random.default_rng(seed)
    start = int(rng.integers(len(SIZES)))
    out = []
    for i in range(count):
        big = SIZES[(start + i) % len(SIZES)]
        small = [int(x) for x in rng.choice([1, 2, 3, 4, 5, 7, 8, 9], size=3)]
        dims = [big, *small]
        rng.shuffle(dims)
        out.append(tuple(dims))
    return out


#: Programs with a matrix-matrix product: planning them models many candidates.
HEAVY = ("chain", "gemm", "sum_t_gemm", "matmul", "matmul_nt", "col_major", "padded_out")


def _interp_cases() -> list:
    cases = []
    for name in PROGRAMS:
        for dtype in ("f32", "f64"):
            count = 4 if name in HEAVY else 7
            for dims in interp_dims(count, seed_of(name, dtype)):
                cases.append(pytest.param(name, dims, dtype, id=f"{name}-{dtype}-{dims}"))
    return cases


@pytest.mark.parametrize(("name", "dims", "dtype"), _interp_cases())
def test_interpreted_plan_matches_reference(name, dims, dtype):
    check_plan(name, dims, dtype)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17])
def test_interpreted_square_sizes_around_vector_widths(n, dtype):
    """Every dimension equal: the full-vector, narrow-vector and masked leftovers at once."""
    for name in ("matvec", "bilinear", "fused_dot", "matvec_t", "gemv2"):
        check_plan(name, (n, n, n, n), dtype)
    if n <= 9:
        check_plan("gemm", (n, n, n, n), dtype)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", ["gemv", "gemm", "fused_dot", "two_statements", "chain",
                                  "col_major", "outer"])
def test_interpreted_generic_target(name, dtype):
    """The plain C target (no vectors) plans scalar code; it must compute the same."""
    for dims in ((1, 1, 1, 1), (5, 3, 7, 2), (9, 6, 4, 3)):
        check_plan(name, dims, dtype, target="generic")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_interpreted_large_sizes(dtype):
    for name, dims in (("gemv", (40, 37, 1, 1)), ("matmul", (31, 40, 17, 1)),
                       ("bilinear", (37, 40, 1, 1)), ("axpy", (1, 40, 1, 1)),
                       ("two_statements", (31, 40, 37, 1))):
        check_plan(name, dims, dtype)


# ----------------------------------------------------------------------------- all schedules

SCHEDULE_CASES = [
    ("gemm", (3, 5, 7, 1), "f64"),
    ("gemm", (9, 6, 5, 1), "f32"),
    ("gemv", (5, 9, 1, 1), "f64"),
    ("gemv", (7, 13, 1, 1), "f32"),
    ("matvec_t", (6, 3, 1, 1), "f64"),
    ("bilinear", (6, 11, 1, 1), "f64"),
    ("fused_dot", (5, 3, 1, 1), "f32"),
    ("sum_t_gemm", (5, 3, 4, 1), "f64"),
    ("outer", (3, 10, 1, 1), "f32"),
    ("axpy", (1, 7, 1, 1), "f64"),
    ("axpy", (1, 13, 1, 1), "f32"),
    ("col_major", (5, 3, 6, 1), "f64"),
    ("vecmat", (6, 5, 1, 1), "f64"),
    ("chain", (3, 5, 2, 6), "f64"),
    ("two_statements", (3, 6, 5, 1), "f32"),
]


@pytest.mark.parametrize("isa", [AVX2, GENERIC], ids=["avx2", "generic"])
@pytest.mark.parametrize(("name", "dims", "dtype"), SCHEDULE_CASES,
                         ids=[f"{n}-{d}-{t}" for n, d, t in SCHEDULE_CASES])
def test_every_candidate_schedule(name, dims, dtype, isa):
    """Each operation under each of its candidates (others at the planned schedule): every
    candidate that builds computes the reference; at least one per index builds where the
    index has unit stride somewhere, and the scalar schedule always builds."""
    decls = decls_of(name, dims, dtype)
    p = plan(PROGRAMS[name][0], target=isa, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of(name, dims, dtype)))
    for n, op in enumerate(p.indexed.ops):
        built = set()
        for sched in candidates(p.indexed, op):
            schedule = (*p.schedule[:n], sched, *p.schedule[n + 1:])
            try:
                module = build_module(p.indexed, p.specs, schedule, isa, "cand")
            except ScheduleError:
                continue
            built.add(sched.vector)
            got = run_interp(module, p.specs, p.typed, values)
            assert_matches(p.typed, values, got, f"{name} {dims} {dtype} {isa.name} {schedule}")
        assert None in built, f"op {op.out}: the scalar schedule did not build"
        if isa is AVX2 and name != "col_major":  # col_major: no index has unit stride
            assert len(built) > 1, f"op {op.out}: no vectorized schedule built"


def test_schedules_reach_masked_and_narrow_leftovers():
    """The candidate sweep above is only useful if leftovers occur: check which vector
    widths and masked accesses the candidates of y = A*x produce per extent."""
    from blacc.ir import kernel as k
    from blacc.ir.walk import rewrite

    def kinds(module) -> set[str]:
        found = set()

        def visit(node):
            if isinstance(node, (k.Load, k.Store)):
                lanes = node.lanes if isinstance(node, k.Load) else node.value.lanes
                if node.count is not None:
                    found.add("masked")
                elif lanes > 1:
                    found.add(f"w{lanes}")
            return node

        rewrite(module.function(module.entry).body, visit)
        return found

    # f32 on AVX2: 8 lanes, then 4, then a masked 4 for 2 or 3 left (1 left is scalar);
    # f64: 4 lanes, then 2, then a scalar: never masked
    expected = {("f32", 7): {"w4", "masked"}, ("f32", 15): {"w8", "w4", "masked"},
                ("f32", 6): {"w4", "masked"}, ("f32", 13): {"w8", "w4"},
                ("f64", 7): {"w4", "w2"}, ("f64", 3): {"w2"}}
    for (dtype, n), kinds_wanted in expected.items():
        decls = dict(A=M(n, n, dtype), x=V(n, dtype), y=V(n, dtype))
        p = plan("y = A*x", target="avx2", **decls)
        seen = set()
        for sched in candidates(p.indexed, p.indexed.ops[0]):
            try:
                seen |= kinds(build_module(p.indexed, p.specs, (sched,), AVX2, "cand"))
            except ScheduleError:
                continue
        assert kinds_wanted <= seen, (dtype, n, seen)


# ----------------------------------------------------------------------------- compiled


def _compile_cases() -> list:
    """~76 compiled cases: every program in both dtypes at two sizes, plus extra sizes for
    the core programs, covering all of SIZES."""
    rng = np.random.default_rng(20240611)
    plan_ = {
        "matvec": [(1, 1, 1, 1), (8, 9, 1, 1), (17, 40, 1, 1)],
        "matmul": [(2, 3, 5, 1), (16, 15, 4, 1), (7, 31, 9, 1)],
        "axpy": [(1, 1, 1, 1), (1, 17, 1, 1), (1, 37, 1, 1)],
        "gemv": [(3, 4, 1, 1), (13, 7, 1, 1), (40, 9, 1, 1)],
        "gemm": [(1, 1, 1, 1), (5, 8, 9, 1), (9, 17, 3, 1)],
        "gemv2": [(4, 5, 1, 1), (15, 16, 1, 1)],
        "bilinear": [(2, 7, 1, 1), (16, 9, 1, 1)],
        "sum_t_gemm": [(3, 4, 5, 1), (8, 7, 2, 1)],
        "fused_dot": [(7, 5, 1, 1), (37, 3, 1, 1)],
        "chain": [(2, 3, 4, 5), (9, 4, 8, 7)],
        "two_statements": [(4, 3, 5, 1), (17, 13, 8, 1)],
        "three_statements": [(5, 9, 1, 1)],
        "matvec_t": [(9, 7, 1, 1)],
        "matmul_nt": [(5, 9, 4, 1)],
        "outer": [(7, 9, 1, 1)],
        "literals": [(3, 5, 1, 1)],
        "vecmat": [(4, 13, 1, 1)],
        "col_major": [(5, 3, 4, 1)],
        "padded_out": [(6, 5, 3, 1)],
    }
    cases = []
    for name, dims_list in plan_.items():
        for i, dims in enumerate(dims_list):
            for dtype in ("f32", "f64"):
                # the third size of the core programs in one dtype only, chosen at random
                if i == 2 and dtype != ("f32", "f64")[int(rng.integers(2))]:
                    continue
                cases.append(pytest.param(name, dims, dtype, id=f"{name}-{dtype}-{dims}"))
    return cases


COMPILE_CASES = _compile_cases()


def layout_array(s, dtype: str, value=None) -> np.ndarray:
    """A (rows, cols) array laid out as spec ``s`` says: a view into a SENTINEL-filled
    buffer with s's leading dimension (1-D for vectors), holding ``value`` if given."""
    dt, ld = NP[dtype], s.leading_dimension
    if s.layout == "row":
        a = np.full((s.rows, max(ld, s.cols)), SENTINEL, dt)[:, :s.cols]
    else:
        a = np.full((max(ld, s.rows), s.cols), SENTINEL, dt, order="F")[:s.rows, :]
    if value is not None:
        a[...] = np.asarray(value).reshape(s.rows, s.cols)
    if (s.rows == 1) != (s.cols == 1):
        a = a.reshape(-1)
    return a


def unplanned(source: str, decls: dict) -> SimpleNamespace:
    """What ``call_args``, ``run_emitted`` and ``assert_matches`` read of a plan (its
    ``typed`` program and argument ``specs``), type-checked only: for kernels the spine
    computes, which the small path's planner never sees."""
    typed = _typed(source, decls)
    return SimpleNamespace(typed=typed, specs=arg_specs(typed))


def call_args(p, values: dict, *, pass_outputs: bool) -> tuple[dict, dict]:
    """(keyword arguments for the kernel, the arrays it may write); arrays in the layout
    their specs want (padded views for ld > natural)."""
    kwargs, outs = {}, {}
    for s in p.specs:
        if s.kind == "scalar":
            if s.role != "out":
                kwargs[s.name] = values[s.name]
        elif s.role == "out":
            if pass_outputs:
                kwargs[s.name] = outs[s.name] = layout_array(s, p.typed.dtype)
        else:
            kwargs[s.name] = layout_array(s, p.typed.dtype, values[s.name])
            if s.role == "inout":
                outs[s.name] = kwargs[s.name]
    return kwargs, outs


@pytest.mark.parametrize(("name", "dims", "dtype"), COMPILE_CASES)
def test_compiled_program_matches_reference(name, dims, dtype):
    decls = decls_of(name, dims, dtype)
    source = PROGRAMS[name][0]
    kernel = blacc.compile(source, **decls)
    p = plan(source, **decls)
    values = make_values(decls, dtype, np.random.default_rng(seed_of("c", name, dims, dtype)))
    # pass every output explicitly for half the cases, let the kernel allocate the others
    pass_outputs = seed_of(name, dims, dtype) % 2 == 0 or name == "padded_out"
    kwargs, outs = call_args(p, values, pass_outputs=pass_outputs)
    inputs = {n: a.copy() for n, a in kwargs.items()
              if isinstance(a, np.ndarray) and n not in outs}
    result = kernel(**kwargs)
    written = [s for s in p.specs if s.role != "in"]
    if len(written) == 1:
        result = {written[0].name: result}
    assert isinstance(result, dict) and list(result) == [s.name for s in written]
    got = {}
    for s in written:
        value = result[s.name]
        if s.kind == "scalar":
            assert isinstance(value, float), (s.name, type(value))
        else:
            assert isinstance(value, np.ndarray) and value.dtype == NP[dtype]
            if s.name in outs:
                assert value is outs[s.name], f"{s.name}: not written in place"
            else:  # allocated: a declared Vector 1-D, as NumPy holds vectors
                shape = (s.rows,) if s.vector else (s.rows, s.cols)
                assert value.shape == shape, (s.name, value.shape)
            if s.name in outs and s.layout == "row" and s.rows > 1 and s.cols > 1 \
                    and s.ld != s.cols:
                assert (value.base[:, s.cols:] == SENTINEL).all(), "row padding written"
            if s.name in outs and s.layout == "col" and s.rows > 1 and s.cols > 1 \
                    and s.ld != s.rows:
                assert (value.base[s.rows:, :] == SENTINEL).all(), "column padding written"
        got[s.name] = value
    for n, a in inputs.items():
        assert np.array_equal(a, kwargs[n], equal_nan=True), f"input {n} was written"
    assert_matches(p.typed, values, got, f"{name} dims={dims} {dtype} {p.schedule}")


def test_compile_case_budget():
    """Keep the number of C compilations in this file reasonable (and all sizes covered)."""
    assert 60 <= len(COMPILE_CASES) <= 100, len(COMPILE_CASES)
    used = {d for case in COMPILE_CASES for d in case.values[1]}
    used |= {d for case in _interp_cases() for d in case.values[1]}
    assert set(SIZES) <= used, set(SIZES) - used


def test_compiled_kernel_fast_path_and_repeat_calls():
    """The positional ``fast`` entry point: same result as by-name, idempotent on re-call
    for outputs that are not read (y = A*x), accumulates for in/out (y = A*x + y)."""
    decls = dict(A=M(5, 9, "f32"), x=V(9, "f32"), y=V(5, "f32"))
    k1 = blacc.compile("y = A*x", **decls)
    k2 = blacc.compile("y = A*x + y", **decls)
    rng = np.random.default_rng(1)
    A = rng.uniform(-1, 1, (5, 9)).astype(np.float32)
    x = rng.uniform(-1, 1, 9).astype(np.float32)
    y = np.zeros(5, np.float32)
    assert k1.fast(A, x, y) is None
    first = y.copy()
    k1.fast(A, x, y)
    np.testing.assert_array_equal(y, first)
    np.testing.assert_allclose(first, A.astype(np.float64) @ x, rtol=1e-5, atol=1e-6)
    y2 = np.zeros(5, np.float32)
    for _ in range(3):
        k2(A=A, x=x, y=y2)
    np.testing.assert_allclose(y2, 3 * (A.astype(np.float64) @ x), rtol=1e-5, atol=1e-5)


def test_compiled_scalar_outputs_several():
    """Two scalar outputs and a vector output: the by-name call returns a dict in spec
    order; fast returns a tuple of the scalars."""
    dt = "f64"
    decls = dict(x=V(6, dt), A=M(6, 4, dt), y=V(4, dt), a=S(dt), b=S(dt), u=V(4, dt))
    src = "a = x'*A*y; u = A'*x; b = u'*y + b"
    kernel = blacc.compile(src, **decls)
    p = plan(src, **decls)
    values = make_values(decls, dt, np.random.default_rng(5))
    result = kernel(x=values["x"], A=values["A"], y=values["y"], b=values["b"])
    assert set(result) == {"a", "b", "u"}
    assert_matches(p.typed, values, result, src)



@pytest.mark.parametrize(("src", "roles"), [
    ("y = A*x; y = 2*y", {"y": "out"}),  # y is assigned before it is read
    ("y = 2*y; y = A*x + y", {"y": "inout"}),
    ("s = x'*x; s = s*s; y = s*y", {"y": "inout", "s": "out"}),
    ("y = A*x + y; s = y'*y + s", {"y": "inout", "s": "inout"}),
])
def test_outputs_read_only_after_assignment_are_outputs(src, roles):
    """An output is 'inout' only when its values on entry are read; a statement reading
    its own target after an earlier one assigned it reads the new values. Such an output
    can be left out of the call (the kernel allocates it)."""
    decls = {k: v for k, v in dict(A=M(5, 3, "f64"), x=V(3, "f64"), y=V(5, "f64"),
                                   s=S("f64")).items() if k in src}
    p = plan(src, **decls)
    assert {s.name: s.role for s in p.specs if s.name in roles} == roles
    values = make_values(decls, "f64", np.random.default_rng(11))
    kwargs, _ = call_args(p, values, pass_outputs=False)
    result = blacc.compile(src, **decls)(**kwargs)
    written = [s.name for s in p.specs if s.role != "in"]
    got = result if len(written) > 1 else {written[0]: result}
    assert_matches(p.typed, values, got, src)


def test_an_allocated_vector_output_is_1d():
    """y left out of the call is allocated as NumPy holds a vector: (5,) for a declared
    Vector, (5, 1) for a Matrix(5, 1); the kernel's repr shows the same."""
    A, x = np.arange(45.0).reshape(5, 9), np.ones(9)
    as_vector = blacc.compile("y = A*x", A=M(5, 9), x=V(9), y=V(5))
    as_matrix = blacc.compile("y = A*x", A=M(5, 9), x=V(9), y=M(5, 1))
    y, y2 = as_vector(A=A, x=x), as_matrix(A=A, x=x)
    assert y.shape == (5,) and y2.shape == (5, 1)
    np.testing.assert_array_equal(y, A @ x)
    np.testing.assert_array_equal(y2[:, 0], A @ x)
    assert "x: in f64[9], y: out f64[5])" in repr(as_vector)
    assert "y: out f64[5x1])" in repr(as_matrix)


# ------------------------------------------------------- one-row/one-column matrices with ld

def test_degenerate_matrix_ld_output_column():
    """y = A*x with y = Matrix(4, 1, ld=3): the wrapper demands a view with row stride 3
    (one column of a 4x3 buffer) and the kernel writes 4 contiguous elements instead,
    clobbering the buffer's other columns."""
    decls = dict(A=M(4, 3), x=V(3), y=M(4, 1, ld=3))
    kernel = blacc.compile("y = A*x", **decls)
    A, x = np.arange(12.0).reshape(4, 3), np.ones(3)
    buf = np.full((4, 3), SENTINEL)
    kernel(A=A, x=x, y=buf[:, :1])
    assert (buf[:, 1:] == SENTINEL).all(), buf
    np.testing.assert_allclose(buf[:, 0], A @ x)


def test_degenerate_matrix_ld_input_row():
    """y = A*x with A = Matrix(1, 3, layout='col', ld=2): A's elements are 2 apart (the
    wrapper accepts exactly that) but the kernel reads 3 contiguous elements."""
    decls = dict(A=M(1, 3, layout="col", ld=2), x=V(3), y=V(1))
    kernel = blacc.compile("y = A*x", **decls)
    buf = np.full((2, 3), SENTINEL, order="F")
    buf[0] = [1.0, 2.0, 3.0]
    got = kernel(A=buf[:1, :], x=np.ones(3))
    np.testing.assert_allclose(np.ravel(got), [6.0])


def test_degenerate_matrix_ld_interpreted():
    """The same disagreement in the kernel IR: the module addresses the operand as a
    contiguous vector while its ArgSpec (extent, ld) says strided."""
    decls = dict(A=M(4, 3), x=V(3), y=M(4, 1, ld=3))
    p = plan("y = A*x", target="generic", **decls)
    values = make_values(decls, "f64", np.random.default_rng(0))
    got = run_interp(p.module, p.specs, p.typed, values)
    assert_matches(p.typed, values, got)


def test_sibling_sums_share_an_index_and_are_all_vectorized():
    """alpha*A*x + beta*B*x: both reductions are named k1 (nested ones k2, ...), so the
    chosen schedule puts every one of them on the vector lanes, none stays scalar."""
    from blacc.ir import indexed as ix

    decls = dict(A=M(4, 32, "f32"), B=M(4, 32, "f32"), x=V(32, "f32"), y=V(4, "f32"),
                 alpha=S("f32"), beta=S("f32"))
    p = plan("y = alpha*A*x + beta*B*x", target="avx2", **decls)
    sums = [n for n in _nodes(p.indexed.ops[0].body) if isinstance(n, ix.Sum)]
    assert [s.index for s in sums] == ["k1", "k1"]
    assert p.schedule[0].vector == "k1"
    assert "A[" not in p.source.replace("_mm256_loadu_ps(&A[", "")  # no scalar A loads
    nested = plan("s = x'*(A'*(A*x))", A=M(5, 7, "f64"), x=V(7, "f64"), s=S("f64"))
    names = {n.index for op in nested.indexed.ops for n in _nodes(op.body)
             if isinstance(n, ix.Sum)}
    assert names <= {"k1", "k2", "k3"}


def _nodes(n):
    from blacc.ir import indexed as ix

    yield n
    for c in ix.children(n):
        yield from _nodes(c)


def test_a_temporary_too_large_for_the_stack_is_allocated():
    """(A*B + x*y') is a temporary of 96 x 96 doubles, 72 KiB, past ``blac.STACK_BYTES``:
    the kernel allocates it (at 1100 x 1100 on the stack, 9.7 MB, it overflowed Linux's
    8 MiB and crashed) and computes the program (the small path's: no GEMM, with the
    product of vectors)."""
    n = 96
    kernel = blacc.compile("D = (A*B + x*y')*E", x=V(n), y=V(n),
                           **{name: M(n, n) for name in "ABDE"})
    assert "blacc_alloc(" in kernel.source and "blacc_gemm_" not in kernel.source
    rng = np.random.default_rng(3)
    A, B, E = (rng.uniform(-1, 1, (n, n)) for _ in range(3))
    x, y = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    np.testing.assert_allclose(kernel(A=A, B=B, x=x, y=y, E=E), (A @ B + np.outer(x, y)) @ E,
                               rtol=1e-12, atol=1e-10)
