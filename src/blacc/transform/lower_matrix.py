"""Register tiles as LLVM matrix intrinsics (seed 000's micro kernel), and their generic
expansion for backends without them.

``lower_tiles_to_matrix_intrinsic(module, isa, kr)`` rewrites each register tile
(``TileZero`` ... ``TileMMA`` ... ``TileStore``) of a row-major C. A row-major ``mr x nr`` tile
is a column-major ``nr x mr`` matrix, so the tile is C^T = B^T A^T: with B's rows and A's
columns at unit stride, a k block of B is a column-major ``nr x kr`` matrix (stride b_rs)
and one of A a column-major ``kr x mr`` matrix (stride a_rs)::

    acc[6x16] = 0                        if rows == 6 and cols == 16 and 4 <= a_rs and ...:
    tile_mma(acc += a x b, k=kc)   ->      macc: f32x96 = bcast96(0.0)
    tile_store(c <- alpha*acc + ...)       for pm in range(0, kc - kc % 4, 4):
                                             macc = macc + mmul16x4x6(mload16x4(b[pm*b_rs]),
                                                                      mload4x6(a[pm]))
                                           for pm in range(kc - kc % 4, kc): ... (16x1x6)
                                           mstore16x6(c[0], stride=c_rs <- alpha*macc [+ beta*C])
                                         else:
                                           <the tile operations, for lower_tiles>

Edge tiles, and strides the intrinsics do not allow (a column stride below the column
height, e.g. negative leading dimensions), keep the tile operations: ``lower_tiles``
turns them into blacc's outer products (``UnrollJam`` and ``Prefetch`` apply to those
only; ``kr`` is the intrinsic path's unrolling). With a constant k the k steps are
unrolled: the seed's "Intrinsic" strategy, where the whole product is a few calls.

``expand_matrix(module, isa)`` is the generic lowering: each matrix value is split into
chunks of its columns (ISA vectors, then scalars), a multiply becomes broadcast FMAs::

    macc = macc + mmul16x4x6(mload16x4(b[i]), mload4x6(a[j]))
      ->  mt1_0 = load8(b[i]); mt1_8 = load8(b[i + 8]); mt1_16 = load8(b[i + b_rs]); ...
          macc_0 = fma(mt1_0, bcast8(a[j]), macc_0); macc_0 = ... (4 FMAs per chunk)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import TypeVar

from ..errors import ScheduleError
from ..ir import kernel as k
from ..ir.printer import expr as show
from ..target.isa import Isa

_S = TypeVar("_S", bound=k.Stmt)

#: A constant k loop of at most this many kr steps is unrolled into straight-line calls.
MAX_UNROLLED_STEPS = 32


# ----------------------------------------------------------------------------- tiles -> matrix


def lower_tiles_to_matrix_intrinsic(module: k.Module, isa: Isa, kr: int = 1) -> k.Module:
    """Register tiles as ``MatrixLoad``/``MatrixMultiply``/``MatrixStore`` with inner block
    ``kr``; edge tiles keep their tile operations (lower them with ``lower_tiles`` next).
    ``isa`` is unused (the matrices are target-independent); passes take one."""
    if not isinstance(kr, int) or isinstance(kr, bool) or kr < 1:
        raise ScheduleError(f"matrix intrinsic: kr must be a positive integer, got {kr!r}")
    funcs = tuple(replace(f, body=_tiles_body(f.body, kr)) for f in module.functions)
    return k.Module(funcs, module.entry, module.attributes)


def _tiles_body(body: tuple[k.Stmt, ...], kr: int) -> tuple[k.Stmt, ...]:
    """Find ``TileZero(t)`` ... ``TileMMA(t)`` ... ``TileStore(t)`` in one statement list
    (other statements in between, e.g. prefetches of C, move before the tile)."""
    out: list[k.Stmt] = []
    rest = list(body)
    while rest:
        s = rest.pop(0)
        if isinstance(s, k.For):
            out.append(replace(s, body=_tiles_body(s.body, kr)))
        elif isinstance(s, k.If):
            out.append(k.If(s.cond, _tiles_body(s.then, kr), _tiles_body(s.orelse, kr)))
        elif isinstance(s, k.TileZero):
            mma = _take(rest, k.TileMMA, s.tile, out)
            store = _take(rest, k.TileStore, s.tile, out)
            out += _tile(s, mma, store, kr)
        elif isinstance(s, (k.TileMMA, k.TileStore)):
            raise ScheduleError(f"matrix intrinsic: {type(s).__name__} of tile {s.tile.name!r} "
                                "without a TileZero before it")
        else:
            out.append(s)
    return tuple(out)


def _take(rest: list[k.Stmt], kind: type[_S], tile: k.Tile, before: list[k.Stmt]) -> _S:
    """Remove the next ``kind`` statement of ``tile`` from ``rest``; plain statements in
    front of it go to ``before``."""
    while rest:
        s = rest.pop(0)
        if isinstance(s, kind) and s.tile == tile:
            return s
        if isinstance(s, (k.TileZero, k.TileMMA, k.TileStore, k.For, k.If)):
            break
        before.append(s)
    raise ScheduleError(f"matrix intrinsic: tile {tile.name!r} needs TileZero, TileMMA and "
                        "TileStore in one statement list")


@dataclass(frozen=True)
class _Shape:
    """A register tile as matrices: C^T (nr x mr) = B^T (nr x k) @ A^T (k x mr)."""

    mr: int
    nr: int
    dtype: str


def _unit(stride: k.Expr, what: str) -> None:
    if stride != k.Const(1):
        raise ScheduleError(
            f"matrix intrinsic: {what} must have unit stride (got {show(stride)}); the "
            "intrinsic path needs a row-major C, B with unit column stride and an unpacked A "
            "with unit stride along k (fix A_s1, B_s1, C_s1 = 1 in known_strides)")


def _tile(zero: k.TileZero, mma: k.TileMMA, store: k.TileStore, kr: int) -> list[k.Stmt]:
    t = zero.tile
    _unit(mma.a.cs, f"operand {mma.a.buf!r} along k (a.cs)")
    _unit(mma.b.cs, f"operand {mma.b.buf!r} along its columns (b.cs)")
    _unit(store.c.cs, f"output {store.c.buf!r} along its columns (c.cs)")
    shape = _Shape(t.rows, t.cols, t.dtype)
    first_rows = kr if not isinstance(mma.k, k.Const) else min(kr, int(mma.k.value))
    # Full tile, and column strides at least the column heights (LLVM's precondition).
    conds = [(mma.rows, k.Const(t.rows), "=="), (mma.cols, k.Const(t.cols), "=="),
             (k.Const(first_rows), mma.a.rs, "<="), (k.Const(t.cols), mma.b.rs, "<="),
             (k.Const(t.cols), store.c.rs, "<=")]
    fast = [*_k_steps(mma, shape, kr), *_store(store, shape)]
    dynamic = []
    for a, b, op in conds:
        if isinstance(a, k.Const) and isinstance(b, k.Const):
            ok = a.value == b.value if op == "==" else a.value <= b.value
            if not ok:  # never full: outer products only
                return [zero, mma, store]
        else:
            dynamic.append(k.Bin(op, a, b))
    if not dynamic:
        return fast
    cond = dynamic[0]
    for c in dynamic[1:]:
        cond = k.Bin("and", cond, c)
    return [k.If(cond, tuple(fast), (zero, mma, store))]


def _splat(x: k.Expr, lanes: int) -> k.Expr:
    return k.Broadcast(x, lanes) if lanes > 1 else x


def _acc(shape: _Shape) -> k.Var:
    return k.Var("macc", shape.dtype, shape.mr * shape.nr)


def _update(mma: k.TileMMA, shape: _Shape, p: k.Expr, inner: int,
            first: bool = False) -> k.Stmt:
    """macc += B^T[:, p:p+inner] @ A^T[p:p+inner, :] (``first``: macc = ...)."""
    b = k.MatrixLoad(mma.b.buf, mma.b.at(p, 0), mma.b.rs, shape.nr, inner, shape.dtype)
    a = k.MatrixLoad(mma.a.buf, mma.a.at(0, p), mma.a.rs, inner, shape.mr, shape.dtype)
    acc, product = _acc(shape), k.MatrixMultiply(b, a, shape.nr, inner, shape.mr)
    return k.Decl(acc, product) if first else k.Assign(acc, k.Bin("+", acc, product))


def _k_steps(mma: k.TileMMA, shape: _Shape, kr: int) -> list[k.Stmt]:
    kc = mma.k
    if isinstance(kc, k.Const) and int(kc.value) // kr <= MAX_UNROLLED_STEPS:
        steps, rem = divmod(int(kc.value), kr)
        blocks = [(q * kr, kr) for q in range(steps)] + ([(steps * kr, rem)] if rem else [])
        return [_update(mma, shape, k.Const(p), inner, first=n == 0)
                for n, (p, inner) in enumerate(blocks)]
    zero = k.Decl(_acc(shape), _splat(k.Const(0.0, shape.dtype), shape.mr * shape.nr))
    p, main = k.Var("pm"), k.Var("kmain_m")
    return [zero,
            k.Decl(main, kc - k.Bin("%", kc, k.Const(kr))),
            k.For(p, k.Const(0), main, kr, (_update(mma, shape, p, kr),)),
            k.For(p, main, kc, 1, (_update(mma, shape, p, 1),))]


def _store(s: k.TileStore, shape: _Shape) -> list[k.Stmt]:
    """C^T = alpha * macc (+ beta * C^T), never reading C when beta == 0."""
    lanes, dt = shape.mr * shape.nr, shape.dtype
    index, stride = s.c.at(0, 0), s.c.rs
    scaled = k.Bin("*", _splat(s.alpha, lanes), _acc(shape))
    old = k.MatrixLoad(s.c.buf, index, stride, shape.nr, shape.mr, dt)
    with_c = k.Fma(_splat(s.beta, lanes), old, scaled)
    return [k.If(k.Bin("==", s.beta, k.Const(0.0, dt)),
                 (k.MatrixStore(s.c.buf, index, stride, scaled, shape.nr, shape.mr),),
                 (k.MatrixStore(s.c.buf, index, stride, with_c, shape.nr, shape.mr),))]


# ----------------------------------------------------------------------------- generic expansion


def has_matrix_values(node: object) -> bool:
    """Whether ``node`` (a module, function, statement or expression) uses matrix nodes."""
    if isinstance(node, (k.MatrixLoad, k.MatrixMultiply, k.MatrixStore)):
        return True
    if isinstance(node, k.Module):
        return any(has_matrix_values(f.body) for f in node.functions)
    if isinstance(node, tuple):
        return any(has_matrix_values(x) for x in node)
    fields = getattr(node, "__dataclass_fields__", None)
    return bool(fields) and any(has_matrix_values(getattr(node, f)) for f in fields)


def expand_matrix(module: k.Module, isa: Isa) -> k.Module:
    """Matrix values as plain kernel IR: ISA-wide (or scalar) loads, FMAs and stores."""
    funcs = []
    for f in module.functions:
        if has_matrix_values(f.body):
            f = replace(f, body=_Expander(isa, f.body).run())
        funcs.append(f)
    return k.Module(tuple(funcs), module.entry, module.attributes)


def _chunks(lanes: int, rows: int, width: int) -> list[tuple[int, int]]:
    """(first lane, lanes) of the pieces of a column-major value with ``rows``-lane columns:
    ``width``-lane vectors down each column, then scalars."""
    out = []
    for col in range(lanes // rows):
        r = 0
        while r < rows:
            w = width if r + width <= rows else 1
            out.append((col * rows + r, w))
            r += w
    return out


def _height(e: k.Expr, heights: dict[str, int]) -> int | None:
    """The column height of a matrix-shaped value, where its form tells it."""
    if isinstance(e, (k.MatrixLoad, k.MatrixMultiply)):
        return e.rows
    if isinstance(e, k.Var):
        return heights.get(e.name)
    for child in _elementwise_children(e):
        h = _height(child, heights)
        if h is not None:
            return h
    return None


def _elementwise_children(e: k.Expr) -> tuple[k.Expr, ...]:
    if isinstance(e, k.Bin):
        return (e.a, e.b)
    if isinstance(e, k.Fma):
        return (e.a, e.b, e.c)
    if isinstance(e, k.Select):
        return (e.a, e.b)
    return ()


def _wide_vars(e: k.Expr) -> list[k.Var]:
    if isinstance(e, k.Var):
        return [e] if e.lanes > 1 else []
    return [v for c in _elementwise_children(e) for v in _wide_vars(c)]


def _statements(body: tuple[k.Stmt, ...]):
    for s in body:
        yield s
        for child in (getattr(s, "body", ()), getattr(s, "then", ()), getattr(s, "orelse", ())):
            yield from _statements(child)


class _Expander:
    """Expands the matrix values of one function body."""

    def __init__(self, isa: Isa, body: tuple[k.Stmt, ...]) -> None:
        self.isa = isa
        self.body = body
        self.heights = self._infer_heights(body)
        self.temps = itertools.count(1)

    @staticmethod
    def _infer_heights(body: tuple[k.Stmt, ...]) -> dict[str, int]:
        """Column height of every matrix-valued variable, from what is assigned to it or
        what it is stored as (``macc = bcast(0)`` tells nothing; ``macc + mmul...`` does)."""
        heights: dict[str, int] = {}
        for _ in range(3):
            for s in _statements(body):
                if isinstance(s, (k.Decl, k.Assign)):
                    h = _height(s.value, heights)
                    if h is not None:
                        heights.setdefault(s.var.name, h)
                        for v in _wide_vars(s.value):
                            heights.setdefault(v.name, h)
                elif isinstance(s, k.MatrixStore):
                    for v in _wide_vars(s.value):
                        heights.setdefault(v.name, s.rows)
        return heights

    def run(self) -> tuple[k.Stmt, ...]:
        return self.stmts(self.body)

    def stmts(self, body: tuple[k.Stmt, ...]) -> tuple[k.Stmt, ...]:
        return tuple(x for s in body for x in self.stmt(s))

    def stmt(self, s: k.Stmt) -> list[k.Stmt]:
        if isinstance(s, k.For):
            return [replace(s, body=self.stmts(s.body))]
        if isinstance(s, k.If):
            if has_matrix_values(s.cond):
                raise ScheduleError("expand_matrix: a matrix value in a condition")
            return [k.If(s.cond, self.stmts(s.then), self.stmts(s.orelse))]
        if isinstance(s, (k.Decl, k.Assign)) and s.var.name in self.heights:
            pre, value = self.bind_operands(s.value)
            kind = type(s)
            rows = self.heights[s.var.name]
            return [*pre, *(kind(self.chunk_var(s.var, lo, w), self.piece(value, lo, w))
                            for lo, w in self.chunks(s.var.dtype, s.var.lanes, rows))]
        if isinstance(s, k.MatrixStore):
            pre, value = self.bind_operands(s.value)
            return [*pre, *(k.Store(s.buf, s.index + (lo // s.rows) * s.stride + lo % s.rows,
                                    self.piece(value, lo, w))
                            for lo, w in self.chunks(value.dtype, value.lanes, s.rows))]
        if has_matrix_values(s):
            raise ScheduleError(f"expand_matrix: cannot expand {type(s).__name__} with "
                                "matrix values")
        return [s]

    def chunks(self, dtype: str, lanes: int, rows: int) -> list[tuple[int, int]]:
        if lanes % rows:
            raise ScheduleError(f"expand_matrix: {lanes} lanes are not columns of {rows}")
        return _chunks(lanes, rows, self.isa.lanes(dtype))

    @staticmethod
    def chunk_var(v: k.Var, lo: int, w: int) -> k.Var:
        """The variable holding lanes [lo, lo + w) of ``v`` (a 1x1 matrix is itself)."""
        return v if v.lanes == 1 else k.Var(f"{v.name}_{lo}", v.dtype, w)

    def bind_operands(self, e: k.Expr) -> tuple[list[k.Stmt], k.Expr]:
        """Load each multiply's left operand once, into a temporary of chunks, since every
        column of the product reads all of it."""
        pre: list[k.Stmt] = []

        def visit(x: k.Expr) -> k.Expr:
            if isinstance(x, k.MatrixMultiply):
                a = x.a
                if not isinstance(a, k.Var):
                    a, bind = self.temporary(visit(a), x.rows)
                    pre.extend(bind)
                return k.MatrixMultiply(a, x.b, x.rows, x.inner, x.cols)
            if isinstance(x, k.Bin):
                return k.Bin(x.op, visit(x.a), visit(x.b))
            if isinstance(x, k.Fma):
                return k.Fma(visit(x.a), visit(x.b), visit(x.c))
            if isinstance(x, k.Select):
                return k.Select(x.cond, visit(x.a), visit(x.b))
            return x

        value = visit(e)
        return pre, value

    def temporary(self, value: k.Expr, rows: int) -> tuple[k.Var, list[k.Stmt]]:
        var = k.Var(f"mt{next(self.temps)}", value.dtype, value.lanes)
        self.heights[var.name] = rows
        return var, [k.Decl(self.chunk_var(var, lo, w), self.piece(value, lo, w))
                     for lo, w in self.chunks(value.dtype, value.lanes, rows)]

    # ------------------------------------------------------------------ one piece of a value
    def piece(self, e: k.Expr, lo: int, w: int) -> k.Expr:  # noqa: C901 - one case per node
        """Lanes [lo, lo + w) of the matrix-shaped value ``e`` as plain IR."""
        if isinstance(e, k.Broadcast):
            return self.piece(e.value, lo, w)
        if e.lanes == 1 and not has_matrix_values(e):  # a scalar, the same in every lane
            return k.Broadcast(e, w) if w > 1 else e
        if isinstance(e, k.Const):
            return self.piece(k.Const(e.value, e.dtype), lo, w)
        if isinstance(e, k.Var):
            rows = self.heights.get(e.name)
            if rows is None or (lo, w) not in self.chunks(e.dtype, e.lanes, rows):
                raise ScheduleError(f"expand_matrix: lanes {lo}..{lo + w} of {e.name!r} are "
                                    "not one of its pieces")
            return self.chunk_var(e, lo, w)
        if isinstance(e, k.Bin):
            if e.op == "+" and isinstance(e.b, k.MatrixMultiply):
                return self.product(e.b, lo, w, self.piece(e.a, lo, w))
            if e.op == "+" and isinstance(e.a, k.MatrixMultiply):
                return self.product(e.a, lo, w, self.piece(e.b, lo, w))
            return k.Bin(e.op, self.piece(e.a, lo, w), self.piece(e.b, lo, w))
        if isinstance(e, k.Fma):
            return k.Fma(*(self.piece(x, lo, w) for x in (e.a, e.b, e.c)))
        if isinstance(e, k.Select):
            return k.Select(e.cond, self.piece(e.a, lo, w), self.piece(e.b, lo, w))
        if isinstance(e, k.MatrixLoad):
            col, row = divmod(lo, e.rows)
            if row + w > e.rows:
                raise ScheduleError(f"expand_matrix: lanes {lo}..{lo + w} cross a column")
            return k.Load(e.buf, e.index + col * e.stride + row, e.dtype, w)
        if isinstance(e, k.MatrixMultiply):
            return self.product(e, lo, w, None)
        raise ScheduleError(f"expand_matrix: cannot expand {type(e).__name__}")

    def product(self, e: k.MatrixMultiply, lo: int, w: int, acc: k.Expr | None) -> k.Expr:
        """Lanes [lo, lo + w) of ``acc + e``: one column of the product, as FMAs of the left
        operand's columns by broadcast elements of the right operand."""
        col, row = divmod(lo, e.rows)
        if row + w > e.rows:
            raise ScheduleError(f"expand_matrix: lanes {lo}..{lo + w} cross a column")
        for p in range(e.inner):
            a = self.piece(e.a, p * e.rows + row, w)
            b = self.piece(e.b, col * e.inner + p, 1)
            b = k.Broadcast(b, w) if w > 1 else b
            acc = k.Bin("*", a, b) if acc is None else k.Fma(a, b, acc)
        assert acc is not None
        return acc
