"""Layer 4: the kernel IR — functions, loops, buffers and SIMD values.

Nodes are frozen dataclasses (hashable values). There is no C text here: the
backends print these nodes. Two groups of statements exist:

* tile-level operations made by applying a schedule (``PackSlivers``,
  ``TileZero``, ``TileMMA``, ``TileStore``), which lowering passes expand;
* plain operations every backend prints (``For``, ``Store``, ``Call``, ...).

Every value has a type: an element type name ('f32', 'f64', 'i64', 'bool')
and a lane count (1 for scalars). Vector values appear after lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- expressions


class Expr:
    """Base of expressions. Operators build ``Bin`` nodes so index math reads naturally."""

    dtype: str
    lanes: int

    def __add__(self, other: Expr | int) -> Expr:
        return add(self, wrap(other))

    def __radd__(self, other: int) -> Expr:
        return add(wrap(other), self)

    def __sub__(self, other: Expr | int) -> Expr:
        return sub(self, wrap(other))

    def __mul__(self, other: Expr | int) -> Expr:
        return mul(self, wrap(other))

    def __rmul__(self, other: int) -> Expr:
        return mul(wrap(other), self)


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int | float
    dtype: str = "i64"
    lanes: int = 1


@dataclass(frozen=True, eq=True)
class Var(Expr):
    name: str
    dtype: str = "i64"
    lanes: int = 1


#: Binary operators and whether their result is boolean.
BINARY_OPS = {"+": False, "-": False, "*": False, "/": False, "%": False, "min": False,
              "max": False, "<": True, "<=": True, "==": True, "!=": True, "and": True}


@dataclass(frozen=True, eq=True)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown binary operator {self.op!r}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return "bool" if BINARY_OPS[self.op] else self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(self.a.lanes, self.b.lanes)


def _check_count(move: object, count: Expr | None, lanes: int) -> None:
    """A masked move whose count is known moves 1 to ``lanes`` lanes: one of none is
    wasted work at an address that may lie past its array (C: undefined)."""
    if isinstance(count, Const) and not 0 < count.value <= lanes:
        raise ValueError(f"{type(move).__name__} of {lanes} lanes with count {count.value}")


@dataclass(frozen=True, eq=True)
class Load(Expr):
    """``lanes`` consecutive elements of ``buf`` from ``index``; with ``count``, only the
    first ``count`` lanes are read (the others are zero) — a masked load. ``past_end``:
    the lanes past ``count`` may lie past the end of ``buf``, so the first ``count`` are
    moved in plain pieces, never with a mask (``transform.past_end``)."""

    buf: str
    index: Expr
    dtype: str
    lanes: int = 1
    count: Expr | None = None
    past_end: bool = False

    def __post_init__(self) -> None:
        _check_count(self, self.count, self.lanes)


@dataclass(frozen=True, eq=True)
class Broadcast(Expr):
    """A scalar copied into every lane."""

    value: Expr
    lanes: int

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.value.dtype


@dataclass(frozen=True, eq=True)
class Fma(Expr):
    """a * b + c, lane-wise, with one rounding where the target has it."""

    a: Expr
    b: Expr
    c: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.c.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.c.lanes


@dataclass(frozen=True, eq=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.a.lanes


def _check_halves(node: str, lanes: int) -> None:
    if lanes < 2 or lanes % 2:
        raise ValueError(f"{node}: needs a vector of an even number of lanes, got {lanes}")


@dataclass(frozen=True, eq=True)
class _OfSeveral(Expr):
    """A value made of several others of one type (``xs``)."""

    xs: tuple[Expr, ...]

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.xs[0].dtype


@dataclass(frozen=True, eq=True)
class BuildVector(_OfSeveral):
    """A vector whose lane l is the scalar ``xs[l]``: elements that are not next to each
    other in memory (a column of a row-major B, read down the lanes of a sum) gathered
    with scalar loads and inserts, once for every row that uses them.

        BuildVector((B[8], B[17], B[26], 0.0))  ->  _mm256_setr_pd(B[8], B[17], B[26], 0.0)
    """

    def __post_init__(self) -> None:
        n = len(self.xs)
        if n < 2 or n & (n - 1) or any(x.lanes != 1 or x.dtype != self.xs[0].dtype
                                       for x in self.xs):
            raise ValueError(f"BuildVector takes 2, 4, 8, ... scalars of one type, got "
                             f"{[(x.lanes, x.dtype) for x in self.xs]}")

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return len(self.xs)


@dataclass(frozen=True, eq=True)
class Halves(Expr):
    """Two vectors of one width side by side, ``lo`` in the low lanes and ``hi`` in the
    high ones (on AVX2, two 128-bit vectors as the halves of a 256-bit one).
    ``Halves(x, x)`` duplicates ``x`` into both halves: a row of B used by two rows of C
    held in one register.

        Halves(load4(B[4]), load4(B[4]))  ->  _mm256_broadcast_ps(&B[4])
    """

    lo: Expr
    hi: Expr

    def __post_init__(self) -> None:
        if self.lo.lanes != self.hi.lanes or self.lo.dtype != self.hi.dtype:
            raise ValueError(f"Halves of a {self.lo.lanes}-lane {self.lo.dtype} and a "
                             f"{self.hi.lanes}-lane {self.hi.dtype} value")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.lo.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return 2 * self.lo.lanes


def quartered(x: Expr) -> Halves:
    """``x`` in all four quarters of a vector four times as wide: a row of x used by four
    rows held in one register (``OpSchedule.quads``)."""
    twice = Halves(x, x)
    return Halves(twice, twice)


def quartered_load(e: Expr) -> Load | None:
    """The whole load that ``e`` repeats in its four quarters (``quartered``), or None."""
    if (isinstance(e, Halves) and e.lo == e.hi and isinstance(e.lo, Halves)
            and e.lo.lo == e.lo.hi and isinstance(e.lo.lo, Load) and e.lo.lo.count is None):
        return e.lo.lo
    return None


@dataclass(frozen=True, eq=True)
class _AsWideAs(Expr):
    """A value of the type and width of ``x``, its first operand."""

    x: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.x.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.x.lanes


@dataclass(frozen=True, eq=True)
class HalfSplat(_AsWideAs):
    """Lane ``lane`` of each half of ``x`` copied into every lane of that half: with
    rows i and i+1 of A in the two halves, A[i, k] x 4 and A[i+1, k] x 4 for one FMA on
    two rows of C (AVX2: ``vpermilps`` with an immediate). With ``parts`` 4, the same
    within each quarter: four rows of A, four rows of C (AVX-512 f32, ``vpermilps``)."""

    lane: int
    parts: int = 2

    def __post_init__(self) -> None:
        if self.parts not in (2, 4) or self.x.lanes < self.parts or self.x.lanes % self.parts:
            raise ValueError(f"HalfSplat: {self.x.lanes} lanes do not split into "
                             f"{self.parts} parts")
        if not 0 <= self.lane < self.x.lanes // self.parts:
            raise ValueError(f"HalfSplat: lane {self.lane} outside a part of "
                             f"{self.x.lanes // self.parts} lanes")


@dataclass(frozen=True, eq=True)
class Spread(Expr):
    """The elements of ``x``, a whole load of two or four, each copied into every lane of
    its own part of a ``lanes``-lane vector: element q fills part q. Where A[i, k] and
    the rows after it lie side by side in memory (a transposed A), one load and one
    shuffle give the splats of a k for two or four rows of C held in one register
    (``OpSchedule.pairs``, ``OpSchedule.quads``).

        Spread(load2(A[4*k]), 8)  ->  [A[4k] x 4, A[4k+1] x 4]
    """

    x: Load
    lanes: int

    def __post_init__(self) -> None:
        parts = self.x.lanes
        if (not isinstance(self.x, Load) or self.x.count is not None or parts not in (2, 4)
                or self.lanes <= parts or self.lanes % parts):
            raise ValueError(f"Spread takes a whole load of 2 or 4 elements into a multiple "
                             f"of them, got {self.x!r} into {self.lanes} lanes")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.x.dtype

    @property
    def parts(self) -> int:
        return self.x.lanes


@dataclass(frozen=True, eq=True)
class Half(Expr):
    """The low (``which`` 0) or high (1) half of ``x``: to store two rows held in one
    register where they are not contiguous in memory."""

    x: Expr
    which: int

    def __post_init__(self) -> None:
        _check_halves("Half", self.x.lanes)
        if self.which not in (0, 1):
            raise ValueError(f"Half: which must be 0 or 1, got {self.which!r}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.x.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.x.lanes // 2


@dataclass(frozen=True, eq=True)
class _TwoVectors(Expr):
    """Lanes picked from two vectors of one type and 2, 4, 8, ... lanes."""

    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        a, b = self.a, self.b
        if a.lanes != b.lanes or a.dtype != b.dtype or a.lanes < 2 or a.lanes & (a.lanes - 1):
            raise ValueError(f"{type(self).__name__} takes two vectors of one type and 2, 4, "
                             f"8, ... lanes, got {a.lanes} x {a.dtype} and {b.lanes} x "
                             f"{b.dtype}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.a.lanes


@dataclass(frozen=True, eq=True)
class ShiftDown(_AsWideAs):
    """Lanes ``by`` and up of ``x`` in its first lanes, zeros in the last ``by`` (one
    byte shift, psrldq, for a 128-bit vector): the first lanes of a vector loaded so that
    it ends where its operand ends, not past it (``transform.past_end``).

        ShiftDown([a0 a1 a2 a3], 1)  ->  [a1 a2 a3 0]
    """

    by: int

    def __post_init__(self) -> None:
        if not 0 < self.by < self.x.lanes:
            raise ValueError(f"ShiftDown moves a {self.x.lanes}-lane vector by 1 to "
                             f"{self.x.lanes - 1} lanes, not {self.by}")


@dataclass(frozen=True, eq=True)
class Zip(_TwoVectors):
    """The low (``half`` 0) or high (1) half of the lanes of ``a`` and ``b`` interleaved,
    a0 b0 a1 b1 ...: with a tree of them, w vectors of the columns of a tile become its
    rows, contiguous in memory (a tile of C computed along a column, stored row by row).

        Zip([a0 a1 a2 a3], [b0 b1 b2 b3], 0)  ->  [a0 b0 a1 b1]
    """

    half: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.half not in (0, 1):
            raise ValueError(f"Zip: half must be 0 or 1, got {self.half!r}")


@dataclass(frozen=True, eq=True)
class Unzip(_TwoVectors):
    """The even (``odd`` 0) or odd (1) lanes of ``a`` followed by ``b``: the inverse of
    ``Zip``, columns of a tile out of its rows.

        Unzip([a0 a1 a2 a3], [b0 b1 b2 b3], 1)  ->  [a1 a3 b1 b3]
    """

    odd: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.odd not in (0, 1):
            raise ValueError(f"Unzip: odd must be 0 or 1, got {self.odd!r}")


def zip_lanes(lanes: int, half: int) -> list[int]:
    """Where ``Zip`` takes each lane from, counting ``b``'s lanes after ``a``'s."""
    return [half * lanes // 2 + i // 2 + (lanes if i % 2 else 0) for i in range(lanes)]


def unzip_lanes(lanes: int, odd: int) -> list[int]:
    """Where ``Unzip`` takes each lane from, counting ``b``'s lanes after ``a``'s."""
    return [2 * i + odd for i in range(lanes)]


@dataclass(frozen=True, eq=True)
class Permute(Expr):
    """Lanes of ``x`` (followed by ``y``'s, a vector of the same type, where given) in any
    order, as many as ``lanes_from`` names (a power of two, at most ``x``'s): lane i of
    the result is lane ``lanes_from[i]`` of them. The columns of a small row-major block
    loaded as one vector, one permute each (vpermps): A 3 x 3 f32 in the first 9 lanes of
    a 512-bit load, its column 1 is lanes (1, 4, 7, 0). With ``y``, one two-source
    permute (vpermt2ps): A 4 x 8 f32 in two registers, A[0..3, k] each splatted in its
    quarter.

        Permute([a0 a1 a2 a3 a4 a5 a6 a7], (1, 4, 7, 0))  ->  [a1 a4 a7 a0]
        Permute([a0 a1 a2 a3], (0, 5), [b0 b1 b2 b3])     ->  [a0 b1]
    """

    x: Expr
    lanes_from: tuple[int, ...]
    y: Expr | None = None

    def __post_init__(self) -> None:
        n = len(self.lanes_from)
        sources = self.x.lanes * (1 if self.y is None else 2)
        if (n < 2 or n & (n - 1) or n > self.x.lanes
                or not all(0 <= i < sources for i in self.lanes_from)):
            raise ValueError(f"Permute takes 2, 4, 8, ... lanes of the {sources} of its "
                             f"vectors, got {self.lanes_from!r}")
        if self.y is not None and (self.y.lanes, self.y.dtype) != (self.x.lanes,
                                                                   self.x.dtype):
            raise ValueError(f"Permute takes two vectors of one type, got {self.x.lanes} x "
                             f"{self.x.dtype} and {self.y.lanes} x {self.y.dtype}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.x.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return len(self.lanes_from)


@dataclass(frozen=True, eq=True)
class Ref(Expr):
    """The address of ``buf[index]``: a pointer argument for a ``Call``."""

    buf: str
    index: Expr
    dtype: str = "ptr"
    lanes: int = 1


def wrap(x: Expr | int) -> Expr:
    return x if isinstance(x, Expr) else Const(x)


def const_value(e: Expr | None) -> int | float | None:
    """The value of ``e`` when it is a constant (e.g. a count known at generation time)."""
    return e.value if isinstance(e, Const) else None


def add(a: Expr, b: Expr) -> Expr:
    if const_value(a) == 0:
        return b
    if const_value(b) == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value, a.dtype)
    return Bin("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    if const_value(b) == 0:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value - b.value, a.dtype)
    return Bin("-", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    if const_value(a) == 1:
        return b
    if const_value(b) == 1:
        return a
    if const_value(a) == 0 or const_value(b) == 0:
        return Const(0, a.dtype)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value, a.dtype)
    return Bin("*", a, b)


def minimum(a: Expr | int, b: Expr | int) -> Expr:
    return Bin("min", wrap(a), wrap(b))


def maximum(a: Expr | int, b: Expr | int) -> Expr:
    return Bin("max", wrap(a), wrap(b))


@dataclass(frozen=True, eq=True)
class Reduce(Expr):
    """The sum of a vector's lanes, a scalar (a horizontal add)."""

    x: Expr
    lanes: int = 1

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.x.dtype


@dataclass(frozen=True, eq=True)
class SumLanes(_OfSeveral):
    """Lane j is the sum of row j, where ``xs`` hold as many rows as they have lanes, in
    order: one row per vector (n vectors of n lanes), two, one in each half (n/2
    vectors: rows half a vector long, held in pairs), or four, one in each quarter (n/4
    vectors). The horizontal sums of the rows, transposed into one vector: rows of a
    matrix-vector product stored at once, not one scalar at a time.

        SumLanes((acc0, acc1, acc2, acc3))  ->  [hsum(acc0), hsum(acc1), hsum(acc2), hsum(acc3)]
        SumLanes((p0, p1)), 4 lanes each    ->  [hsum(lo(p0)), hsum(hi(p0)), hsum(lo(p1)), ...]
    """

    def __post_init__(self) -> None:
        n = self.xs[0].lanes if self.xs else 0
        if (len(self.xs) < 2 or n & (n - 1) or len(self.xs) not in (n, n // 2, n // 4)
                or any(x.lanes != n or x.dtype != self.xs[0].dtype for x in self.xs)):
            raise ValueError(f"SumLanes takes n, n/2 or n/4 vectors of n lanes of one type "
                             f"(n = 2, 4, 8, ...; at least two vectors), got "
                             f"{[(x.lanes, x.dtype) for x in self.xs]}")

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.xs[0].lanes

    @property
    def rows_per_vector(self) -> int:
        return self.lanes // len(self.xs)


@dataclass(frozen=True, eq=True)
class SumRows(_OfSeveral):
    """Lane j is the sum of all the lanes of ``xs[j]``: n rows wider than n lanes (four
    rows of 16 f32 summed into 4 lanes), transposed and added within parts of n lanes,
    then the parts added. The same sums as each row's halves added until it is n lanes
    wide and ``SumLanes`` of those, in fewer instructions: 13 for four rows of 16 f32
    where the halves took 16 and ``SumLanes`` 9 (``transform.sum_lanes``).

        SumRows((a, b, c, d)), 16 lanes each  ->  [hsum(a), hsum(b), hsum(c), hsum(d)]
    """

    def __post_init__(self) -> None:
        n, m = len(self.xs), (self.xs[0].lanes if self.xs else 0)
        if (n < 2 or n & (n - 1) or m <= n or m % n
                or any(x.lanes != m or x.dtype != self.xs[0].dtype for x in self.xs)):
            raise ValueError(f"SumRows takes n vectors (n = 2, 4, 8, ...) of one type and of "
                             f"more than n lanes, got {[(x.lanes, x.dtype) for x in self.xs]}")

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return len(self.xs)


# ----------------------------------------------------------------------------- statements


class Stmt:
    """Base of statements."""


@dataclass(frozen=True)
class Comment(Stmt):
    text: str


@dataclass(frozen=True)
class Decl(Stmt):
    """Declare a local variable with an initial value. ``in_register``: the value is kept
    in a register for all its uses, where a C compiler would rather fold a shared load
    into each instruction that uses it (gcc does, for vector loads used by several FMAs:
    twice the loads of a register tile)."""

    var: Var
    value: Expr
    in_register: bool = False


@dataclass(frozen=True)
class Assign(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True)
class Store(Stmt):
    """Write ``value`` (``value.lanes`` elements) to ``buf[index]``; with ``count``, only the
    first ``count`` lanes are written — a masked store. ``past_end`` as for ``Load``."""

    buf: str
    index: Expr
    value: Expr
    count: Expr | None = None
    past_end: bool = False

    def __post_init__(self) -> None:
        _check_count(self, self.count, self.value.lanes)


@dataclass(frozen=True)
class For(Stmt):
    """for var in range(start, stop, step) — ``step`` is a positive constant.

    ``unroll`` > 1 is a hint, not a transformation: the backend's compiler may unroll the
    loop that many times (the C backend prints ``#pragma GCC unroll``)."""

    var: Var
    start: Expr
    stop: Expr
    step: int
    body: tuple[Stmt, ...]
    unroll: int = 1


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@dataclass(frozen=True)
class Alloc(Stmt):
    """A scratch buffer of ``size`` elements, aligned to ``align`` bytes, freed by ``Free``."""

    buf: str
    dtype: str
    size: Expr
    align: int = 64


@dataclass(frozen=True)
class Local(Stmt):
    """A fixed-size array of the function (on the stack), not initialised: its writer
    fills it before anything reads it (zeroing it cost as much as computing it).
    ``heap``: too large for a thread's stack, it is allocated when the function starts
    and freed when it returns, and the function returns a status (``Function.status``)."""

    buf: str
    dtype: str
    size: int
    heap: bool = False


@dataclass(frozen=True)
class Free(Stmt):
    buf: str


@dataclass(frozen=True)
class Call(Stmt):
    func: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Prefetch(Stmt):
    """A hint that ``buf[index]`` will be read (``write`` for written) soon."""

    buf: str
    index: Expr
    write: bool = False


@dataclass(frozen=True)
class Barrier(Stmt):
    """A compiler barrier: no memory access moves across it, and a value loaded before it
    is loaded again after it. Between the straight-line register blocks of a small kernel
    it keeps gcc from reusing one block's loads in a later block (a row of B shared by
    blocks of different rows), which keeps them live across blocks and spills them; at
    the top of a loop over blocks of rows it keeps gcc from hoisting those loads out of
    the loop, with the same result.

    ``locals``: whether it holds for the function's local arrays too (the C backend names
    those stored to before it). gcc lets a plain memory clobber pass a local whose
    address never escapes: across straight-line blocks it then keeps a temporary's
    values in registers, which ran faster than reloading them (C = alpha*A*B + beta*C
    12 x 4 x 12 f32 on AVX2: alpha*B in registers, no stack access, 0.91x when
    reloaded); at the top of a loop it hoists the temporary's loads out of the loop and
    spills them (48 x 4 x 48 f32 on AVX-512: 1.3x as fast when reloaded)."""

    locals: bool = False


# ----------------------------------------------------------------------------- tile operations


@dataclass(frozen=True)
class Tile:
    """A register tile of accumulators: ``rows x cols`` elements of ``dtype``, its columns
    held ``lanes`` at a time in vector registers (1: scalars). With ``along='k'`` each
    element has a vector of its own holding ``lanes`` partial sums over the reduction,
    added up when the tile is stored (a tile of dot products)."""

    name: str
    dtype: str
    rows: int
    cols: int
    lanes: int = 1
    along: str = "j"


@dataclass(frozen=True)
class Operand2D:
    """A 2-D view of a buffer: element (r, c) is ``buf[offset + r*rs + c*cs]``."""

    buf: str
    offset: Expr
    rs: Expr
    cs: Expr

    def at(self, r: Expr | int, c: Expr | int) -> Expr:
        return self.offset + wrap(r) * self.rs + wrap(c) * self.cs


@dataclass(frozen=True)
class PackSlivers(Stmt):
    """Copy ``src[0:rows, 0:cols]`` into ``dst`` as slivers of ``width`` rows:
    ``dst[s*width*cols + c*width + r] = src[s*width + r, c]``, zero past ``rows``."""

    dst: str
    src: Operand2D
    rows: Expr
    cols: Expr
    width: int
    dtype: str


@dataclass(frozen=True)
class TileZero(Stmt):
    tile: Tile


@dataclass(frozen=True)
class TileMMA(Stmt):
    """tile += a[0:tile.rows, 0:k] @ b[0:k, 0:tile.cols].

    ``rows``/``cols`` are the valid extents at the matrix edges; when ``padded`` the
    operands hold zeros (or at least readable memory) past them, so full tiles may be
    read, otherwise reads past the edges must be avoided. ``unroll`` is the
    unroll-and-jam factor of the k loop; ``prefetch`` names contiguous (packed) panels
    to prefetch that many k steps ahead."""

    tile: Tile
    a: Operand2D
    b: Operand2D
    k: Expr
    rows: Expr
    cols: Expr
    padded: bool
    unroll: int = 1
    prefetch: tuple[tuple[str, int], ...] = ()  # ("a" | "b", distance in k steps)


@dataclass(frozen=True)
class TileStore(Stmt):
    """c[0:rows, 0:cols] = alpha * tile + beta * c, never reading c when beta == 0."""

    tile: Tile
    c: Operand2D
    rows: Expr
    cols: Expr
    alpha: Expr
    beta: Expr


# ----------------------------------------------------------------------------- functions


@dataclass(frozen=True)
class Param:
    """A function parameter: a scalar (``pointer`` False) or a pointer to elements, of
    which ``extent`` are the operand's when known (``transform.past_end``)."""

    name: str
    dtype: str
    pointer: bool = False
    const: bool = False
    extent: int | None = None

    @property
    def var(self) -> Var:
        return Var(self.name, self.dtype)


@dataclass(frozen=True)
class Function:
    """``status``: an exported function returns an int, 0 or 1 where a scratch allocation
    failed; without it (a kernel that allocates nothing) it returns nothing, one
    instruction less in a call of a nanosecond."""

    name: str
    params: tuple[Param, ...]
    body: tuple[Stmt, ...]
    exported: bool = False
    status: bool = True


@dataclass(frozen=True)
class Module:
    functions: tuple[Function, ...]
    entry: str
    attributes: tuple[tuple[str, str], ...] = field(default=())

    def function(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def replace_function(self, func: Function) -> Module:
        funcs = tuple(func if f.name == func.name else f for f in self.functions)
        return Module(funcs, self.entry, self.attributes)


# ----------------------------------------------------------------------------- matrix values
#
# Small matrices held in one flat vector, column-major as in LLVM's matrix intrinsics: a
# ``rows x cols`` matrix is a vector of ``rows * cols`` lanes and lane ``c * rows + r`` holds
# element (r, c). ``transform.lower_matrix`` makes them from register tiles; the LLVM backend
# prints them as ``llvm.matrix.*`` calls and ``transform.lower_matrix.expand_matrix`` turns
# them into plain loads, FMAs and stores for backends without the intrinsics (C).


def _check_shape(node: str, **dims: int) -> None:
    for what, n in dims.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{node}: {what} must be a positive integer, got {n!r}")


@dataclass(frozen=True, eq=True)
class MatrixLoad(Expr):
    """``buf[index + c*stride + r]`` for r < rows, c < cols, as one column-major vector
    (``llvm.matrix.column.major.load``). ``stride`` must be >= ``rows``: columns may not
    overlap, as LLVM requires.

        MatrixLoad("b", p*b_rs, b_rs, 16, 4, "f32")  ->  <64 x float>, column c = row p+c of b
    """

    buf: str
    index: Expr
    stride: Expr
    rows: int
    cols: int
    dtype: str

    def __post_init__(self) -> None:
        _check_shape("MatrixLoad", rows=self.rows, cols=self.cols)

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.rows * self.cols


@dataclass(frozen=True, eq=True)
class MatrixMultiply(Expr):
    """(rows x inner) @ (inner x cols) of two column-major matrix values, a column-major
    ``rows x cols`` value (``llvm.matrix.multiply``). The order of each element's sum and the
    fusing of multiply-adds are left to the backend (LLVM's ``contract``), and so is folding
    an accumulation ``acc + product`` into the sum: results agree up to rounding."""

    a: Expr
    b: Expr
    rows: int
    inner: int
    cols: int

    def __post_init__(self) -> None:
        _check_shape("MatrixMultiply", rows=self.rows, inner=self.inner, cols=self.cols)
        if self.a.lanes != self.rows * self.inner or self.b.lanes != self.inner * self.cols:
            raise ValueError(f"MatrixMultiply {self.rows}x{self.inner}x{self.cols}: operands "
                             f"have {self.a.lanes} and {self.b.lanes} lanes, need "
                             f"{self.rows * self.inner} and {self.inner * self.cols}")
        if self.a.dtype != self.b.dtype:
            raise ValueError(f"MatrixMultiply of {self.a.dtype} and {self.b.dtype}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return self.rows * self.cols


@dataclass(frozen=True)
class MatrixStore(Stmt):
    """Write the column-major ``rows x cols`` matrix ``value`` to ``buf[index + c*stride + r]``
    (``llvm.matrix.column.major.store``); ``stride`` >= ``rows``."""

    buf: str
    index: Expr
    stride: Expr
    value: Expr
    rows: int
    cols: int

    def __post_init__(self) -> None:
        _check_shape("MatrixStore", rows=self.rows, cols=self.cols)
        if self.value.lanes != self.rows * self.cols:
            raise ValueError(f"MatrixStore {self.rows}x{self.cols}: the value has "
                             f"{self.value.lanes} lanes")
