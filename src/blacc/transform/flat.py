"""A small matrix output computed as one flat vector (``OpSchedule.flat``).

C = alpha*(A0 + A1)'*B + beta*C with 3 x 3 f32 operands is nine elements: rows of three
lanes take nine broadcasts of A0[k, i] + A1[k, i] and nine FMAs on 128-bit vectors
(4.6 ns a call on Zen 5, the LGen harness), where Eigen's fixed-size product holds
eight of C's elements in one vector and the ninth in a scalar (3.9 ns). Held flat, lane
p of the output is its element at offset p (row-major i*n + j, or column-major), and each
operand a term reads is, per lane, the element that position needs: for C's lanes
(i, j), A0[k, i] and B[k, j] for each k. Read along the lanes they are

* one element for every lane: a broadcast;
* consecutive elements: a plain load (beta*C reads C so);
* a run of consecutive elements in each half or quarter: one load into all of them (B
  4 x 4 read over C's rows of 4 f32, ``_Flat.repeated``);
* anything else: one permute (``k.Permute``) of the operand's elements, loaded once into
  one or two vectors (A0 3 x 3 is nine lanes of one masked 512-bit load; its column i
  spread over C's rows is lanes 3k, 3k, 3k, 3k+1, ...).

So the 3 x 3 update is two masked loads and an add for A0 + A1, a load of B, six
permutes, three FMAs, and C's 8 + 1 lanes loaded, scaled and stored (3.2 ns). The flat
lanes go in whole vectors, widest first, and the few left after the narrowest in
scalars. Sums are unrolled. Needs an ISA that permutes (AVX-512) and an output whose
elements are contiguous; each permuted operand must fit two vectors.

Only updates in place are held flat. There the next call's loads of the output wait on
this call's stores, and a few whole vectors of it (instead of rows ending in pieces) and
fewer instructions between them pay: micro C = alpha*(A0 + A1)'*B + beta*C 3 x 3 f32
4.56 -> 3.19 ns, f64 4.58 -> 3.50, 5 x 5 f32 8.89 -> 5.97, 4 x 4 x 8 f32 5.54 -> 3.32
(same-session A/B, Zen 5). Where nothing waits on the output, the permutes cost more
than the broadcasts from memory they replace, though the model finds them cheaper: C =
A*B 3 x 3 f32 1.73 -> 1.93 ns, f64 1.74 -> 2.12, 2 x 2 and 5 x 5 f32 0.93-0.94x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..ir import indexed as ix
from ..ir import kernel as k
from ..target.isa import Isa

if TYPE_CHECKING:
    from .blac import _Gen, _Storage

#: Most elements of an output held flat, in vectors of the ISA's widest width.
FLAT_VECTORS = 2
#: Longest sum unrolled term by term.
FLAT_SUM = 16


def flat_applies(program: ix.Program, op: ix.Op, isa: Isa) -> bool:
    """Whether ``op`` may be computed flat, as far as its shapes tell: an update of a
    matrix in place (two rows and two columns at least, ``op`` reads its output) of at
    most ``FLAT_VECTORS`` vectors, sums of at most ``FLAT_SUM`` terms, on an ISA with
    permutes. (Its elements must also be contiguous: ``lower_flat`` checks the layout.)"""
    out = program.operand(op.out)
    dt = program.dtype
    return (isa.has_op("permute", dt) and out.rows > 1 and out.cols > 1
            and out.rows * out.cols <= FLAT_VECTORS * isa.lanes(dt)
            and any(r.operand == op.out for r in ix.reads(op.body))
            and all(s.extent <= FLAT_SUM for s in _sums(op.body)))


def lower_flat(gen: _Gen, program: ix.Program, op: ix.Op, isa: Isa,
               store: dict[str, _Storage]) -> list[k.Stmt]:
    """Statements computing ``op`` flat: the vectors of permuted operands, then each
    vector (or scalar) of the output's lanes."""
    out = program.operand(op.out)
    st = store[op.out]
    layout = _layout(st, out.rows, out.cols) if st.scalar_var is None else None
    if not flat_applies(program, op, isa) or layout is None:
        raise ScheduleError(f"{op.out} is not held flat: it needs a matrix output of "
                            f"contiguous elements, at most {FLAT_VECTORS} vectors, and "
                            "an ISA with permutes")
    flat = _Flat(gen, program, op, isa, store, layout)
    stmts: list[k.Stmt] = []
    values = []
    for start, width in _pieces(out.rows * out.cols, isa.widths(program.dtype)):
        values.append((start, flat.value(op.body, {}, start, width)))
    stmts += flat.declared
    stmts += [k.Store(st.buf, k.Const(start), v) for start, v in values]
    return stmts


def _layout(st: _Storage, rows: int, cols: int) -> str | None:
    """'row' or 'col' where the output's elements are contiguous that way, else None."""
    if (st.rs, st.cs) == (cols, 1):
        return "row"
    if (st.rs, st.cs) == (1, rows):
        return "col"
    return None


def _pieces(count: int, widths: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start, width) of whole vectors, widest first, then scalars for the rest."""
    out, start = [], 0
    for w in widths:
        while count - start >= w:
            out.append((start, w))
            start += w
    return out


def _sums(n: ix.Node) -> list[ix.Sum]:
    own = [n] if isinstance(n, ix.Sum) else []
    return own + [s for c in ix.children(n) for s in _sums(c)]


class _Flat:
    """Values of one flat operation, lane by lane."""

    def __init__(self, gen: _Gen, program: ix.Program, op: ix.Op, isa: Isa,
                 store: dict[str, _Storage], layout: str) -> None:
        self.gen, self.isa, self.store, self.op = gen, isa, store, op
        self.dt = program.dtype
        self.out = program.operand(op.out)
        self.layout = layout
        self.lanes = isa.lanes(self.dt)
        #: what permutes read, by operand name (a read) or node (operands read alike):
        #: its first element and the vectors holding it
        self.held: dict[str | ix.Node, tuple[int, list[k.Var]]] = {}
        self.declared: list[k.Stmt] = []

    def position(self, p: int) -> tuple[int, int]:
        if self.layout == "row":
            return divmod(p, self.out.cols)
        j, i = divmod(p, self.out.rows)
        return i, j

    def value(self, node: ix.Node, bound: dict[str, int], start: int, width: int) -> k.Expr:
        gen = self.gen
        if isinstance(node, ix.Lit):
            return k.Const(float(node.value), self.dt)
        if isinstance(node, ix.Read):
            return self.read(node, bound, start, width)
        if isinstance(node, (ix.Add, ix.Mul, ix.Neg)) and (alike := self.alike(node)):
            # operands read alike (A0[k, i] + A1[k, i]): combined where they are held,
            # then permuted once
            offs = self.offsets(alike, bound, start, width)
            if width > 1 and not _plain(offs):
                return self.permuted(node, alike, offs)
        if isinstance(node, ix.Neg):
            return gen.combine("-", k.Const(0.0, self.dt),
                               self.value(node.x, bound, start, width))
        if isinstance(node, (ix.Add, ix.Mul)):
            a = self.value(node.a, bound, start, width)
            b = self.value(node.b, bound, start, width)
            return gen.combine("+" if isinstance(node, ix.Add) else "*", a, b)
        if isinstance(node, ix.Sum):
            total = None
            for t in range(node.extent):
                term = self.value(node.body, {**bound, node.index: t}, start, width)
                total = term if total is None else gen.combine("+", term, total)
            return total
        raise ScheduleError(f"cannot compute {type(node).__name__} flat")

    def offsets(self, r: ix.Read, bound: dict[str, int], start: int, width: int) -> list[int]:
        st = self.store[r.operand]
        di, dj = self.op.dims
        out = []
        for p in range(start, start + width):
            i, j = self.position(p)
            at = {di: i, dj: j, **bound}
            row, col = (at[x] if isinstance(x, str) else 0 for x in r.index)
            out.append(row * st.rs + col * st.cs)
        return out

    def read(self, r: ix.Read, bound: dict[str, int], start: int, width: int) -> k.Expr:
        st = self.store[r.operand]
        if st.scalar_var is not None:
            return st.scalar_var
        offs = self.offsets(r, bound, start, width)
        if width == 1:
            return k.Load(st.buf, k.Const(offs[0]), self.dt)
        if len(set(offs)) == 1:
            return k.Broadcast(k.Load(st.buf, k.Const(offs[0]), self.dt), width)
        if _plain(offs):
            return k.Load(st.buf, k.Const(offs[0]), self.dt, width)
        if (repeated := self.repeated(st.buf, offs)) is not None:
            return repeated
        return self.permuted(r, r, offs)

    def repeated(self, buf: str, offs: list[int]) -> k.Expr | None:
        """Consecutive elements repeated in each half or quarter of the vector (B[k, j]
        over C's rows of 4 f32, B 4 x 4: B's row k in every quarter), loaded once into
        all of them (vbroadcastf32x4, vbroadcastf64x4, vbroadcastf128): a load, where a
        permute of the operand held in a register takes the shuffle pipe, on Intel's
        cores port 5, which the FMAs of 512-bit vectors share. C = alpha*(A0 + A1)'*B +
        beta*C 4 x 4 x 4 f32 on AVX-512 ran 3.55-3.87 ns a call with B permuted, 3.05-3.33
        with it loaded so (LGen's harness; a Xeon, CPU model 167). None where ``offs`` is
        no such run or the ISA has no such load."""
        width = len(offs)
        for parts, name in ((2, "dup_load"), (4, "quad_load")):
            run = offs[:width // parts]
            if (len(run) > 1 and offs == run * parts and _plain(run)
                    and self.isa.has_op(name, self.dt, width)):
                load = k.Load(buf, k.Const(run[0]), self.dt, len(run))
                return k.Halves(load, load) if parts == 2 else k.quartered(load)
        return None

    def alike(self, node: ix.Node) -> ix.Read | None:
        """The first array read of ``node``, where every array read in it has the same
        index and strides and it holds no sum: it can then be computed where held."""
        if ix.has_sum(node):
            return None
        reads = [r for r in ix.reads(node) if self.store[r.operand].scalar_var is None]
        if not reads:
            return None
        st = self.store[reads[0].operand]
        same = all(r.index == reads[0].index and (self.store[r.operand].rs,
                                                  self.store[r.operand].cs) == (st.rs, st.cs)
                   for r in reads)
        return reads[0] if same else None

    def permuted(self, node: ix.Node, read: ix.Read, offs: list[int]) -> k.Expr:
        first, vectors = self.hold(node, read)
        lanes_from = tuple(o - first for o in offs)
        y = vectors[1] if max(lanes_from) >= self.lanes else None
        return k.Permute(vectors[0], lanes_from, y)

    def hold(self, node: ix.Node, read: ix.Read) -> tuple[int, list[k.Var]]:
        """The first element ``node`` reads (at ``read``'s positions, over every lane and
        term of the operation) and the one or two vectors that hold ``node`` computed
        element-wise from there, made once: a read's operand loaded, or a sum of
        operands read alike."""
        key = read.operand if node == read else node
        if key in self.held:
            return self.held[key]
        everything = [o for start, w in _pieces(self.out.rows * self.out.cols,
                                                self.isa.widths(self.dt))
                      for r, extents in _scoped_reads(self.op.body)
                      if (r.operand, r.index) == (read.operand, read.index)
                      or (node == read and r.operand == read.operand)
                      for bound in _bindings(extents)
                      for o in self.offsets(r, bound, start, w)]
        first, span = min(everything), max(everything) - min(everything) + 1
        if span > 2 * self.lanes:
            raise ScheduleError(f"{read.operand} spans {span} elements: more than two "
                                "vectors to permute")
        vectors = []
        for v in range(-(-span // self.lanes)):
            left = span - v * self.lanes
            count = None if left >= self.lanes else k.Const(left)
            var = self.gen.fresh("flat", self.lanes)
            value = self.elementwise(node, first + v * self.lanes, count)
            self.declared.append(k.Decl(var, value, in_register=True))
            vectors.append(var)
        self.held[key] = (first, vectors)
        return self.held[key]

    def elementwise(self, node: ix.Node, at: int, count: k.Expr | None) -> k.Expr:
        """``node`` on the ``self.lanes`` elements of its operands from offset ``at``."""
        gen = self.gen
        if isinstance(node, ix.Read):
            st = self.store[node.operand]
            if st.scalar_var is not None:
                return st.scalar_var
            return k.Load(st.buf, k.Const(at), self.dt, self.lanes, count)
        if isinstance(node, ix.Lit):
            return k.Const(float(node.value), self.dt)
        if isinstance(node, ix.Neg):
            return gen.combine("-", k.Const(0.0, self.dt), self.elementwise(node.x, at, count))
        a, b = self.elementwise(node.a, at, count), self.elementwise(node.b, at, count)
        return gen.combine("+" if isinstance(node, ix.Add) else "*", a, b)


def _scoped_reads(node: ix.Node, extents: dict[str, int] | None = None
                  ) -> list[tuple[ix.Read, dict[str, int]]]:
    """Each array read of ``node`` with the extents of the sums around it, by index.
    Sums side by side may share an index name with other extents (``x'*y`` over 3 and
    ``A*B`` over 6 in one term): a read ranges over its own sums only."""
    extents = extents or {}
    if isinstance(node, ix.Read):
        return [(node, extents)]
    if isinstance(node, ix.Sum):
        extents = {**extents, node.index: node.extent}
    return [x for c in ix.children(node) for x in _scoped_reads(c, extents)]


def _bindings(extents: dict[str, int]) -> list[dict[str, int]]:
    """Every assignment of the indices of ``extents``."""
    out: list[dict[str, int]] = [{}]
    for index, extent in extents.items():
        out = [{**b, index: t} for b in out for t in range(extent)]
    return out


def _plain(offs: list[int]) -> bool:
    """Whether lanes at ``offs`` are consecutive elements: one plain load."""
    return offs == list(range(offs[0], offs[0] + len(offs)))
