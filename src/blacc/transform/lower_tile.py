"""Lower register-tile operations to vector (or scalar) kernel IR.

``TileMMA`` becomes the outer-product form of seed 000's matrix-multiply
intrinsic: per k step, ``cols/lanes`` vector loads of b, one broadcast of a per
row and ``rows*cols/lanes`` FMAs into accumulators that stay in registers. With
one lane (the generic target) the same walk makes scalar accumulators.

    tile_mma(acc[6x16] += a x b, k=kc)
      ->  for p in range(0, kc - kc % 4, 4):
            b_0_0 = load8(b[p*16]); ...
            a_0_0 = bcast8(a[p*6]); acc_0_0 = fma(a_0_0, b_0_0, acc_0_0)

Edges: when the operands are not zero-padded the tile has a second, guarded
copy of the loop for edge tiles (rows clamped, b loaded with masks); stores are
masked at edges; beta == 0 never loads c.

A tile vectorized along k (``Tile.along == 'k'``) is a tile of dot products: per step of
``lanes`` k values, a vector of each row of a and of each column of b and an FMA per
element; the last partial step loads with masks; the store sums each element's lanes.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import ScheduleError
from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..target.isa import Isa


def lower_tiles(module: k.Module, isa: Isa, *, hint_unroll: bool = False) -> k.Module:
    """``hint_unroll``: leave the k loop rolled, marked to be unrolled ``unroll`` times by
    the C compiler, instead of unrolling it here. GCC allocates registers badly for our
    unrolled copies (f64 6x8: 27 register moves and 30 repeated loads of b in the loop;
    GEMM 1000^3 at 33.4 GFLOPS against LLVM's 38.9) and perfectly for its own."""
    funcs = tuple(replace(f, body=_lower_body(f.body, isa, hint_unroll))
                  for f in module.functions)
    return k.Module(funcs, module.entry, module.attributes)


def _lower_body(body: tuple[k.Stmt, ...], isa: Isa, hint: bool) -> tuple[k.Stmt, ...]:
    out: list[k.Stmt] = []
    for s in body:
        if isinstance(s, k.TileZero):
            out += _zero(s.tile, isa)
        elif isinstance(s, k.TileMMA):
            out += _mma(s, isa, hint)
        elif isinstance(s, k.TileStore):
            out += _store(s, isa)
        elif isinstance(s, k.For):
            out.append(replace(s, body=_lower_body(s.body, isa, hint)))
        elif isinstance(s, k.If):
            out.append(k.If(s.cond, _lower_body(s.then, isa, hint),
                            _lower_body(s.orelse, isa, hint)))
        else:
            out.append(s)
    return tuple(out)


def _lanes(tile: k.Tile, isa: Isa) -> int:
    if tile.lanes > 1 and isa.vector_type(tile.dtype, tile.lanes) is None:
        widths = ", ".join(str(w) for w in isa.widths(tile.dtype) if w > 1)
        raise ScheduleError(f"Vectorize: target {isa.name} has no {tile.lanes}-lane "
                            f"{tile.dtype} vectors (it has {widths or 'none'})")
    return tile.lanes


def _acc(tile: k.Tile, r: int, v: int) -> k.Var:
    return k.Var(f"{tile.name}_{r}_{v}", tile.dtype, tile.lanes)


def _vectors(tile: k.Tile) -> int:
    """Accumulators per row: one per vector of columns, or one per column along k."""
    return tile.cols if tile.along == "k" else tile.cols // tile.lanes


def _zero(tile: k.Tile, isa: Isa) -> list[k.Stmt]:
    lanes = _lanes(tile, isa)
    zero = k.Const(0.0, tile.dtype)
    init = k.Broadcast(zero, lanes) if lanes > 1 else zero
    return [k.Decl(_acc(tile, r, v), init)
            for r in range(tile.rows) for v in range(_vectors(tile))]


def _unit(e: k.Expr, what: str) -> None:
    if e != k.Const(1):
        raise ScheduleError(f"Vectorize: {what} must have unit stride along the vectorized "
                            "dimension (pack it, or specialize the stride to 1)")


def _mma(s: k.TileMMA, isa: Isa, hint: bool) -> list[k.Stmt]:
    lanes = _lanes(s.tile, isa)
    if s.tile.along == "k":
        return _dot_mma(s, lanes)
    if lanes > 1:
        _unit(s.b.cs, f"operand {s.b.buf!r}")
    full = _mma_loops(s, lanes, guarded=False, tag="", hint=hint)
    if s.padded:
        return full
    is_full = k.Bin("and", k.Bin("==", s.rows, k.Const(s.tile.rows)),
                    k.Bin("==", s.cols, k.Const(s.tile.cols)))
    edge = _mma_loops(s, lanes, guarded=True, tag="e", hint=hint)
    return [k.If(is_full, tuple(full), tuple(edge))]


def _mma_loops(s: k.TileMMA, lanes: int, *, guarded: bool, tag: str,
               hint: bool) -> list[k.Stmt]:
    t = s.tile
    p = k.Var(f"p{tag}")
    nv = t.cols // lanes

    def step(pk: k.Expr, u: int) -> list[k.Stmt]:
        stmts: list[k.Stmt] = []
        bvals = []
        for v in range(nv):
            col = v * lanes
            if lanes > 1:
                count = s.cols - col if guarded else None
                load = k.Load(s.b.buf, s.b.at(pk, col), t.dtype, lanes, count)
            else:
                c = k.minimum(col, s.cols - 1) if guarded else col
                load = k.Load(s.b.buf, s.b.at(pk, c), t.dtype)
            bv = k.Var(f"b{tag}_{u}_{v}", t.dtype, lanes)
            stmts.append(k.Decl(bv, load))
            bvals.append(bv)
        for r in range(t.rows):
            row = k.minimum(r, s.rows - 1) if guarded else r
            a = k.Load(s.a.buf, s.a.at(row, pk), t.dtype)
            av = k.Var(f"a{tag}_{u}_{r}", t.dtype, lanes)
            stmts.append(k.Decl(av, k.Broadcast(a, lanes) if lanes > 1 else a))
            for v in range(nv):
                acc = _acc(t, r, v)
                stmts.append(k.Assign(acc, k.Fma(av, bvals[v], acc)))
        return stmts

    if s.unroll == 1 or hint:
        return [k.For(p, k.Const(0), s.k, 1, (*_prefetches(s, p, 1), *step(p, 0)),
                      unroll=s.unroll)]
    main = k.Var(f"kmain{tag}")
    unrolled = [*_prefetches(s, p, s.unroll),
                *(st for u in range(s.unroll) for st in step(p + u, u))]
    return [k.Decl(main, s.k - k.Bin("%", s.k, k.Const(s.unroll))),
            k.For(p, k.Const(0), main, s.unroll, tuple(unrolled)),
            k.For(p, main, s.k, 1, tuple(step(p, 0)))]


def _dot_mma(s: k.TileMMA, lanes: int) -> list[k.Stmt]:
    """A tile of dot products: rows of a and columns of b read ``lanes`` k values at a
    time (unit stride along k), full tiles unrolled ``s.unroll`` steps, edge tiles with
    their rows and columns clamped (recomputing the last one; the store skips them)."""
    _unit(s.a.cs, f"operand {s.a.buf!r}")
    _unit(s.b.rs, f"operand {s.b.buf!r}")
    t = s.tile
    whole = k.Var("kwhole")  # k values in whole vectors

    def step(pk: k.Expr, u: int, tag: str, guarded: bool, count: k.Expr | None
             ) -> list[k.Stmt]:
        out: list[k.Stmt] = []
        bvals = []
        for c in range(t.cols):
            col = k.minimum(c, s.cols - 1) if guarded else c
            bv = k.Var(f"b{tag}_{u}_{c}", t.dtype, lanes)
            out.append(k.Decl(bv, k.Load(s.b.buf, s.b.at(pk, col), t.dtype, lanes, count)))
            bvals.append(bv)
        for r in range(t.rows):
            row = k.minimum(r, s.rows - 1) if guarded else r
            av = k.Var(f"a{tag}_{u}_{r}", t.dtype, lanes)
            out.append(k.Decl(av, k.Load(s.a.buf, s.a.at(row, pk), t.dtype, lanes, count)))
            for c in range(t.cols):
                acc = _acc(t, r, c)
                out.append(k.Assign(acc, k.Fma(av, bvals[c], acc)))
        return out

    def loops(tag: str, guarded: bool) -> list[k.Stmt]:
        p = k.Var(f"p{tag}")
        main = k.Var(f"kmain{tag}")
        width = lanes * s.unroll
        body = [st for u in range(s.unroll)
                for st in step(p + u * lanes, u, tag, guarded, None)]
        return [k.Decl(main, whole - k.Bin("%", whole, k.Const(width))),
                k.For(p, k.Const(0), main, width, tuple(body)),
                k.For(p, main, whole, lanes, tuple(step(p, 0, tag, guarded, None))),
                k.If(k.Bin("<", whole, s.k),
                     tuple(step(whole, 0, f"{tag}t", guarded, s.k - whole)))]

    is_full = k.Bin("and", k.Bin("==", s.rows, k.Const(t.rows)),
                    k.Bin("==", s.cols, k.Const(t.cols)))
    return [k.Decl(whole, s.k - k.Bin("%", s.k, k.Const(lanes))),
            k.If(is_full, tuple(loops("", False)), tuple(loops("e", True)))]


#: Bytes per cache line assumed when spreading prefetches over a panel.
CACHE_LINE = 64


def _prefetches(s: k.TileMMA, p: k.Expr, steps: int) -> list[k.Stmt]:
    """One prefetch per cache line of the ``steps`` k steps ``distance`` ahead of ``p``;
    the panels are packed, so each k step is ``width`` contiguous elements."""
    out: list[k.Stmt] = []
    size = itemsize(s.tile.dtype)
    for role, distance in s.prefetch:
        panel, width = (s.a, s.tile.rows) if role == "a" else (s.b, s.tile.cols)
        lines = -(-steps * width * size // CACHE_LINE)
        start = panel.offset + (p + distance) * width
        out += [k.Prefetch(panel.buf, start + line * (CACHE_LINE // size))
                for line in range(lines)]
    return out


def _store(s: k.TileStore, isa: Isa) -> list[k.Stmt]:
    t = s.tile
    lanes = _lanes(t, isa)
    if t.along == "k":
        return _dot_store(s)
    if lanes > 1:
        _unit(s.c.cs, f"output {s.c.buf!r}")
    alpha = k.Var("alpha_v", t.dtype, lanes)
    beta = k.Var("beta_v", t.dtype, lanes)
    splat = (lambda x: k.Broadcast(x, lanes)) if lanes > 1 else (lambda x: x)

    def stores(edge: bool, read_c: bool) -> tuple[k.Stmt, ...]:
        out: list[k.Stmt] = []
        for r in range(t.rows):
            row: list[k.Stmt] = []
            for v in range(t.cols // lanes):
                col = v * lanes
                count = (s.cols - col) if edge and lanes > 1 else None
                value: k.Expr = k.Bin("*", alpha, _acc(t, r, v))
                if read_c:
                    old = k.Load(s.c.buf, s.c.at(r, col), t.dtype, lanes, count)
                    value = k.Fma(beta, old, value)
                store: k.Stmt = k.Store(s.c.buf, s.c.at(r, col), value, count)
                if edge and lanes == 1:
                    store = k.If(k.Bin("<", k.Const(col), s.cols), (store,))
                row.append(store)
            out += [k.If(k.Bin("<", k.Const(r), s.rows), tuple(row))] if edge else row
        return tuple(out)

    is_full = k.Bin("and", k.Bin("==", s.rows, k.Const(t.rows)),
                    k.Bin("==", s.cols, k.Const(t.cols)))
    beta_zero = k.Bin("==", s.beta, k.Const(0.0, t.dtype))
    return [
        k.Decl(alpha, splat(s.alpha)),
        k.Decl(beta, splat(s.beta)),
        k.If(beta_zero,
             (k.If(is_full, stores(False, False), stores(True, False)),),
             (k.If(is_full, stores(False, True), stores(True, True)),)),
    ]


def _dot_store(s: k.TileStore) -> list[k.Stmt]:
    """c[r, c] = alpha * (sum of the element's lanes) + beta * c[r, c], one scalar at a
    time, skipping the rows and columns past the edges; beta == 0 never loads c."""
    t = s.tile

    def stores(read_c: bool) -> tuple[k.Stmt, ...]:
        out: list[k.Stmt] = []
        for r in range(t.rows):
            for c in range(t.cols):
                total = k.Reduce(_acc(t, r, c)) if t.lanes > 1 else _acc(t, r, c)
                value: k.Expr = k.Bin("*", s.alpha, total)
                if read_c:
                    value = k.Fma(s.beta, k.Load(s.c.buf, s.c.at(r, c), t.dtype), value)
                inside = k.Bin("and", k.Bin("<", k.Const(r), s.rows),
                               k.Bin("<", k.Const(c), s.cols))
                out.append(k.If(inside, (k.Store(s.c.buf, s.c.at(r, c), value),)))
        return tuple(out)

    beta_zero = k.Bin("==", s.beta, k.Const(0.0, t.dtype))
    return [k.If(beta_zero, stores(False), stores(True))]
