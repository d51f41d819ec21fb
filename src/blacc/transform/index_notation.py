"""From a typed BLAC program (frontend) to index notation (ir.indexed), fusing.

Each statement becomes one operation computing its output element by element;
products become sums over a fresh index (LGen's Table 2 rules in index form):

    [a + b](i,j) = a(i,j) + b(i,j)        [a'](i,j) = a(j,i)
    [s * a](i,j) = s * a(i,j)             [a * b](i,j) = sum_k a(i,k) * b(k,j)

so ``beta = (A*x + alpha*y)'*z + beta`` is one pass. A product's operand that itself
contains a product is recomputed for every output element it meets; when that
happens more than once (the other output dimension is longer than 1) it is
computed once into a temporary instead. An operand that adds or subtracts several
arrays, ``(A0 + A1)'*B``, may be computed once too, and so may a product's right
operand with the product's scalars moved onto it, ``alpha*A*x`` -> ``A*t0`` with
``t0 = alpha*x``, or, where several products are scaled, onto it in place
(``scalars_inside``): ``forms`` gives every version and the cost model picks one. Those
are the only temporaries made.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from ..frontend import typed as t
from ..ir import indexed as ix
from ..runtime.signature import ARRAY, IN, INOUT, OUT, SCALAR, ArgSpec
from .associate import reassociated_program


@dataclass
class _State:
    ops: list[ix.Op] = field(default_factory=list)
    temps: list[ix.Operand] = field(default_factory=list)
    counter: int = 0
    combine_once: bool = False
    scale_once: bool = False
    declared: frozenset[str] = frozenset()

    def fresh_index(self) -> str:
        self.counter += 1
        return f"k{self.counter}"

    def fresh_temporary(self) -> str:
        """t0, t1, ...: the first not declared by the program nor taken already."""
        taken = self.declared | {o.name for o in self.temps}
        return next(n for n in (f"t{i}" for i in itertools.count()) if n not in taken)


def _has_product(e: t.TExpr) -> bool:
    return any(isinstance(n, t.TMul) and n.op != "scale" for n in t.walk(e))


def _lower(e: t.TExpr, at: tuple[ix.IndexRef, ix.IndexRef], extents: dict[str, int],
           st: _State) -> ix.Node:
    r, c = at
    if isinstance(e, t.TNum):
        return ix.Lit(e.value)
    if isinstance(e, t.TRef):
        return ix.Read(e.name, (r if e.rows > 1 else 0, c if e.cols > 1 else 0))
    if isinstance(e, t.TNeg):
        return ix.Neg(_lower(e.x, at, extents, st))
    if isinstance(e, t.TTranspose):
        return _lower(e.x, (c, r), extents, st)
    if isinstance(e, t.TAdd):
        return ix.Add(_lower(e.a, at, extents, st), _lower(e.b, at, extents, st))
    if isinstance(e, t.TSub):
        return ix.Add(_lower(e.a, at, extents, st), ix.Neg(_lower(e.b, at, extents, st)))
    if isinstance(e, t.TMul):
        if e.op == "scale":
            a_at = (0, 0) if e.a.shape == (1, 1) else at
            b_at = (0, 0) if e.b.shape == (1, 1) else at
            return ix.Mul(_lower(e.a, a_at, extents, st), _lower(e.b, b_at, extents, st))
        inner = e.a.cols
        kk: ix.IndexRef = st.fresh_index() if inner > 1 else 0
        inner_extents = {**extents, kk: inner} if isinstance(kk, str) else extents
        # a(i,k) is met once per output column, b(k,j) once per output row
        reuse = (_extent(c, extents) > 1, _extent(r, extents) > 1)
        moved = _scalars_moved(e, reuse) if st.scale_once else None
        if moved is not None:
            a = _operand(moved[0], (r, kk), reuse=reuse[0], extents=inner_extents, st=st)
            b = _temporary(moved[1], (kk, c), st)
        else:
            a = _operand(e.a, (r, kk), reuse=reuse[0], extents=inner_extents, st=st)
            b = _operand(e.b, (kk, c), reuse=reuse[1], extents=inner_extents, st=st)
        body = ix.Mul(a, b)
        return ix.Sum(kk, inner, body) if isinstance(kk, str) else body
    raise TypeError(f"cannot lower {type(e).__name__}")


def _extent(index: ix.IndexRef, extents: dict[str, int]) -> int:
    return extents.get(index, 1) if isinstance(index, str) else 1


def _operand(e: t.TExpr, at: tuple[ix.IndexRef, ix.IndexRef], *, reuse: bool,
             extents: dict[str, int], st: _State) -> ix.Node:
    if reuse and _has_product(e):
        return _temporary(e, at, st)
    if reuse and st.combine_once and _arrays_read(e) > 1:
        return _combined_once(e, at, extents, st)
    return _lower(e, at, extents, st)


def _temporary(e: t.TExpr, at: tuple[ix.IndexRef, ix.IndexRef], st: _State) -> ix.Node:
    """``e`` computed once by an operation of its own; read at ``at``."""
    name = st.fresh_temporary()
    st.temps.append(ix.Operand(name, e.rows, e.cols, temporary=True))
    st.ops.append(_op(name, e, st))
    return ix.Read(name, (at[0] if e.rows > 1 else 0, at[1] if e.cols > 1 else 0))


def _arrays_read(e: t.TExpr) -> int:
    return len({n.name for n in t.walk(e) if isinstance(n, t.TRef) and n.shape != (1, 1)})


def _combined_once(e: t.TExpr, at: tuple[ix.IndexRef, ix.IndexRef],
                   extents: dict[str, int], st: _State) -> ix.Node:
    """A product operand that combines several arrays element-wise, ``alpha*(A0 + A1)'``:
    the combination ``A0 + A1`` is computed once, in its own orientation (so that it
    vectorizes along its rows), instead of once per output tile that meets it; the
    transposes, signs and scalar factors around it stay in the product."""
    if _arrays_read(e) <= 1:
        return _lower(e, at, extents, st)
    if isinstance(e, t.TTranspose):
        return _combined_once(e.x, (at[1], at[0]), extents, st)
    if isinstance(e, t.TNeg):
        return ix.Neg(_combined_once(e.x, at, extents, st))
    if isinstance(e, t.TMul) and e.op == "scale":
        scalar, array = (e.a, e.b) if e.a.shape == (1, 1) else (e.b, e.a)
        return ix.Mul(_lower(scalar, (0, 0), extents, st),
                      _combined_once(array, at, extents, st))
    return _temporary(e, at, st)


def _peel_scalars(e: t.TExpr) -> tuple[list[t.TExpr], t.TExpr]:
    """The scalar factors of a scaled array and the array: alpha*(beta*A) -> [alpha, beta], A."""
    if isinstance(e, t.TMul) and e.op == "scale":
        scalar, array = (e.a, e.b) if e.a.shape == (1, 1) else (e.b, e.a)
        if array.shape != (1, 1):
            inner, arr = _peel_scalars(array)
            return [scalar, *inner], arr
    return [], e


def _scalars_moved(e: t.TMul, reuse: tuple[bool, bool]) -> tuple[t.TExpr, t.TExpr] | None:
    """``(alpha*A)*x`` as ``A*(alpha*x)`` with ``alpha*x`` to be computed once: the scalar
    factors of both operands move onto the right one when it is a single array that the
    product meets more than once and has fewer elements than the result (so scaling it
    costs less than scaling every result). Only the right one: it is read as vectors
    (along its rows, or along the reduction), while the left one is broadcast element by
    element where the result is vectorized along its rows, and broadcasting an element
    just stored as part of a vector stalls on store forwarding (``C = alpha*A*B`` with A
    4x4 scaled once ran 0.79-0.96x). (a, b) or None."""
    sa, a = _peel_scalars(e.a)
    sb, b = _peel_scalars(e.b)
    scalars = sa + sb
    if (not scalars or not reuse[1] or b.rows * b.cols >= e.rows * e.cols
            or _arrays_read(b) != 1 or _has_product(b)):
        return None
    scale = scalars[0]
    for x in scalars[1:]:
        scale = t.TMul(scale, x, "scale", (1, 1))
    return a, t.TMul(scale, b, "scale", b.shape)


def merge_sums(n: ix.Node) -> ix.Node:
    """sum_k a(k) + sum_l b(l) -> sum_k (a(k) + b(k)) for sums over equal extents: one
    chain of multiply-adds instead of two accumulators added at the end. Only sums added
    directly to each other merge; a scaled sum keeps its scalar outside."""
    if isinstance(n, ix.Add):
        a, b = merge_sums(n.a), merge_sums(n.b)
        if isinstance(a, ix.Sum) and isinstance(b, ix.Sum) and a.extent == b.extent:
            fresh = f"{a.index}_{b.index}"
            return ix.Sum(fresh, a.extent, ix.Add(_rename(a.body, a.index, fresh),
                                                  _rename(b.body, b.index, fresh)))
        return ix.Add(a, b)
    return n


def _op(target: str, e: t.TExpr, st: _State) -> ix.Op:
    extents = {"i": e.rows, "j": e.cols}
    at = ("i" if e.rows > 1 else 0, "j" if e.cols > 1 else 0)
    body = _lower(e, at, extents, st)
    return ix.Op(target, ("i", "j"), body)


def _factors(n: ix.Node) -> list[ix.Node]:
    if isinstance(n, ix.Mul):
        return _factors(n.a) + _factors(n.b)
    return [n]


def _product(factors: list[ix.Node]) -> ix.Node:
    out = factors[0]
    for f in factors[1:]:
        out = ix.Mul(out, f)
    return out


def _on_sums(n: ix.Node, f: Callable[[ix.Sum], ix.Node]) -> ix.Node:
    """``n`` with every outermost Sum replaced by ``f(sum)`` (``f`` decides whether to
    descend into the sum's body)."""
    if isinstance(n, ix.Neg):
        return ix.Neg(_on_sums(n.x, f))
    if isinstance(n, (ix.Add, ix.Mul)):
        return type(n)(_on_sums(n.a, f), _on_sums(n.b, f))
    return f(n) if isinstance(n, ix.Sum) else n


def hoist_invariant_factors(n: ix.Node) -> ix.Node:
    """sum_k s * a(k) * b(k) -> s * sum_k a(k) * b(k) when s does not depend on k, so
    ``alpha*A*B`` scales each result once instead of every product term.

        Sum(k, Mul(Mul(alpha, A[i,k]), B[k,j]))  ->  Mul(alpha, Sum(k, Mul(A[i,k], B[k,j])))
    """

    def hoist(s: ix.Sum) -> ix.Node:
        body = hoist_invariant_factors(s.body)
        factors = _factors(body)
        outside = [f for f in factors
                   if s.index not in ix.indices_used(f) and not ix.has_sum(f)]
        inside = [f for f in factors if f not in outside]
        if not outside or not inside:
            return ix.Sum(s.index, s.extent, body)
        return ix.Mul(_product(outside), ix.Sum(s.index, s.extent, _product(inside)))

    return _on_sums(n, hoist)


def _rename(n: ix.Node, old: str, new: str) -> ix.Node:
    """Free occurrences of index ``old`` renamed to ``new`` (a Sum binding ``old`` again
    shadows it)."""
    if isinstance(n, ix.Read):
        return ix.Read(n.operand, tuple(new if i == old else i for i in n.index))
    if isinstance(n, ix.Neg):
        return ix.Neg(_rename(n.x, old, new))
    if isinstance(n, (ix.Add, ix.Mul)):
        return type(n)(_rename(n.a, old, new), _rename(n.b, old, new))
    if isinstance(n, ix.Sum) and n.index != old:
        return ix.Sum(n.index, n.extent, _rename(n.body, old, new))
    return n


def _unique_sums(n: ix.Node, fresh: Iterator[str]) -> ix.Node:
    """Every summation index renamed to a fresh name, innermost first (a fresh name is
    never one the body uses, so nothing is captured)."""

    def unique(s: ix.Sum) -> ix.Node:
        name = next(fresh)
        return ix.Sum(name, s.extent, _rename(_unique_sums(s.body, fresh), s.index, name))

    return _on_sums(n, unique)


def _depth_names(n: ix.Node, depth: int) -> ix.Node:
    def by_depth(s: ix.Sum) -> ix.Node:
        name = f"k{depth + 1}"
        return ix.Sum(name, s.extent, _depth_names(_rename(s.body, s.index, name), depth + 1))

    return _on_sums(n, by_depth)


def name_sums_by_depth(n: ix.Node) -> ix.Node:
    """Name every summation index after its nesting depth (k1 outermost, k2 inside it...),
    so sibling sums share a name and one schedule vectorizes all of them: in
    ``alpha*A*x + beta*B*x`` both products reduce along ``k1``, instead of ``k1`` and
    ``k2`` with only one of them on the vector lanes. Indices first get unique names so
    that renaming an outer sum cannot capture an inner one's index (or the reverse)."""
    fresh = (f"_s{i}" for i in itertools.count())
    return _depth_names(_unique_sums(n, fresh), 0)


def forms(program: t.TypedProgram) -> tuple[ix.Program, ...]:
    """The ways to write ``program`` in index notation, fully fused first, without
    repeats. The others compute some product operands once into temporaries:
    ``combine_once``, an operand that combines several arrays element-wise (see
    ``_combined_once``); ``scale_once``, the scalar factors of a product moved onto its
    right operand, scaled once (``_scalars_moved``), with the sums added together then
    merged into one (``merge_sums``): ``alpha*A*x + beta*B*x`` becomes
    ``sum_k A(i,k)*t0(k) + B(i,k)*t1(k)`` with ``t0 = alpha*x``, ``t1 = beta*x``; and,
    last, the fused form with the scalars moved in place (``scalars_inside``). Which is
    faster depends on the shapes: the cost model decides. Each comes as written and, where
    a chain of products has an association with fewer multiplies (``A*B*x`` as
    ``A*(B*x)``, see ``associate``), in that association too."""
    out: list[ix.Program] = []
    inside: list[ix.Program] = []
    for associated in (program, reassociated_program(program)):
        for scale_once, combine_once in itertools.product((False, True), repeat=2):
            p = to_indexed(associated, combine_once=combine_once, scale_once=scale_once)
            if p not in out:
                out.append(p)
            if (not (scale_once or combine_once) and (q := scalars_inside(p)) is not None
                    and q not in inside):
                inside.append(q)
    # last: a tie goes to the forms above
    return tuple(out) + tuple(q for q in inside if q not in out)


def scalars_inside(program: ix.Program) -> ix.Program | None:
    """``program`` with the scalar factors of its scaled sums moved onto each sum's right
    operand, in place (``_scalars_into``): ``alpha*A*x + beta*B*x`` as ``sum_k
    A(i,k)*(alpha*x(k)) + sum_k B(i,k)*(beta*x(k))``, where x is scaled once per vector
    of it that the rows share, not each result twice; or None where fewer than two sums
    are scaled, which it saves too little to be worth modelling (``scale_once`` puts the
    scaled operand in a temporary instead). y = alpha*A*x + beta*B*x, 8 x 8 f32, ran 5.2
    -> 4.2 ns a call with it (a Xeon, CPU model 167, LGen's harness)."""
    moved = [0]
    ops = []
    for op in program.ops:
        out = program.operand(op.out)
        extents = dict(zip(op.dims, (out.rows, out.cols), strict=True))
        ops.append(ix.Op(op.out, op.dims, _scalars_into(op.body, extents, moved)))
    return replace(program, ops=tuple(ops)) if moved[0] >= 2 else None


def _scalars_into(n: ix.Node, extents: dict[str, int], moved: list[int]) -> ix.Node:
    """``s * sum_k a(k)*b(k)`` -> ``sum_k a(k)*(s*b(k))`` for a scalar factor ``s`` (no
    index, no sum) and a right operand ``b`` without sums, outside any sum, where ``b``
    has no more elements than the result (``extents``: its dimensions), as for
    ``scale_once``: y = alpha*A*x + beta*B*x with A 4 x 100 f32, x scaled in every
    step of the sum, ran 0.89x on AVX2. ``moved`` counts them."""
    if isinstance(n, ix.Neg):
        return ix.Neg(_scalars_into(n.x, extents, moved))
    if isinstance(n, ix.Add):
        return ix.Add(_scalars_into(n.a, extents, moved), _scalars_into(n.b, extents, moved))
    if isinstance(n, ix.Mul):
        s, rest = n.a, n.b
        if (isinstance(rest, ix.Sum) and isinstance(rest.body, ix.Mul)
                and not ix.indices_used(s) and not ix.has_sum(s)
                and not ix.has_sum(term := rest.body.b)
                and _elements(term, {**extents, rest.index: rest.extent})
                <= math.prod(extents.values())):
            moved[0] += 1
            return ix.Sum(rest.index, rest.extent, ix.Mul(rest.body.a, ix.Mul(s, term)))
        return ix.Mul(_scalars_into(n.a, extents, moved), _scalars_into(n.b, extents, moved))
    return n


def _elements(n: ix.Node, extents: dict[str, int]) -> int:
    """How many values ``n`` takes over the indices it uses."""
    return math.prod(extents[i] for i in ix.indices_used(n))


def to_indexed(program: t.TypedProgram, *, combine_once: bool = False,
               scale_once: bool = False) -> ix.Program:
    """The program in index notation, one operation per statement plus temporaries
    (``combine_once``, ``scale_once``: see ``forms``)."""
    st = _State(combine_once=combine_once, scale_once=scale_once,
                declared=frozenset(program.decls))
    for stmt in program.statements:
        op = _op(stmt.target, stmt.expr, st)
        st.ops.append(op)

    def tidy(body: ix.Node) -> ix.Node:
        body = hoist_invariant_factors(body)
        return name_sums_by_depth(merge_sums(body) if scale_once else body)

    st.ops[:] = [ix.Op(op.out, op.dims, tidy(op.body)) for op in st.ops]
    operands = [ix.Operand(n, *_shape(program, n)) for n in program.operands]
    return ix.Program((*operands, *st.temps), tuple(st.ops), program.dtype)


def _shape(program: t.TypedProgram, name: str) -> tuple[int, int]:
    return program.decls[name].shape


def arg_specs(program: t.TypedProgram) -> tuple[ArgSpec, ...]:
    """The kernel's parameters: inputs, then outputs that are not inputs (see
    TypedProgram.operands); outputs whose values on entry are read (inputs of the program,
    TypedProgram.inputs) are 'inout'. An output read only after a statement has
    assigned it (``y = A*x; y = 2*y``) is 'out': its values on entry are never used."""
    specs = []
    for name in program.operands:
        d = program.decls[name]
        rows, cols = _shape(program, name)
        if name not in program.outputs:
            role = IN
        elif name in program.inputs:
            role = INOUT
        else:
            role = OUT
        kind = SCALAR if d.kind == "scalar" else ARRAY
        layout = getattr(d, "layout", "row")
        specs.append(ArgSpec(name, kind, program.dtype, role, rows, cols, layout,
                             getattr(d, "ld", None), vector=d.kind == "vector"))
    return tuple(specs)
