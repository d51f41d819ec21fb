"""Lines of large outputs fetched for writing ahead of stores that interleave rows.

A register block of several rows stores one vector into each of its rows per step of its
loop along the columns: the stores of a step go to several places far apart (C = A*B
with C 100 x 100 f64, blocks of 4 rows: 800 bytes apart), and from one step to the next
each moves one vector along its row. When the output is only written and holds more
than L1 (``L1_BYTES``), it leaves L1 between calls and each line's first store waits for
the line to come from L2. The hardware prefetches a single stream of stores that goes up
one line after another, as gcc's row-by-row loops write, but not several interleaved
ones: on a Xeon (Emerald Rapids, LGen's harness, a kernel's C replaced by hand, 2-3
alternations) that C = A*B ran 3.6-5.4 us a call with blocks of 2 or 4 rows against
2.3-2.6 for the loops, and 2.33-2.63 with the same code taking one row at a time. With a
prefetch of each row's line ``AHEAD_BYTES`` ahead of its store in every step, the blocks
of 4 rows ran 2.02-2.74 us, and C 80 x 80 f64 1.37-1.47 -> 1.10-1.21 us (the loops
1.29-1.51). In a slower stretch of that machine the gain was smaller (AVX2 blocks of 2
rows 4.0-4.3 -> 2.1-3.0 us by hand; in LGen's harness 0.58x -> 0.64x the loops), but
never a loss.

``prefetch_stores`` adds those prefetches to innermost loops whose vector stores into
such outputs form two or more streams (runs of stores less than a step's advance apart).
The address is clamped to the operand, so that the hint never names memory beyond it. The
prefetch is ``__builtin_prefetch(p, 1, 3)``: ``prefetchw`` where the compiler's flags
allow it (``-march=native``), else ``prefetcht0`` (1.05x slower in the measures above,
still 1.5x as fast as no prefetch).

Only where the machine gains from them (``Machine.prefetches_store_streams``): on Zen 3
the kernels above ran 1.3-1.5x as fast without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..ir.walk import map_bodies, nodes_of, substitute
from .lower_tile import CACHE_LINE
from .sum_lanes import index_offset

#: Bytes of outputs a call may only write and still find them in L1 at its next call
#: (the L1 data cache of Zen 3-5 and of recent Xeons is 32-48 KiB).
L1_BYTES = 48 * 1024
#: How far ahead of its store each stream's line is prefetched: 4 lines (C 100 x 100
#: f64, blocks of 4 rows, six alternations by hand: 2.15-2.74 us a call; 2 lines ahead
#: 2.15-2.49, within that machine's noise).
AHEAD_BYTES = 4 * CACHE_LINE


def bytes_stored(body: tuple[k.Stmt, ...], skip: frozenset[str]) -> int:
    """Bytes a call stores into buffers not in ``skip``."""
    total = 0
    for s in body:
        if isinstance(s, k.For):
            start, stop = k.const_value(s.start), k.const_value(s.stop)
            trips = len(range(start, stop, s.step)) if isinstance(start, int) and isinstance(
                stop, int) else 0
            total += trips * bytes_stored(s.body, skip)
        elif isinstance(s, k.Store) and s.buf not in skip:
            total += s.value.lanes * itemsize(s.value.dtype)
    return total


def prefetch_stores(body: tuple[k.Stmt, ...],
                    extents: Mapping[str, int | None]) -> tuple[k.Stmt, ...]:
    """``body`` with write prefetches ahead of interleaved streams of stores into
    outputs it only writes, when those hold more than ``L1_BYTES`` (see the module's
    docstring). ``extents``: the elements each operand spans."""
    scratch = frozenset(s.buf for s in body if isinstance(s, k.Local))
    # statements only, an upper bound: most kernels end here, before any walk of their
    # expressions (the model builds many candidates per plan)
    if bytes_stored(body, scratch) <= L1_BYTES:
        return body
    moves = nodes_of(body, (k.Load, k.Store))
    read = frozenset(m.buf for m in moves if isinstance(m, k.Load))
    stored = frozenset(m.buf for m in moves if isinstance(m, k.Store))
    written_only = frozenset(b for b in stored - read - scratch if extents.get(b))
    if not written_only or bytes_stored(body, stored - written_only) <= L1_BYTES:
        return body

    def visit(stmts: tuple[k.Stmt, ...]) -> tuple[k.Stmt, ...]:
        out: list[k.Stmt] = []
        for s in stmts:
            if isinstance(s, k.For) and not nodes_of(s.body, k.For):
                s = _with_prefetches(s, written_only, extents)
            elif isinstance(s, (k.For, k.If)):
                s = map_bodies(s, visit)
            out.append(s)
        return tuple(out)

    return visit(body)


def _with_prefetches(loop: k.For, outputs: frozenset[str],
                     extents: Mapping[str, int | None]) -> k.For:
    """``loop`` (innermost) with a prefetch per stream of its stores into ``outputs``
    at its top, when some output has two streams or more."""
    step_on = {loop.var.name: k.add(loop.var, k.Const(loop.step))}
    by_buf: dict[str, list[k.Store]] = {}
    for s in nodes_of(loop.body, k.Store):
        if s.buf in outputs:
            by_buf.setdefault(s.buf, []).append(s)
    prefetches: list[k.Stmt] = []
    for buf, stores in by_buf.items():
        if all(s.value.lanes == 1 for s in stores):
            # a prefetch per element, 8 or 16 a line: the generic target's C = A*B
            # 80 x 4 x 80 f64 (blocks of 8 rows, a column a step) ran 9.1 us a call with
            # them and 4.6 without (gcc -O2), 7.5 and 1.7 with -O3 -march=native, where
            # gcc vectorizes the loop that has none (Xeon, CPU model 167)
            continue
        first = stores[0]
        advance = index_offset(substitute(first.index, step_on), first.index)
        offsets = [index_offset(s.index, first.index) for s in stores]
        if not advance or advance < 0 or None in offsets or any(
                index_offset(substitute(s.index, step_on), s.index) != advance
                for s in stores):
            continue  # not stores that all move along together
        size = itemsize(first.value.dtype)
        streams: list[list[int]] = []  # offsets of the stores of each stream, ascending
        for offset in sorted(set(offsets)):  # type: ignore[type-var]
            if streams and offset - streams[-1][0] < max(advance, CACHE_LINE // size):
                streams[-1].append(offset)
            else:
                streams.append([offset])
        if len(streams) < 2:
            continue
        ahead = max(AHEAD_BYTES // size, advance)
        last = int(extents[buf]) - 1  # type: ignore[arg-type]
        for stream in streams:
            at = k.add(first.index, k.Const(stream[-1] + ahead))
            prefetches.append(k.Prefetch(buf, k.minimum(at, last), write=True))
    if not prefetches:
        return loop
    return replace(loop, body=(*prefetches, *loop.body))
