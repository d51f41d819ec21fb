"""Straight-line code reordered so that each result is stored as soon as it is ready.

A register block is lowered step by step of its reduction: every accumulator's first
update, then every accumulator's second, ..., and the stores of all of them at the end.
The core then issues the whole block's stores in one burst after its last FMAs, on a
single store port, while the FMA pipes wait for the next call. Ordered accumulator by
accumulator instead (one accumulator's updates, then its store, then the next's), the
stores spread over the block and issue beside the FMAs, as the straightforward loops'
code does. On Zen 5 (LGen's harness, a kernel's C replaced by hand, 2 alternations):
C = A*B 16 x 4 x 16 f32 (16 accumulators, 4 updates each) 9.0 -> 8.3 ns a call, the
loops 8.3; 8 x 8 x 8 f64 9.0 -> 8.7 (the loops 8.7). Groups of 2 accumulators ran as
fast, groups of 4 and 8 a little and much slower.

Only blocks that store products are reordered: each store writes one accumulator's
result, nothing the block stores is also read in it, no temporary is read, and the
values the accumulators share (rows of B) fit in the registers beside one accumulator.
Measured over the 253 LGen kernels the order changes without those conditions (two
same-session A/B runs, normalised by the loops): the 73 plain products that meet them
ran 1.012x as fast (geomean; 0.94-1.13x, C = A*B 16 x 4 x 16 f32 1.08x), the others
0.993x (0.88-1.27x): where a block also loads its output (beta*C), stores the
transposes of several accumulators, or reads a temporary that an earlier statement
stored in vectors (taken row by row, each read waits for a later store: C = alpha*(A0 +
A1)'*B + beta*C 8 x 8 x 8 f32, 0.88x), the step-by-step order was as fast or faster.

The out-of-order core still overlaps the accumulators' chains of dependent updates as
long as its window holds enough of them: the order changes only where every chain is at
most ``MAX_CHAIN`` updates long (8 chains of 16 fill a window of 128 instructions, and 8
keep two FMA pipes of latency 4 busy). Longer chains keep the step-by-step order.

Dependences are kept: a statement moves ahead of another only when neither writes a
variable the other reads or writes, and they do not both access one buffer with one of
them storing. Each list of statements (a function's body, a loop's, a branch's) is
reordered on its own, and nothing moves across a statement that holds statements or a
``Barrier``.
"""

from __future__ import annotations

from collections import Counter

from ..ir import kernel as k
from ..ir.walk import map_bodies, nodes_of

#: Longest chain of updates of one accumulator that is still reordered (see above).
MAX_CHAIN = 16

_STRAIGHT = (k.Decl, k.Assign, k.Store, k.Comment)


def stores_as_ready(body: tuple[k.Stmt, ...], registers: int,
                    scratch: frozenset[str] | None = None) -> tuple[k.Stmt, ...]:
    """``body`` with each run of straight-line statements that stores accumulators
    ordered result by result: each store as early as the statements it depends on
    allow, in the order of the stores, the rest after them in their order.
    ``registers``: the target's vector registers; ``scratch``: the function's
    temporaries (its ``Local`` arrays, by default those of ``body``)."""
    if scratch is None:
        scratch = frozenset(s.buf for s in body if isinstance(s, k.Local))

    def ordered(run: list[k.Stmt]) -> list[k.Stmt]:
        return _reordered(run) if _applies(run, registers, scratch) else run

    body = tuple(map_bodies(s, lambda b: stores_as_ready(b, registers, scratch))
                 for s in body)
    out: list[k.Stmt] = []
    run: list[k.Stmt] = []
    for s in body:
        if isinstance(s, _STRAIGHT):
            run.append(s)
            continue
        out += ordered(run)
        run = []
        out.append(s)
    return tuple(out + ordered(run))


def _applies(run: list[k.Stmt], registers: int, scratch: frozenset[str]) -> bool:
    """Whether ``run`` is register blocks of a product (see above): stores that each
    write one accumulator's result (scaled, not transposed with others), chains of at
    most ``MAX_CHAIN`` updates, no load of what the run stores or of a temporary, and
    the values that several accumulators share (rows of B) few enough to stay in
    registers all through, as they must once each accumulator is taken whole (C = A*B
    4 x 4 x 16 f64 on AVX2 shares 16 vectors of B, and gcc spilled them)."""
    updates = Counter(s.var.name for s in run if isinstance(s, k.Assign))
    if not updates or max(updates.values()) > MAX_CHAIN:
        return False
    readers: dict[str, set[str]] = {}  # variable -> the accumulators whose updates read it
    for s in run:
        if isinstance(s, (k.Decl, k.Assign)) and s.var.name in updates:
            for v in nodes_of(s.value, k.Var):
                if v.name not in updates:
                    readers.setdefault(v.name, set()).add(s.var.name)
    if sum(len(accs) > 1 for accs in readers.values()) > registers - 2:
        return False
    written = {s.buf for s in run if isinstance(s, k.Store)}
    if any(e.buf in scratch or e.buf in written for s in run for e in nodes_of(s, k.Load)):
        return False
    feeds: dict[str, frozenset[str]] = {}  # variable -> the accumulators it reads
    stored: list[frozenset[str]] = []
    for s in run:
        accs = frozenset().union(*(feeds.get(v.name, frozenset())
                                   for v in nodes_of(_read_part(s), k.Var)))
        if isinstance(s, (k.Decl, k.Assign)):
            own = frozenset({s.var.name}) if s.var.name in updates else frozenset()
            feeds[s.var.name] = accs | own
        elif isinstance(s, k.Store):
            stored.append(accs)
    return (len(stored) >= 2 and all(len(a) == 1 for a in stored)
            and len(set(stored)) == len(stored))


def _reordered(run: list[k.Stmt]) -> list[k.Stmt]:
    before = _dependences(run)
    placed = [False] * len(run)
    order: list[int] = []

    def place(i: int) -> None:
        stack = [(i, iter(before[i]))]
        while stack:
            j, pending = stack[-1]
            nxt = next((p for p in pending if not placed[p]), None)
            if nxt is not None:
                placed[nxt] = True  # claimed; appended once its own predecessors are
                stack.append((nxt, iter(before[nxt])))
                continue
            stack.pop()
            order.append(j)

    for i, s in enumerate(run):
        if isinstance(s, k.Store) and not placed[i]:
            placed[i] = True
            place(i)
    for i in range(len(run)):
        if not placed[i]:
            placed[i] = True
            place(i)
    return [run[i] for i in order]


def _dependences(run: list[k.Stmt]) -> list[list[int]]:
    """For each statement, the earlier ones that must stay before it, in their order."""
    last_write: dict[str, int] = {}
    reads_since: dict[str, list[int]] = {}
    last_store: dict[str, int] = {}
    loads_since: dict[str, list[int]] = {}
    before: list[list[int]] = []
    for i, s in enumerate(run):
        deps: set[int] = set()
        written = s.var.name if isinstance(s, (k.Decl, k.Assign)) else None
        read = {v.name for v in nodes_of(_read_part(s), k.Var)}
        if isinstance(s, k.Assign):
            read.add(s.var.name)  # an update reads what it replaces
        for v in read:
            if v in last_write:
                deps.add(last_write[v])
        if written is not None:
            deps.update(reads_since.get(written, ()))
            if written in last_write:
                deps.add(last_write[written])
        loaded = {e.buf for e in nodes_of(_read_part(s), k.Load)}
        for b in loaded:
            if b in last_store:
                deps.add(last_store[b])
        if isinstance(s, k.Store):
            deps.update(loads_since.get(s.buf, ()))
            if s.buf in last_store:
                deps.add(last_store[s.buf])
        before.append(sorted(deps))
        for v in read:
            reads_since.setdefault(v, []).append(i)
        if written is not None:
            last_write[written] = i
            reads_since[written] = []
        for b in loaded:
            loads_since.setdefault(b, []).append(i)
        if isinstance(s, k.Store):
            last_store[s.buf] = i
            loads_since[s.buf] = []
    return before


def _read_part(s: k.Stmt) -> object:
    """What statement ``s`` reads: its value (and a store's index and count)."""
    if isinstance(s, k.Store):
        return (s.index, s.value, s.count)
    if isinstance(s, (k.Decl, k.Assign)):
        return s.value
    return ()
