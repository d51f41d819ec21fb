"""Lower a fixed-size indexed program (ir.indexed) to vectorized kernel IR.

One operation ``out[i, j] = body`` is computed block by block: a block is a
register tile of output positions evaluated together, and every reduction of the
body runs once for the whole block with one accumulator per position (unroll and
jam), so loads shared by positions are issued once and the FMAs of a block are
independent. One index is mapped onto SIMD lanes:

* an output dimension with unit stride (``C = A*B`` row-major: j), leaves that do not
  depend on it are broadcast; or
* the index of a reduction whose leaves have unit stride along it (``alpha = x'*y``,
  ``y = A*x`` with A row-major: k), finished by a horizontal sum.

An output whose rows are 2 or 4 elements long and follow one another, with the lanes
down its columns (``C(n x 4) = alpha*(A0 + A1)'*B + beta*C``: A0 and A1 run along n), is
computed as tiles transposed in registers (``_column_tiles``): w columns of a few vectors
per block, zipped into rows to be stored (``Zip``); the element-wise rest of the body
(beta*C) runs on the rows. Likewise any matrix with rows of 2 or 4 elements, one
after another, can be read down its columns: its rows loaded and unzipped (``Unzip``;
``y = A*x`` with A n x 4 and the lanes along n, as gcc vectorizes it).

Sums side by side in the body over one index and extent (``siblings``: the two products
of ``y = alpha*A*x + beta*B*x``) are reduced together, their terms in one loop, an
operand they share (x) loaded once per term for both: loaded per sum, a block of two
rows of A and B 4 x 64 f64 loaded x four times, six loads per four FMAs where one loop
takes nine per eight.

Extents that are not multiples of the vector length end with narrower vectors
(128-bit on AVX2; 256- and 128-bit on AVX-512) or a masked one — never a scalar tail
where a vector op fits.
Loops with few iterations are unrolled into straight-line code with constant
offsets; longer ones stay loops. A long row of vectors is a loop over blocks of
columns, with the broadcasts of the block's A elements hoisted out of it when they
fit in the registers the block leaves (what makes gcc's plain loops fast for
``C(4 x n) = A(4x4)*B(4 x n)``); else it stays straight-line code.

An output dimension exactly half a vector wide (4 f32 or 2 f64 columns on AVX2) can
instead hold two rows per register (``OpSchedule.pairs``): rows i and i+1 of C in the
two halves, a row of B duplicated into both halves, A[i, k] and A[i+1, k] splatted
within their halves from one load of the two rows — half the FMAs of one row per
128-bit vector (what gcc makes of the plain loops). An odd last row stays a 128-bit
vector, and two rows are one 256-bit access only where they are contiguous in memory
(else two 128-bit halves); on AVX-512, 4 f64 columns pair rows in 256-bit halves. An
output dimension a quarter of a vector wide (4 f32 columns on AVX-512) holds four rows
per register (``OpSchedule.quads``) the same way: a row of B in every quarter
(vbroadcastf32x4), A[i..i+3, k] splatted within the quarters from one load of four
contiguous rows of A (or, for longer rows, one permute of the four rows that one or two
vectors hold), the four rows of C stored at once — gcc's loops for
``C(n x 4) = A(n x 4)*B(4x4)`` on Zen 5, where transposing 16 rows of A and C through
two-source permutes ran half as fast. A sum on lanes over exactly half a vector pairs rows the
same way (``y = A*x``, A n x 4 f32: rows i and i+1 of A in one 256-bit load, x in both
halves); the rows' horizontal sums then come out of one transpose per eight rows. A
sum over a quarter of a vector holds four rows per vector too (A n x 4
f32 on AVX-512, four rows in one 512-bit load, x in every quarter), sixteen rows summed
and stored at once and fewer, a multiple of four, in one masked store.

Where the vector of each position is only a half or a quarter of a full one and a sum
runs along another index (C(4 x 4) = A(4 x n)*B(n x 4), x'*A*y with A n x 4), its terms
can instead go two or four at a time into the parts of full vectors
(``OpSchedule.folds``): rows k..k+3 of B in one 512-bit load, A[i, k..k+3] spread over
the quarters (``k.Spread``), and once the sum is done the parts folded together, half
onto half. Each FMA then does four terms of a row, not one, and each chain of
dependent FMAs is a quarter as long.

A small matrix updated in place (C = alpha*(A0 + A1)'*B + beta*C, 3 x 3) can instead be
held flat (``OpSchedule.flat``, ``transform.flat``): its elements in one or two vectors
in memory order, each operand a term reads permuted into the lanes that need it.

    y[i] = sum_k A[i,k] x[k]   (5x9 f64, vector k, block 4)
      ->  acc_0..3 = 0; for k in (0, 4, 8): acc_r = fma(load4(A[r*9+k], count), load4(x[k]), acc_r)
          y[r] = hsum(acc_r)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from ..errors import ScheduleError
from ..ir import indexed as ix
from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..ir.walk import names_used, nodes_of, rewrite, simplify, substitute
from ..runtime.signature import ARRAY, ArgSpec
from ..target.isa import Isa
from .flat import flat_applies, lower_flat
from .past_end import mark_past_end
from .prefetch_stores import L1_BYTES, prefetch_stores
from .share_loads import share_masked_loads
from .stores_as_ready import stores_as_ready
from .sum_lanes import batch_row_sums, index_offset


@dataclass(frozen=True)
class OpSchedule:
    """How one operation is computed: the index on lanes (None: scalar code), the block
    of output positions computed together (rows x vector chunks: the register tile), and
    the trip count up to which loops are fully unrolled, and the partial accumulators per
    reduction. Together they fix the loop order: blocks of outputs outside, every
    reduction inside a block, the lane index innermost (an output dimension, or a
    reduction finished by a horizontal sum)."""

    vector: str | None
    block: tuple[int, int] = (1, 1)
    unroll: int = 16
    #: Partial accumulators per position for each reduction: terms go round-robin to
    #: ``split`` independent chains, summed at the end, so a long reduction over a small
    #: block is not bound by the latency of one chain of FMAs.
    split: int = 1
    #: Two rows per full vector, one in each half (the vectorized output dimension, or
    #: the sums on lanes, half a vector wide); ``block[0]`` then counts rows, two per
    #: accumulator.
    pairs: bool = False
    #: The last lanes of a vectorized output dimension in one masked vector, the
    #: narrowest that holds them (7 of 8 f64 lanes as one AVX-512 vector), instead of
    #: exact narrower vectors and a masked one for the rest (4 + 3 of 4) (``chunks``).
    one_tail: bool = False
    #: Four rows per full vector, one in each quarter, where the vectorized output
    #: dimension or the sums on lanes are a quarter of a vector long (rows of 4 f32 on
    #: AVX-512). Of sums, as many rows at once as a vector has lanes, their sums stored
    #: as one vector; other rows one at a time.
    quads: bool = False
    #: The columns of a vectorized output dimension after its last exact vector (the
    #: ninth of a 9-wide f64 C on AVX-512, else a scalar column) computed as sums on
    #: lanes instead: each position a dot product along the reduction, summed across its
    #: lanes, the operand read down them at a stride (that column of B) gathered into
    #: vectors once for a block of rows (``BuildVector``). C = A*B 9 x 9 x 9 f64 on Zen 5:
    #: the ninth column as 18 FMAs on 512-bit vectors instead of 81 scalar ones.
    tail_sums: bool = False
    #: Where each position's vector is a half or a quarter of a full one (a row of 4 f32
    #: of C(4 x 4) = A(4 x n)*B(n x 4) on AVX-512), the terms of a sum not on lanes two
    #: or four at a time, one in each part of full vectors: rows k..k+3 of B in one
    #: 512-bit load, A[i, k..k+3] spread over the quarters (``k.Spread``); the parts
    #: added together once the sum is done, the terms past the last whole group on the
    #: narrow vector. Full vectors instead of a half or a quarter of one, and a quarter
    #: of the chain of dependent FMAs per accumulator.
    folds: bool = False
    #: A small matrix output held as one flat vector (or two), lane p its element at
    #: offset p, each operand a term reads permuted into the lanes that need it
    #: (``transform.flat``).
    flat: bool = False

    @property
    def rows_per_vector(self) -> int:
        return 4 if self.quads else 2 if self.pairs else 1


@dataclass(frozen=True)
class _Chunk:
    """A piece of the vectorized index: ``width`` lanes from ``start`` (an int, or a loop
    variable), ``count`` of them valid."""

    start: int | k.Expr
    width: int
    count: int

    @property
    def start_expr(self) -> k.Expr:
        return self.start if isinstance(self.start, k.Expr) else k.Const(self.start)

    @property
    def masked(self) -> bool:
        return self.count < self.width


@dataclass(frozen=True)
class _Pair:
    """Consecutive positions of an output dimension from ``start``, two in the low and
    high halves of each vector (``OpSchedule.pairs``) or four in its quarters
    (``OpSchedule.quads``)."""

    start: k.Expr
    rows: int = 2


def chunks(extent: int, widths: tuple[int, ...], one_tail: bool = False) -> list[_Chunk]:
    """Cover range(extent) with full vectors, then the rest with exact narrower vectors
    and the narrowest one that holds what is left, masked; with ``one_tail``, the whole
    rest in the narrowest vector that holds it, masked where it is not exact."""
    full = widths[0]
    out = [_Chunk(s, full, full) for s in range(0, extent - extent % full, full)]
    rest, start = extent % full, extent - extent % full
    if one_tail and rest:
        return [*out, _Chunk(start, min(w for w in widths if w >= rest), rest)]
    while rest:
        fits = [w for w in widths if w <= rest]
        exact = fits[0] if fits and fits[0] > 1 else None
        if exact:
            out.append(_Chunk(start, exact, exact))
            start, rest = start + exact, rest - exact
            continue
        w = min(x for x in widths if x >= rest)
        out.append(_Chunk(start, w, rest))
        start, rest = start + rest, 0
    return out


def _sum_pieces(pieces: list[_Chunk], masks: bool) -> list[_Chunk]:
    """``chunks`` of a sum on lanes, its leftover joined to accumulators it already has:
    the row then ends in one horizontal sum, taken for several rows at once (sum_lanes),
    not in a sum plus a scalar chain or a fold of two widths. With mask registers (one
    fast masked load) all the rest after the widest vectors is one masked vector of
    theirs (f64 7 as 4 + 3 of 4, not 4 + 2 + 1); else the last piece joins the
    narrowest vector before it (f32 4 + 1 as 4 + 4 with one lane, 8 + 2 as 8 + 8 with
    two), loaded with the moves it had (``Isa.plain_moves``)."""
    if len(pieces) < 2:
        return pieces
    if masks:  # the last piece may itself be masked at that width (f32 7 as 4 + 3 of 4)
        wide = [c for c in pieces if c.width == pieces[0].width and not c.masked]
        end = pieces[-1].start + pieces[-1].count
        rest = end - wide[-1].start - wide[-1].width
        return wide + ([_Chunk(end - rest, wide[0].width, rest)] if rest else [])
    last, narrowest = pieces[-1], min(c.width for c in pieces[:-1])
    if last.width >= narrowest:
        return pieces
    return [*pieces[:-1], _Chunk(last.start, narrowest, last.count)]


def _lane_pieces(extent: int, isa: Isa, dtype: str) -> list[_Chunk]:
    """The pieces a sum of ``extent`` terms on lanes is taken in (``_sum_pieces``)."""
    return _sum_pieces(chunks(extent, isa.widths(dtype)), isa.mask_registers)


def _chain_sets(pieces: list[_Chunk], split: int) -> dict[int, int]:
    """Per vector width of ``pieces``, the sets of partial accumulators a sum keeps: one
    per ``split`` chain, at most one per piece of that width."""
    widths = [c.width for c in pieces]
    return {w: max(1, min(split, widths.count(w))) for w in dict.fromkeys(widths)}


def accumulators(program: ix.Program, op: ix.Op, sched: OpSchedule, isa: Isa) -> int:
    """Accumulators ``op`` keeps per position of a block: ``split`` partial chains per
    reduction in its body, and for a sum on lanes one set of them per vector width its
    pieces take (as ``_Gen.reduce`` makes them: f64 7 on AVX2 is 4 + 2 + 1 lanes, the
    last joined to the 2, so two accumulators a row)."""
    sums = sums_of(op.body)
    if not sums:
        return sched.split
    return sum(sum(_chain_sets(_lane_pieces(s.extent, isa, program.dtype), sched.split)
                   .values()) if s.index == sched.vector else sched.split for s in sums)


# ----------------------------------------------------------------------------- addressing


@dataclass(frozen=True)
class _Storage:
    """Where an operand lives: a buffer with element strides, or a scalar variable."""

    buf: str
    rs: int
    cs: int
    scalar_var: k.Var | None = None

    def index(self, r: k.Expr, c: k.Expr) -> k.Expr:
        if isinstance(r, k.Const) and isinstance(c, k.Const):  # most, in unrolled code
            return k.Const(r.value * self.rs + c.value * self.cs, r.dtype)
        return r * self.rs + c * self.cs


def storages(program: ix.Program, specs: tuple[ArgSpec, ...]) -> dict[str, _Storage]:
    out = {}
    by_name = {s.name: s for s in specs}
    for o in program.operands:
        if o.temporary:
            out[o.name] = _Storage(o.name, o.cols, 1)
            continue
        s = by_name[o.name]
        if s.kind != ARRAY and not s.written:
            out[o.name] = _Storage(o.name, 0, 0, k.Var(o.name, program.dtype))
        elif s.kind != ARRAY:
            out[o.name] = _Storage(o.name, 0, 0)
        elif s.layout == "row":
            out[o.name] = _Storage(o.name, s.leading_dimension, 1)
        else:
            out[o.name] = _Storage(o.name, 1, s.leading_dimension)
    return out


# ----------------------------------------------------------------------------- generation


class _Gen:
    """Generates the statements of one operation under one schedule."""

    def __init__(self, program: ix.Program, op: ix.Op, sched: OpSchedule, isa: Isa,
                 store: dict[str, _Storage], prefix: str,
                 gathered_without: str | None = None, shared_splats: bool = True,
                 straight_rows: bool = False) -> None:
        self.p, self.op, self.s, self.isa, self.store = program, op, sched, isa, store
        self.share_splats = shared_splats  # ``build_module``'s
        #: a block of rows writes its vectors in straight-line code, never in a loop along
        #: the row (``writes_near_l1``)
        self.straight_rows = straight_rows
        self.dt = program.dtype
        self.prefix = prefix
        self.n = 0
        #: an output index: operands that do not depend on it may be read on the lanes
        #: at a stride, gathered (``OpSchedule.tail_sums``, for the rows of a block)
        self.gathered_without = gathered_without
        #: vectors made once per list of statements, by operand, what they cover (a
        #: chunk, or where four rows start) and the list that declares them: columns of
        #: operands read down their short rows (``read_column``), and four rows loaded
        #: for their permutes (``four_rows``)
        self.columns: dict[tuple[str, _Chunk | k.Expr, int],
                           tuple[list[k.Stmt], list[k.Expr]]] = {}
        #: sums whose terms went into the parts of vectors (``OpSchedule.folds``)
        self.folds = 0
        #: values of sums already reduced together with their siblings (``siblings``),
        #: for the positions the expression around them is being evaluated at
        self.reduced: dict[ix.Sum, list[k.Expr]] = {}

    def fresh(self, hint: str, lanes: int) -> k.Var:
        self.n += 1
        return k.Var(f"{self.prefix}{hint}{self.n}", self.dt, lanes)

    # values: per position, an Expr; ``ctx`` maps index -> Expr (scalar) or _Chunk (lanes)
    def value(self, node: ix.Node, ctxs: list[dict], out: list[k.Stmt]) -> list[k.Expr]:
        if isinstance(node, ix.Lit):
            return [k.Const(float(node.value), self.dt)] * len(ctxs)
        if isinstance(node, ix.Read):
            return [self.read(node, c, out) for c in ctxs]
        if isinstance(node, ix.Neg):
            return [self.combine("-", k.Const(0.0, self.dt), x)
                    for x in self.value(node.x, ctxs, out)]
        if isinstance(node, (ix.Add, ix.Mul)):
            together = [g for g in siblings(node) if g[0] not in self.reduced]
            if together:
                return self.value_with(node, together, ctxs, out)
            a, b = self.value(node.a, ctxs, out), self.value(node.b, ctxs, out)
            op = "+" if isinstance(node, ix.Add) else "*"
            return [self.combine(op, x, y) for x, y in zip(a, b, strict=True)]
        if isinstance(node, ix.Sum):
            if node in self.reduced:
                return self.reduced[node]
            return self.reduce([node], ctxs, out)[0]
        raise TypeError(f"cannot generate {type(node).__name__}")

    def value_with(self, node: ix.Node, together: list[list[ix.Sum]], ctxs: list[dict],
                   out: list[k.Stmt]) -> list[k.Expr]:
        """``node``'s values with each group of sibling sums in it (``together``)
        reduced first, the sums of a group in one loop."""
        saved = self.reduced
        self.reduced = {**saved, **{s: v for group in together
                                    for s, v in zip(group, self.reduce(group, ctxs, out),
                                                    strict=True)}}
        try:
            return self.value(node, ctxs, out)
        finally:
            self.reduced = saved

    def lanes_of(self, ctx: dict) -> int:
        chunk = next((v for v in ctx.values() if isinstance(v, _Chunk)), None)
        pair = next((v for v in ctx.values() if isinstance(v, _Pair)), None)
        return (pair.rows if pair else 1) * chunk.width if chunk else 1

    def named(self, e: k.Expr, out: list[k.Stmt]) -> k.Var:
        var = self.fresh("t", e.lanes)
        out.append(k.Decl(var, e))
        return var

    def read(self, r: ix.Read, ctx: dict, out: list[k.Stmt]) -> k.Expr:
        st = self.store[r.operand]
        if st.scalar_var is not None:
            return st.scalar_var
        idx: list[k.Expr] = []
        chunk, pos, pair = None, None, None
        for axis, i in enumerate(r.index):
            v = ctx[i] if isinstance(i, str) else k.Const(0)
            if isinstance(v, _Chunk):
                chunk, pos = v, axis
                v = v.start_expr
            elif isinstance(v, _Pair):
                if pair is not None:
                    raise ScheduleError(f"{r.operand} is indexed twice by the paired rows")
                pair, nrows = axis, v.rows
                v = v.start
            idx.append(v)
        if pair is not None:
            return self.read_pair(r, st, idx, pair, chunk, pos, nrows, out)
        index = st.index(idx[0], idx[1])
        if chunk is None or chunk.width == 1:  # one element, at any stride
            return k.Load(st.buf, index, self.dt)
        if (st.rs, st.cs)[pos] != 1:
            column = self.read_column(r, st, idx, pos, chunk, out)
            if column is not None:
                return column
            if self.gathered_without is not None and self.gathered_without not in r.index:
                stride = (st.rs, st.cs)[pos]
                zero = k.Const(0.0, self.dt)
                return k.BuildVector(tuple(
                    k.Load(st.buf, simplify(index + lane * stride), self.dt)
                    if lane < chunk.count else zero for lane in range(chunk.width)))
            raise ScheduleError(f"vectorizing {self.s.vector!r} needs unit stride in "
                                f"{r.operand}")
        count = k.Const(chunk.count) if chunk.masked else None
        return k.Load(st.buf, index, self.dt, chunk.width, count)

    def read_column(self, r: ix.Read, st: _Storage, idx: list[k.Expr], pos: int,
                    chunk: _Chunk, out: list[k.Stmt]) -> k.Expr | None:
        """A vector down a column of an operand whose rows are w elements long and
        follow one another (C of beta*C under ``_column_tiles``; A of ``y = A*x`` with A
        n x 4 and the lanes along n), its columns made once per list of statements: for
        w = 2 or 4, one of the w vectors that ``Unzip``s make of the ``chunk``'s rows;
        for other w, where at least ``PERMUTED_ROWS`` rows fit one full vector, one
        ``Permute`` of it each (A 3 x 3 f32 on AVX-512). None for any other read."""
        other = 1 - pos
        operand = self.p.operand(r.operand)
        w = (operand.rows, operand.cols)[other]
        # (on the lanes of a sum, the transposes would only feed horizontal sums: x'*A*y
        # with A 4 x 4 ran 0.24-0.34x as fast)
        if (self.s.vector not in self.op.dims or (st.rs, st.cs)[other] != 1
                or (st.rs, st.cs)[pos] != w or not isinstance(idx[other], k.Const)):
            return None
        unzipped = w in SHORT_ROWS and self.isa.has_op("unzip_even", self.dt, chunk.width)
        # (two rows per permute do not pay: y = A*x, A 3 x 3 f64, rows 0-1 so and row 2
        # scalar, ran 1.81 ns a call against 1.27 with sums along the rows on Zen 5)
        permuted = (w not in SHORT_ROWS and PERMUTED_ROWS <= chunk.count
                    and chunk.count * w < self.isa.lanes(self.dt)
                    and self.isa.has_op("permute", self.dt))
        if not (unzipped or permuted):
            return None
        cached = (r.operand, chunk, id(out))
        if cached not in self.columns:
            if unzipped:
                rows = [self.named(x, out) for x in _row_loads(st, pos, chunk, w, self.dt)]
                columns = unzip_rows(rows, lambda e: self.named(e, out))
            else:
                columns = self.permuted_columns(st, pos, chunk, w, out)
            # (the list is kept with its columns, so that its id is not reused)
            self.columns[cached] = (out, columns)
        return self.columns[cached][1][int(idx[other].value)]

    def permuted_columns(self, st: _Storage, pos: int, chunk: _Chunk, w: int,
                         out: list[k.Stmt]) -> list[k.Expr]:
        """The w columns of the ``chunk``'s rows of w elements, all in one masked load of
        a full vector, each named: column c is lanes c, c + w, c + 2w, ... of it, and a
        lane past the chunk's count the last one, which the masked load zeroed."""
        full = self.isa.lanes(self.dt)
        rows = self.named(k.Load(st.buf, _row_start(st, pos, chunk), self.dt, full,
                                 k.Const(chunk.count * w)), out)
        return [self.named(k.Permute(rows, tuple(c + q * w if q < chunk.count else full - 1
                                                 for q in range(chunk.width))), out)
                for c in range(w)]

    def read_pair(self, r: ix.Read, st: _Storage, idx: list[k.Expr], axis: int,
                  chunk: _Chunk | None, pos: int | None, nrows: int,
                  out: list[k.Stmt]) -> k.Expr:
        """A leaf read at two positions of the paired index (its ``axis``), one per half
        of the vector. Two rows of a chunk are one load where they are contiguous, else
        two half loads; one element per row is splatted within its half from a load of
        the rows' aligned group of half-vector width when that lies inside the operand
        (the same load serves the group's other elements), else broadcast from two
        scalar loads. Four rows (``nrows``, ``OpSchedule.quads``) are read as one load of
        contiguous rows: of a chunk, or of a quarter-vector group whose element is
        splatted within the quarters. Where the rows' elements lie side by side (a
        transposed or column-major operand), two or four rows take one load of them,
        spread over the parts (``k.Spread``)."""
        strides = (st.rs, st.cs)

        def at(row: int, other: k.Expr | None = None) -> k.Expr:
            j = list(idx)
            j[axis] = j[axis] + row
            if other is not None:
                j[1 - axis] = other
            return st.index(j[0], j[1])

        def two_rows(width: int, other: k.Expr | None = None) -> k.Expr:
            if strides[axis] == width:  # the second row starts where the first ends
                return k.Load(st.buf, at(0, other), self.dt, 2 * width)
            if not self.isa.has_op("halves", self.dt, 2 * width):
                raise ScheduleError(f"{self.isa.name} does not join two {self.dt} vectors "
                                    f"of {width} into one: {r.operand}'s rows are apart")
            return k.Halves(k.Load(st.buf, at(0, other), self.dt, width),
                            k.Load(st.buf, at(1, other), self.dt, width))

        if chunk is not None:
            if strides[pos] != 1:
                raise ScheduleError(f"vectorizing {self.s.vector!r} needs unit stride in "
                                    f"{r.operand}")
            if chunk.masked or chunk.width * nrows != self.isa.lanes(self.dt):
                raise ScheduleError(f"{nrows} rows per vector need a chunk of exactly "
                                    f"1/{nrows} of a vector")
            if nrows == 4:
                if strides[axis] != chunk.width:
                    raise ScheduleError(f"four rows per vector need the rows of "
                                        f"{r.operand} one after another")
                return k.Load(st.buf, at(0), self.dt, 4 * chunk.width)
            return two_rows(chunk.width)
        part = self.isa.lanes(self.dt) // nrows
        e, other = idx[1 - axis], 1 - axis
        operand = self.p.operand(r.operand)
        extent = (operand.rows, operand.cols)[other]
        if strides[other] == 1 and isinstance(e, k.Const) and isinstance(r.index[other], str):
            first = int(e.value) - int(e.value) % part
            if (first + part <= extent and nrows == 4 and strides[axis] == part
                    and self.isa.has_op(f"quarter_splat{int(e.value) - first}", self.dt,
                                        4 * part)):
                # four rows of A one after another: one load, splatted within quarters
                # (vpermilps: f32 only; AVX-512 has no such splat of f64 pairs)
                return k.HalfSplat(k.Load(st.buf, at(0, k.Const(first)), self.dt, 4 * part),
                                   int(e.value) - first, 4)
            if (first + part <= extent and nrows == 2
                    and self.isa.has_op(f"half_splat{int(e.value) - first}", self.dt,
                                        2 * part)):
                return k.HalfSplat(two_rows(part, k.Const(first)), int(e.value) - first)
        if strides[axis] == 1 and self.isa.has_op(f"spread{nrows}", self.dt):
            # the rows' elements side by side (A' of a row-major A): one load of them,
            # spread over the parts
            return k.Spread(k.Load(st.buf, at(0), self.dt, nrows), self.isa.lanes(self.dt))
        if nrows == 4 and (spread := self.four_rows(r, st, idx, axis, out)) is not None:
            return spread
        if nrows == 4:
            raise ScheduleError(f"four rows per vector read {r.operand} one element per row "
                                "only from rows of a quarter vector one after another, "
                                "from elements of the four rows side by side, or from "
                                "rows that two vectors hold")
        if part * itemsize(self.dt) > 16:
            # (two broadcasts joined into a 512-bit vector: C = alpha*(A0 + A1)'*B + beta*C,
            # 4 x 8 x 4 f64, ran 0.65x as fast on Zen 5 as four rows per 256-bit FMA)
            raise ScheduleError(f"two rows per 512-bit vector read {r.operand} one element "
                                "per row only from a load of both rows")
        return k.Halves(k.Broadcast(k.Load(st.buf, at(0), self.dt), part),
                        k.Broadcast(k.Load(st.buf, at(1), self.dt), part))

    def four_rows(self, r: ix.Read, st: _Storage, idx: list[k.Expr], axis: int,
                  out: list[k.Stmt]) -> k.Expr | None:
        """One element of each of four rows, each splatted in its quarter, where the rows
        follow one another and all four fit two full vectors: the rows loaded once per
        list of statements (one or two vectors, the last masked), each element one
        ``Permute`` of them (A 4 x 8 f32 of C = A*B 4 x 8 x 4: A[0..3, k] by one
        vpermt2ps; gcc's loops do the same). None where they do not fit."""
        other, lanes = 1 - axis, self.isa.lanes(self.dt)
        operand = self.p.operand(r.operand)
        extent = (operand.rows, operand.cols)[other]
        stride = (st.rs, st.cs)[axis]
        span = 3 * stride + extent  # the elements from the first row's to the last's end
        if ((st.rs, st.cs)[other] != 1 or stride < extent or span > 2 * lanes
                or not isinstance(idx[other], k.Const)
                or not self.isa.has_op("permute2", self.dt)):
            return None
        first = [*idx]
        first[other] = k.Const(0)
        start = st.index(first[0], first[1])
        cached = (r.operand, start, id(out))
        if cached not in self.columns:
            loads = [k.Load(st.buf, simplify(start + q * lanes), self.dt, lanes,
                            None if n == lanes else k.Const(n))
                     for q, n in enumerate((min(span, lanes), span - lanes)) if n > 0]
            self.columns[cached] = (out, [self.named(x, out) for x in loads])
        vectors = self.columns[cached][1]
        element = int(idx[other].value)
        lanes_from = tuple(q * stride + element for q in range(4) for _ in range(lanes // 4))
        return k.Permute(vectors[0], lanes_from, vectors[1] if len(vectors) > 1 else None)

    def combine(self, op: str, a: k.Expr, b: k.Expr) -> k.Expr:
        lanes = max(a.lanes, b.lanes)
        if isinstance(a, k.Const) and isinstance(b, k.Const):
            value = {"+": a.value + b.value, "-": a.value - b.value, "*": a.value * b.value}
            return k.Const(value[op], self.dt)
        if op == "+" and isinstance(a, k.Const) and a.value == 0:
            return self.widen(b, lanes)
        if op in "+-" and isinstance(b, k.Const) and b.value == 0:
            return self.widen(a, lanes)
        # a*b + c and c + a*b become one fused multiply-add
        if op == "+" and isinstance(b, k.Bin) and b.op == "*" and lanes == b.lanes:
            a, b = b, a
        if op == "+" and isinstance(a, k.Bin) and a.op == "*" and lanes == a.lanes:
            return k.Fma(a.a, a.b, self.widen(b, lanes))
        if op == "*" and isinstance(a, k.Const) and a.value == 1:
            return b
        if op == "*" and isinstance(b, k.Const) and b.value == 1:
            return a
        return k.Bin(op, self.widen(a, lanes), self.widen(b, lanes))

    def widen(self, e: k.Expr, lanes: int) -> k.Expr:
        if e.lanes == lanes:
            return e
        if e.lanes > 1 and 2 * e.lanes == lanes:  # a row of one half, for both paired rows
            loaded = isinstance(e, k.Load) and e.count is None
            if not self.isa.has_op("dup_load" if loaded else "halves", self.dt, lanes):
                raise ScheduleError(f"{self.isa.name} does not put one {self.dt} vector "
                                    "in both halves of a wider one")
            return k.Halves(e, e)
        if e.lanes > 1 and 4 * e.lanes == lanes:  # a row of one quarter, for four rows
            if not (isinstance(e, k.Load) and e.count is None
                    and self.isa.has_op("quad_load", self.dt, lanes)):
                # (a loaded row is in every quarter with one vbroadcastf32x4; a row
                # computed on a quarter-wide vector would take shuffles to get there)
                raise ScheduleError("four rows per vector take the other factor of their "
                                    "sums only as it is loaded into every quarter")
            return k.quartered(e)
        return k.Broadcast(e, lanes)

    def reduce(self, nodes: list[ix.Sum], ctxs: list[dict], out: list[k.Stmt]
               ) -> list[list[k.Expr]]:
        """The values of ``nodes``, sums over one index and extent (one sum, or siblings:
        see ``siblings``), at every position of ``ctxs``, their terms in one loop: the
        operands they share (x of ``alpha*A*x + beta*B*x``) loaded once per term."""
        node = nodes[0]
        vectorized = node.index == self.s.vector
        pieces = (_lane_pieces(node.extent, self.isa, self.dt) if vectorized
                  else [_Chunk(i, 1, 1) for i in range(node.extent)])
        # positions computed together: one each, or two or four in one vector
        units = (self.paired(ctxs) if vectorized and (self.s.pairs or self.s.quads)
                 else [(c, (p,)) for p, c in enumerate(ctxs)])
        if units and len(units[0][1]) == 4:  # the whole sum in one quarter of a vector
            pieces = [_Chunk(0, node.extent, node.extent)]
        if vectorized and not all(_zero_padded(n.body, n.index) for n in nodes):
            raise ScheduleError(f"sum over {node.index!r} cannot run on lanes: a term does "
                                "not vanish on masked lanes")
        parts = 1 if vectorized else self.fold_parts(node, ctxs)
        if parts > 1:  # groups of ``parts`` terms, then the terms left one at a time
            whole = node.extent - node.extent % parts
            pieces = [*(_Chunk(t, parts, parts) for t in range(0, whole, parts)),
                      *(_Chunk(t, 1, 1) for t in range(whole, node.extent))]
        results: list[list[k.Expr]] = [[k.Const(0.0, self.dt)] * len(ctxs) for _ in nodes]
        # one accumulator set per vector width used (full vectors, then the leftover)
        by_width: dict[int, list[_Chunk]] = {}
        for c in pieces:
            by_width.setdefault(c.width, []).append(c)
        nsets = _chain_sets(pieces, self.s.split)
        for width, group in by_width.items():
            folded = width if parts > 1 and width > 1 else 1
            lanes = [len(ps) * width if vectorized else folded * self.lanes_of(c)
                     for c, ps in units]
            sets = [[[self.fresh("acc", n) for n in lanes] for _ in range(nsets[width])]
                    for _ in nodes]
            self.accumulate(nodes, [c for c, _ in units], group, sets, vectorized, out,
                            folded)
            for node_sets, node_results in zip(sets, results, strict=True):
                self.finish(node_sets, units, lanes, folded, vectorized and width > 1,
                            node_results, out)
        return results

    def finish(self, sets: list[list[k.Var]], units: list[tuple[dict, tuple[int, ...]]],
               lanes: list[int], folded: int, on_lanes: bool, results: list[k.Expr],
               out: list[k.Stmt]) -> None:
        """One sum's accumulator ``sets`` of one width added into its ``results`` per
        position: the partial chains summed pairwise, the parts of folded terms added, the
        halves or quarters of paired rows taken apart, the lanes of a sum on them reduced
        (``on_lanes``)."""
        for u, (_, positions) in enumerate(units):
            partial: list[k.Expr] = [accs[u] for accs in sets]
            while len(partial) > 1:  # a pairwise sum of the partial chains
                partial = [k.Bin("+", *partial[i:i + 2]) if i + 1 < len(partial)
                           else partial[i] for i in range(0, len(partial), 2)]
            acc = partial[0]
            while acc.lanes > lanes[u] // folded:  # the parts of folded terms added
                acc = self.named(acc, out)
                acc = k.Bin("+", k.Half(acc, 0), k.Half(acc, 1))
            for h, p in enumerate(positions):
                part = (k.Half(acc, h) if len(positions) == 2
                        else k.Half(k.Half(acc, h // 2), h % 2) if len(positions) == 4
                        else acc)
                total = k.Reduce(part) if on_lanes else part
                results[p] = self.combine("+", results[p], total)

    def fold_parts(self, node: ix.Sum, ctxs: list[dict]) -> int:
        """How many terms of ``node`` (a sum not on lanes) go into the parts of each
        accumulator (``OpSchedule.folds``): 2 or 4 where every position's vector is one
        exact chunk a half or a quarter of a full vector wide and the sum has that many
        terms; else 1."""
        if not self.s.folds or not ctxs:
            return 1
        widths = set()
        for c in ctxs:
            pieces = [v for v in c.values() if isinstance(v, (_Chunk, _Pair))]
            if len(pieces) != 1 or not isinstance(pieces[0], _Chunk) or pieces[0].masked:
                return 1
            widths.add(pieces[0].width)
        lanes = self.isa.lanes(self.dt)
        width = widths.pop()
        parts = lanes // width if not widths and lanes % width == 0 else 1
        if parts not in (2, 4) or node.extent < parts or not all(
                self.isa.has_op(h, self.dt, n) for n in (lanes, lanes // 2)[:parts // 2]
                for h in ("half_lo", "half_hi")):
            return 1
        self.folds += 1
        return parts

    def paired(self, ctxs: list[dict]) -> list[tuple[dict, tuple[int, ...]]]:
        """``ctxs`` of a sum on lanes as (context, positions) units: two positions next to
        each other along an output dimension share one, their rows of the sum in the two
        halves of full vectors (``OpSchedule.pairs``; ``_check_sum_pairs`` has made sure
        the sum is half a vector long); a position left over keeps its own. With
        ``OpSchedule.quads``, four share one, in runs of as many rows as a vector has
        lanes: those rows' sums are then one vector (``SumLanes``), never a row alone."""
        if self.s.quads:
            return self.quartered(ctxs)
        units: list[tuple[dict, tuple[int, ...]]] = []
        taken: set[int] = set()
        for p, c in enumerate(ctxs):
            if p in taken:
                continue
            for q in range(p + 1, len(ctxs)):
                dim = None if q in taken else _next_along(c, ctxs[q], self.op.dims)
                if dim is not None:
                    taken.add(q)
                    units.append(({**c, dim: _Pair(c[dim])}, (p, q)))
                    break
            else:
                units.append((c, (p,)))
        return units

    def quartered(self, ctxs: list[dict]) -> list[tuple[dict, tuple[int, ...]]]:
        """Units of four positions for ``OpSchedule.quads`` where ``ctxs`` are positions
        one after another along the output's contiguous dimension, as many as a vector
        has lanes (their sums one vector) or, with mask registers, a multiple of four
        (the last ones one masked vector); else every position one each."""
        lanes = self.isa.lanes(self.dt)
        st, out = self.store[self.op.out], self.p.operand(self.op.out)
        dim = (self.op.dims[0] if st.rs == 1 and out.rows > 1
               else self.op.dims[1] if st.cs == 1 and out.cols > 1 else None)
        singles = [(c, (p,)) for p, c in enumerate(ctxs)]
        whole = len(ctxs) % (4 if self.isa.mask_registers else lanes) == 0
        if dim is None or not whole or any(
                _next_along(ctxs[p], ctxs[p + 1], self.op.dims) != dim
                for p in range(len(ctxs) - 1)):
            return singles
        return [({**ctxs[p], dim: _Pair(ctxs[p][dim], 4)}, (p, p + 1, p + 2, p + 3))
                for p in range(0, len(ctxs), 4)]

    def step(self, nodes: list[ix.Sum], ctxs: list[dict], value: k.Expr | _Chunk,
             accs: list[list[k.Var]], body: list[k.Stmt], first: bool = False) -> None:
        """One term of each sum of ``nodes`` (over one index) for every position of the
        block, into that sum's ``accs``; the ``first`` term declares the accumulators (a
        product, not an FMA onto zero: no zeroing, and the C compiler need not copy a
        shared operand that a destructive FMA would overwrite). An operand value shared
        by several positions or sums (a row of B across the rows of a C tile, a
        broadcast element of A across its vectors, x across A*x and B*x) is loaded once
        into a variable, just before its first use: the register tile of a GEMM
        micro-kernel."""
        inner = [{**c, nodes[0].index: value} for c in ctxs]
        # per sum, (acc, x, y): acc += x*y, or (acc, x, None): acc += x
        terms: list[list[tuple[k.Var, k.Expr, k.Expr | None]]] = []
        for node, node_accs in zip(nodes, accs, strict=True):
            if isinstance(node.body, ix.Mul):
                a = self.value(node.body.a, inner, body)
                b = self.value(node.body.b, inner, body)
                terms.append([(acc, self.widen(x, acc.lanes), self.widen(y, acc.lanes))
                              for acc, x, y in zip(node_accs, a, b, strict=True)])
            else:
                terms.append([(acc, self.widen(x, acc.lanes), None) for acc, x
                              in zip(node_accs, self.value(node.body, inner, body), strict=True)])
        pairs = iter(self.shared_splats([(x, y) for sum_terms in terms
                                         for _, x, y in sum_terms if y is not None], body))
        terms = [[(acc, *next(pairs)) if y is not None else (acc, x, y)
                  for acc, x, y in sum_terms] for sum_terms in terms]
        uses: Counter[k.Expr] = Counter()
        tiled: set[k.Expr] = set()  # shared by the positions of one sum: a register tile
        for sum_terms in terms:
            own = Counter(e for _, x, y in sum_terms if y is not None for e in (x, y))
            tiled |= {e for e, n in own.items() if n > 1}
            uses += own
        named: dict[k.Expr, k.Expr] = {}

        def operand(e: k.Expr) -> k.Expr:
            if uses[e] < 2 or isinstance(e, (k.Var, k.Const)) or _constant(e):
                return e
            if e not in named:
                var = self.fresh("v", e.lanes)
                # a tile's shared load is kept in a register; one shared by sibling sums
                # only (x of A*x and B*x in a block of one row) gcc may keep for the next
                # rows too, as it does with the loads of separate sums
                shared_load = isinstance(e, k.Load) and e.lanes > 1 and e in tiled
                body.append(k.Decl(var, e, in_register=shared_load))
                named[e] = var
            return named[e]

        for acc, x, y in (term for sum_terms in terms for term in sum_terms):
            if y is None:
                body.append(k.Decl(acc, x) if first else k.Assign(acc, k.Bin("+", acc, x)))
                continue
            x, y = operand(x), operand(y)
            body.append(k.Decl(acc, k.Bin("*", x, y)) if first
                        else k.Assign(acc, k.Fma(x, y, acc)))

    def shared_splats(self, pairs: list[tuple[k.Expr, k.Expr]], body: list[k.Stmt]
                      ) -> list[tuple[k.Expr, k.Expr]]:
        """``pairs`` (the factors of one term for each position) with a scalar splat at
        several widths (a row of 10 f64 as vectors of 8 and 2 lanes) splatted once, at
        the widest, into a variable, the narrower ones its low part (a free cast): one
        load, not one per width. C = A*B 10 x 10 x 10 f64 on Zen 5, written so by hand:
        23.6-24.1 ns against 27.3-27.5 with a broadcast from memory in each FMA."""
        widths: dict[k.Expr, list[int]] = {}  # of the splats of each value
        for e in (e for pair in pairs for e in pair):
            if isinstance(e, k.Broadcast) and not _constant(e):
                widths.setdefault(e.value, []).append(e.lanes)
        shared: dict[k.Expr, k.Var] = {}

        def splat(e: k.Expr) -> k.Expr:
            uses = widths.get(e.value, []) if isinstance(e, k.Broadcast) else []
            w = max(uses, default=0)
            if not self.share_splats or not uses or min(uses) == w or uses.count(w) > 1:
                # one width only; or a wide splat several FMAs share, which is a register
                # already (4 x 4 x 100 f32 in blocks of 2 x 4: sharing it with the 4-lane
                # leftover tipped the model off blocks of 4 x 3, 0.93x as fast on Zen 5)
                return e
            lanes = w
            while lanes > e.lanes:
                if not self.isa.has_op("half_lo", self.dt, lanes):
                    return e
                lanes //= 2
            if e.value not in shared:
                shared[e.value] = self.fresh("s", w)
                body.append(k.Decl(shared[e.value], k.Broadcast(e.value, w)))
            out: k.Expr = shared[e.value]
            while out.lanes > e.lanes:
                out = k.Half(out, 0)
            return out

        return [(splat(x), splat(y)) for x, y in pairs]

    def accumulate(self, nodes: list[ix.Sum], ctxs: list[dict], group: list[_Chunk],
                   sets: list[list[list[k.Var]]], vectorized: bool, out: list[k.Stmt],
                   folded: int = 1) -> None:
        """Terms of ``group`` (pieces of one width) of each sum of ``nodes`` into its
        accumulator ``sets``, term t into set t % len(sets): the first term of each set
        declares it, the others follow as straight-line code, or as a loop whose body
        holds one term per set when there are many full pieces. ``folded``: each piece is
        that many terms, one per part of the accumulators (``OpSchedule.folds``)."""
        width = group[0].width
        nsets = len(sets[0])

        def piece(c: _Chunk, start: k.Expr | None = None) -> k.Expr | _Chunk | _Pair:
            first = c.start_expr if start is None else start
            if vectorized:
                return c if start is None else _Chunk(start, width, width)
            return _Pair(first, folded) if folded > 1 else first

        def term(t: int) -> list[list[k.Var]]:  # every sum's set t
            return [node_sets[t] for node_sets in sets]

        for t in range(nsets):
            self.step(nodes, ctxs, piece(group[t]), term(t), out, first=True)
        rest = group[nsets:]
        uniform = bool(rest) and not any(c.masked or c.width != width for c in rest)
        looped = ((vectorized or folded > 1) and uniform and len(rest) > self.s.unroll // width
                  or (not vectorized and folded == 1 and len(rest) > self.s.unroll))
        rounds = len(rest) // nsets if looped else 0
        if rounds > 1:
            # a loop over full vectors (or scalars); chunk starts become a loop variable
            var = k.Var(f"{self.prefix}{nodes[0].index}")
            body: list[k.Stmt] = []
            for n in range(nsets):
                self.step(nodes, ctxs, piece(rest[n], var + n * width), term(n), body)
            first = rest[0].start
            out.append(k.For(var, k.Const(first), k.Const(first + rounds * nsets * width),
                             nsets * width, tuple(body)))
            rest = rest[rounds * nsets:]
        for t, c in enumerate(rest):
            self.step(nodes, ctxs, piece(c), term(t % nsets), out)


def _next_along(c: dict, d: dict, dims: tuple[str, str]) -> str | None:
    """The output dimension along which position ``d`` is the one after ``c`` (the other
    indices equal), or None."""
    if c.keys() != d.keys() or any(isinstance(v, (_Chunk, _Pair)) for v in (*c.values(),
                                                                            *d.values())):
        return None
    differ = [i for i in c if c[i] != d[i]]
    if len(differ) == 1 and differ[0] in dims and index_offset(d[differ[0]], c[differ[0]]) == 1:
        return differ[0]
    return None


def _constant(e: k.Expr) -> bool:
    """A value the C compiler materialises for free (a splat of a constant)."""
    return isinstance(e, k.Broadcast) and isinstance(e.value, k.Const)


def _zero_padded(n: ix.Node, index: str) -> bool:
    """True when every additive term of ``n`` reads something indexed by ``index``
    (so zeros loaded on masked lanes make the whole term zero)."""
    if isinstance(n, ix.Read):
        return index in n.index
    if isinstance(n, ix.Mul):
        return _zero_padded(n.a, index) or _zero_padded(n.b, index)
    if isinstance(n, ix.Add):
        return _zero_padded(n.a, index) and _zero_padded(n.b, index)
    if isinstance(n, ix.Neg):
        return _zero_padded(n.x, index)
    if isinstance(n, ix.Sum):
        return _zero_padded(n.body, index)
    return False


def _positions(extent: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, extent, step):
        yield start, min(step, extent - start)


def lower_op(program: ix.Program, op: ix.Op, sched: OpSchedule, isa: Isa,
             store: dict[str, _Storage], prefix: str, shared_splats: bool = True,
             straight_rows: bool = False) -> list[k.Stmt]:
    """Statements computing one operation (``shared_splats``: as for ``build_module``;
    ``straight_rows``: blocks of rows in straight-line code, see ``writes_near_l1``)."""
    if sched.folds and (sched.pairs or sched.quads or sched.one_tail or sched.tail_sums):
        raise ScheduleError("terms folded into the parts of vectors take the whole vector; "
                            "it holds no rows, masked tail or columns summed on lanes")
    gen = _Gen(program, op, sched, isa, store, prefix, shared_splats=shared_splats,
               straight_rows=straight_rows)
    if sched.flat:
        if sched != OpSchedule(sched.vector, flat=True):
            raise ScheduleError("a flat output has no blocks, rows per vector, tails or "
                                "partial sums")
        return lower_flat(gen, program, op, isa, store)
    stmts = _lower_op(gen, program, op, sched, isa, store, prefix)
    if sched.folds and not gen.folds:
        raise ScheduleError(f"no sum of {op.out} has terms to fold into the parts of a "
                            "vector: its vectors are not a half or a quarter of one")
    return stmts


def _lower_op(gen: _Gen, program: ix.Program, op: ix.Op, sched: OpSchedule, isa: Isa,
              store: dict[str, _Storage], prefix: str) -> list[k.Stmt]:
    out = program.operand(op.out)
    di, dj = op.dims
    extent = {di: out.rows, dj: out.cols}
    st = store[op.out]
    v = sched.vector
    stmts: list[k.Stmt] = []
    if v in extent:
        u = dj if v == di else di
        if (st.rs, st.cs)[op.dims.index(v)] != 1 and st.scalar_var is None:
            if sched.one_tail or sched.tail_sums:
                tail = "one masked tail" if sched.one_tail else "columns summed on lanes"
                raise ScheduleError(f"{tail} needs {op.out} contiguous along {v!r}")
            return _column_tiles(gen, op, st, v, u, extent)
        vchunks = chunks(extent[v], isa.widths(program.dtype), sched.one_tail)
        bu, bv = sched.block
        if sched.tail_sums:
            if sched.one_tail or sched.pairs or sched.quads:
                raise ScheduleError("columns summed on lanes are the tail; there is no "
                                    "other to mask or to hold rows in")
            exact = _exact_vectors(vchunks)
            if exact in (0, len(vchunks)):
                raise ScheduleError(f"no columns of {op.out} after exact vectors to sum "
                                    "on lanes")
            vchunks, tail_start = vchunks[:exact], vchunks[exact].start
        if sched.pairs or sched.quads:
            per = sched.rows_per_vector
            if sched.pairs and sched.quads:
                raise ScheduleError("rows are held in pairs or in quads, not both")
            if sched.one_tail:
                held = "pairs" if sched.pairs else "quads"
                raise ScheduleError(f"rows held in {held} have no tail to mask")
            _check_pairs(program, isa, extent[v], st, op.dims.index(v), per)
            _blocks_along(extent[u], bu, sched.unroll, k.Var(f"{prefix}{u}"),
                          lambda u0, un, body: _pair_block(gen, op, st, u, v, u0, un, body,
                                                           per),
                          stmts)
            return stmts

        lanes = vchunks[0].width
        chains = sched.split * max(1, len(sums_of(op.body)))
        # leading groups of bv full vectors: a loop over them when there are many
        looped = 0
        while (looped + 1) * bv <= len(vchunks) and all(
                not c.masked and c.width == lanes
                for c in vchunks[looped * bv:(looped + 1) * bv]):
            looped += 1
        if looped <= max(1, sched.unroll // (bv * lanes)):
            looped = 0

        def group(u0: k.Expr, un: int, chunk_group: list[_Chunk], body: list[k.Stmt],
                  straight: bool = False) -> None:
            ctxs = [{u: u0 + a, v: c} for a in range(un) for c in chunk_group]
            values = gen.value(op.body, ctxs, body)
            for ctx, val in zip(ctxs, values, strict=True):
                c = ctx[v]
                r, col = (c.start_expr if x is c else x for x in (ctx[di], ctx[dj]))
                count = k.Const(c.count) if c.masked else None
                body.append(k.Store(st.buf, st.index(r, col), gen.widen(val, c.width),
                                    count))
            if straight:
                # the next block of straight-line code starts afresh: the C compiler
                # would reuse this block's loads there and keep them live (spilled)
                body.append(k.Barrier())

        def block(u0: k.Expr, un: int, body: list[k.Stmt]) -> None:
            hoisted = None
            if looped:
                # the block's vectors in a loop with its broadcasts hoisted out of it,
                # if they fit in the registers the block leaves (else straight-line
                # code: a loop that broadcasts every element of A again per iteration
                # is slower, and gcc spills the addresses of the broadcasts)
                var = k.Var(f"{prefix}{v}")
                inner: list[k.Stmt] = []
                group(u0, un, [_Chunk(var + b * lanes, lanes, lanes) for b in range(bv)],
                      inner)
            straight = isinstance(u0, k.Const)  # not in a loop over blocks of rows
            tail: list[k.Stmt] = []  # the vectors after the looped groups
            for c0 in range(looped * bv, len(vchunks), bv):
                group(u0, un, vchunks[c0:c0 + bv], tail, straight)
            if looped and not gen.straight_rows:
                spare = isa.registers - block_registers(un, bv, chains)
                hoisted = _hoist_broadcasts(gen, inner, var, spare, tail)
            if hoisted is not None:
                decls, inner, tail = hoisted
                body += decls
            if hoisted is not None or looped * bv > LONG_ROW_VECTORS:
                body.append(k.For(var, k.Const(0), k.Const(looped * bv * lanes), bv * lanes,
                                  tuple(inner)))
            else:
                for c0 in range(0, looped * bv, bv):
                    group(u0, un, vchunks[c0:c0 + bv], body, straight)
            body += tail
            if straight and hoisted is not None and not tail:
                # gcc unrolls a loop of few trips, and its loads of B are then those of
                # the next block's loop: kept live from one to the next, and spilled
                # (unless ``_shared_fit`` finds that they fit)
                body.append(k.Barrier())

        row = k.Var(f"{prefix}{u}")
        _blocks_along(extent[u], bu, sched.unroll, row, block, stmts)
        spare = isa.registers - block_registers(bu, bv, chains)
        if _shared_fit(stmts, spare):
            stmts = [s for s in stmts if not isinstance(s, k.Barrier)]
        stmts = [_reload_per_iteration(s, spare, isa.registers)
                 if isinstance(s, k.For) and s.var == row
                 else s for s in stmts]
        if sched.tail_sums:
            stmts += _tail_sums(gen, st, u, v, extent, tail_start)
        return stmts
    # scalar outputs per position (the lanes, if any, run along a reduction)
    if sched.pairs and sched.quads:
        raise ScheduleError("rows are held in pairs or in quads, not both")
    if sched.pairs:
        _check_sum_pairs(program, op, isa, v)
    if sched.quads:
        _check_sum_quads(program, op, isa, v)
    if st.scalar_var is not None:
        raise ScheduleError(f"{op.out} is an input scalar; it cannot be assigned")
    bu, bv = sched.block

    def rows(i0: k.Expr, iN: int, body: list[k.Stmt]) -> None:
        def block(j0: k.Expr, jN: int, body: list[k.Stmt]) -> None:
            ctxs = [{di: i0 + a, dj: j0 + b} for a in range(iN) for b in range(jN)]
            values = gen.value(op.body, ctxs, body)
            for ctx, val in zip(ctxs, values, strict=True):
                body.append(k.Store(st.buf, st.index(ctx[di], ctx[dj]), val))

        # many blocks along the row in a loop, as blocks of rows are: unrolled, a
        # 100 x 100 output in blocks of 6 x 2 was 10,000 statements (the generic
        # target's C = alpha*A*B + beta*C 100 x 5 x 100 f64: 10,025 lines of C, each
        # candidate schedule built and modelled in 75 ms)
        _blocks_along(extent[dj], bv, sched.unroll, k.Var(f"{prefix}{dj}"), block, body)

    _blocks_along(extent[di], bu, sched.unroll, k.Var(f"{prefix}{di}"), rows, stmts)
    return stmts


def _exact_vectors(pieces: list[_Chunk]) -> int:
    """How many of ``pieces`` (``chunks``) are whole vectors before the first scalar or
    masked one: what ``OpSchedule.tail_sums`` keeps on vectors."""
    exact = 0
    while exact < len(pieces) and pieces[exact].width > 1 and not pieces[exact].masked:
        exact += 1
    return exact


def _tail_sums(gen: _Gen, st: _Storage, u: str, v: str, extent: dict[str, int],
               start: int) -> list[k.Stmt]:
    """Columns ``start`` and on of the output dimension ``v`` as sums on lanes
    (``OpSchedule.tail_sums``): position by position, in blocks of rows, with the lanes
    along the reduction and operands that do not depend on the row gathered."""
    op = gen.op
    indices = {s.index for s in sums_of(op.body)}
    if len(indices) != 1:
        raise ScheduleError("columns summed on lanes need exactly one reduction index")
    sched = replace(gen.s, vector=indices.pop(), tail_sums=False)
    tail = _Gen(gen.p, op, sched, gen.isa, gen.store, gen.prefix, gathered_without=u,
                shared_splats=gen.share_splats)
    tail.n = gen.n  # names go on from the vectors' code
    di, dj = op.dims

    def rows(u0: k.Expr, un: int, body: list[k.Stmt]) -> None:
        ctxs = [{u: u0 + a, v: k.Const(j)} for a in range(un) for j in range(start, extent[v])]
        for ctx, val in zip(ctxs, tail.value(op.body, ctxs, body), strict=True):
            body.append(k.Store(st.buf, st.index(ctx[di], ctx[dj]), val))

    stmts: list[k.Stmt] = []
    _blocks_along(extent[u], sched.block[0], sched.unroll, k.Var(f"{gen.prefix}{u}"), rows,
                  stmts)
    return stmts


#: The fewest rows a ``Permute`` of their columns out of one vector (other row lengths than
#: ``SHORT_ROWS``) is worth.
PERMUTED_ROWS = 3

#: Row lengths that tiles transposed in registers take: log2(w) rounds of Zips. With
#: three rounds (8 x 8 f64 on AVX-512) C = A*B ran 0.6x as fast as broadcasting A.
SHORT_ROWS = (2, 4)


def _row_counts(chunk: _Chunk, w: int) -> list[int]:
    """Valid elements of each of the w vectors that hold ``chunk.count`` rows of w
    elements one after another."""
    return [max(0, min(chunk.width, chunk.count * w - q * chunk.width)) for q in range(w)]


def _row_start(st: _Storage, pos: int, chunk: _Chunk) -> k.Expr:
    """Where the ``chunk``'s first row starts, its index on axis ``pos`` of ``st``."""
    return st.index(*(chunk.start_expr if a == pos else k.Const(0) for a in (0, 1)))


def _row_loads(st: _Storage, pos: int, chunk: _Chunk, w: int, dtype: str) -> list[k.Expr]:
    """The ``chunk``'s rows of w elements, one after another in ``st``: w vectors of its
    width (the last ones partial or zero past a masked leftover), or w scalars for a
    chunk one element wide."""
    start = _row_start(st, pos, chunk)
    if chunk.width == 1:
        return [k.Load(st.buf, simplify(start + q), dtype) for q in range(w)]
    return [k.Load(st.buf, simplify(start + q * chunk.width), dtype, chunk.width,
                   None if n == chunk.width else k.Const(n))
            if n else k.Broadcast(k.Const(0.0, dtype), chunk.width)
            for q, n in enumerate(_row_counts(chunk, w))]


def zip_rows(columns: Sequence[k.Expr], emit: Callable[[k.Expr], k.Expr]) -> list[k.Expr]:
    """The w (2, 4, 8, ...) ``columns`` of a tile, each a vector down the rows, as w
    vectors holding its rows one after another (row-major): log2(w) rounds of ``Zip``.
    ``emit`` names the values of the inner rounds, each used twice; those of the last
    round, used once each, are returned as expressions (one not stored is not built)."""
    if len(columns) == 1:
        return list(columns)
    evens, odds = (_named(zip_rows(part, emit), emit) for part in (columns[0::2],
                                                                  columns[1::2]))
    return [k.Zip(a, b, h) for a, b in zip(evens, odds, strict=True) for h in (0, 1)]


def unzip_rows(rows: Sequence[k.Expr], emit: Callable[[k.Expr], k.Expr]) -> list[k.Expr]:
    """The inverse of ``zip_rows``: w vectors holding a tile's rows of w elements one
    after another, as its w columns."""
    if len(rows) == 1:
        return list(rows)
    pairs = range(0, len(rows), 2)
    even, odd = (unzip_rows([emit(k.Unzip(rows[i], rows[i + 1], h)) for i in pairs], emit)
                 for h in (0, 1))
    return [(odd if c % 2 else even)[c // 2] for c in range(len(rows))]


def _named(values: list[k.Expr], emit: Callable[[k.Expr], k.Expr]) -> list[k.Expr]:
    return values if len(values) == 1 else [emit(x) for x in values]


def _column_tiles(gen: _Gen, op: ix.Op, st: _Storage, v: str, u: str,
                  extent: dict[str, int]) -> list[k.Stmt]:
    """An output whose rows along ``u`` are w = 2 or 4 elements long (``SHORT_ROWS``), one
    after another, with the lanes down its columns (``v``): C(n x 4) = (A0 + A1)'*B,
    where A0 and A1 run along n. Each block computes w columns of ``block[1]`` vectors,
    reads rows of w elements (beta*C) as columns (``unzip_rows``) and stores its columns
    as rows (``zip_rows``): a tile transposed in registers, not the scalar code its
    strided columns would otherwise need."""
    sched, isa, dt, program = gen.s, gen.isa, gen.dt, gen.p
    w = extent[u]
    axis = op.dims.index(v)
    strides = (st.rs, st.cs)
    if w not in SHORT_ROWS or w > isa.lanes(dt) or strides[1 - axis] != 1 \
            or strides[axis] != w:
        raise ScheduleError(f"vectorizing output dim {v!r} needs {op.out} contiguous along "
                            f"it, or its rows of {' or '.join(map(str, SHORT_ROWS))} "
                            "elements one after another")
    if sched.pairs or sched.block[0] != w:
        raise ScheduleError(f"a tile transposed in registers takes all {w} columns of "
                            f"{op.out} in each block")
    vchunks = chunks(extent[v], isa.widths(dt))
    for c in vchunks:
        if c.width > 1 and not isa.has_op("zip_lo", dt, c.width):
            raise ScheduleError(f"target {isa.name} cannot interleave {c.width}-lane {dt} "
                                "vectors")
    bv = sched.block[1]

    def row_read(n: ix.Node) -> bool:
        """A read of an operand laid out like the output (C of beta*C): loaded by rows."""
        if not isinstance(n, ix.Read) or v not in n.index or u not in n.index:
            return False
        rst, operand = gen.store[n.operand], program.operand(n.operand)
        pos = n.index.index(v)
        return ((rst.rs, rst.cs)[pos] == w and (rst.rs, rst.cs)[1 - pos] == 1
                and (operand.rows, operand.cols)[1 - pos] == w)

    def has_row_read(n: ix.Node) -> bool:
        return row_read(n) or any(has_row_read(c) for c in ix.children(n))

    def rows_of(n: ix.Node, group: list[_Chunk], body: list[k.Stmt]) -> list[list[k.Expr]]:
        """Per chunk of ``group``, the value of ``n`` as the w vectors of its rows. The
        element-wise part of the body is computed on rows: a sum (and any part with no
        read laid out like the output) down the columns, then zipped into rows; a read
        laid out like the output straight from memory (no Unzip)."""
        if isinstance(n, ix.Lit) or (isinstance(n, ix.Read)
                                     and gen.store[n.operand].scalar_var is not None):
            value = gen.value(n, [{}], body)[0]
            return [[value] * w for _ in group]
        if isinstance(n, (ix.Add, ix.Mul, ix.Neg)) and has_row_read(n):
            if isinstance(n, ix.Neg):
                return [[gen.combine("-", k.Const(0.0, gen.dt), x) for x in rows]
                        for rows in rows_of(n.x, group, body)]
            op_ = "+" if isinstance(n, ix.Add) else "*"
            return [[gen.combine(op_, x, y) for x, y in zip(ra, rb, strict=True)]
                    for ra, rb in zip(rows_of(n.a, group, body), rows_of(n.b, group, body),
                                      strict=True)]
        if row_read(n):
            pos = n.index.index(v)
            return [_row_loads(gen.store[n.operand], pos, c, w, dt) for c in group]
        ctxs = [{u: k.Const(a), v: c} for c in group for a in range(w)]
        values = gen.value(n, ctxs, body)
        out = []
        for i, c in enumerate(group):
            vals = values[i * w:(i + 1) * w]
            if c.width == 1:
                out.append(vals)
                continue
            columns = [gen.named(gen.widen(x, c.width), body) for x in vals]
            out.append(zip_rows(columns, lambda e: gen.named(e, body)))
        return out

    def group(chunk_group: list[_Chunk], body: list[k.Stmt]) -> None:
        for c, rows in zip(chunk_group, rows_of(op.body, chunk_group, body), strict=True):
            start = _row_start(st, axis, c)
            if c.width == 1:
                body += [k.Store(st.buf, simplify(start + a), val)
                         for a, val in enumerate(rows)]
                continue
            body += [k.Store(st.buf, simplify(start + q * c.width), gen.widen(row, c.width),
                             None if count == c.width else k.Const(count))
                     for q, (row, count) in enumerate(zip(rows, _row_counts(c, w),
                                                          strict=True)) if count]

    lanes = vchunks[0].width
    full = [c for c in vchunks if c.width == lanes and not c.masked]
    looped = len(full) // bv if len(full) > max(bv, sched.unroll // lanes) else 0
    stmts: list[k.Stmt] = []
    tail: list[k.Stmt] = []
    for c0 in range(looped * bv, len(vchunks), bv):
        group(vchunks[c0:c0 + bv], tail)
        tail.append(k.Barrier())
    chains = sched.split * max(1, len(sums_of(op.body)))
    spare = isa.registers - block_registers(w, bv, chains)
    if looped:
        var = k.Var(f"{gen.prefix}{v}")
        inner: list[k.Stmt] = []
        group([_Chunk(var + b * lanes, lanes, lanes) for b in range(bv)], inner)
        hoisted = _hoist_broadcasts(gen, inner, var, spare, tail)
        if hoisted is not None:
            decls, inner, tail = hoisted
            stmts += decls
        stmts.append(k.For(var, k.Const(0), k.Const(looped * bv * lanes), bv * lanes,
                           tuple(inner)))
    stmts += tail
    if _shared_fit(stmts, spare):
        stmts = [s for s in stmts if not isinstance(s, k.Barrier)]
    return _drop_unread(stmts)


def _drop_unread(stmts: Sequence[k.Stmt]) -> list[k.Stmt]:
    """``stmts`` without the declarations nothing reads (values of the transposes that
    only lead to the rows past a masked leftover): expressions have no side effects."""
    read: set[str] = set()
    out: list[k.Stmt] = []
    for s in reversed(stmts):
        if isinstance(s, k.Decl) and s.var.name not in read:
            continue
        if isinstance(s, k.For):
            s = replace(s, body=tuple(_drop_unread(s.body)))
        read |= names_used(s)
        out.append(s)
    return out[::-1]


def _set_inside(var: k.Var, body: Sequence[k.Stmt]) -> set[str]:
    """The names of the variables a loop over ``var`` with ``body`` sets, its own included:
    what an expression must not read to be the same in every iteration."""
    return {var.name, *(s.var.name for s in nodes_of(tuple(body), (k.Decl, k.Assign, k.For)))}


def _hoist_broadcasts(gen: _Gen, body: list[k.Stmt], var: k.Var, budget: int,
                      after: list[k.Stmt]
                      ) -> tuple[list[k.Stmt], list[k.Stmt], list[k.Stmt]] | None:
    """Broadcasts of loads, or of values computed from loads (A0[i,k] + A1[i,k]), that do
    not depend on the loop variable ``var`` (an element of A for a loop along a row of
    C): (their declarations before the loop, the loop body and the statements ``after``
    it rewritten to use them — a narrower broadcast after it takes the low half or
    quarter), or None when there are more than ``budget``. C compilers do not hoist a
    broadcast-load intrinsic out of a loop that stores, but they do hoist a broadcast of
    scalars loaded and added: left in the loop, those of C = alpha*(A0 + A1)'*B + beta*C
    4 x 4 x 32 f64 in blocks of 2 x 4 were hoisted by gcc and spilled (117 accesses to
    the stack), and the kernel ran 53 ns a call against 43 for a block the model ranked
    below it."""
    written = {s.buf for s in nodes_of(tuple(body), k.Store)}  # buffers stored to inside
    inside = _set_inside(var, body)
    found: dict[k.Expr, k.Var] = {}

    def invariant(e: k.Expr) -> bool:
        loads = nodes_of(e, k.Load)
        return (bool(loads) and all(x.count is None and x.buf not in written for x in loads)
                and not {v.name for v in nodes_of(e, k.Var)} & inside)

    def visit(x: object) -> object:
        if isinstance(x, k.Broadcast) and invariant(x.value):
            if x not in found:
                found[x] = gen.fresh("inv", x.lanes)
            return found[x]
        return x

    inner = [rewrite(s, visit) for s in body]
    if len(found) > budget:
        return None
    by_load = {e.value: v for e, v in found.items()}

    def reuse(x: object) -> object:
        if isinstance(x, k.Broadcast) and x.value in by_load:
            v: k.Expr = by_load[x.value]
            if v.lanes % x.lanes == 0:  # the low half, quarter, ... (widths halve)
                while v.lanes > x.lanes:
                    v = k.Half(v, 0)
                return v
        return x

    hoisted = set(found.values())

    def drop_copies(stmts: list[k.Stmt]) -> list[k.Stmt]:
        """A variable that only named a hoisted broadcast is replaced by it."""
        copies = {s.var.name: s.value for s in stmts
                  if isinstance(s, k.Decl) and s.value in hoisted}
        return [substitute(s, copies) for s in stmts
                if not (isinstance(s, k.Decl) and s.var.name in copies)]

    return ([k.Decl(v, e) for e, v in found.items()], drop_copies(inner),
            drop_copies([rewrite(s, reuse) for s in after]))


def _check_pairs(program: ix.Program, isa: Isa, width: int, st: _Storage, axis: int,
                 per: int = 2) -> None:
    """Rows held ``per`` (2 or 4) to a vector need the ISA's operations for them
    (``_output_parts``) and an output dimension exactly 1/``per`` of a vector wide and
    contiguous."""
    full, held = isa.lanes(program.dtype), {2: "two", 4: "four"}[per]
    if not _output_parts(isa, program.dtype, per) or width * per != full:
        raise ScheduleError(f"{held} rows per vector need {full // per} columns and a target "
                            f"with the operations for them (have {width}, target {isa.name})")
    if (st.rs, st.cs)[axis] != 1:
        raise ScheduleError(f"{held} rows per vector need {st.buf} contiguous along its rows")


def _output_parts(isa: Isa, dtype: str, per: int) -> bool:
    """Whether ``isa`` holds rows of an output ``per`` to a vector: halves joined, or a
    row loaded into every quarter and lanes splatted within quarters."""
    if per == 2:
        return ("halves", dtype) in isa.ops
    return all(isa.has_op(name, dtype) for name in ("quad_load", "quarter_splat0"))


def _check_sum_pairs(program: ix.Program, op: ix.Op, isa: Isa, v: str | None) -> None:
    """Two rows per vector with the lanes on a reduction need every sum over that index
    exactly half a vector long, and the ISA's half-vector operations."""
    full = isa.lanes(program.dtype)
    if ("halves", program.dtype) not in isa.ops or not _sums_of_part(op, v, full, 2):
        raise ScheduleError(f"two rows per vector need the lanes on an output dimension or "
                            f"on sums over exactly {full // 2} elements (target {isa.name})")


def _sums_of_part(op: ix.Op, v: str | None, lanes: int, per: int) -> bool:
    """Whether ``op`` has sums over ``v`` and all of them are 1/``per`` of a vector long."""
    sums = [s for s in sums_of(op.body) if s.index == v]
    return bool(sums) and all(per * s.extent == lanes for s in sums)


def _quarter_vector_sums(program: ix.Program, op: ix.Op, isa: Isa, v: str | None) -> bool:
    """Whether every sum of ``op`` over ``v`` is a quarter of a vector long and the ISA has
    the operations for rows held four per vector."""
    return (all(isa.has_op(name, program.dtype) for name in ("quad_load", "sum_quarters"))
            and _sums_of_part(op, v, isa.lanes(program.dtype), 4))


def _check_sum_quads(program: ix.Program, op: ix.Op, isa: Isa, v: str | None) -> None:
    """Four rows per vector need every sum over the lanes a quarter of a vector long, and
    the ISA's operations for such rows."""
    if not _quarter_vector_sums(program, op, isa, v):
        raise ScheduleError(f"four rows per vector need sums over exactly "
                            f"{isa.lanes(program.dtype) // 4} elements on lanes and a "
                            f"target that sums them (target {isa.name})")


def _pair_block(gen: _Gen, op: ix.Op, st: _Storage, u: str, v: str, u0: k.Expr, un: int,
                body: list[k.Stmt], per: int = 2) -> None:
    """``un`` rows from ``u0``: ``per`` (2 or 4) rows to a full vector, the rows left
    over each in a vector 1/``per`` as wide. The rows of a vector are stored with one
    full store where they are contiguous, else part by part."""
    width = gen.isa.lanes(gen.dt) // per
    chunk = _Chunk(0, width, width)
    whole = un - un % per
    ctxs: list[dict] = [{u: _Pair(u0 + a, per), v: chunk} for a in range(0, whole, per)]
    ctxs += [{u: u0 + a, v: chunk} for a in range(whole, un)]
    values = gen.value(op.body, ctxs, body)
    row_stride = st.rs if u == op.dims[0] else st.cs

    def index(row: k.Expr) -> k.Expr:
        return st.index(row, k.Const(0)) if u == op.dims[0] else st.index(k.Const(0), row)

    for ctx, val in zip(ctxs, values, strict=True):
        row = ctx[u]
        if not isinstance(row, _Pair):
            body.append(k.Store(st.buf, index(row), gen.widen(val, width)))
            continue
        val = gen.widen(val, per * width)
        if row_stride == width:
            body.append(k.Store(st.buf, index(row.start), val))
            continue
        if not isinstance(val, (k.Var, k.Const)):  # evaluated once for all its rows
            var = gen.fresh("pair", val.lanes)
            body.append(k.Decl(var, val))
            val = var
        for h in range(per):
            part = k.Half(val, h) if per == 2 else k.Half(k.Half(val, h // 2), h % 2)
            body.append(k.Store(st.buf, index(row.start + h), part))


def _shared_fit(stmts: list[k.Stmt], spare: int) -> bool:
    """Whether the vectors that several straight-line blocks load alike (``stmts`` split
    at its barriers: a row of B for blocks of different rows, a broadcast element of A
    for blocks of different columns) fit in the ``spare`` registers a block leaves. Then
    the C compiler may keep them in registers from one block to the next (B of
    ``C(n x 4) = A*B(4x4)``), and the barriers go."""
    seen: dict[k.Expr, int] = {}
    block = 0
    for s in stmts:
        if isinstance(s, k.Barrier):
            block += 1
            continue
        for e in nodes_of(s, (k.Load, k.Broadcast)):
            if e.lanes > 1:
                seen.setdefault(e, block)
                if seen[e] != block:
                    seen[e] = -1  # loaded by two blocks
    return sum(1 for b in seen.values() if b == -1) <= spare


#: Trip counts up to which C compilers unroll a short loop completely (gcc -O3 peels up
#: to 16 when the copies are small enough; those here are).
PEELED_TRIPS = 16


def _reload_per_iteration(loop: k.For, spare: int, registers: int) -> k.For:
    """``loop`` over blocks of rows, starting with a barrier when the vectors its body
    loads alike in every iteration (the rows of B) do not fit in the ``spare``
    registers a block leaves. The C compiler would hoist those loads out of the loop
    and spill them; after a barrier each iteration loads them again, from L1 (a
    temporary's rows too where the unrolled loop below is what overflows,
    ``k.Barrier.locals``). (Broadcasts are not counted: C compilers leave them in a
    loop that stores.)

    A short inner loop along the row is unrolled by the compiler, and its loads of B
    then become alike in every iteration too, one set per trip. That matters where the
    broadcasts hoisted out of the inner loop take more than half of the ``registers``:
    C = A*B, 48 x 4 x 48 f32 on AVX-512 (24 broadcasts, 12 rows of B) spilled 43 times
    and ran 1.5x faster with the barrier; with fewer broadcasts the compiler's spills
    cost less than the reloads (AVX2, 32 x 4 x 32 f32: 0.9x with the barrier)."""
    inside = _set_inside(loop.var, loop.body)
    invariant = {e for s in loop.body if not isinstance(s, k.For)
                 for e in nodes_of(s, k.Load)
                 if e.lanes > 1 and not names_used(e.index) & inside}
    # broadcasts hoisted out of an inner loop stay live across it
    hoisted = sum(isinstance(s, k.Decl) and isinstance(s.value, k.Broadcast)
                  for s in loop.body)
    peeled = 0
    for s in loop.body if 2 * hoisted > registers else ():
        if isinstance(s, k.For) and isinstance(s.stop, k.Const) and isinstance(s.start, k.Const):
            trips = -(-(s.stop.value - s.start.value) // s.step)
            if trips <= PEELED_TRIPS:
                per_trip = {e for e in nodes_of(s.body, k.Load) if e.lanes > 1
                            and not names_used(e.index) & (inside - {s.var.name})}
                peeled += trips * len(per_trip)
    if len(invariant) + (hoisted + peeled if peeled else 0) <= spare:
        return loop
    # a temporary's loads too where the unrolled inner loop is what overflows: gcc hoisted
    # them all the same and spilled (48 x 4 x 48 f32, alpha*B in a temporary: 1.3x as fast
    # with them reloaded); elsewhere it keeps the temporary's values or computes them
    # again from its inputs, which ran faster than reloads (AVX2, 32 x 4 x 32 f32: 0.91x)
    return replace(loop, body=(k.Barrier(locals=bool(peeled)), *loop.body))


#: The band, in multiples of ``L1_BYTES``, of a call's operands in which an output only
#: written goes out in straight-line rows (``Machine.straight_rows_near_l1``). On a Xeon
#: (CPU model 167; LGen's harness, C = A*B n x 4 x n, a block's vectors in a loop with
#: A's broadcasts hoisted out of it against straight-line code, the same blocks; x
#: LIBXSMM): f32 n = 100, 104, 112 (0.88, 0.95, 1.09 L1) 0.87-0.94 -> 1.03-1.05x, f64
#: 76, 80 (1.04, 1.15) 0.88-0.96 -> 1.02-1.29x. Below the band the loop is as fast or
#: faster (f32 96, 0.81 L1: 1.12 -> 0.93x), above it the loop with write prefetches
#: (f64 84, 1.26: 1.29x against 1.02x; f32 120: 1.27 against 1.07). An output also
#: read (C = alpha*A*B + beta*C) ran the same either way.
NEAR_L1 = (0.85, 1.2)


def writes_near_l1(program: ix.Program, op: ix.Op) -> bool:
    """Whether ``op`` writes an output that no operation reads while the program's
    operands about fill L1 (``NEAR_L1``): there a block of rows is faster in
    straight-line code than in a loop along its rows."""
    out = program.operand(op.out)
    if out.temporary or any(r.operand == op.out for o in program.ops
                            for r in ix.reads(o.body)):
        return False
    footprint = sum(o.rows * o.cols for o in program.operands) * itemsize(program.dtype)
    low, high = NEAR_L1
    return low * L1_BYTES < footprint <= high * L1_BYTES


def _blocks_along(extent: int, bu: int, unroll: int, var: k.Var,
                  block: Callable[[k.Expr, int, list[k.Stmt]], None],
                  stmts: list[k.Stmt]) -> None:
    """Blocks of ``bu`` positions along one dimension (rows; the columns of scalar code):
    a loop over full blocks when there are many (then the shorter last block), else
    every block unrolled with constant offsets."""
    full = extent - extent % bu
    if full // bu > max(1, unroll // bu):
        body: list[k.Stmt] = []
        block(var, bu, body)
        stmts.append(k.For(var, k.Const(0), k.Const(full), bu, tuple(body)))
        if extent > full:
            block(k.Const(full), extent - full, stmts)
    else:
        for u0, un in _positions(extent, bu):
            block(k.Const(u0), un, stmts)


#: A row of more full vectors than this is a loop over its blocks of vectors even where
#: the broadcasts of A cannot be hoisted out of it: written out, a row of 1000 f32 makes
#: a kernel of 10,000 lines that takes 20 s to plan (D = alpha*A*B + beta*C 1000 x 8 x
#: 1000). LGen's longest rows (100 f64 on AVX2, 25 vectors) stay straight-line code.
LONG_ROW_VECTORS = 32
#: Register blocks tried: rows x vector chunks (or x output columns for scalar outputs).
#: Blocks of 12 and 16 rows fit 32 registers (AVX-512): C = A*B 10 x 10 x 10 f32 in one
#: block of 10 rows ran 1.13x as fast as in blocks of 8 and 2.
BLOCKS = ((1, 1), (2, 1), (3, 1), (4, 1), (6, 1), (8, 1), (12, 1), (16, 1), (1, 2), (2, 2),
          (3, 2), (4, 2), (6, 2), (1, 3), (2, 3), (3, 3), (4, 3), (1, 4), (2, 4))
#: The same, tallest first for each number of chunks: with the lanes along an output
#: dimension, the model's equally fast blocks differ in how often B's vectors are loaded
#: again, once per block of rows, which it does not see as a bound; the first of equals
#: is kept (C = A*B 7 x 7 x 7 f64: all 7 rows 1.35x as fast as blocks of 3, on a Xeon).
TALL_FIRST = tuple(sorted(BLOCKS, key=lambda b: (b[1], -b[0])))
#: Partial accumulators tried for long reductions.
SPLITS = (1, 2, 4)


def block_registers(rows: int, cols: int, chains: int = 1) -> int:
    """Vector registers a ``rows x cols`` block keeps live: ``chains`` accumulators per
    position, the operand shared down each column (a vector of B reused by every row;
    in a one-row block it has one use and is folded into its FMA as a memory operand)
    and one broadcast."""
    return rows * cols * chains + (cols if rows > 1 else 0) + 1


def _row_spans(span: int, registers: int) -> tuple[tuple[int, int], ...]:
    """One-row blocks wider than ``BLOCKS``: the whole row, or the row in two or three
    even parts, as registers allow. An element of A is then broadcast once per row and
    used by every vector of it (gcc's order for ``C(n x n) = A(n x 4)*B(4 x n)``), where
    a tile of several rows and fewer vectors broadcasts it again per column block."""
    out = []
    for parts in (1, 2, 3):
        cols = -(-span // parts)
        if cols > max(bv for _, bv in BLOCKS) and block_registers(1, cols) <= registers:
            out.append((1, cols))
    return tuple(out)


def candidates(program: ix.Program, op: ix.Op, isa: Isa | None = None) -> list[OpSchedule]:
    """Every schedule worth considering for ``op``: each index on lanes (or none), register
    blocks that fit the registers (clamped to the extents, so no two candidates build
    the same code), partial accumulators where a reduction is long and the block has
    too few independent chains to cover the FMA latency, and one masked tail where it
    differs from the exact pieces (``OpSchedule.one_tail``)."""
    out = program.operand(op.out)
    extent = {op.dims[0]: out.rows, op.dims[1]: out.cols}
    sums = sums_of(op.body)
    names = [op.dims[0], op.dims[1]] + [s.index for s in sums]
    registers = isa.registers if isa is not None else 16
    result: list[OpSchedule] = []
    for v in [None, *dict.fromkeys(names)]:
        if v in extent and extent[v] == 1:
            continue  # lanes on a unit dimension: the scalar schedule under another name
        lanes = isa.lanes(program.dtype) if isa is not None and v is not None else 1
        if isa is not None and v is not None and v not in extent and lanes == 1:
            continue  # a sum on one lane: the scalar schedule again (the generic target)
        if v in extent:  # rows x vector chunks of the other output dimension
            u = op.dims[1] if v == op.dims[0] else op.dims[0]
            span = (extent[u], -(-extent[v] // lanes))
        else:  # rows x columns of scalar outputs
            span = (extent[op.dims[0]], extent[op.dims[1]])
        # the longest sum whose terms are not on lanes: what partial chains can split
        terms = max([s.extent if s.index != v else s.extent // lanes for s in sums],
                    default=0)
        seen = set()
        # wide one-row blocks pay where rows run in a loop, B's vectors reused from row
        # to row; unrolled rows share B's loads better in a taller tile (4 x n: 0.9x)
        wide = _row_spans(span[1], registers) if span[0] > OpSchedule.unroll else ()
        # one masked tail only where masked moves are fast (mask registers: with AVX2's
        # vmaskmov, C = A*B 3 x 3 x 3 f64 ran 0.5x as fast as with 2 + 1 lanes); into an
        # output the program reads, stored as plain pieces (``Isa.plain_moves``): a
        # masked store makes the next load of it wait (C = alpha*A*B + beta*C,
        # 12 x 4 x 12 f32: 0.22x)
        tail_differs = (v in extent and isa is not None and isa.mask_registers
                        and _one_tail_differs(program, op, isa, extent[v]))
        sum_tail = v in extent and isa is not None and _sum_tail_applies(program, op, isa, v,
                                                                         extent[v])
        for bu, bv in (TALL_FIRST if v in extent else BLOCKS) + wide:
            block = (min(bu, span[0]), min(bv, span[1]))
            if block_registers(*block) > registers:
                continue
            for split in SPLITS:
                if split > 1 and (terms < 2 * split
                                  or block[0] * block[1] * split > registers - 4):
                    continue
                if (block, split) not in seen:
                    seen.add((block, split))
                    result.append(OpSchedule(v, block, split=split))
                    if tail_differs:
                        result.append(OpSchedule(v, block, split=split, one_tail=True))
                    if sum_tail:
                        result.append(OpSchedule(v, block, split=split, tail_sums=True))
        if isa is not None and v is not None:
            result += _pair_candidates(program, op, isa, v, extent, terms)
            result += _quad_candidates(program, op, isa, v, extent, terms)
            result += _fold_candidates(program, op, isa, v, extent)
    if isa is not None and flat_applies(program, op, isa):
        result.append(OpSchedule(op.dims[1], flat=True))
    return result


#: Rows of outputs per block with the terms of their sums folded into the parts of
#: vectors (``OpSchedule.folds``; each row one exact narrow vector).
FOLD_ROWS = (1, 2, 3, 4, 6, 8)


def _fold_candidates(program: ix.Program, op: ix.Op, isa: Isa, v: str,
                     extent: dict) -> list[OpSchedule]:
    """Schedules that fold the terms of the sums not on lanes into the parts of vectors
    (``OpSchedule.folds``), where the lane index (an output dimension, or the index of a
    sum) is a half or a quarter of a vector long and another sum has that many terms."""
    lanes = isa.lanes(program.dtype)
    sums = sums_of(op.body)
    width = extent[v] if v in extent else max(s.extent for s in sums if s.index == v)
    parts = lanes // width if lanes % width == 0 else 0
    terms = max((s.extent for s in sums if s.index != v), default=0)
    if parts not in (2, 4) or terms < parts:
        return []
    u = (op.dims[1] if v == op.dims[0] else op.dims[0]) if v in extent else op.dims[0]
    out, seen = [], set()
    for rows in FOLD_ROWS:
        block = (min(rows, extent[u]), 1)
        for split in SPLITS:
            if split > 1 and (terms // parts < 2 * split
                              or block[0] * split > isa.registers - 4):
                continue
            if (block, split) not in seen:
                seen.add((block, split))
                out.append(OpSchedule(v, block, split=split, folds=True))
    return out


def _sum_tail_applies(program: ix.Program, op: ix.Op, isa: Isa, v: str, extent: int) -> bool:
    """Whether ``OpSchedule.tail_sums`` is a candidate for lanes along the output dimension
    ``v``: exact vectors first, then columns left in a scalar or masked piece, and one
    reduction index, every sum over it at least a vector long."""
    pieces = chunks(extent, isa.widths(program.dtype))
    sums = sums_of(op.body)
    lanes = isa.lanes(program.dtype)
    return (len({s.index for s in sums}) == 1 and all(s.extent >= lanes for s in sums)
            and 0 < _exact_vectors(pieces) < len(pieces))


#: Rows per block tried with two rows per vector (one accumulator per two rows).
PAIR_ROWS = (2, 4, 6, 8, 12, 16)
#: ... and with four rows of an output per vector (one accumulator per four rows).
QUAD_ROWS = (4, 8, 16, 32)


def _read_anywhere(program: ix.Program, name: str) -> bool:
    """Whether an operation of ``program`` reads operand ``name``."""
    return any(r.operand == name for o in program.ops for r in ix.reads(o.body))


def _one_tail_differs(program: ix.Program, op: ix.Op, isa: Isa, extent: int) -> bool:
    """Whether one masked tail (``OpSchedule.one_tail``) covers ``extent`` lanes of
    ``op``'s output otherwise than the exact pieces do, and can be stored: into an output
    the program reads, only as plain pieces."""
    widths = isa.widths(program.dtype)
    tail = chunks(extent, widths, True)
    if tail == chunks(extent, widths):
        return False
    last = tail[-1]  # masked: a tail of an exact width would be the exact pieces' too
    return (not _read_anywhere(program, op.out)
            or isa.plain_moves("store", program.dtype, last.width, last.count,
                               read_back=True) is not None)


def _pair_candidates(program: ix.Program, op: ix.Op, isa: Isa, v: str, extent: dict,
                     terms: int) -> list[OpSchedule]:
    """Schedules with two rows per vector when the lane dimension (an output dimension, or
    the index of the sums) is half a vector wide."""
    lanes = isa.lanes(program.dtype)
    if v in extent:
        u = op.dims[1] if v == op.dims[0] else op.dims[0]
        half = 2 * extent[v] == lanes and not _read_back_in_pieces(program, op, isa)
    else:  # rows of the output, each ending in horizontal sums
        u = op.dims[0]
        half = _sums_of_part(op, v, lanes, 2)
    if ("halves", program.dtype) not in isa.ops or not half or extent[u] < 2:
        return []
    out, seen = [], set()
    for rows in PAIR_ROWS:
        rows = min(rows, extent[u])
        accs = -(-rows // 2)
        if accs + 2 > isa.registers:
            continue
        for split in SPLITS:
            if split > 1 and (terms < 2 * split or accs * split > isa.registers - 4):
                continue
            if (rows, split) not in seen:
                seen.add((rows, split))
                out.append(OpSchedule(v, (rows, 1), split=split, pairs=True))
    return out


def _read_back_in_pieces(program: ix.Program, op: ix.Op, isa: Isa) -> bool:
    """Whether ``op`` writes a temporary in 512-bit vectors, which later operations read
    back an element at a time: such loads wait on the wide stores, so its rows are not
    held several to a vector. alpha*B in C = alpha*(A0 + A1)'*B + beta*C, n x 4 x 4,
    then took the temporary's form and ran 0.6-0.8x as fast on Zen 5."""
    return (program.operand(op.out).temporary
            and isa.lanes(program.dtype) * itemsize(program.dtype) == 64)


def _quad_candidates(program: ix.Program, op: ix.Op, isa: Isa, v: str, extent: dict,
                     terms: int) -> list[OpSchedule]:
    """Schedules with four rows per vector: where the vectorized output dimension is a
    quarter of a vector wide, blocks of ``QUAD_ROWS`` rows; where the sums on lanes are a
    quarter of a vector long and the output is a column of at least a vector's worth of
    rows (four with mask registers), blocks of one and two vectors' worth."""
    lanes = isa.lanes(program.dtype)
    if v in extent:  # rows of an output a quarter of a vector wide, four to a vector
        u = op.dims[1] if v == op.dims[0] else op.dims[0]
        if (4 * extent[v] != lanes or extent[u] < 4 or _read_back_in_pieces(program, op, isa)
                or not _output_parts(isa, program.dtype, 4)):
            return []
        return [OpSchedule(v, (rows, 1), split=split, quads=True)
                for rows in QUAD_ROWS if rows <= max(4, extent[u] - extent[u] % 4)
                for split in SPLITS
                if rows // 4 * split + 2 <= isa.registers and (split == 1 or terms >= 2 * split)]
    u = op.dims[0]
    least = 4 if isa.mask_registers else lanes  # with masked stores, any four rows
    if (extent[u] < least or program.operand(op.out).cols != 1
            or not _quarter_vector_sums(program, op, isa, v)):
        return []
    out, seen = [], set()
    for rows in (lanes, 2 * lanes):
        rows = min(rows, extent[u] - extent[u] % 4)
        accs = rows // 4
        for split in SPLITS:
            if ((rows, split) not in seen and accs * split + 2 <= isa.registers
                    and (split == 1 or terms >= 2 * split)):
                seen.add((rows, split))
                out.append(OpSchedule(v, (rows, 1), split=split, quads=True))
    return out


def sums_of(n: ix.Node) -> list[ix.Sum]:
    own = [n] if isinstance(n, ix.Sum) else []
    return own + [s for c in ix.children(n) for s in sums_of(c)]


def _outer_sums(n: ix.Node) -> list[ix.Sum]:
    """The sums in ``n`` not inside another sum, in order."""
    if isinstance(n, ix.Sum):
        return [n]
    return [s for c in ix.children(n) for s in _outer_sums(c)]


def siblings(n: ix.Node) -> list[list[ix.Sum]]:
    """Groups of two or more distinct sums of ``n``, none inside another, over the same
    index and extent: ``alpha*sum_k A(i,k)*x(k) + beta*sum_k B(i,k)*x(k)``. A group is
    reduced in one loop (``_Gen.reduce``), x loaded once for both products: y = alpha*A*x
    + beta*B*x with A, B 4 x 64 f64 loaded x four times in two loops per pair of rows."""
    groups: dict[tuple[str, int], list[ix.Sum]] = {}
    for s in dict.fromkeys(_outer_sums(n)):
        groups.setdefault((s.index, s.extent), []).append(s)
    return [g for g in groups.values() if len(g) > 1]


def entry_params(specs: tuple[ArgSpec, ...]) -> tuple[k.Param, ...]:
    """Entry parameters in spec order: arrays and written scalars by pointer, with the
    elements they span."""
    return tuple(k.Param(s.name, s.dtype, pointer=s.by_pointer, const=not s.written,
                         extent=s.extent if s.by_pointer else None) for s in specs)


#: A temporary whose elements later operations splat this many times or more is read
#: back from memory (a compiler barrier after it): gcc would otherwise rebuild each splat
#: from the vectors just stored, with shuffles (C = A*B n x 4 x 4 f32, alpha*B in a
#: temporary: 1.3-1.4x as fast with the barrier); a few splats it builds faster than
#: a store is forwarded to a load (micro gemam 2 x 2 f64, 4 splats: 0.83x with it).
SPLATS_FROM_MEMORY = 8


def build_module(program: ix.Program, specs: tuple[ArgSpec, ...],
                 schedule: tuple[OpSchedule, ...], isa: Isa, name: str, *,
                 write_prefetches: bool = True, shared_splats: bool = True,
                 straight_near_l1: bool = False) -> k.Module:
    """The whole program as one exported function; temporaries are local arrays.
    ``write_prefetches``: whether interleaved stores into large outputs get write
    prefetches ahead of them (``prefetch_stores``, ``Machine.prefetches_store_streams``).
    ``straight_near_l1``: whether outputs only written by operands that about fill L1
    are written in straight-line rows (``writes_near_l1``,
    ``Machine.straight_rows_near_l1``).
    ``shared_splats``: whether a scalar splat at several widths is splatted once, at the
    widest (``_Gen.shared_splats``; ``strategy.small.Core.shared_splats``)."""
    if len(schedule) != len(program.ops):
        raise ScheduleError(f"{len(program.ops)} operations but {len(schedule)} op schedules")
    store = storages(program, specs)
    body: list[k.Stmt] = list(_temporaries(program))
    parts: list[tuple[k.Stmt, ...]] = []
    for n, (op, sched) in enumerate(zip(program.ops, schedule, strict=True)):
        straight = straight_near_l1 and writes_near_l1(program, op)
        lowered = batch_row_sums(tuple(lower_op(program, op, sched, isa, store,
                                                prefix=f"s{n}_",
                                                shared_splats=shared_splats,
                                                straight_rows=straight)), isa)
        if sched.quads and any(r.x.lanes not in isa.widths(program.dtype)
                               for r in nodes_of(lowered, k.Reduce)):
            raise ScheduleError("rows held four per vector must be summed a vector's "
                                "worth at a time")
        parts.append(lowered)
    for n, (op, lowered) in enumerate(zip(program.ops, parts, strict=True)):
        body += lowered
        later = [e for part in parts[n + 1:] for e in nodes_of(part, k.Load)]
        if sum(e.buf == op.out and e.lanes == 1 for e in later) >= SPLATS_FROM_MEMORY:
            body.append(k.Barrier())
    params = entry_params(specs)
    ordered = stores_as_ready(share_masked_loads(tuple(body), isa), isa.registers)
    if write_prefetches:
        ordered = prefetch_stores(ordered, {p.name: p.extent for p in params})
    # a status to return only where a temporary is allocated
    status = any(s.heap for s in body if isinstance(s, k.Local))
    entry = k.Function(name, params, ordered, exported=True, status=status)
    return mark_past_end(k.Module((entry,), entry=name), isa)


#: The bytes of temporaries a kernel keeps on the stack; larger ones are allocated from
#: the heap when it starts (a thread's stack may be as small as 128 KiB, musl's default;
#: D = (A*B + x*y')*E 1100^3 f64, a temporary of 9.7 MB, overflowed Linux's 8 MiB). A
#: kernel with that much to keep computes for far longer than the allocation takes: the
#: heap's against the stack's, D = (A*B + C)*E 92^3 f64 on the small path, 0.99-1.02x the
#: time, 130^3 f32 1.01x, 200^3 f64 1.00x.
STACK_BYTES = 64 * 1024


def _temporaries(program: ix.Program) -> list[k.Local]:
    """The program's temporaries, the smallest on the stack while they fit in
    ``STACK_BYTES``, the others on the heap; in the program's order."""
    temps = [o for o in program.operands if o.temporary]
    size = itemsize(program.dtype)
    room, heap = STACK_BYTES, set()
    for o in sorted(temps, key=lambda o: o.rows * o.cols):
        if o.rows * o.cols * size <= room:
            room -= o.rows * o.cols * size
        else:
            heap.add(o.name)
    return [k.Local(o.name, program.dtype, o.rows * o.cols, heap=o.name in heap)
            for o in temps]
