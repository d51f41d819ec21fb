"""Rows whose results are horizontal sums, stored to consecutive elements, as one vector.

A sum vectorized along its own index (``y[i] = sum_k A[i,k] * x[k]`` with ``k`` on the
lanes) ends every row in a horizontal sum and a scalar store:

    y[i+0] = alpha * hsum(acc0) + beta * y[i+0]
    y[i+1] = alpha * hsum(acc1) + beta * y[i+1]        (... n rows)

When n consecutive rows have the same expression, up to the accumulators summed and the
element of the output they read, they are one vector statement instead:

    y[i : i+n] = alpha * sumlanes(acc0, ..., acc{n-1}) + beta * y[i : i+n]

``SumLanes`` transposes and adds n vectors of n lanes at once (on AVX2, unpacks and
shuffles and three adds for four f32 rows, where four separate horizontal sums take
eight adds and eight shuffles). Wider accumulators are transposed as they are where the
target has it (``SumRows``: four rows of 16 f32 in 13 instructions, not 25), else first
halved (their two halves added); rows held two per vector (``Half(acc, 0)``,
``Half(acc, 1)``: ``OpSchedule.pairs``) are summed as such, n rows from n/2 vectors,
and rows held four per vector (``OpSchedule.quads``: ``Half(Half(acc, 0), 1)`` is row
1) n rows from n/4. The vector statement takes the place of the group's last store;
the stores before it are dropped, which is safe because nothing between them touches
the output or reassigns what their values read.

Before grouping, a row that adds several horizontal sums gets one (``one_sum``):
``y = alpha*A*x + beta*B*x`` ends every row in ``alpha*hsum(a) + beta*hsum(b)``, which
becomes ``hsum(alpha*a + beta*b)``; a row of 6 f64 (a vector of 4 and one of 2) ends in
``hsum(a) + hsum(b)``, which becomes ``hsum(lo(a) + hi(a) + b)``, and rows like it then
group into vectors of 2.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import kernel as k
from ..ir.walk import names_used, nodes_of
from ..target.isa import Isa


def batch_row_sums(body: tuple[k.Stmt, ...], isa: Isa) -> tuple[k.Stmt, ...]:
    """``body`` with groups of row stores rewritten as vector stores (loops and branches
    included)."""
    stmts = [_inside(s, isa) for s in body]
    out: list[k.Stmt] = []
    i = 0
    while i < len(stmts):
        group = _group(stmts, i)
        if len(group) < 2:
            out.append(stmts[i])
            i += 1
            continue
        rows = [stmts[j] for j in group]
        replaced = _vector_stores(rows, isa)  # by position in the group
        for j in range(i, group[-1] + 1):
            if j in group:
                out += replaced[group.index(j)]
            else:
                out.append(stmts[j])
        i = group[-1] + 1
    return tuple(out)


def _scaled_sum(e: k.Expr) -> tuple[k.Expr | None, k.Expr] | None:
    """``hsum(v)`` -> (None, v); ``s * hsum(v)`` with a scalar ``s`` -> (s, v)."""
    if isinstance(e, k.Reduce) and e.x.lanes >= 2:
        return None, e.x
    if isinstance(e, k.Bin) and e.op == "*":
        for s, r in ((e.a, e.b), (e.b, e.a)):
            if (isinstance(r, k.Reduce) and r.x.lanes >= 2 and s.lanes == 1
                    and not nodes_of(s, k.Reduce)):
                return s, r.x
    return None


def _scaled(scale: k.Expr | None, v: k.Expr) -> k.Expr:
    return v if scale is None else k.Bin("*", k.Broadcast(scale, v.lanes), v)


def _folded(v: k.Expr, lanes: int) -> k.Expr:
    """``v`` with its halves added until it has ``lanes`` lanes (the same sum)."""
    while v.lanes > lanes:
        v = k.Bin("+", k.Half(v, 0), k.Half(v, 1))
    return v


def _joined(x: k.Expr, y: k.Expr) -> k.Expr | None:
    """``x + y`` as one horizontal sum when both are (scaled) sums, the wider one of 4
    lanes or more (two sums of 2 lanes are a shuffle and an add each: no more than
    scaling and adding the vectors first). A wider sum is folded to the narrower
    width; widths are powers of two."""
    sx, sy = _scaled_sum(x), _scaled_sum(y)
    if sx is None or sy is None or max(sx[1].lanes, sy[1].lanes) < 4:
        return None
    lanes = min(sx[1].lanes, sy[1].lanes)
    scale, v = sx[0], _folded(sx[1], lanes)
    w = _scaled(sy[0], _folded(sy[1], lanes))
    if scale is None:
        return k.Reduce(k.Bin("+", v, w))
    return k.Reduce(k.Fma(k.Broadcast(scale, lanes), v, w))


def one_sum(e: k.Expr) -> k.Expr:
    """Horizontal sums of vectors of one width added together, scaled or not, as one:
    ``alpha*hsum(a) + beta*hsum(b)`` -> ``hsum(alpha*a + beta*b)`` (the sum is linear;
    a vector multiply and add instead of a second tree of shuffles and adds). A scale
    that is itself a horizontal sum is not linear in the other and is left alone."""
    if isinstance(e, k.Fma) and e.a.lanes == 1:  # a scalar fma(a, b, c) is a*b + c
        c = one_sum(e.c)
        return _joined(k.Bin("*", e.a, e.b), c) or k.Fma(e.a, e.b, c)
    if isinstance(e, k.Bin) and e.op == "+":
        a, b = one_sum(e.a), one_sum(e.b)
        return _joined(a, b) or k.Bin("+", a, b)
    return e


def _inside(s: k.Stmt, isa: Isa) -> k.Stmt:
    if isinstance(s, k.Store) and s.count is None and s.value.lanes == 1:
        return replace(s, value=one_sum(s.value))
    if isinstance(s, k.For):
        return replace(s, body=batch_row_sums(s.body, isa))
    if isinstance(s, k.If):
        return k.If(s.cond, batch_row_sums(s.then, isa), batch_row_sums(s.orelse, isa))
    return s


def _is_row(s: k.Stmt) -> bool:
    """A scalar store of a horizontal sum that reads its output, if at all, only at the
    element it writes (so reading a whole group's elements before storing them is safe)."""
    return (isinstance(s, k.Store) and s.count is None and s.value.lanes == 1
            and bool(nodes_of(s.value, k.Reduce))
            and all(index_offset(x.index, s.index) == 0
                    for x in nodes_of(s.value, k.Load) if x.buf == s.buf))


def index_offset(index: k.Expr, base: k.Expr) -> int | None:
    """``index - base`` when it is a constant (indices as affine sums of variables)."""
    a, b = _affine(index), _affine(base)
    if a is None or b is None:
        return None
    terms = {v: a[0].get(v, 0) - b[0].get(v, 0) for v in a[0].keys() | b[0].keys()}
    return a[1] - b[1] if not any(terms.values()) else None


def _affine(e: k.Expr) -> tuple[dict[str, int], int] | None:
    """(coefficient per variable, constant) of an integer index expression, or None."""
    if isinstance(e, k.Const):
        return {}, int(e.value)
    if isinstance(e, k.Var):
        return {e.name: 1}, 0
    if isinstance(e, k.Bin) and e.op in "+-*":
        a, b = _affine(e.a), _affine(e.b)
        if a is None or b is None:
            return None
        if e.op == "*":
            if a[0] and b[0]:
                return None  # a product of variables
            (terms, c), scale = (a, b[1]) if a[0] else (b, a[1])
            return {v: n * scale for v, n in terms.items()}, c * scale
        sign = 1 if e.op == "+" else -1
        terms = dict(a[0])
        for v, n in b[0].items():
            terms[v] = terms.get(v, 0) + sign * n
        return terms, a[1] + sign * b[1]
    return None


def _group(stmts: list[k.Stmt], i: int) -> list[int]:
    """Positions of the row stores that can join the one at ``i``: to the next elements
    of its buffer, with nothing in between that touches that buffer or reassigns a
    variable the stores so far read."""
    first = stmts[i]
    if not _is_row(first):
        return [i]
    group, read = [i], set(names_used(first.value))
    for j in range(i + 1, len(stmts)):
        s = stmts[j]
        if (_is_row(s) and s.buf == first.buf
                and index_offset(s.index, first.index) == len(group)):
            group.append(j)
            read |= set(names_used(s.value))
            continue
        if not isinstance(s, (k.Decl, k.Assign)) or first.buf in names_used(s.value):
            break
        if isinstance(s, k.Assign) and s.var.name in read:
            break
    return group


def _vector_stores(rows: list[k.Store], isa: Isa) -> list[list[k.Stmt]]:
    """Per row of the group, the statements that replace its store: the vector store at
    the last row of each batch, nothing at the others; a row left alone stays scalar.
    Rows held four per vector that do not fill one go in one masked store where the ISA
    has mask registers (fewer rows than a vector has lanes, a multiple of four), before
    narrower vectors are tried: four of their rows are summed in one full vector. Rows
    left that fill no vector go in the narrowest vector wider than them, stored in part
    (after whole narrower vectors: four rows of 8 f32 are one ``SumRows`` into four
    lanes, 11 instructions from gcc, where eight rows' transposition takes 22)."""
    out: list[list[k.Stmt]] = [[r] for r in rows]
    start = 0
    while start < len(rows):
        widths = [w for w in isa.widths(rows[start].value.dtype) if w > 1]
        start = (_whole_batch(rows, start, widths[:1], isa, out)
                 or _masked_batch(rows, start, widths, isa, out)
                 or _whole_batch(rows, start, widths[1:], isa, out)
                 or _partial_batch(rows, start, widths, isa, out)
                 or start + 1)
    return out


def _whole_batch(rows: list[k.Store], start: int, widths: list[int], isa: Isa,
                 out: list[list[k.Stmt]]) -> int | None:
    """The rows from ``start`` that fill the widest of ``widths`` they can, joined into one
    store placed in ``out``; where the next batch starts, or None."""
    for n in widths:
        batch = rows[start:start + n]
        value = _vectorize([r.value for r in batch], n, isa) if len(batch) == n else None
        if value is not None:
            for p in range(start, start + n):
                out[p] = []
            out[start + n - 1] = [k.Store(batch[0].buf, batch[0].index, value)]
            return start + n
    return None


def _masked_batch(rows: list[k.Store], start: int, widths: list[int], isa: Isa,
                  out: list[list[k.Stmt]]) -> int | None:
    """The most rows from ``start`` (a multiple of four, fewer than a vector's lanes) that
    join into one masked store, placed in ``out``; where the next batch starts, or None."""
    if not isa.mask_registers or not widths:
        return None
    for m in range(min(len(rows) - start, widths[0] - 1) // 4 * 4, 0, -4):
        batch = rows[start:start + m]
        value = _vectorize([r.value for r in batch], widths[0], isa)
        if value is not None:
            for p in range(start, start + m):
                out[p] = []
            out[start + m - 1] = [k.Store(batch[0].buf, batch[0].index, value, k.Const(m))]
            return start + m
    return None


def _partial_batch(rows: list[k.Store], start: int, widths: list[int], isa: Isa,
                   out: list[list[k.Stmt]]) -> int | None:
    """The rows left from ``start``, two or more but fewer than a vector's lanes, joined
    into the narrowest vector wider than them that they fit, placed in ``out`` as one
    store of their count (plain pieces without mask registers: ``Isa.plain_moves``);
    the end of the rows, or None. y = A*x n x n f32 on Zen 3, its last rows horizontal
    sums each before: n = 6, 7, 10 ran 1.08-1.12x as fast (over the loops, medians of
    three A/B rounds), n = 3 by hand 0.81-0.90x the loops' speed with three sums,
    0.91-0.99x with one ``SumLanes`` (the first row repeated in the fourth lane) and a
    store of 2 + 1 lanes."""
    count = len(rows) - start
    if count < 2:
        return None
    for n in sorted(w for w in widths if w > count):
        value = _vectorize([r.value for r in rows[start:]], n, isa, repeat=True)
        if value is not None:
            for p in range(start, len(rows)):
                out[p] = []
            out[-1] = [k.Store(rows[start].buf, rows[start].index, value, k.Const(count))]
            return len(rows)
    return None


def _vectorize(values: list[k.Expr], n: int, isa: Isa, *, repeat: bool = False
               ) -> k.Expr | None:
    """One ``n``-lane expression whose lane r is ``values[r]``, or None. Fewer values than
    lanes leave the last lanes unspecified (for a masked store): loads then read only
    the lanes given, and only rows held four per vector are summed so."""
    first, count = values[0], len(values)
    if all(v == first for v in values) and not nodes_of(first, k.Reduce):
        return k.Broadcast(first, n)
    if all(isinstance(v, k.Reduce) for v in values):
        return _sum_lanes([v.x for v in values], n, isa, repeat)
    if all(isinstance(v, k.Load) and v.lanes == 1 and v.count is None and v.buf == first.buf
           and index_offset(v.index, first.index) == r for r, v in enumerate(values)):
        return k.Load(first.buf, first.index, first.dtype, n,
                      None if count == n else k.Const(count))
    if all(isinstance(v, k.Bin) and v.op == first.op for v in values):
        a = _vectorize([v.a for v in values], n, isa, repeat=repeat)
        b = _vectorize([v.b for v in values], n, isa, repeat=repeat)
        return None if a is None or b is None else k.Bin(first.op, a, b)
    if all(isinstance(v, k.Fma) for v in values):
        parts = [_vectorize([getattr(v, f) for v in values], n, isa, repeat=repeat)
                 for f in "abc"]
        return None if None in parts else k.Fma(*parts)
    return None


def _sum_lanes(xs: list[k.Expr], n: int, isa: Isa, repeat: bool = False) -> k.Expr | None:
    dtype = xs[0].dtype
    if any(x.lanes != xs[0].lanes or x.dtype != dtype for x in xs):
        return None
    if repeat and len(xs) < n <= xs[0].lanes:  # fewer rows than lanes, which are not
        # stored past them: the rows repeated, which the C compiler's CSE can share (two
        # rows of 4 f32 repeated: 6 instructions from gcc, four rows 9)
        xs = [xs[r % len(xs)] for r in range(n)]
    if len(xs) < n and 4 * xs[0].lanes != n:
        return None
    if 2 * xs[0].lanes == n:  # rows of half a vector: summed two per vector if they were
        whole = [_unhalved(xs[r], xs[r + 1]) for r in range(0, n, 2)]
        if not _has_op(isa, "sum_halves", dtype, n) or None in whole:
            return None
        return k.SumLanes(tuple(w for w in whole if w is not None))
    if 4 * xs[0].lanes == n:  # rows of a quarter of a vector, if they were held four per
        if len(xs) % 4:
            return None
        halves = [_unhalved(xs[r], xs[r + 1]) for r in range(0, len(xs), 2)]
        if None in halves or not _has_op(isa, "sum_quarters", dtype, n):
            return None
        whole = [_unhalved(halves[h], halves[h + 1]) for h in range(0, len(halves), 2)]
        if None in whole:
            return None
        # fewer rows than lanes (a masked store): the missing vectors' sums are zero
        whole += [k.Broadcast(k.Const(0.0, dtype), n)] * (n // 4 - len(whole))
        return k.SumLanes(tuple(whole))
    if xs[0].lanes > n == len(xs) and _has_op(isa, f"sum_rows{n}", dtype, xs[0].lanes):
        return k.SumRows(tuple(xs))  # wider rows transposed before they are halved
    if xs[0].lanes < n or not _has_op(isa, "sum_lanes", dtype, n):
        return None
    while xs[0].lanes > n:  # add the halves of wider accumulators first
        xs = [k.Bin("+", k.Half(x, 0), k.Half(x, 1)) for x in xs]
    return k.SumLanes(tuple(xs))


def _has_op(isa: Isa, name: str, dtype: str, lanes: int) -> bool:
    try:
        isa.op(name, dtype, lanes)
    except KeyError:
        return False
    return True


def _unhalved(lo: k.Expr, hi: k.Expr) -> k.Expr | None:
    """The vector whose halves are ``lo`` and ``hi`` without joining them, or None: the
    halves of one vector (two rows computed in one register, ``OpSchedule.pairs``), one
    broadcast twice, or an operation on such."""
    if isinstance(lo, k.Half) and isinstance(hi, k.Half) and lo.x == hi.x:
        return lo.x if (lo.which, hi.which) == (0, 1) else None
    if isinstance(lo, k.Broadcast) and lo == hi:
        return k.Broadcast(lo.value, 2 * lo.lanes)
    if isinstance(lo, k.Bin) and isinstance(hi, k.Bin) and lo.op == hi.op:
        a, b = _unhalved(lo.a, hi.a), _unhalved(lo.b, hi.b)
        return None if a is None or b is None else k.Bin(lo.op, a, b)
    if isinstance(lo, k.Fma) and isinstance(hi, k.Fma):
        parts = [_unhalved(getattr(lo, f), getattr(hi, f)) for f in "abc"]
        return None if None in parts else k.Fma(*parts)
    return None
