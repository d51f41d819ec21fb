"""Choosing how to compute a fixed-size BLAC: a cost model, and search by measuring.

Candidates come from ``transform.blac.candidates`` (index on lanes x register block).
``model`` (the default) generates each candidate's kernel IR and estimates cycles
with no measuring: issue cost of the weighted instructions on two pipes, against the
latency of the longest dependent FMA chain, plus a penalty when a block needs more
accumulators than the target has registers. ``exhaustive`` and ``random`` compile
candidates and keep the fastest (LGen section 3.5).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from ..errors import ScheduleError
from ..ir import indexed as ix
from ..ir import kernel as k
from ..runtime.signature import ArgSpec
from ..target.isa import Isa
from ..transform.blac import OpSchedule, build_module, candidates

SEARCHES = ("model", "exhaustive", "random")

#: Relative costs; AVX2 masked stores are slow on AMD cores, masked loads a little.
_WEIGHTS = {"load": 1.0, "masked_load": 2.0, "store": 1.0, "masked_store": 12.0,
            "arith": 1.0, "reduce": 5.0}
FMA_LATENCY = 4
ISSUE_WIDTH = 2


def _expr_cost(e: k.Expr) -> float:
    if isinstance(e, k.Load):
        return _WEIGHTS["masked_load" if e.count is not None else "load"]
    if isinstance(e, k.Broadcast):
        return (0.0 if isinstance(e.value, (k.Load, k.Const)) else 1.0) + _expr_cost(e.value)
    if isinstance(e, (k.Fma, k.Bin)):
        parts = (e.a, e.b, e.c) if isinstance(e, k.Fma) else (e.a, e.b)
        own = _WEIGHTS["arith"] if e.dtype in ("f32", "f64") else 0.0
        return own + sum(_expr_cost(p) for p in parts)
    if isinstance(e, k.Reduce):
        return _WEIGHTS["reduce"] + _expr_cost(e.x)
    return 0.0


def _cost(body: tuple[k.Stmt, ...]) -> tuple[float, int]:
    """(weighted instruction count, longest chain of updates of one variable)."""
    total, chains = 0.0, {}
    longest = 0
    for s in body:
        if isinstance(s, (k.Decl, k.Assign)):
            total += _expr_cost(s.value)
            if isinstance(s, k.Assign):
                chains[s.var.name] = chains.get(s.var.name, 0) + 1
                longest = max(longest, chains[s.var.name])
        elif isinstance(s, k.Store):
            total += _WEIGHTS["masked_store" if s.count is not None else "store"]
            total += _expr_cost(s.value)
        elif isinstance(s, k.For):
            trips = max(0, (s.stop.value - s.start.value + s.step - 1) // s.step)
            inner, chain = _cost(s.body)
            total += trips * inner
            longest = max(longest, trips * chain)
    return total, longest


def model_cost(module: k.Module, accumulators: int, registers: int) -> float:
    """Estimated cycles of a fixed-size kernel."""
    total, longest = _cost(module.function(module.entry).body)
    cycles = max(total / ISSUE_WIDTH, longest * FMA_LATENCY)
    if accumulators > registers - 3:  # the block spills
        cycles *= 1.0 + 0.25 * (accumulators - registers + 3)
    return cycles


def _sums(n: ix.Node) -> int:
    return (1 if isinstance(n, ix.Sum) else 0) + sum(_sums(c) for c in ix.children(n))


def options(program: ix.Program, specs: tuple[ArgSpec, ...],
            isa: Isa) -> list[list[tuple[float, OpSchedule]]]:
    """Per operation, every schedule that can be built with its modelled cycles, best
    first. Operations are computed one after another, so each is modelled on its own."""
    result = []
    for op in program.ops:
        single = ix.Program(program.operands, (op,), program.dtype)
        found = []
        for sched in candidates(program, op):
            try:
                module = build_module(single, specs, (sched,), isa, "probe")
            except ScheduleError:
                continue
            acc = sched.block[0] * sched.block[1] * max(1, _sums(op.body))
            found.append((model_cost(module, acc, isa.registers), sched))
        if not found:
            raise ScheduleError(f"no schedule can compute {op.out}")
        result.append(sorted(found, key=lambda o: o[0]))
    return result


def choose(program: ix.Program, specs: tuple[ArgSpec, ...], isa: Isa, *, search: str = "model",
           measure: Callable[[tuple[OpSchedule, ...]], float] | None = None,
           budget: int = 24, seed: int = 0) -> tuple[OpSchedule, ...]:
    """The schedule to use. ``measure(schedule) -> seconds`` is required for the
    measuring searches; ``budget`` caps how many candidates they time (exhaustive takes
    the best-modelled ones first)."""
    if search not in SEARCHES:
        raise ScheduleError(f"search must be one of {', '.join(SEARCHES)}, not {search!r}")
    per_op = options(program, specs, isa)
    if search == "model":
        return tuple(opts[0][1] for opts in per_op)
    if measure is None:
        raise ScheduleError(f"search={search!r} measures candidates and needs measure()")
    top = [opts[:8] for opts in per_op]
    combos = sorted(itertools.product(*top), key=lambda c: sum(cost for cost, _ in c))
    pool = [tuple(s for _, s in c) for c in combos]
    if search == "random" and len(pool) > budget:
        pool = random.Random(seed).sample(pool, budget)
    return min(pool[:budget], key=measure)
