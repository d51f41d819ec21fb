"""Apply a schedule to a contraction: structured operation -> kernel IR loop nest.

The result is a ``Module`` with an exported entry function (loops over tiles,
packing, a call per register tile) and a micro-kernel function made of tile
operations (``TileZero``, ``TileMMA``, ``TileStore``). Lowering passes then turn
tile operations into vector code for a target.

Entry ABI: ``name(<extents>, alpha, <X>, <X>_s0, <X>_s1 for each operand, beta)`` in
the order extents, alpha, inputs, beta, output; ``<X>_s0/_s1`` are the element
strides of the operand's two axes. Extents must be >= 1 (the runtime handles 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ScheduleError
from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..ir.structured import Contraction
from ..ir.walk import names_used, rewrite, simplify, substitute
from .lower_tile import CACHE_LINE
from .schedule import NarrowEdges, Pack, Prefetch, Schedule, Tile, UnrollJam, Vectorize


@dataclass(frozen=True)
class _Roles:
    """Which dimension plays which part in a matmul-shaped contraction."""

    i: str  # rows of the output, carried by the left input
    j: str  # columns of the output, carried by the right input
    k: str  # the reduction
    left: str
    right: str
    out: str


def _roles(op: Contraction) -> _Roles:
    if len(op.inputs) != 2 or len(op.reduction_dims) != 1 or len(op.output.dims) != 2:
        raise ScheduleError(f"{op.name}: the GEMM schedules need two 2-D inputs, one reduction "
                            "and a 2-D output")
    (kd,) = op.reduction_dims
    i, j = op.output.dims
    left = next((a for a in op.inputs if set(a.dims) == {i, kd}), None)
    right = next((a for a in op.inputs if set(a.dims) == {kd, j}), None)
    if left is None or right is None or left is right:
        raise ScheduleError(f"{op.name} is not matmul-shaped: need inputs indexed by "
                            f"({i},{kd}) and ({kd},{j})")
    return _Roles(i, j, kd, left.operand, right.operand, op.output.operand)


def _stride(op: Contraction, operand: str, dim: str) -> k.Var:
    axis = op.access(operand).dims.index(dim)
    return k.Var(f"{operand}_s{axis}")


def _extent(op: Contraction, dim: str) -> k.Expr:
    ext = op.dim(dim).extent
    return k.Const(ext) if isinstance(ext, int) else k.Var(ext)


@dataclass
class _Plan:
    loops: list[tuple[str, int]]
    packs: dict[str, tuple[int, int]]  # operand -> (loop depth, sliver)
    unroll: int
    lanes: int
    prefetch: dict[str, int]  # operand -> distance
    vector_dim: str = "j"  # the dimension on the lanes: the output's columns, or k
    balanced: set[int] = field(default_factory=set)  # depths of loops with equal tiles
    narrow_edges: bool = False


def _read_schedule(op: Contraction, r: _Roles, schedule: Schedule) -> _Plan:
    plan = _Plan(loops=[], packs={}, unroll=1, lanes=1, prefetch={})
    dims = {d.name for d in op.domain}
    for t in schedule:
        if isinstance(t, Tile):
            for dim, size in t.sizes:
                if dim not in dims:
                    raise ScheduleError(f"Tile: {op.name} has no dimension {dim!r}")
                outer = [s for d, s in plan.loops if d == dim]
                if outer and size > outer[-1]:
                    raise ScheduleError(f"Tile: {dim}={size} is larger than the enclosing "
                                        f"tile {dim}={outer[-1]}")
                plan.loops.append((dim, size))
                if t.balanced:
                    plan.balanced.add(len(plan.loops) - 1)
        elif isinstance(t, Pack):
            if t.operand not in (r.left, r.right):
                raise ScheduleError(f"Pack: {t.operand!r} is not an input of {op.name}")
            if t.operand in plan.packs:
                raise ScheduleError(f"Pack: {t.operand!r} is packed twice")
            plan.packs[t.operand] = (len(plan.loops), t.sliver)
        elif isinstance(t, UnrollJam):
            if t.dim != r.k:
                raise ScheduleError(f"UnrollJam: only the reduction {r.k!r} is unrolled and "
                                    f"jammed, not {t.dim!r}")
            plan.unroll = t.factor
        elif isinstance(t, Vectorize):
            if t.dim not in (r.j, r.k):
                raise ScheduleError(f"Vectorize: only {r.j!r}, the output's unit-stride "
                                    f"dimension, or the reduction {r.k!r} maps onto lanes, "
                                    f"not {t.dim!r}")
            plan.lanes = t.lanes
            plan.vector_dim = "k" if t.dim == r.k else "j"
        elif isinstance(t, Prefetch):
            if t.operand not in (r.left, r.right):
                raise ScheduleError(f"Prefetch: {t.operand!r} is not an input of {op.name}")
            plan.prefetch[t.operand] = t.distance
        elif isinstance(t, NarrowEdges):
            if t.dim != r.j:
                raise ScheduleError(f"NarrowEdges: only {r.j!r}, the output's vectorized "
                                    f"columns, has edge tiles of whole vectors, not {t.dim!r}")
            plan.narrow_edges = True
        else:
            raise ScheduleError(f"unknown transformation {t!r}")
    return plan


def _check(plan: _Plan, r: _Roles) -> tuple[int, int]:
    """The register tile (mr, nr); raises ScheduleError when the plan cannot be built."""
    if len(plan.loops) < 2 or {d for d, _ in plan.loops[-2:]} != {r.i, r.j}:
        raise ScheduleError(f"the innermost Tile must tile {r.i!r} and {r.j!r}: it is the "
                            "register tile")
    if {len(plan.loops) - 2, len(plan.loops) - 1} & plan.balanced:
        raise ScheduleError("the register tile has a fixed size: it cannot be balanced")
    reg = dict(plan.loops[-2:])
    mr, nr = reg[r.i], reg[r.j]
    k_depths = [n for n, (d, _) in enumerate(plan.loops) if d == r.k]
    if len(k_depths) > 1:
        raise ScheduleError(f"Tile: the reduction {r.k!r} may be tiled once (the kc block)")
    for operand, (depth, sliver) in plan.packs.items():
        want = mr if operand == r.left else nr
        if sliver != want:
            raise ScheduleError(f"Pack({operand!r}, {sliver}): the sliver must equal the "
                                f"register tile's {want}")
        if depth > len(plan.loops) - 2:
            raise ScheduleError(f"Pack({operand!r}) must come before the register tile")
        if k_depths and k_depths[0] >= depth:
            raise ScheduleError(f"Pack({operand!r}) must come after Tile of {r.k!r}")
    for operand in plan.prefetch:
        if operand not in plan.packs:
            raise ScheduleError(f"Prefetch({operand!r}) needs the operand packed: only a "
                                "packed panel is contiguous")
    if plan.vector_dim == "j" and nr % plan.lanes:
        raise ScheduleError(f"Vectorize: {plan.lanes} lanes do not divide the register "
                            f"tile's {r.j}={nr}")
    if plan.narrow_edges and (plan.vector_dim != "j" or plan.lanes == 1):
        raise ScheduleError(f"NarrowEdges({r.j!r}) needs {r.j!r} vectorized: its edge tiles "
                            "are whole vectors")
    if plan.vector_dim == "k" and (plan.packs or plan.prefetch or k_depths):
        raise ScheduleError(f"Vectorize({r.k!r}): a tile of dot products reads its operands "
                            f"in place along the whole reduction: no Pack, Prefetch or Tile "
                            f"of {r.k!r}")
    return mr, nr


def _ceil_div(x: k.Expr, m: int) -> k.Expr:
    return k.Bin("/", x + (m - 1), k.Const(m))


def _round_up(x: k.Expr, m: int) -> k.Expr:
    return _ceil_div(x, m) * m


def _smaller(a: k.Expr, b: k.Expr) -> k.Expr:
    """min(a, b), folded where both are known."""
    if isinstance(a, k.Const) and isinstance(b, k.Const):
        return k.Const(min(a.value, b.value))
    return k.minimum(a, b)


def apply(op: Contraction, schedule: Schedule, *, name: str = "kernel",
          known_strides: dict[str, int] | None = None) -> k.Module:
    """Build the loop nest of ``schedule`` for the matmul-shaped ``op``.

    ``known_strides`` fixes stride parameters at compile time (e.g. ``{"C_s1": 1}``
    for an output with unit column stride), which vectorization may require."""
    r = _roles(op)
    plan = _read_schedule(op, r, schedule)
    mr, nr = _check(plan, r)
    # NarrowEdges: register tiles of 1, 2, ... vectors for the last column tile
    edge_widths = range(plan.lanes, nr, plan.lanes) if plan.narrow_edges else ()
    dt = op.dtype
    extent = {d.name: _extent(op, d.name) for d in op.domain}
    whole = dict(extent)  # extent changes to a tile's length inside each tiled loop
    # The loop variables whose sum is the current tile's start, per dimension.
    terms: dict[str, list[tuple[int, k.Var]]] = {d.name: [] for d in op.domain}

    def base(dim: str, since: int = 0) -> k.Expr:
        total: k.Expr = k.Const(0)
        for depth, var in terms[dim]:
            if depth >= since:
                total = total + var
        return total

    static_bound: dict[str, int | None] = {
        d.name: d.extent if isinstance(d.extent, int) else None for d in op.domain}

    allocs: list[k.Stmt] = []
    frees: list[k.Stmt] = []
    packed: dict[str, tuple[str, int, k.Expr]] = {}  # operand -> (buffer, depth, kb)
    reg_depth = len(plan.loops)
    beta = k.Var("beta", dt)

    def body_at(depth: int) -> tuple[k.Stmt, ...]:
        stmts: list[k.Stmt] = []
        for operand, (pdepth, sliver) in plan.packs.items():
            if pdepth == depth:
                stmts.append(_pack(operand, sliver, depth))
        if depth == reg_depth:
            stmts.append(_micro_call())
            return tuple(stmts)
        dim, size = plan.loops[depth]
        var = k.Var(f"{dim}{depth}")
        length = k.Var(f"{dim}{depth}_len")
        saved = (extent[dim], static_bound[dim])
        outer_extent = extent[dim]
        terms[dim].append((depth, var))
        extent[dim], static_bound[dim] = length, size
        inner = body_at(depth + 1)
        extent[dim], static_bound[dim] = saved
        terms[dim].pop()
        if depth not in plan.balanced:
            stmts.append(k.For(var, k.Const(0), outer_extent, size,
                               (k.Decl(length, k.minimum(size, outer_extent - var)), *inner)))
            return tuple(stmts)
        # Equal tiles: count = ceil(extent / size), step = ceil(extent / count) <= size,
        # rounded up to whole tiles of the next loop over the same dimension (a panel of
        # B split into whole slivers) but never past size, which the buffers are sized for.
        count, step, index = (k.Var(f"{dim}{depth}_{s}") for s in ("count", "step", "i"))
        even = k.Bin("/", outer_extent + (count - 1), k.maximum(count, 1))
        grain = next((s for d, s in plan.loops[depth + 1:] if d == dim), 1)
        stmts += [k.Decl(count, _ceil_div(outer_extent, size)),
                  k.Decl(step, even if grain == 1 else k.minimum(_round_up(even, grain), size)),
                  k.For(index, k.Const(0), count, 1,
                        (k.Decl(var, index * step),
                         k.Decl(length, k.minimum(step, outer_extent - var)), *inner))]
        return tuple(stmts)

    def _pack(operand: str, sliver: int, depth: int) -> k.Stmt:
        row_dim = r.i if operand == r.left else r.j
        buf = f"{operand}p"
        # a block's size where the dimension is blocked, but never more than the whole
        # extent (a 100 x 100 GEMM packed into buffers for 256 x 6144 took 12 MB)
        rows_size = _round_up(whole[row_dim], sliver)
        if (rows_bound := static_bound[row_dim]) is not None:
            rows_size = _smaller(k.Const(-(-rows_bound // sliver) * sliver), rows_size)
        cols_size = whole[r.k]
        if (k_bound := static_bound[r.k]) is not None:
            cols_size = _smaller(k.Const(k_bound), cols_size)
        allocs.append(k.Alloc(buf, dt, rows_size * cols_size))
        frees.append(k.Free(buf))
        rs, cs = _stride(op, operand, row_dim), _stride(op, operand, r.k)
        src = k.Operand2D(operand, base(row_dim) * rs + base(r.k) * cs, rs, cs)
        packed[operand] = (buf, depth, extent[r.k])
        return k.PackSlivers(buf, src, extent[row_dim], extent[r.k], sliver, dt)

    def _operand(operand: str, row_dim: str, sliver: int) -> tuple[k.Expr, k.Expr, k.Expr]:
        """(pointer, row stride, column stride) of the micro-kernel's view of an input;
        rows run along ``row_dim``, columns along the reduction."""
        if operand in packed:
            buf, depth, kb = packed[operand]
            return k.Ref(buf, base(row_dim, since=depth) * kb), k.Const(1), k.Const(sliver)
        rs, cs = _stride(op, operand, row_dim), _stride(op, operand, r.k)
        return k.Ref(operand, base(row_dim) * rs + base(r.k) * cs), rs, cs

    def _micro_call() -> k.Stmt:
        a, a_rs, a_cs = _operand(r.left, r.i, mr)
        b, b_cs, b_rs = _operand(r.right, r.j, nr)  # b is indexed (k, j): swap the strides
        c_rs, c_cs = _stride(op, r.out, r.i), _stride(op, r.out, r.j)
        c = k.Ref(r.out, base(r.i) * c_rs + base(r.j) * c_cs)
        k_tiled = any(d == r.k for d, _ in plan.loops)
        beta_now = (k.Select(k.Bin("==", base(r.k), k.Const(0)), beta, k.Const(1.0, dt))
                    if k_tiled else beta)
        cols = extent[r.j]
        args = (extent[r.k], a, a_rs, a_cs, b, b_rs, b_cs, c, c_rs, c_cs,
                extent[r.i], cols, k.Var("alpha", dt), beta_now)
        call: k.Stmt = k.Call(f"{name}_micro", args)
        for width in reversed(edge_widths):  # the narrowest test outermost
            call = k.If(k.Bin("<=", cols, k.Const(width)),
                        (k.Call(f"{name}_micro{width}", args),), (call,))
        return call

    loops = body_at(0)
    roles = {r.left: "a", r.right: "b"}
    prefetch = tuple(sorted((roles[o], d) for o, d in plan.prefetch.items()))
    micros = [_micro_kernel(f"{name}_micro{'' if width == nr else width}", dt, mr, width,
                            plan.unroll, plan.lanes, padded=len(plan.packs) == 2,
                            prefetch=prefetch, along=plan.vector_dim)
              for width in (*edge_widths, nr)]
    body = (*allocs, *loops, *frees)
    if known_strides:
        body = simplify(substitute(body, {s: k.Const(v) for s, v in known_strides.items()}))
    entry = k.Function(name, _entry_params(op), body, exported=True)
    module = k.Module((*(_specialize_calls(m, entry) for m in micros), entry), entry=name)
    return _inline_constant_args(module)


def _entry_params(op: Contraction) -> tuple[k.Param, ...]:
    dt = op.dtype
    params = [k.Param(str(d.extent), "i64") for d in op.domain if isinstance(d.extent, str)]
    params.append(k.Param("alpha", dt))
    for acc, const in [(a, True) for a in op.inputs] + [(None, False)]:
        if acc is None:
            params.append(k.Param("beta", dt))
            acc = op.output
        params.append(k.Param(acc.operand, dt, pointer=True, const=const))
        params += [k.Param(f"{acc.operand}_s{axis}", "i64") for axis in range(len(acc.dims))]
    return tuple(params)


def _micro_kernel(name: str, dt: str, mr: int, nr: int, unroll: int, lanes: int,
                  padded: bool, prefetch: tuple[tuple[str, int], ...], along: str = "j"
                  ) -> k.Function:
    """C[0:rows, 0:cols] = alpha * A[0:mr, 0:kc] @ B[0:kc, 0:nr] + beta * C, as tile ops."""
    i64 = "i64"
    params = (k.Param("kc", i64), k.Param("a", dt, True, True), k.Param("a_rs", i64),
              k.Param("a_cs", i64), k.Param("b", dt, True, True), k.Param("b_rs", i64),
              k.Param("b_cs", i64), k.Param("c", dt, True), k.Param("c_rs", i64),
              k.Param("c_cs", i64), k.Param("rows", i64), k.Param("cols", i64),
              k.Param("alpha", dt), k.Param("beta", dt))
    v = {p.name: p.var for p in params}
    tile = k.Tile("acc", dt, mr, nr, lanes, along)
    a = k.Operand2D("a", k.Const(0), v["a_rs"], v["a_cs"])
    b = k.Operand2D("b", k.Const(0), v["b_rs"], v["b_cs"])
    c = k.Operand2D("c", k.Const(0), v["c_rs"], v["c_cs"])
    # Bring every cache line of the C tile toward L1 while the k loop runs (rows and
    # columns clamped to the tile's valid part: a prefetch past the array would be
    # harmless, but stays inside). A row of the tile may start anywhere in a line, so
    # its last element is fetched as well as one element per line's width.
    per_line = max(1, CACHE_LINE // itemsize(dt))
    cols = dict.fromkeys([k.Const(0), *(k.minimum(col, v["cols"] - 1)
                                        for col in (*range(per_line, nr, per_line), nr - 1))])
    warm_c = tuple(k.Prefetch("c", c.at(k.minimum(r, v["rows"] - 1), col), write=True)
                   for r in range(mr) for col in cols)
    body = (k.TileZero(tile),
            *warm_c,
            k.TileMMA(tile, a, b, v["kc"], v["rows"], v["cols"], padded, unroll, prefetch),
            k.TileStore(tile, c, v["rows"], v["cols"], k.Var("alpha", dt), k.Var("beta", dt)))
    return k.Function(name, params, body)


def _specialize_calls(func: k.Function, caller: k.Function) -> k.Function:
    """Fold arguments that are the same constant at every call site into the callee."""
    calls = [s for s in _walk_stmts(caller.body) if isinstance(s, k.Call) and s.func == func.name]
    fixed = {}
    for n, p in enumerate(func.params):
        values = {c.args[n] for c in calls}
        if len(values) == 1 and isinstance(next(iter(values)), k.Const):
            fixed[p.name] = next(iter(values))
    body = simplify(substitute(func.body, fixed))
    return replace(func, body=body)


def _inline_constant_args(module: k.Module) -> k.Module:
    """Drop parameters whose value was folded into the callee from signature and calls."""
    keep: dict[str, list[int]] = {}
    for f in module.functions:
        used = names_used(f.body)
        keep[f.name] = [n for n, p in enumerate(f.params) if p.name in used or f.exported]

    def fix_calls(body: tuple[k.Stmt, ...]) -> tuple[k.Stmt, ...]:
        def visit(x: object) -> object:
            if isinstance(x, k.Call) and x.func in keep:
                return k.Call(x.func, tuple(x.args[n] for n in keep[x.func]))
            return x

        return rewrite(body, visit)

    new = []
    for f in module.functions:
        params = tuple(f.params[n] for n in keep[f.name])
        new.append(replace(f, params=params, body=fix_calls(f.body)))
    return k.Module(tuple(new), module.entry, module.attributes)


def _walk_stmts(body: tuple[k.Stmt, ...]):
    for s in body:
        yield s
        for child in (getattr(s, "body", ()), getattr(s, "then", ()), getattr(s, "orelse", ())):
            yield from _walk_stmts(child)
