"""Mark the masked moves whose masked-off lanes may lie past the end of their operand.

A masked load or store reads or writes only its first ``count`` lanes, and the others
do not fault; but where they fall on a page that is not mapped (the page after an
array, which nothing touches) the core takes a microcode assist for each such move:
about 140 ns on Zen 5, AVX2's ``vmaskmov`` and AVX-512's mask registers alike (a
12-of-16 f32 load ending at a page boundary: 0.5 ns a move with the next page touched,
147 ns with it untouched or inaccessible). An array that ends there would make every
call ~50 times as slow. So the moves that may reach past the end of a parameter (its
``extent``) are changed, and the others stay masked:

* a 128-bit load that can start earlier within its operand loads the vector that ends
  where its lanes end and shifts them down (``k.ShiftDown``, where the ISA has it: one
  load and one byte shift, about the cost of the masked load; C = A*B 3 x 3 x 3 f32,
  the last row of B: 1.70 ns a call masked, 1.73 shifted, 1.81 as three plain pieces
  joined). Not for a buffer the kernel also stores into: a load that overlaps an
  earlier store in part is not forwarded from it. Wider vectors have no such shift in
  one cheap instruction: C = alpha*(A0 + A1)'*B + beta*C 5 x 5 x 5 f32, the last 9 of
  16 lanes of A0, A1, B shifted by valignd, 6.3 ns a call; in pieces 8 + 1, 5.8.
* any other is flagged ``past_end``: the backends move its first lanes as plain pieces
  (``Isa.plain_moves``).

Within an array, a page the masked-off lanes reach holds later elements, which the
kernel or its caller touches.

An access's reach is bounded by interval arithmetic on its index over the ranges of the
loops around it; one it cannot bound is taken to reach past the end. Parameters of no
known extent (GEMM's, sized at run time) are left as they are.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

from ..ir import kernel as k
from ..ir.walk import any_node, map_bodies, read_back_buffers, rewrite, simplify
from ..target.isa import Isa

Interval = tuple[int, int]


def mark_past_end(module: k.Module, isa: Isa) -> k.Module:
    """``module`` with each masked move that may reach past the end of a parameter with
    a known ``extent`` shifted (a load, where ``isa`` has the shift) or flagged
    ``past_end``."""
    funcs = []
    for f in module.functions:
        extents = {p.name: p.extent for p in f.params if p.pointer and p.extent is not None}
        if extents and _has_masked(f.body):
            f = replace(f, body=_marked(f.body, _Rules(extents, f.body, isa), {}))
        funcs.append(f)
    return replace(module, functions=tuple(funcs))


def _has_masked(node: object) -> bool:
    """Whether ``node`` holds a masked move: a quick walk, since the search builds (and
    so marks) many large kernels that have none (a 100 x 100 C: 1.8 s of 10 when each
    was rebuilt node by node)."""
    return any_node(node, lambda x: isinstance(x, (k.Load, k.Store)) and x.count is not None)


class _Rules:
    """What the pass knows of one function: its parameters' extents, its body (for the
    buffers it reads back, found only when a load could be shifted) and the ISA."""

    def __init__(self, extents: dict[str, int], body: tuple[k.Stmt, ...], isa: Isa):
        self.extents, self.body, self.isa = extents, body, isa

    @cached_property
    def read_back(self) -> frozenset[str]:
        return read_back_buffers(self.body)

    def mark(self, x: object, ranges: dict[str, Interval]) -> object:
        if not isinstance(x, (k.Load, k.Store)) or x.count is None:
            return x
        lanes = x.lanes if isinstance(x, k.Load) else x.value.lanes
        if lanes == 1 or x.buf not in self.extents:
            return x
        past = reaches_past(x.index, lanes, self.extents[x.buf], ranges)
        if past and isinstance(x, k.Load) and (shifted := self.shifted(x, ranges)):
            return shifted
        return replace(x, past_end=past)

    def shifted(self, e: k.Load, ranges: dict[str, Interval]) -> k.Expr | None:
        """``e`` as the vector that ends where its lanes end, shifted down; None where it
        would start before its buffer, the kernel stores into that buffer, the ISA has
        no shift of that width, or one plain load moves the lanes (2 of 8 f64: vmovupd
        xmm, no shift)."""
        count = k.const_value(e.count)
        if (count is None or not 0 < count < e.lanes or e.buf in self.read_back
                or not self.isa.has_op("shift_down", e.dtype, e.lanes)
                or self.isa.plain_moves("load", e.dtype, e.lanes, count)):
            return None
        by = e.lanes - count
        start = bounds(e.index, ranges)
        if start is None or start[0] < by:
            return None
        return k.ShiftDown(k.Load(e.buf, simplify(e.index - by), e.dtype, e.lanes), by)


def _marked(body: tuple[k.Stmt, ...], rules: _Rules,
            ranges: dict[str, Interval]) -> tuple[k.Stmt, ...]:
    out = []
    for s in body:
        if isinstance(s, k.For):
            inner = dict(ranges)
            span = _loop_range(s, ranges)
            if span is None:
                inner.pop(s.var.name, None)
            else:
                inner[s.var.name] = span
            out.append(replace(s, body=_marked(s.body, rules, inner)))
        elif isinstance(s, k.If):
            out.append(map_bodies(s, lambda b: _marked(b, rules, ranges)))
        elif _has_masked(s):
            out.append(rewrite(s, lambda x: rules.mark(x, ranges)))
        else:
            out.append(s)
    return tuple(out)


def reaches_past(index: k.Expr, lanes: int, extent: int, ranges: dict[str, Interval]) -> bool:
    """Whether ``lanes`` elements from ``index`` may end past ``extent`` elements (True
    where the index cannot be bounded)."""
    span = bounds(index, ranges)
    return span is None or span[1] + lanes > extent


def _loop_range(s: k.For, ranges: dict[str, Interval]) -> Interval | None:
    """The values ``s``'s variable takes (None: not known, or no iterations)."""
    start, stop = bounds(s.start, ranges), bounds(s.stop, ranges)
    if start is None or stop is None or stop[1] <= start[0]:
        return None
    last = stop[1] - 1
    if start[0] == start[1]:  # the last value the step reaches
        last = start[0] + (last - start[0]) // s.step * s.step
    return start[0], last


def bounds(e: k.Expr, ranges: dict[str, Interval]) -> Interval | None:
    """The least and greatest value of an integer expression over ``ranges`` of its
    variables, or None where it has another variable or operator."""
    if isinstance(e, k.Const) and isinstance(e.value, int):
        return e.value, e.value
    if isinstance(e, k.Var):
        return ranges.get(e.name)
    if not isinstance(e, k.Bin) or e.op not in ("+", "-", "*", "min", "max"):
        return None
    a, b = bounds(e.a, ranges), bounds(e.b, ranges)
    if a is None or b is None:
        return None
    if e.op == "+":
        return a[0] + b[0], a[1] + b[1]
    if e.op == "-":
        return a[0] - b[1], a[1] - b[0]
    if e.op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if e.op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    products = [x * y for x in a for y in b]
    return min(products), max(products)
