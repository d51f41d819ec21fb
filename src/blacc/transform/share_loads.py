"""A masked load that a list of statements repeats, loaded once into a variable.

Fully unrolled code reads the same leftover lanes again and again: ``y = A*x`` with A
3 x 3 multiplies each row of A by the three lanes of x, one masked load of x per row.
gcc merges repeated plain loads, but not masked ones (AVX2's ``vmaskmovps``, AVX-512's
k-masked moves), not even with nothing stored between them: the 3 x 3 kernel ran
1.50 ns a call with three loads of x and 1.36 with one (Zen 5, AVX2 plan). So the
lowering names each repeated masked load once, before the first statement that reads
it, and the statements read the variable.

Only AVX2's masked loads are shared. AVX-512's k-masked loads, shared, ran no faster
over the 55 AVX-512 LGen kernels that repeat one (geomean 0.995x, 0.93-1.03x; C = A*B
2 x 2 x 2 f32 1.10 -> 1.19 ns), where AVX2's y = A*x and y = alpha*A*x + beta*B*x,
3 x 3 and 7 x 7 f32, ran 1.05-1.10x as fast.

Only loads from buffers the kernel never writes are shared (inputs: nothing between two
reads can change them), and only where the index reads no variable that a statement
reassigns. Each list of statements (a function's body, a loop's, a branch's) is
handled on its own: a load inside a loop is not moved out of it.
"""

from __future__ import annotations

import itertools
from collections import Counter

from ..ir import kernel as k
from ..ir.walk import map_bodies, names_used, nodes_of, rewrite
from ..target.isa import Isa

#: Prefix of the variables that hold shared loads.
PREFIX = "shared"


def share_masked_loads(body: tuple[k.Stmt, ...], isa: Isa) -> tuple[k.Stmt, ...]:
    """``body`` with every masked load that one of its statement lists reads twice or
    more held in a variable declared before the first statement that reads it (on ISAs
    without mask registers; elsewhere ``body`` as it is)."""
    if isa.mask_registers:
        return body
    written: set[str] = set()
    reassigned: set[str] = set()
    masked = False
    for x in nodes_of(body, (k.Store, k.Ref, k.Assign, k.Load)):  # one walk: kernels are big
        if isinstance(x, k.Assign):
            reassigned.add(x.var.name)
        elif isinstance(x, k.Load):
            masked = masked or x.count is not None
        else:
            written.add(x.buf)
    if not masked:
        return body
    taken = names_used(body)
    counter = itertools.count(1)

    def fresh() -> str:
        while (name := f"{PREFIX}{next(counter)}") in taken:
            pass
        return name

    def shareable(e: k.Load) -> bool:
        return (e.count is not None and e.buf not in written
                and not (names_used(e.index) | names_used(e.count)) & reassigned)

    def in_list(stmts: tuple[k.Stmt, ...]) -> tuple[k.Stmt, ...]:
        stmts = tuple(map_bodies(s, in_list) for s in stmts)
        uses = Counter(e for s in stmts if not _has_body(s)
                       for e in nodes_of(s, k.Load) if shareable(e))
        shared = {e: k.Var(fresh(), e.dtype, e.lanes) for e, n in uses.items() if n > 1}
        if not shared:
            return stmts
        out: list[k.Stmt] = []
        declared: set[k.Load] = set()
        for s in stmts:
            if _has_body(s):
                out.append(s)
                continue
            for e in dict.fromkeys(nodes_of(s, k.Load)):
                if e in shared and e not in declared:
                    declared.add(e)
                    out.append(k.Decl(shared[e], e))
            out.append(rewrite(s, lambda x: shared.get(x, x) if isinstance(x, k.Load) else x))
        return tuple(out)

    return in_list(body)


def _has_body(s: k.Stmt) -> bool:
    return isinstance(s, (k.For, k.If))

