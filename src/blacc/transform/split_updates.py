"""Updates of an operand in place moved in 256-bit pieces on AVX-512.

A kernel that updates an operand (``y = alpha*x + y``, ``C = alpha*A*B + beta*C``) loads
it, computes and stores it back; called again, it loads what it stored, and that load
waits until the store forwards its data. On Zen 5 a load forwarded from a 512-bit store
comes about two cycles later than one from a 256-bit store, and a masked 512-bit load is
not forwarded from the plain pieces its leftover was stored in (``Isa.plain_moves``):
y = alpha*x + y, 16-64 f32, ran 3.6 ns a call in 512-bit vectors and 3.1 in 256-bit
ones; C = alpha*(A0 + A1)'*B + beta*C, 4 x 4 x 12 f32, 8.0 ns with rows of C as masked
512-bit vectors and 7.0 with AVX2's 8 + 4 (the LGen harness, which calls a kernel again
and again on the same operands, as a loop over time steps would).

So a statement that stores a 512-bit vector into a buffer, loaded in the same statement
at the same place (an update), becomes one statement per 256- or 128-bit piece: its
valid lanes as whole vectors of 256 and then 128 bits, and what is left as one masked
128-bit vector. Along the path from the update's load to the store the value is computed
piece by piece (loads of the piece, narrower broadcasts); what does not wait on that
load (alpha times the accumulator) is computed whole, once, and taken apart into its
halves (``Half``), off the chain that runs through memory from one call to the next.

The pieces cost loads, stores and FMAs: where the kernel is longer than that chain they
cost more than they save (0.7-0.95x), so a plan splits only short straight-line kernels
and masked updates (``strategy.small.split_short_updates``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..ir.walk import map_bodies, names_used, nodes_of, simplify
from ..target.isa import Isa

#: Bytes of the widest vector a split update moves at once.
PIECE_BYTES = 32
#: Prefix of the variables that hold what the pieces share.
PREFIX = "whole"


def split_updates(body: tuple[k.Stmt, ...], isa: Isa,
                  max_pieces: int | None = None) -> tuple[k.Stmt, ...]:
    """``body`` with every 512-bit update of a buffer in place (a store whose value loads
    the same lanes) split into pieces of at most ``PIECE_BYTES`` (AVX-512 only); ``body``
    as it is where that makes more than ``max_pieces`` pieces in all."""
    if not isa.mask_registers:
        return body
    taken = names_used(body)
    counter = itertools.count(1)

    def fresh(e: k.Expr) -> k.Var:
        while (name := f"{PREFIX}{next(counter)}") in taken:
            pass
        return k.Var(name, e.dtype, e.lanes)

    pieces = 0

    def in_list(stmts: tuple[k.Stmt, ...]) -> tuple[k.Stmt, ...]:
        nonlocal pieces
        out: list[k.Stmt] = []
        for s in stmts:
            s = map_bodies(s, in_list)
            split = _split(s, isa, fresh) if isinstance(s, k.Store) else (s,)
            if split != (s,):
                pieces += sum(isinstance(x, k.Store) for x in split)
            out.extend(split)
        return tuple(out)

    out = in_list(body)
    return body if max_pieces is not None and pieces > max_pieces else out


def _split(s: k.Store, isa: Isa, fresh: Callable[[k.Expr], k.Var]) -> tuple[k.Stmt, ...]:
    v = s.value
    if v.lanes * itemsize(v.dtype) != 64:
        return (s,)
    update = next((e for e in nodes_of(v, k.Load) if e.buf == s.buf and e.index == s.index
                   and e.lanes == v.lanes and e.count == s.count), None)
    count = k.Const(v.lanes) if s.count is None else s.count
    if update is None or not isinstance(count, k.Const):
        return (s,)
    # what does not wait on the update is computed whole, once, and taken apart
    named: list[k.Stmt] = []

    def hoist(e: k.Expr) -> k.Expr:
        if (e.lanes == 1 or isinstance(e, (k.Load, k.Broadcast, k.Const, k.Var))
                or update in nodes_of(e, k.Load)):
            return e
        var = fresh(e)
        named.append(k.Decl(var, e))
        return var

    v = _outside_in(v, hoist)
    out = []
    for off, width, valid in _pieces(count.value, v.lanes, isa.widths(v.dtype)):
        value = _window(v, off, width)
        if value is None:
            return (s,)
        out.append(k.Store(s.buf, simplify(s.index + off), value,
                           None if valid == width else k.Const(valid)))
    return (*named, *out)


def _outside_in(e: k.Expr, fn: Callable[[k.Expr], k.Expr]) -> k.Expr:
    """``e`` with ``fn`` applied to each lane-wise operand from the root down, stopping
    where ``fn`` replaces one."""
    new = fn(e)
    if new is not e or type(e) not in _LANE_WISE:
        return new
    return replace(e, **{f: _outside_in(getattr(e, f), fn) for f in _LANE_WISE[type(e)]})


#: Lane-wise operations and their operands.
_LANE_WISE = {k.Bin: ("a", "b"), k.Fma: ("a", "b", "c"), k.Select: ("cond", "a", "b")}


def _pieces(count: int, lanes: int, widths: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(offset, width, valid lanes) of the pieces that move the first ``count`` lanes:
    whole vectors of at most ``PIECE_BYTES``, widest first, then one masked vector of
    the narrowest width for the rest."""
    vectors = [w for w in widths if 1 < w < lanes and w * 64 // lanes <= PIECE_BYTES]
    out, off = [], 0
    for w in vectors:
        while count - off >= w:
            out.append((off, w, w))
            off += w
    if off < count:
        out.append((off, vectors[-1], count - off))
    return out


def _window(e: k.Expr, off: int, width: int) -> k.Expr | None:
    """Lanes ``off`` .. ``off + width`` of ``e``; None where they cannot be taken."""
    if e.lanes == width and off == 0:
        return e
    if e.lanes == 1:  # a scalar operand of a lane-wise operation
        return e
    if isinstance(e, k.Load):
        count = e.count
        if count is not None:
            if not isinstance(count, k.Const):
                return None
            count = None if count.value >= off + width else k.Const(count.value - off)
        return k.Load(e.buf, simplify(e.index + off), e.dtype, width, count)
    if isinstance(e, (k.Broadcast, k.Const)):
        return replace(e, lanes=width)
    if isinstance(e, tuple(_LANE_WISE)):
        parts = {f: _window(getattr(e, f), off, width) for f in _LANE_WISE[type(e)]}
        return None if None in parts.values() else replace(e, **parts)
    while e.lanes > width:  # any other value: its halves, and their halves
        half = e.lanes // 2
        e, off = k.Half(e, off // half), off % half
    return e
