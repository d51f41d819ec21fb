"""Choosing how to compute a fixed-size BLAC: a cost model, and search by measuring.

Candidates come from ``transform.blac.candidates`` (index on lanes x register block).
``model`` (the default) generates each candidate's kernel IR and estimates cycles
with no measuring: the instructions on the FMA pipes, load and store ports they use,
against the latency of the longest chain of dependent updates (per loop, the chain one
iteration hands to the next; a short reduction loop the C compiler unrolls is taken as
its copies) as far as the next call cannot overlap it, plus a penalty
when a block needs more vector registers than the target has. ``exhaustive`` and
``random`` time a pool of the best-modelled candidates (``search_pool``; the caller
compiles and times them, ``blacs.plan``) and keep the fastest (LGen section 3.5).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from ..errors import ScheduleError
from ..ir import indexed as ix
from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..ir.walk import loaded_buffers, names_used, nodes_of, read_back_buffers, simplify, substitute
from ..runtime.signature import ArgSpec
from ..target.isa import Isa
from ..target.machine import Machine
from ..transform.blac import (
    PEELED_TRIPS,
    OpSchedule,
    accumulators,
    block_registers,
    build_module,
    candidates,
    chunks,
    sums_of,
    writes_near_l1,
)
from ..transform.lower_tile import CACHE_LINE
from ..transform.past_end import mark_past_end
from ..transform.prefetch_stores import L1_BYTES, bytes_stored
from ..transform.split_updates import split_updates

SEARCHES = ("model", "exhaustive", "random")

#: A core like Zen 3 or Golden Cove: two FMA pipes, three loads and one vector store per
#: cycle, about six instructions dispatched per cycle, FMA latency 4. AVX2 masked stores
#: are slow on AMD cores (about 12 cycles each), masked loads a little slower than loads;
#: leftovers of a known count use plain moves where the ISA has them (``Isa.plain_moves``).
FP_PIPES = 2
#: In-register shuffles (vpermilps, vinsertf128, vextractf128) run on pipes of their
#: own next to the FMA pipes (Zen 3: FP1 and FP2, one of them shared with FMAs;
#: Skylake: port 5), so FMAs and shuffles together issue on about three pipes.
SHUFFLE_PIPES = 2
FP_AND_SHUFFLE_PIPES = 3
#: Both cores have three load pipes. Counted two, as for 256-bit loads on Zen 3, the
#: model's pick ran 1.067x the fastest candidate's time on LGen's cases (a Xeon, every
#: candidate of an exhaustive search timed, ``benchmarks/lgen/model_fit.py``); three,
#: 1.062x, and the rule between ISAs (``worth_wider``) still fits best as it is.
LOAD_PORTS = 3
STORE_PORTS = 1
DISPATCH = 6
FMA_LATENCY = 4
MASKED_STORE = 12.0
MASKED_LOAD = 2.0
BROADCAST_FP = 0.5
LOOP_OVERHEAD = 0.5
#: A chain starts when the core reaches its first update: straight-line code is taken in
#: program order at about ``IN_ORDER_RATE`` instructions a cycle (what Zen 3 retired on
#: long kernels, ``OP_CACHE_INSTRUCTIONS``), so a chain that begins late in the code ends
#: late, and blocks whose chains come one after another take longer than blocks that
#: interleave them. C = alpha*A*B + beta*C 4 x 16 x 4 f32 in folds: its four rows one
#: after another ran 22.0 ns a call, interleaved 16.9 (Zen 3), modelled alike when every
#: chain started at once. On 110 LGen cases with every candidate timed on Zen 3
#: (``benchmarks/lgen/model_fit.py``), the model's pick ran 1.127x the fastest
#: candidate's time with chains starting at once, 1.098x at 4 a cycle (1.103x at 6;
#: 1.093x at 3, where 6 picks had not been timed); a store's horizontal sums now add to
#: the chain they end, not to the longest. The 101 of LGen's 510 kernels that change
#: on Zen 3 ran 1.04x and 1.05x as fast over the loops in two A/B rounds
#: (benchmarks/lgen/README.md, "Chains in program order").
IN_ORDER_RATE = 4.0
#: Straight-line code beyond about this many instructions is fetched at a lower rate:
#: measured on Zen 3 (``C = A*B``, 4 x 4 x n, fully unrolled), kernels of 300-900
#: instructions retire 4 down to 2.5 instructions per cycle, where the same work as a
#: loop runs at the FMA bound.
OP_CACHE_INSTRUCTIONS = 256
FRONTEND_RATE = 2.75
#: Calls overlap. A kernel is called again and again (LGen's harness, a loop over many
#: small problems), each call independent of the last, so the out-of-order core runs the
#: next call's instructions while this one's chain of dependent updates completes. With
#: about ``WINDOW`` instructions in flight, a kernel of n instructions is bound by only
#: n / WINDOW of its chains' latency. Fitted on LGen's 510 cases with every candidate of
#: an exhaustive search timed on a Xeon (``benchmarks/lgen/model_fit.py``): the model's
#: pick ran 1.079x the fastest candidate's time (geomean) charged its whole latency,
#: 1.073x with a window of 128 (64-256 within 0.3% of it). x' * A * y with A 4 x 32 f32
#: had been given two partial sums: 3.16 ns, one chain 2.74. (On Intel's cores n counts
#: only FP instructions and shuffles, ``INTEL_OVERLAP_BY_FP``.)
WINDOW = 128


@dataclass(frozen=True)
class Core:
    """The pipes a core gives one ISA's vector instructions, where cores differ: how many
    take shuffles, how many take FP instructions and shuffles together, and the FP issue
    slots a broadcast from memory takes (``BROADCAST_FP``). ``core_for`` gives a
    machine's."""

    shuffle_pipes: float
    fp_and_shuffle_pipes: float
    broadcast_fp: float
    #: shuffles charged for one that takes two vectors (vpermt2ps, an unpack); 2 where
    #: two pipes take shuffles (``_zip_shuffles``)
    pair_shuffle: float = 2.0
    #: whether calls overlap as far as ``WINDOW`` FP instructions and shuffles (those that
    #: wait for a chain's results) allow, not ``WINDOW`` instructions of any kind
    overlap_by_fp: bool = False
    #: shuffles charged per halving of a horizontal sum (``k.Reduce``) but f32's last:
    #: 0 where pipes beside the ones the other shuffles take them
    reduce_shuffle: float = 0.0
    #: cycles a call waits for a temporary's vector stores to be forwarded to broadcasts
    #: of its elements (``SCRATCH_ROUND_TRIP``; None: that constant's value)
    scratch_round_trip: float | None = None
    #: whether the kernels emitted splat a scalar used at several widths once, at the
    #: widest (``build_module``'s ``shared_splats``); the model ranks schedules as built
    #: with shared splats either way (``options``)
    shared_splats: bool = True
    #: the share of a kernel's time each broadcast beyond ``HOISTED_FREE`` costs when it
    #: is hoisted out of a short loop, inside another, that the C compiler unrolls
    #: (``_unrolled_hoists``)
    hoisted_splat: float = 0.0
    #: whether an output in a band of sizes is computed in blocks of one row only
    #: (``_one_row_near_l1``)
    one_row_near_l1: bool = False
    #: whether an output of a few rows, each of two vectors or more, is computed in blocks
    #: of all its rows (``_short_output_rows``)
    whole_short_outputs: bool = False
    #: whether the kernels emitted write an output only written, by operands that about
    #: fill L1, in straight-line rows (``build_module``'s ``straight_near_l1``); asked
    #: only of one-row blocks (``_keeps_rows_of_b``)
    straight_rows_near_l1: bool = False


def _core(core: Core | None) -> Core:
    """``core``, or the one the model's constants describe (Zen 3, and the default)."""
    if core is not None:
        return core
    return Core(SHUFFLE_PIPES, FP_AND_SHUFFLE_PIPES, BROADCAST_FP)


def core_for(machine: Machine, isa: Isa) -> Core:
    """The pipes ``machine`` gives ``isa``'s kernels. Intel's cores (Skylake-SP to Granite
    Rapids) shuffle across 128-bit lanes on port 5 alone, so the model counts one shuffle
    pipe, and one shuffle for an instruction that takes two vectors (vpermt2ps, an
    unpack). With 512-bit vectors port 5 is also the second FMA pipe (ports 0 and 1 fused
    make the first; while 512-bit instructions run, port 1 takes no vector instruction):
    two pipes for FP instructions and shuffles together. A broadcast from memory is a
    load alone at any width, a horizontal sum's shuffles take the shuffle pipe
    (``INTEL_REDUCE_SHUFFLE``), and calls overlap as far as their FP instructions and
    shuffles allow (``INTEL_OVERLAP_BY_FP``). Other cores: the model's constants (two
    shuffle pipes beside the FMA pipes, as on AMD's); on Zen 3 a temporary broadcast back an
    element at a time costs no wait (``ZEN3_SCRATCH_ROUND_TRIP``). Where the ISA's vectors
    are wider than the datapath (Zen 4's AVX-512) the kernels emitted do not share a
    splat across widths: C = A*B 24 x 4 x 24 f32 in blocks of 6 x 2 (a 16-lane and an
    8-lane vector a row) ran 51.3 ns a call with one 512-bit broadcast of each element of
    A for both FMAs, 45.9 with each FMA's own broadcast from memory (folded into it by
    gcc, ``{1to16}``, ``{1to8}``). The 16 LGen kernels that change ran 1.018x as fast over
    the loops (six A/B rounds; misses >3% 4 -> 0; that product 0.86x -> 1.00x). The
    model still ranks schedules with the splats shared: within an ISA it charges each
    broadcast from memory an FP slot, which a folded one does not take, and ranking them
    unshared moved C = alpha*(A0 + A1)'*B + beta*C 12 x 4 x 4 f64 to a form that ran 20.0
    ns against its block's 15.4 unshared."""
    if _zen3(machine):
        return replace(_core(None), scratch_round_trip=ZEN3_SCRATCH_ROUND_TRIP)
    if machine.vendor != "GenuineIntel":
        wide = _pieces(isa.lanes("f32"), "f32", machine.vector_datapath) > 1
        return replace(_core(None), shared_splats=not wide,
                       hoisted_splat=WIDE_HOISTED_SPLAT if wide else 0.0)
    fp_and_shuffle = (INTEL_WIDE_FP_AND_SHUFFLE_PIPES if isa.mask_registers
                      else FP_AND_SHUFFLE_PIPES)
    return Core(INTEL_SHUFFLE_PIPES, fp_and_shuffle, INTEL_BROADCAST_FP, INTEL_PAIR_SHUFFLE,
                bool(INTEL_OVERLAP_BY_FP), INTEL_REDUCE_SHUFFLE,
                one_row_near_l1=machine.one_row_blocks_near_l1,
                whole_short_outputs=machine.whole_short_outputs,
                straight_rows_near_l1=machine.straight_rows_near_l1)


#: ``core_for`` on Intel's cores. Over the pools of LGen's 510 cases on a Xeon (every
#: candidate of an exhaustive search timed, ``benchmarks/lgen/model_fit.py``) the
#: model's pick ran 1.0501x the fastest candidate's time (geomean; 1.0623x on the
#: constants' pipes), its AVX-512 pick 1.0442x the fastest AVX-512 candidate's (1.0613x),
#: its AVX2 pick 1.0307x (1.0327x). AVX-512's shuffles alone on one pipe, or its
#: broadcasts alone free, did not help (on 195 of the cases: 1.0690 and 1.0664, 1.0658
#: neither, 1.0451 both); AVX2's broadcasts free did not then (1.0368 against 1.0360),
#: nor did reaching 6 instructions a cycle rather than ``IN_ORDER_RATE`` (1.0514 against
#: 1.0451). Once calls overlap by FP instructions (``INTEL_OVERLAP_BY_FP``), AVX2's
#: broadcasts from memory as loads alone (``vmovddup``/``vbroadcastss`` take no FP port on
#: Intel's cores) fit better: 1.0451 -> 1.0429, AVX2's pick 1.0317x -> 1.0276x; the 64
#: LGen kernels that change ran 1.019x and 1.014x as fast in two A/B rounds (micro
#: x'*A*y 2 x 2 f64 1.33-1.37x, from 0.91x to 1.23x the loops). With ``target="avx2"``
#: 129 of them change, 1.001-1.006x over the loops in four A/B rounds, and large outputs
#: such as C = A*B 100 x 4 x 100 f64 go from blocks of 2 rows with write prefetches to 4
#: whole rows a step without (1425-1477 -> 1359-1426 ns a call).
INTEL_SHUFFLE_PIPES = 1
#: Horizontal sums' shuffles on Intel's one shuffle pipe (``Core.reduce_shuffle``): on
#: the pools, regret 1.0429 -> 1.0403, AVX2's pick 1.0276x -> 1.0233x its fastest
#: (f32's last step too: 1.0404, or half a shuffle a step: 1.0405; AVX2's sums alone:
#: 1.0410); the 9 LGen kernels that change on the Xeon ran
#: 1.096-1.110x over the loops in three A/B rounds (x'*A*y 4 x 4 f32 off folds onto
#: broadcasts, 1.36-1.45 -> 1.05-1.15 ns, Eigen's speed).
INTEL_REDUCE_SHUFFLE = 1.0
INTEL_PAIR_SHUFFLE = 1.0
INTEL_WIDE_FP_AND_SHUFFLE_PIPES = 2
INTEL_BROADCAST_FP = 0.0
#: On the same pools, calls overlapped as far as ``WINDOW`` FP instructions and shuffles
#: allow (loads and stores, whose addresses are known at once, leave the scheduler
#: early) where they overlapped as far as ``WINDOW`` instructions: regret 1.0487 ->
#: 1.0451 (a window of 96 to 224 within 0.001 of it). C = alpha*A*B + beta*C 4 x 12 x 4
#: f64 in 4 x 1 blocks of 256-bit broadcasts and FMAs, 124 instructions, 56 of them FP
#: (chains of 12 FMAs): timed 31 cycles a call, modelled 44 and not taken, now 28. The
#: 80 LGen kernels that change ran 1.025x as fast in two A/B rounds. The AVX2 kernels of
#: a pretend Zen 3 that would change, timed on the Xeon, 0.996-1.000x: other cores keep
#: the constants' window.
INTEL_OVERLAP_BY_FP = True


@dataclass
class _Issue:
    """Instructions of a piece of code by the resource they occupy (``other``: integer
    and branch instructions, which only take dispatch slots; ``pieces``: issues beyond the
    first of instructions on vectors wider than the core's datapath, which take their
    pipe again but no dispatch slot)."""

    fp: float = 0.0
    loads: float = 0.0
    stores: float = 0.0
    other: float = 0.0
    shuffles: float = 0.0
    pieces: float = 0.0

    def __iadd__(self, o: _Issue) -> _Issue:
        self.fp += o.fp
        self.loads += o.loads
        self.stores += o.stores
        self.other += o.other
        self.shuffles += o.shuffles
        self.pieces += o.pieces
        return self

    def scaled(self, n: int) -> _Issue:
        return _Issue(self.fp * n, self.loads * n, self.stores * n, self.other * n,
                      self.shuffles * n, self.pieces * n)

    def split(self, pieces: int) -> _Issue:
        """These instructions, each issued ``pieces`` times on its pipe."""
        out = self.scaled(pieces)
        out.pieces = self.pieces * pieces + self.total * (pieces - 1)
        return out

    @property
    def total(self) -> float:
        """Instructions dispatched."""
        return self.fp + self.loads + self.stores + self.other + self.shuffles - self.pieces

    def cycles(self, core: Core | None = None) -> float:
        """Issue time on ``core``'s pipes (None: the model's constants)."""
        core = _core(core)
        return max(self.fp / FP_PIPES, self.shuffles / core.shuffle_pipes,
                   (self.fp + self.shuffles) / core.fp_and_shuffle_pipes,
                   self.loads / LOAD_PORTS, self.stores / STORE_PORTS,
                   self.total / DISPATCH)


def _uses(e: k.Expr, name: str) -> bool:
    if isinstance(e, k.Var):
        return e.name == name
    if isinstance(e, k.Bin):
        return _uses(e.a, name) or _uses(e.b, name)
    return False


def _expr_issue(e: k.Expr, acc: _Issue, isa: Isa, loop: str | None = None,
                joined: set[k.Expr] | None = None, datapath: int = 0,
                single: frozenset[k.Expr] | None = None,
                read: frozenset[str] = frozenset(), core: Core | None = None) -> None:
    """Add the instructions of ``e`` to ``acc``. Inside a loop over ``loop``, a load whose
    address does not depend on it is hoisted out of the loop by the C compiler (B of
    ``C(n x 4) = A*B(4x4)`` stays in registers across the rows): it costs nothing there.
    ``datapath``: bits a core's vector units take at once (0: any vector); an instruction
    on a wider vector issues once per piece (``_pieces``). ``single``: the broadcasts
    from memory that occur once in the kernel (``_single_broadcasts``). ``read``: the
    buffers the kernel reads back (``Isa.plain_moves``)."""
    own = _Issue()
    _node_issue(e, own, acc, isa, loop, joined, datapath, single, read, core)
    pieces = 1 if _from_memory(e) else _pieces(e.lanes, e.dtype, datapath)
    acc += own if pieces == 1 else own.split(pieces)


def _from_memory(e: k.Expr) -> bool:
    """A broadcast straight from memory, which the load pipes do at any width."""
    return isinstance(e, k.Broadcast) and isinstance(e.value, k.Load) and e.value.count is None


def _embedded_broadcast(e: k.Fma | k.Bin, parts: tuple[k.Expr, ...], isa: Isa,
                        single: frozenset[k.Expr] | None) -> k.Expr | None:
    """The operand of an arithmetic instruction that AVX-512 reads as an embedded broadcast
    (``vfmadd231pd (a){1to8}, b, acc``): a broadcast straight from memory, one per
    instruction, on ISAs with EVEX encoding (those with mask registers), where it occurs
    once in the kernel. C = A*B 12 x 4 x 12 f64: gcc folds all 96 of AVX-512's broadcasts
    of A into FMAs and multiplies. One that occurs twice in a piece of straight-line code
    is computed once into a register instead (32 x 4 x 32 f32, two vectors a row: 64
    broadcasts held, and spilled)."""
    if single is None or not isa.mask_registers or e.dtype not in ("f32", "f64"):
        return None
    return next((p for p in parts if p in single), None)


def _single_broadcasts(body: tuple[k.Stmt, ...]) -> frozenset[k.Expr]:
    """The broadcasts straight from memory that occur once in ``body``."""
    seen: dict[k.Expr, int] = {}
    for b in nodes_of(body, k.Broadcast):
        if _from_memory(b):
            seen[b] = seen.get(b, 0) + 1
    return frozenset(b for b, n in seen.items() if n == 1)


def _pieces(lanes: int, dtype: str, datapath: int) -> int:
    """How many times a core with a ``datapath``-bit vector unit issues an instruction on
    ``lanes`` of ``dtype``: Zen 4 runs 512-bit instructions over its 256-bit pipes."""
    return max(1, -(-lanes * itemsize(dtype) * 8 // datapath)) if datapath else 1


def _node_issue(e: k.Expr, own: _Issue, acc: _Issue, isa: Isa, loop: str | None,
                joined: set[k.Expr] | None, datapath: int,
                single: frozenset[k.Expr] | None, read: frozenset[str],
                core: Core | None) -> None:
    """``_expr_issue``: the instructions of ``e`` itself into ``own``, those of its operands
    into ``acc``."""
    if isinstance(e, k.Load):
        if loop is not None and not _uses(e.index, loop):
            return
        if e.count is None:
            own.loads += 1.0
        elif pieces := isa.plain_moves("load", e.dtype, e.lanes, k.const_value(e.count),
                                       read_back=e.buf in read, past_end=e.past_end):
            own.loads += len(pieces)  # one narrower load, or pieces joined
            own.shuffles += len(pieces) - 1
        else:
            own.loads += 1.0 if isa.mask_registers else MASKED_LOAD
    elif isinstance(e, k.Broadcast):
        if _from_memory(e):
            if joined is not None and single is not None:
                # as the choice between ISAs sees it (``isa_choice_cost``), one repeated
                # in straight-line code is loaded once: the C compiler merges the repeats
                if e in joined:
                    return
                joined.add(e)
            # a broadcast straight from memory: a load of its own (not folded into an
            # FMA like a vector load) that also takes FP issue slots, measured on Zen 3;
            # C compilers leave it in a loop even where it is invariant (the lowering
            # hoists the ones that fit in registers itself)
            own.loads += 1.0
            if single is None or not isa.mask_registers:
                # (AVX-512 cores take it as a load alone: Zen 4 and 5, Intel since Skylake)
                own.fp += _core(core).broadcast_fp
        elif not isinstance(e.value, (k.Const, k.Var)):
            # a splat of a constant or of a scalar variable (alpha) is hoisted by the C
            # compiler; one of a computed value costs a shuffle (vbroadcastsd from a
            # register: a shuffle pipe). Charged to the FMA pipes, the fused
            # C = alpha*(A0 + A1)'*B + beta*C, 4 x 4 x 12 f32, was modelled slower than
            # its temporary form, which ran 1.45x as long on Zen 5.
            own.shuffles += 1.0
            _expr_issue(e.value, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, (k.Fma, k.Bin)):
        if joined is not None and _recomputed(e):
            if e in joined:  # computed once by the C compiler, and kept
                return
            joined.add(e)
        if e.dtype in ("f32", "f64"):
            own.fp += 1.0
        parts = (e.a, e.b, e.c) if isinstance(e, k.Fma) else (e.a, e.b)
        folded = _embedded_broadcast(e, parts, isa, single)
        for part in parts:
            if part is folded:
                # the load of an EVEX operand {1toN}: no broadcast of its own
                own.loads += 1.0
            else:
                _expr_issue(part, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.Halves):
        lo = e.lo
        if lo == e.hi and isinstance(lo, k.Load) and lo.count is None:
            # one load duplicated into both halves (vbroadcastf128): a load, no FP slot
            _expr_issue(lo, acc, isa, loop, joined, datapath, single, read, core)
            return
        if (quarter := k.quartered_load(e)) is not None:  # the same in four quarters
            _expr_issue(quarter, acc, isa, loop, joined, datapath, single, read, core)
            return
        # joining two halves takes a shuffle (vinsertf128, its load folded)
        own.shuffles += 1.0
        _expr_issue(lo, acc, isa, loop, joined, datapath, single, read, core)
        _expr_issue(e.hi, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.BuildVector):
        # scalar loads joined by inserts (vmovhpd, vinsertps, vinsertf128 with their
        # loads folded): a shuffle per element after the first, zeros free
        own.shuffles += max(0, sum(not isinstance(x, k.Const) for x in e.xs) - 1)
        for x in e.xs:
            _expr_issue(x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.HalfSplat):
        # a shuffle with an immediate (vpermilps), its load folded; two rows joined from
        # two loads are joined once for all the lanes splatted from them (the C compiler
        # merges the repeated joins of a straight-line segment)
        own.shuffles += WIDE_SPLAT_SHUFFLES if _wide_splat(e, datapath) else 1.0
        if isinstance(e.x, k.Halves) and joined is not None:
            if e.x in joined:
                return
            joined.add(e.x)
        _expr_issue(e.x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.Spread):
        # a load and one shuffle (vpermps, vpermpd; on AVX2 vbroadcastsd from memory, a
        # load alone, and an in-lane vpermilps). (Charged two shuffles, the model took
        # rows held in pairs over folded sums and ran 0.90x as fast on the 30 LGen cases
        # that changed: Zen 5, same-session A/B.)
        own.shuffles += WIDE_SPREAD_SHUFFLES if _wider_than(e, datapath) else 1.0
        _expr_issue(e.x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.Half):
        if e.which:  # the high half needs vextractf128; the low one is free
            own.shuffles += 1.0
        if joined is not None:  # both halves of one value (a wider sum folded) compute
            if e.x in joined:   # it once: the C compiler merges the repeated expression
                return
            joined.add(e.x)
        _expr_issue(e.x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.Permute):  # one permute (vpermps; two sources as a Zip's)
        own.shuffles += 1.0 if e.y is None else _core(core).pair_shuffle
        for x in (e.x, e.y):
            if x is not None:
                _expr_issue(x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.ShiftDown):  # one byte shift (psrldq)
        own.shuffles += 1.0
        _expr_issue(e.x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, (k.Zip, k.Unzip)):
        own.shuffles += _zip_shuffles(e, isa, _core(core))
        _expr_issue(e.a, acc, isa, loop, joined, datapath, single, read, core)
        _expr_issue(e.b, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.SumLanes):
        # n vectors transposed and added: n - 1 adds and two shuffles per add; rows held
        # two or four per vector end in one permute more
        n = len(e.xs)
        own.fp += n - 1
        own.shuffles += 2 * (n - 1) + (e.rows_per_vector > 1)
        for x in e.xs:
            _expr_issue(x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.SumRows):
        # n rows transposed and added as ``SumLanes``' are, then a shuffle and an add
        # for each halving of the parts down to n lanes
        n, folds = len(e.xs), (e.xs[0].lanes // len(e.xs)).bit_length() - 1
        own.fp += n - 1 + folds
        own.shuffles += 2 * (n - 1) + folds
        for x in e.xs:
            _expr_issue(x, acc, isa, loop, joined, datapath, single, read, core)
    elif isinstance(e, k.Reduce):
        # a shuffle and an add per halving; the shuffles go to pipes of their own except
        # on Intel's cores (``Core.reduce_shuffle``), where the sums' extracts, vmovhlps
        # and unpacks take the one shuffle pipe, and f32's last step, vmovshdup, two
        halvings = max(1, e.x.lanes.bit_length() - 1)
        own.fp += halvings
        own.shuffles += _core(core).reduce_shuffle * (halvings - (e.x.dtype == "f32"))
        _expr_issue(e.x, acc, isa, loop, joined, datapath, single, read, core)


#: Shuffles charged for a splat within 256-bit parts of a vector wider than the core's
#: datapath (``_wide_splat``), for each piece the datapath takes. On Zen 4, of the LGen
#: kernels with AVX-512's pairs of 4 f64 rows, all 38 modelled no slower than AVX2's and
#: ran 0.86x as fast (geomean; C = A*B 8 x 4 x 4 f64 1.01x the loops against AVX2's
#: broadcasts' 1.28x). In the fit of ``ZEN4_WIDER_GAIN``'s two runs 2 gave 1.850x over
#: the loops against 1.829x at 1 (1.5: 1.847x; 3: as 2, every such plan on AVX2).
WIDE_SPLAT_SHUFFLES = 2.0


def _wide_splat(e: k.HalfSplat, datapath: int) -> bool:
    """Whether ``e`` splats within parts wider than 128 bits of a vector wider than
    ``datapath`` (Zen 4's ``vpermpd`` with an immediate on a 512-bit vector: two rows of
    4 f64 in the halves)."""
    return _wider_than(e, datapath) and e.lanes * itemsize(e.dtype) * 8 // e.parts > 128


#: Shuffles charged for a ``k.Spread`` (``vpermps``, ``vpermpd`` across the whole vector)
#: on a vector wider than the core's datapath, for each piece the datapath takes. On
#: Zen 4 AVX-512's folds that keep the output dimension on lanes ran well below their
#: model against AVX2's (gemm 4 x n x 4 f32 0.69-0.90x where 1.06-1.22x was modelled;
#: gemm n x 4 x 4 x n n = 8 f32 folds 14-18 ns, AVX2 9.1 ns). Refitting the rule between
#: ISAs on the two forced-ISA runs in ``zen4-avx512-isa/`` (``isa_fit.py``) gave blacc
#: 1.8529x the loops with 25 misses >3% at 1.5, against 1.8503x and 29 at 1 (2: 1.8516x,
#: 25; 3: 1.8438x, 25).
WIDE_SPREAD_SHUFFLES = 1.5


def _wider_than(e: k.Expr, datapath: int) -> bool:
    """Whether ``e`` is a vector wider than a ``datapath``-bit vector unit (0: none is)."""
    return _pieces(e.lanes, e.dtype, datapath) > 1


def _recomputed(e: k.Expr) -> bool:
    """Whether ``e`` is scalar arithmetic on values read from memory (no variable it
    might be assigned between two occurrences): what the C compiler computes once where
    straight-line code repeats it, e.g. A0[k,i] + A1[k,i] of a fused
    C = alpha*(A0 + A1)'*B + beta*C, splatted for a row's vector and used as is by its
    scalar leftover."""
    return e.lanes == 1 and e.dtype in ("f32", "f64") and all(
        v.dtype not in ("f32", "f64") for v in nodes_of(e, k.Var))


def _zip_shuffles(e: k.Zip | k.Unzip, isa: Isa, core: Core) -> float:
    """Shuffles charged for a ``Zip`` or ``Unzip``: an unpack on 128 bits, one
    two-source permute on AVX-512 (vpermt2ps), an unpack within the halves and a permute
    across them on AVX2's 256 bits. Charged 2, 2 and 3. On a Xeon, AVX-512's permute
    charged 1 gave the best geomean in same-session A/B runs of the 119 LGen cases the
    transposes touch (benchmarks/lgen/README.md, "AVX-512"); on Zen 5, charged 2, the 35
    AVX-512 plans that change ran 1.21x as fast (same-session A/B; y = alpha*A*x +
    beta*B*x with A 100 x 4 f64: 48.3 -> 30.3 ns), and charged 3, the 24 that change
    again ran 0.89x as fast. Charged as one shuffle per instruction, y = A*x with A 4 x 4 f64
    took the transposes on AVX2 and ran 0.4x as fast. The 2s are ``core.pair_shuffle``
    and the 3 is one more: on Intel's cores, where one pipe takes every shuffle, 1 and 2."""
    if e.lanes * itemsize(e.dtype) <= 16 or isa.mask_registers:
        return core.pair_shuffle
    return core.pair_shuffle + 1.0


def _reduce_latency(e: k.Expr) -> int:
    """Extra latency of horizontal sums at the end of a chain."""
    if isinstance(e, k.Reduce):
        return FMA_LATENCY * max(1, e.x.lanes.bit_length() - 1) + _reduce_latency(e.x)
    if isinstance(e, k.SumLanes):  # one add per level of the tree
        return (FMA_LATENCY * (len(e.xs).bit_length() - 1)
                + max(_reduce_latency(x) for x in e.xs))
    if isinstance(e, k.SumRows):  # one add per level, down to one lane per row
        return (FMA_LATENCY * (e.xs[0].lanes.bit_length() - 1)
                + max(_reduce_latency(x) for x in e.xs))
    if isinstance(e, (k.Fma, k.Bin)):
        parts = (e.a, e.b, e.c) if isinstance(e, k.Fma) else (e.a, e.b)
        return max(_reduce_latency(p) for p in parts)
    return 0


#: gcc -O3 unrolls a loop completely when it runs at most ``PEELED_TRIPS`` times and its
#: copies come to at most about ``PEELED_INSNS`` of the model's instructions (gcc 12:
#: ``max-completely-peeled-insns`` = 200 of its own, two thirds of the copies' size; this
#: bound agreed with the compiled code for 495 of LGen's 510 kernels). A reduction loop
#: so unrolled is straight-line code whose copies overlap one another and the code around
#: it. x' * A * y with A 4 x 64 f32 on AVX-512: one chain per vector of x' * A, in a loop
#: of 3 trips, was modelled 28.4 cycles as a loop and lost to two partial chains (18.5),
#: which ran 6.9 ns a call against the loop's 5.5 (Emerald Rapids). Loops that store
#: (over blocks of outputs) and loops that permute their terms (``k.Spread``, the folds
#: of C = A*B 4 x n x 4) stay loops to the model: taken as their copies too, 159 of the
#: 510 kernels changed and ran 1.00x as fast in all (same-session A/B, four rounds),
#: C = alpha*A*B + beta*C 4 x n x 4 f32 0.87x; kept, 29 change, at 1.12x
#: (``benchmarks/lgen/README.md``, "Loops the C compiler unrolls").
PEELED_INSNS = 270


class _Timing(NamedTuple):
    """What ``_cycles`` estimates for a piece of code."""

    #: estimated cycles
    cycles: float
    #: instructions issued
    issue: _Issue
    #: dependent updates of each variable declared outside the code
    carried: dict[str, int]
    #: cycles of the longest chain within the code, on variables declared in it
    within: float
    #: whether the model keeps a loop (one not ``_peeled``)
    looped: bool
    #: when each variable of ``carried`` is last updated, from the start of the code
    ends: dict[str, float]


def _trips(loop: k.For) -> int:
    return max(0, (loop.stop.value - loop.start.value + loop.step - 1) // loop.step)


def _may_peel(loop: k.For) -> bool:
    """What ``_peeled`` asks of ``loop`` itself: few trips, no stores, no permuted terms."""
    return (_trips(loop) <= PEELED_TRIPS
            and not nodes_of(loop.body, (k.Store, k.Spread, k.Permute)))


def _peeled(loop: k.For, body: _Timing) -> bool:
    """Whether the model takes ``loop``, its body costed ``body``, as the copies the C
    compiler unrolls it into: a short reduction that neither stores nor permutes its
    terms (``PEELED_INSNS``)."""
    return (not body.looped and _may_peel(loop)
            and _trips(loop) * body.issue.total <= PEELED_INSNS)


def _hoisted_loads(loop: k.For) -> int:
    """Loads in ``loop`` alike in every iteration, which ``_expr_issue`` charges nothing
    there (broadcasts straight from memory are charged in every iteration)."""
    broadcast = {b.value for b in nodes_of(loop.body, k.Broadcast) if _from_memory(b)}
    return len({e for e in nodes_of(loop.body, k.Load)
                if not _uses(e.index, loop.var.name)} - broadcast)


def _cycles(body: tuple[k.Stmt, ...], isa: Isa, loop: str | None = None,
            scratch: frozenset[str] = frozenset(), exposed: float = 1.0, datapath: int = 0,
            single: frozenset[k.Expr] | None = None,
            read: frozenset[str] = frozenset(), core: Core | None = None) -> _Timing:
    """Estimated cycles of straight-line code with loops (``_Timing``). Straight-line
    code runs out of order: its time is its issue time or its longest chain of dependent
    updates, whichever is longer, a chain starting when the core reaches it
    (``IN_ORDER_RATE``). A loop is a segment of its own, bound by issue, by the rate
    the core reaches its instructions, or by the chain carried from one iteration to
    the next (an accumulator without partial sums), unless it is a short reduction the
    C compiler unrolls (``_peeled``): its copies are then straight-line code in the
    segment around it. ``exposed``: the share of a chain's latency that counts
    (``model_cost``); ``datapath`` and ``single`` as for ``_expr_issue``; ``read``: the
    buffers the kernel reads back (``Isa.plain_moves``' read_back)."""
    core = _core(core)  # once, not at every node
    total = 0.0
    issue, segment = _Issue(), _Issue()
    local: set[str] = set()
    chains: dict[str, int] = {}
    ready: dict[str, float] = {}  # when each chain's last update completes
    joined: set[k.Expr] = set()
    stored = 0.0  # when the last store's value is ready, its horizontal sums done
    copies = 0.0  # the longest chain within one copy of an unrolled loop
    looped = False

    def reached() -> float:  # when the core reaches the next instruction
        return segment.total / IN_ORDER_RATE

    def close() -> float:
        longest = max(max(ready.values(), default=0.0), copies, stored)
        return max(segment.cycles(core), longest * exposed)

    for s in body:
        if isinstance(s, k.Barrier):  # what was loaded or computed before is not reused
            joined = set()
        elif isinstance(s, (k.Decl, k.Assign)):
            at = reached()
            _expr_issue(s.value, segment, isa, loop, joined, datapath, single, read, core)
            name = s.var.name
            if isinstance(s, k.Decl):
                local.add(name)
                ready[name] = at
            else:
                chains[name] = chains.get(name, 0) + 1
                ready[name] = ready.get(name, at) + FMA_LATENCY
        elif isinstance(s, k.Store):
            stores = segment.stores
            if s.count is None:
                segment.stores += 1.0
            elif pieces := isa.plain_moves("store", s.value.dtype, s.value.lanes,
                                           k.const_value(s.count), read_back=s.buf in read,
                                           past_end=s.past_end):
                segment.stores += len(pieces)  # the later ones shuffled down first
                segment.shuffles += len(pieces) - 1
            elif isa.mask_registers and s.buf not in scratch:
                segment.stores += 1.0
            else:
                # a masked store into a scratch array (``scratch``) is read back soon,
                # and loads are not forwarded from masked stores: they wait for it to
                # reach the cache (AVX-512 on a Xeon: micro_gemam 5x5 f32 ran 4x slower)
                segment.stores += MASKED_STORE
            extra = ((segment.stores - stores)
                     * (_pieces(s.value.lanes, s.value.dtype, datapath) - 1))
            segment.stores += extra
            segment.pieces += extra
            _expr_issue(s.value, segment, isa, loop, joined, datapath, single, read, core)
            at = reached()
            chain = max((ready.get(n, at) for n in names_used(s.value)), default=at)
            stored = max(stored, chain + _reduce_latency(s.value))
        elif isinstance(s, k.For):
            trips = _trips(s)
            inner = _cycles(s.body, isa, s.var.name, scratch, exposed, datapath, single, read,
                            core)
            if _peeled(s, inner):
                at, step = reached(), inner.issue.total / IN_ORDER_RATE
                segment += inner.issue.scaled(trips)
                segment.loads += _hoisted_loads(s)  # loaded once for all the copies
                for name, c in inner.carried.items():
                    chains[name] = chains.get(name, 0) + c * trips
                    # started before the loop, or where the first copy starts it
                    start = (ready[name] if name in ready
                             else at + inner.ends[name] - c * FMA_LATENCY)
                    ready[name] = start + c * trips * FMA_LATENCY
                copies = max(copies, at + (trips - 1) * step + inner.within)
                continue
            looped = True
            total += close()
            issue += segment
            segment, stored, copies = _Issue(), 0.0, 0.0
            joined = set()
            chains = {n: c for n, c in chains.items() if n not in local}
            # chains carried on past a loop keep their length, not their place
            ready = {n: c * FMA_LATENCY for n, c in chains.items()}
            inner.issue.other += 2  # the counter and the branch
            # each iteration also pays for its taken branch and the loop's bookkeeping
            carried = max(inner.carried.values(), default=0)
            # iterations are reached in program order, as straight-line code is: C =
            # alpha*(A0 + A1)'*B + beta*C n x 4 x 4 f64 with the sum in scalar adds and
            # broadcasts, modelled at its pipes' throughput, ran 1.21-1.61x as long as
            # with the sum stored first (Zen 3, A/B; pools' regret 1.097 -> 1.077)
            total += max(trips * (inner.issue.cycles(core) + LOOP_OVERHEAD),
                         trips * carried * FMA_LATENCY * exposed, inner.cycles,
                         trips * inner.issue.total / IN_ORDER_RATE)
            issue += inner.issue.scaled(trips)
    own = max(max((t for n, t in ready.items() if n in local), default=0.0), stored)
    total += close()
    issue += segment
    return _Timing(total, issue, {n: c for n, c in chains.items() if n not in local},
                   max(own, copies), looped,
                   {n: t for n, t in ready.items() if n not in local})


#: Broadcasts hoisted out of a short loop over a block's vectors (each element of A for
#: C = A*B n x 4 x n, the loop along C's rows, inside the loop over blocks of rows) that
#: cost nothing beyond the model's count; each one more costs ``Core.hoisted_splat`` of
#: the kernel's time. gcc unrolls such a loop completely (``PEELED_TRIPS``,
#: ``PEELED_INSNS``) and interleaves the copies' loads with the broadcasts it keeps live
#: across all of them, and spills. On Zen 4 with AVX-512 (each candidate timed,
#: ``benchmarks/lgen/README.md``, "Broadcasts hoisted out of unrolled loops"), blocks of
#: 6 rows (24 broadcasts) ran 1.07-1.14x the fastest candidate's time at n = 32-80
#: (1.01x at 100 f64, whose 12-trip loop stays a loop), 4 rows (16) 1.02-1.09x, 3 rows
#: (12) 1.00-1.02x, 2 rows (8) 1.00-1.02x.
HOISTED_FREE = 8
#: ``Core.hoisted_splat`` where 512-bit vectors run over a narrower datapath (Zen 4)
WIDE_HOISTED_SPLAT = 0.005


def _unrolled_hoists(body: tuple[k.Stmt, ...], isa: Isa, nested: bool = False) -> int:
    """The most broadcasts declared before an innermost loop, in the same body, that the
    loop uses, where the C compiler unrolls the loop completely (``HOISTED_FREE``); 0 when
    none has more than ``HOISTED_FREE``. It unrolls loops that store, which the model
    keeps as loops (``_may_peel``), so the loop's size is costed here: only for loops
    that would be charged. Only loops inside another loop count (``nested``): broadcasts
    hoisted to the top of the kernel run once a call (C = A*B 4 x 4 x 80 f64, 16 of them,
    ran 0.98x as fast charged and moved to blocks of 2 rows)."""
    most = 0
    for i, s in enumerate(body):
        if not isinstance(s, k.For):
            continue
        if nodes_of(s.body, k.For):
            most = max(most, _unrolled_hoists(s.body, isa, nested=True))
            continue
        if not nested:
            continue
        used = names_used(s)
        hoisted = sum(isinstance(d, k.Decl) and isinstance(d.value, k.Broadcast)
                      and d.var.name in used for d in body[:i])
        if (hoisted > max(most, HOISTED_FREE) and _trips(s) <= PEELED_TRIPS
                and _trips(s) * _cycles(s.body, isa, s.var.name).issue.total <= PEELED_INSNS):
            most = hoisted
    return most


def model_cost(module: k.Module, registers_needed: int, isa: Isa, datapath: int = 0,
               crossing: float | None = None, embedded: bool = False,
               core: Core | None = None, above: float | None = None) -> float:
    """Estimated cycles of a fixed-size kernel called again and again; a block that needs
    more vector registers than the target has spills (a store and a load per extra
    register and use). ``datapath``: as for ``_expr_issue``; ``crossing``: cycles of a
    store across a cache line (``CROSSING_STORE_CYCLES``, ``crossing_store_cycles``);
    ``embedded``: whether AVX-512's broadcasts that occur once are read by their FMA
    (``_embedded_broadcast``) rather than charged as instructions of their own;
    ``core``: the pipes of the core it runs on (``core_for``; None: the constants').
    ``above``: a cost of no interest; once the estimate reaches it (what follows only
    adds), that estimate is returned, short of the rest."""
    body = module.function(module.entry).body
    scratch = frozenset(s.buf for s in body if isinstance(s, k.Local))
    single = _single_broadcasts(body) if embedded else None
    read = read_back_buffers(body)
    cycles, issued, *_ = _cycles(body, isa, scratch=scratch, datapath=datapath, single=single,
                                 read=read, core=core)
    waiting = issued.fp + issued.shuffles if _core(core).overlap_by_fp else issued.total
    if waiting < WINDOW:  # the next call starts before this one's chains end
        cycles = _cycles(body, isa, scratch=scratch, exposed=waiting / WINDOW,
                         datapath=datapath, single=single, read=read, core=core).cycles
    if above is not None and cycles >= above:
        return cycles
    # the straight-line code outside loops (or in loops the C compiler unrolls), at the
    # rate it can be fetched
    parts = [_cycles((s,), isa, scratch=scratch, datapath=datapath, single=single, read=read,
                     core=core)
             for s in body if not isinstance(s, k.For) or _may_peel(s)]
    straight = sum(t.issue.total for t in parts if not t.looped)
    cycles = max(cycles, min(straight, OP_CACHE_INSTRUCTIONS) / DISPATCH
                 + max(0.0, straight - OP_CACHE_INSTRUCTIONS) / FRONTEND_RATE)
    if registers_needed > isa.registers:
        cycles *= 1.0 + 0.25 * (registers_needed - isa.registers)
    if (per := _core(core).hoisted_splat) and (hoisted := _unrolled_hoists(body, isa)):
        cycles *= 1.0 + per * max(0, hoisted - HOISTED_FREE)
    if _masked_into_inout(body, isa):
        cycles = max(cycles, READ_BACK_CYCLES)
    trip = 0.0
    if any(s.x.buf in scratch for s in nodes_of(body, k.Spread)):
        trip = SCRATCH_ROUND_TRIP
    elif any(_from_memory(b) and b.value.buf in scratch for b in nodes_of(body, k.Broadcast)):
        own = _core(core).scratch_round_trip
        trip = SCRATCH_ROUND_TRIP if own is None else own
    if trip:
        cycles += trip
    elif _unforwarded_scratch_loads(body, scratch):  # the same wait: charged once
        cycles += UNFORWARDED_ROUND_TRIP
    crossing = CROSSING_STORE_CYCLES if crossing is None else crossing
    return cycles + (_crossing_stores(body, scratch) * crossing if crossing else 0.0)


#: A temporary (``k.Local``) stored in vectors and read back an element at a time
#: (broadcasts), or a few elements at a time (``k.Spread``), within the call: each read
#: waits for its part of a wider store to be forwarded, a latency that overlapping calls
#: do not hide. C = alpha*(A0 + A1)'*B + beta*C, 4 x 4 x 4 f32 on Zen 5: the form with
#: the sum in a temporary, modelled 11 cycles, ran 5.97 ns (26 cycles) on AVX2, the fused
#: form, modelled 18, 4.05 ns (18 cycles); 16 x 4 x 4 f32 on AVX-512, the sum stored in
#: 512-bit vectors and spread 128 bits at a time, 7.7 ns against 4.4 for the fused column
#: tiles (a measuring search's timings). Read back in whole vectors (y = alpha*A*x +
#: beta*B*x), the temporary costs nothing measurable: charged there too, the fused forms
#: taken instead ran 0.52-0.84x.
#: Charged in proportion to how little else a call issues (``WINDOW``), it changed the
#: forms of longer kernels for the worse (micro gemam 6 x 6, 0.71x).
SCRATCH_ROUND_TRIP = 12.0
#: Zen 3 forwards such stores to broadcasts of their elements without a wait that calls
#: do not overlap: C = alpha*(A0 + A1)'*B + beta*C 4 x 4 x 24 f64 with the sum in a
#: temporary ran 25.0 ns a call, 80 cycles against 82 modelled without the charge; the
#: fused form the model took with it, 32.0 ns, and the loops 28.4 (timed candidates of
#: an exhaustive search). Spreads of two f32 elements (a 64-bit broadcast and a permute)
#: still wait: C = alpha*(A0 + A1)'*B + beta*C 4 x 12 x 4 f32 with them ran 12.3 ns a
#: call in LGen's harness, against 9.5 with the temporary read in whole vectors and
#: permuted in lanes (``k.HalfSplat``, no wait). (On the Xeon's pools charging
#: broadcasts and spreads nothing was no better: regret 1.0408 against 1.0403.)
ZEN3_SCRATCH_ROUND_TRIP = 0.0

#: A temporary read back in vectors that no single store of it holds (a 512-bit load
#: of two 256-bit stores; any part of a masked store): the load is not forwarded and
#: waits for the stores to reach the cache, and the next call's stores into the same
#: stack slots wait behind it, so overlapping calls do not hide it. C = alpha*(A0 +
#: A1)'*B + beta*C, 4 x 12 x 4 f64 on AVX-512 (a Xeon, CPU model 167; timed candidates of
#: an exhaustive search): the sum's last four rows stored as 256-bit vectors and read two
#: rows at a time, 15.6 ns a call, modelled 36 cycles; the fused form, modelled 40, 9.5.
UNFORWARDED_ROUND_TRIP = 12.0
#: Accesses ``_unforwarded_scratch_loads`` follows, loops unrolled, before it gives up.
_FORWARDING_WALK = 4096


def _unforwarded_scratch_loads(body: tuple[k.Stmt, ...], scratch: frozenset[str]) -> bool:
    """Whether a vector load of a temporary (``k.Local``) reads elements of its stores
    that no single unmasked store holds whole, so that no store forwards them (a
    temporary no store in ``body`` writes is another operation's, and not judged: see
    ``cheapest_form``). Indices are affine in the counters of loops with constant
    bounds, whose iterations are each followed; a kernel with more than
    ``_FORWARDING_WALK`` accesses to temporaries is not judged."""
    scratch &= {s.buf for s in nodes_of(body, k.Store)}  # those another operation fills
    if not scratch:                                      # are not judged
        return False
    stores: dict[str, list[tuple[int, int]]] = {}
    masked: dict[str, list[tuple[int, int]]] = {}
    loads: list[tuple[str, int, int]] = []
    walked = 0

    def spans(index: k.Expr, lanes: int,
              loops: tuple[tuple[str, range], ...]) -> list[tuple[int, int]] | None:
        affine = _affine_in(index, loops)
        if affine is None or (
                walked + math.prod(len(values) for _, values in loops) > _FORWARDING_WALK):
            return None
        base, coefficients = affine
        starts = [base]
        for (_, values), c in zip(loops, coefficients, strict=True):
            starts = [s + c * (v - values[0]) for s in starts for v in values]
        return [(s, s + lanes) for s in starts]

    def visit(stmts: tuple[k.Stmt, ...], loops: tuple[tuple[str, range], ...]) -> bool:
        nonlocal walked
        for s in stmts:
            if isinstance(s, k.For):
                start, stop = k.const_value(s.start), k.const_value(s.stop)
                if not (isinstance(start, int) and isinstance(stop, int)):
                    return False
                trips = range(start, stop, s.step)
                if trips and not visit(s.body, (*loops, (s.var.name, trips))):
                    return False
                continue
            accesses = [(x.buf, x.index, x.lanes, x.count, "load")
                        for x in nodes_of(s, k.Load) if x.buf in scratch and x.lanes > 1]
            if isinstance(s, k.Store) and s.buf in scratch:
                accesses.append((s.buf, s.index, s.value.lanes, s.count, "store"))
            for buf, index, lanes, count, kind in accesses:
                n = k.const_value(count) if count is not None else lanes
                found = spans(index, n if isinstance(n, int) else lanes, loops)
                if found is None:
                    return False
                walked += len(found)
                if kind == "load":
                    loads.extend((buf, a, b) for a, b in found)
                else:
                    (stores if count is None else masked).setdefault(buf, []).extend(found)
        return True

    if not visit(body, ()):
        return False
    for buf, a, b in loads:
        if any(a < m1 and m0 < b for m0, m1 in masked.get(buf, ())):
            return True
        plain = stores.get(buf, ())
        if (any(a < s1 and s0 < b for s0, s1 in plain)
                and not any(s0 <= a and b <= s1 for s0, s1 in plain)):
            return True
    return False


def _index_at(index: k.Expr, values: dict[str, int]) -> int | None:
    """``index`` with loop counters set to ``values``, when that is a constant."""
    value = k.const_value(simplify(substitute(index, {
        name: k.Const(v) for name, v in values.items()})))
    return value if isinstance(value, int) else None


def _affine_in(index: k.Expr, loops: tuple[tuple[str, range], ...]
               ) -> tuple[int, list[int]] | None:
    """``index`` (affine in the counters of ``loops``, each a name and its non-empty
    range) at the loops' first iteration, and how much it grows per unit of each
    counter; None when it is not a constant there."""
    first = {name: values[0] for name, values in loops}
    base = _index_at(index, first)
    after = [_index_at(index, {**first, name: values[0] + 1}) for name, values in loops]
    if base is None or None in after:
        return None
    return base, [a - base for a in after]


#: A call that writes an operand it also reads (y of y = alpha*x + y) with a masked store
#: lasts at least this long when called again and again: the next call's load of that
#: operand is not forwarded from the masked store and waits for it to reach the cache.
#: Measured on a Xeon with AVX-512: y = alpha*x + y, n = 100 f32, 27 cycles a call with a
#: masked leftover, 19 with AVX2's plain ones; longer kernels hide the wait (C = alpha*A*B
#: + beta*C, 4 x 4 x 100 f32, ran 1.2x as fast with its masked leftover as without).
READ_BACK_CYCLES = 24.0


#: Outputs that are only written and hold more than ``L1_BYTES`` leave L1 between calls,
#: and a store that crosses a cache line then fetches two lines: each such store costs
#: about ``CROSSING_STORE_CYCLES`` more. Measured on the Xeon, C = A*B with C 100 x 100
#: f64 (800-byte rows): AVX-512's plan, whose 64-byte stores cross a line on every other
#: row (600 a call), 8400 cycles a call; AVX2's plan, none crossing, 6370, where the FMAs
#: alone would make AVX-512 twice as fast.
CROSSING_STORE_CYCLES = 3.5


def _zen3(machine: Machine) -> bool:
    """AMD family 25 without AVX-512: Zen 3 (Zen 4, the same family, has AVX-512)."""
    return (machine.vendor == "AuthenticAMD" and machine.family == 25
            and not machine.has("avx512f"))


def _zen4(machine: Machine) -> bool:
    """AMD family 25 with AVX-512: Zen 4, whose 512-bit instructions take its 256-bit
    pipes twice."""
    return (machine.vendor == "AuthenticAMD" and machine.family == 25
            and machine.has("avx512f"))


def _zen5(machine: Machine) -> bool:
    """AMD family 26: 512-bit pipes at the 256-bit ones' clock."""
    return machine.vendor == "AuthenticAMD" and machine.family == 26


def crossing_store_cycles(machine: Machine) -> float:
    """What a store across a cache line costs on ``machine``, for the choice between its
    ISAs: ``CROSSING_STORE_CYCLES``, but nothing on AMD family 26 (Zen 5), where C = A*B
    with C 100 x 100 f64 ran 652 ns a call with AVX-512 (600 crossing stores) against
    1288 with AVX2; nor on Zen 4, where the same kernels ran 1.07x and 0.97x the loops'
    speed (the one LGen case whose choice the charge changes there). (Plans within one
    ISA are modelled alike on every machine, so that the plan cache need not know the
    machine.)"""
    return 0.0 if _zen5(machine) or _zen4(machine) else CROSSING_STORE_CYCLES


def _crossing_stores(body: tuple[k.Stmt, ...], scratch: frozenset[str]) -> int:
    """Stores a call makes across a cache line into outputs it writes but never reads
    (operands start on a line), when those outputs hold more than ``L1_BYTES``; else 0.
    Store indices are affine in the loop counters."""
    if bytes_stored(body, scratch) <= L1_BYTES:  # no output that big: skip the walk
        return 0
    loaded = loaded_buffers(body)
    sizes: dict[str, int] = {}
    crossing = 0

    def visit(stmts: tuple[k.Stmt, ...], loops: tuple[tuple[str, range], ...]) -> None:
        nonlocal crossing
        for s in stmts:
            if isinstance(s, k.For):
                start, stop = k.const_value(s.start), k.const_value(s.stop)
                if isinstance(start, int) and isinstance(stop, int) and stop > start:
                    visit(s.body, (*loops, (s.var.name, range(start, stop, s.step))))
            elif isinstance(s, k.Store) and s.buf not in scratch | loaded:
                affine = _affine_in(s.index, loops)
                if affine is None:
                    continue
                base, coefficients = affine
                size = itemsize(s.value.dtype)
                width = s.value.lanes * size
                last = base + sum(max(c, 0) * (values[-1] - values[0])
                                  for (_, values), c in zip(loops, coefficients, strict=True))
                sizes[s.buf] = max(sizes.get(s.buf, 0), last * size + width)
                # one element, aligned to its size, never crosses (skipping its spread cut
                # this walk from 76 to 52 ms on the generic target's 100 x 5 x 100 kernel)
                if s.count is None and s.value.lanes > 1:
                    crossing += _crossing_executions(base * size, coefficients, loops, size,
                                                     width)

    visit(body, ())
    return crossing if sum(sizes.values()) > L1_BYTES else 0


def _crossing_executions(start: int, coefficients: tuple[int, ...],
                         loops: tuple[tuple[str, range], ...], size: int, width: int) -> int:
    """How many executions of a store of ``width`` bytes, at byte ``start`` plus the
    loops' counters times ``coefficients`` elements of ``size`` bytes, cross a line."""
    # how many of the store's executions start at each byte offset in a line
    offsets = {start % CACHE_LINE: 1}
    for (_, values), c in zip(loops, coefficients, strict=True):
        step = c * values.step * size
        spread: dict[int, int] = {}
        for offset, count in offsets.items():
            for t in range(len(values)):
                o = (offset + t * step) % CACHE_LINE
                spread[o] = spread.get(o, 0) + count
        offsets = spread
    return sum(c for o, c in offsets.items() if o + width > CACHE_LINE)


def _masked_into_inout(body: tuple[k.Stmt, ...], isa: Isa) -> bool:
    """Whether the kernel stores the first lanes of a vector with mask registers (with a
    mask, or as plain pieces: ``Isa.plain_moves``) into an operand it also loads. The
    next call's masked load of it is not forwarded: from a masked store never, from
    pieces not from several stores at once (y = alpha*A*x + beta*y, A 12 x 4 f32: 12 of
    16 lanes stored as 8 + 4 and loaded masked, 6.15 ns a call; as two vectors, 3.22;
    loaded as 8 + 4 joined, 5.10)."""
    if not isa.mask_registers:
        return False
    local = {s.buf for s in body if isinstance(s, k.Local)}
    loaded = loaded_buffers(body) - local
    return any(s.count is not None and s.buf in loaded and s.value.lanes > 1
               for s in nodes_of(body, k.Store))


def program_cost(module: k.Module, program: ix.Program, schedule: Sequence[OpSchedule],
                 isa: Isa, datapath: int = 0, crossing: float | None = None,
                 embedded: bool = False, core: Core | None = None) -> float:
    """Estimated cycles of ``module``, built from ``program`` with ``schedule``: the
    whole kernel at once, with the register need of its largest block, on a core whose
    vector units take ``datapath`` bits at once (0: any vector the ISA has) and whose
    stores across a cache line cost ``crossing`` cycles (None: ``CROSSING_STORE_CYCLES``);
    ``embedded`` and ``core`` as for ``model_cost``."""
    need = max(_registers(program, op, s, module, isa)
               for op, s in zip(program.ops, schedule, strict=True))
    return model_cost(module, need, isa, datapath, crossing, embedded, core)


def isa_choice_cost(module: k.Module, program: ix.Program, schedule: Sequence[OpSchedule],
                    isa: Isa, machine: Machine) -> float:
    """``program_cost`` as the choice between ``machine``'s ISAs sees it: with its
    datapath (``Machine.vector_datapath``), its cost of a store across a cache line
    (``crossing_store_cycles``), its pipes (``core_for``), AVX-512's broadcasts read
    by their FMA, and a broadcast repeated in straight-line code loaded once, as gcc
    emits it. Counted so on Zen 4, alpha = x'*A*y with A 4 x 24 f32 and 4 x 12 f64
    takes AVX2: 5.44 -> 3.71 and 4.59 -> 3.61 ns a call, Eigen's speed (0.67x and 0.78x
    before), and the five LGen kernels that change ran 1.18x as fast over the loops
    (six A/B rounds). Counted so within an ISA too, its ranking went wrong: C = A*B
    n x 4 x n took other blocks and ran 0.63-0.93x as fast (four rounds)."""
    return program_cost(module, program, schedule, isa, machine.vector_datapath,
                        crossing_store_cycles(machine), embedded=True,
                        core=core_for(machine, isa))


#: Choosing between ISAs of one machine (AVX2 and AVX-512): fixed cycles of a call that
#: no ISA shortens (the call, the latency of a first load and last store), and how much
#: faster the wider one must be modelled to be taken: wider vectors also cost what the
#: model does not see (clock, loads waiting on masked stores of the previous call).
#: Fitted to LGen's 510 cases on a Xeon with AVX-512, each timed with both ISAs: of the
#: rules (call 0-32 cycles, gain 1.1-1.8) this one gave the best geomean, 1.06x over
#: AVX2 alone (normalised by the loops' drift between the runs), with 4 cases below
#: 0.9x (benchmarks/lgen/README.md, "AVX-512"). Refitted after AVX-512 got 128-bit
#: leftovers: 4 cycles and 1.4x were 0.4% better, within noise; fitted again on every
#: candidate of an exhaustive search, timed (see ``WINDOW``), they tie with the best
#: (2 cycles, 1.5x; regret 1.0698 against 1.0697) and beat 4 cycles with 1.5x (1.0734),
#: and are now the rule.
CALL_CYCLES = 4.0
WIDER_GAIN = 1.4
#: The gain on AMD family 26 (Zen 5), whose 512-bit vectors cost no clock and whose
#: kernels start on a cache line since 3e4f61f: refitted on two full LGen runs with
#: ``BLACC_ISA=avx2`` and ``BLACC_ISA=avx512`` (blacc and the loops, each case's model
#: cost on both), 1.05 ran 1.912x over the loops and 1.4 1.892x (the best for 0-8 cycles
#: of call at 1.05 are within 0.001; 1.0, which takes AVX-512 on a tie, 1.904x).
ZEN5_WIDER_GAIN = 1.05
#: The gain on Zen 4 (``_zen4``): none, the wider ISA on a tie. Refitted on two full LGen
#: runs with ``BLACC_ISA=avx2`` and ``BLACC_ISA=avx512`` (blacc and the loops, each
#: case's model cost on both) at 84ab1aa: 1.0 ran 1.829x over the loops with 32 cases
#: below them by more than 3%, 1.4 1.756x with 73 (all AVX2 1.717x, all AVX-512 1.811x,
#: a per-case oracle 1.899x; calls of 0-32 cycles within 0.001 at 1.0, gains 0.95-0.99
#: within 0.001 of it, 1.01 1.822x). Ties are where the choice counts: on 69 cases
#: modelled alike AVX-512 ran 1.03x as fast (C = A*B 4 x 4 x 4 f32, AVX-512's quarters
#: 1.01x the loops, AVX2's pairs 0.80x): it dispatches half the instructions, which the
#: pipes the model counts do not see.
ZEN4_WIDER_GAIN = 1.0


#: The gain on Intel's cores, whose shuffles the model counts on one pipe (``core_for``):
#: 1.4 made up for a model that took 512-bit shuffles as cheaply as on AMD's cores.
#: Fitted on the pools of 431 LGen cases on a Xeon (every candidate of an exhaustive
#: search timed, ``benchmarks/lgen/model_fit.py``), with Intel's pipes for AVX-512 alone:
#: regret 1.0544 at 1.1 (1.0556 at 1.15, 1.0612 at 1.2, 1.0727 at 1.3), against 1.0627
#: with the constants' pipes and 1.4. With the pipes as they are, over all 510: 1.0501
#: (the best rule of the grid, 0 cycles and 1.2x, 1.0496).
INTEL_WIDER_GAIN = 1.1


def wider_gain(machine: Machine) -> float:
    """How much faster the wider ISA must be modelled on ``machine`` to be taken."""
    if _zen5(machine):
        return ZEN5_WIDER_GAIN
    if _zen4(machine):
        return ZEN4_WIDER_GAIN
    return INTEL_WIDER_GAIN if machine.vendor == "GenuineIntel" else WIDER_GAIN


def worth_wider(costs: Sequence[float], *, call: float | None = None,
                gain: float | None = None) -> int:
    """Index of the ISA to use, given each one's ``program_cost``, narrowest first: the
    widest whose modelled time, with ``call`` (``CALL_CYCLES``) added, is at least
    ``gain`` (``WIDER_GAIN``) times shorter than the narrowest one's."""
    call = CALL_CYCLES if call is None else call
    gain = WIDER_GAIN if gain is None else gain
    base = costs[0] + call
    return max((i for i, c in enumerate(costs) if base >= gain * (c + call)), default=0)


def _registers(program: ix.Program, op: ix.Op, sched: OpSchedule, module: k.Module,
               isa: Isa) -> int:
    """Vector registers a block of ``op`` keeps live (``block_registers``), with an
    accumulator per partial chain and per reduction nested in the body, and what a column
    tile keeps beside it (``_column_tile_registers``)."""
    bu, bv = sched.block
    chains = accumulators(program, op, sched, isa)
    if (per := sched.rows_per_vector) > 1:  # two or four rows per accumulator, a row of B
        # shared by them
        accs = -(-bu // per) * bv
        # rows of A splatted within parts (``k.HalfSplat``) are loaded once for the terms
        # they hold, and in straight-line code gcc keeps each beside its accumulator:
        # C = alpha*A*B + beta*C 16 x 4 x 4 f32 in one block of 8 accumulators spilled,
        # 0.89x the loops' speed. In a loop over blocks it folds the loads into the
        # splats instead: counted there, C = A*B and alpha*A*B + beta*C n x 4 x 4 f32,
        # n = 32-100, took blocks of 4 rows and ran 0.82-0.96x as fast (Zen 3, A/B)
        body = module.function(module.entry).body
        held = accs if nodes_of(body, k.HalfSplat) and not nodes_of(body, k.For) else 0
        return accs * chains + held + bv + 1
    return (block_registers(bu, bv, chains) + _column_tile_registers(program, op, sched, module)
            + _shared_rows_registers(program, op, sched, isa))


def _longest_sum(op: ix.Op) -> int:
    """Terms of the longest reduction in ``op``'s body (1 without one)."""
    return max((s.extent for s in sums_of(op.body)), default=1)


def _shared_rows_registers(program: ix.Program, op: ix.Op, sched: OpSchedule,
                           isa: Isa) -> int:
    """Vector registers the other K - 1 rows of the operand shared down a block's columns
    (B of C = A*B) keep beyond ``block_registers``' one row. Where the sum is unrolled
    and blocks of rows repeat over the whole width of the output, those rows are the same
    for every block: gcc loads them once (out of the loop over blocks, or merged in
    straight-line code) and keeps all K live. C = A*B 12 x 4 x 12 f32 on AVX2 in blocks
    of 6 rows x 2 vectors kept 12 accumulators and 8 vectors of B, spilled, and ran
    37.7 ns a call against 19.6 in one-row blocks (Zen 3, timed candidates)."""
    if sched.vector != op.dims[1] or sched.folds:  # lanes along C's rows only
        return 0
    extent = _longest_sum(op)
    out = program.operand(op.out)
    width = len(chunks(out.cols, isa.widths(program.dtype), sched.one_tail))
    if extent > sched.unroll or out.rows <= sched.block[0] or sched.block[1] < width:
        return 0
    shared = extent * sched.block[1]
    # more rows than half the registers: gcc loads them again for each block instead
    return shared - sched.block[1] if shared <= isa.registers // 2 else 0


def _column_tile_registers(program: ix.Program, op: ix.Op, sched: OpSchedule,
                           module: k.Module) -> int:
    """Vector registers a column tile (lanes down an output with short rows,
    ``transform.blac._column_tiles``) keeps live beyond its block: the other K - 1
    columns of a K-column operand read down each vector, and the broadcasts hoisted out
    of its loop. C = A*B with A 100 x 4 and B 4 x 4 f32 on AVX-512 in blocks of 4 columns
    x 3 vectors keeps 12 accumulators, 12 columns of A and 16 broadcasts of B: gcc spills,
    and the blocks ran 33.3 ns a call against 31.3 for 4 x 1 (f64: 63 and 58 ns)."""
    width = program.operand(op.out).cols
    if sched.vector != op.dims[0] or width == 1:
        return 0
    # a longer sum is read a row of ``width`` at a time, not all of it at once
    columns = min(width, _longest_sum(op))
    body = module.function(module.entry).body
    # its own loops: those that store into its output (a whole program's module holds
    # the other operations' loops too)
    in_loops = set().union(*(names_used(s) for s in body if isinstance(s, k.For)
                             and op.out in {st.buf for st in nodes_of(s, k.Store)}))
    hoisted = sum(isinstance(s, k.Decl) and isinstance(s.value, k.Broadcast)
                  and s.var.name in in_loops for s in body)
    return (columns - 1) * sched.block[1] + hoisted


def _work(n: ix.Node) -> int:
    """Arithmetic operations to compute one value of ``n`` (a sum: its extent times its
    body's, plus the additions)."""
    if isinstance(n, ix.Sum):
        return n.extent * (_work(n.body) + 1)
    own = 1 if isinstance(n, (ix.Add, ix.Mul, ix.Neg)) else 0
    return own + sum(_work(c) for c in ix.children(n))


def _lower_bound(program: ix.Program, op: ix.Op, sched: OpSchedule, isa: Isa) -> float:
    """Cycles no schedule with these lanes can beat: every operation fused in pairs (one
    FMA per multiply-add) and on full vectors, on every FP pipe."""
    out = program.operand(op.out)
    lanes = isa.lanes(program.dtype) if sched.vector is not None else 1
    return out.rows * out.cols * _work(op.body) / (2 * lanes * FP_PIPES)


def _unshared_multiplies(op: ix.Op, out: ix.Operand) -> int:
    """Multiplies of ``op`` that a kernel computing it issues for each of its output
    elements: one per term of each product that depends on every output index and every
    index it is summed over (a chain of factors, ``x(i)*A(i,k)*y(k)``, counted once: it
    may be evaluated in another order), times the extents of its sums. Products of a
    literal (``1*x`` may be folded away) and of invariant factors (``alpha*B(k,j)``,
    which may be computed once) are not counted, nor is a repeated term."""
    varying = {d for d, n in zip(op.dims, (out.rows, out.cols), strict=True) if n > 1}
    found: dict[ix.Node, int] = {}

    def visit(n: ix.Node, summed: frozenset[str], runs: int, factor: bool) -> None:
        if isinstance(n, ix.Sum):
            visit(n.body, summed | {n.index}, runs * n.extent, False)
            return
        if isinstance(n, ix.Mul):
            if (not factor and not isinstance(n.a, ix.Lit) and not isinstance(n.b, ix.Lit)
                    and varying | summed <= ix.indices_used(n)):
                found[n] = max(found.get(n, 0), runs)
            factor = True
        for c in ix.children(n):
            visit(c, summed, runs, factor)

    visit(op.body, frozenset(), 1, False)
    return out.rows * out.cols * sum(found.values())


def fewest_cycles(forms: Sequence[ix.Program], isa: Isa) -> float:
    """Cycles below which ``model_cost`` prices no kernel of any of ``forms`` on ``isa``,
    whatever its schedule or core: its multiplies (``_unshared_multiplies``) in full
    vectors on every FP pipe. A true bound, unlike ``_lower_bound``: it counts neither
    additions nor operands a schedule may combine once."""
    return min(sum(_unshared_multiplies(op, form.operand(op.out)) for op in form.ops)
               / (isa.lanes(form.dtype) * FP_PIPES) for form in forms)


def options(program: ix.Program, specs: tuple[ArgSpec, ...], isa: Isa,
            keep: int = 8, core: Core | None = None) -> list[list[tuple[float, OpSchedule]]]:
    """Per operation, the ``keep`` best-modelled schedules that can be built, best first,
    with their modelled cycles. Operations are computed one after another, so each is
    modelled on its own. A candidate is built and modelled only if its lower bound (see
    ``_lower_bound``) can beat the ``keep``-th best so far: the scalar and horizontal-sum
    schedules of a large product are skipped once vector blocks have been modelled.
    ``core``: the pipes modelled (``core_for``; None: the model's constants)."""
    result = []
    for op in program.ops:
        found = None
        if _one_row_near_l1(program, op, core):
            found = _best_modelled(program, op, specs, isa, keep, core, one_row=True)
            if not any(s.vector == op.dims[1] for _, s in found):
                found = None  # no one-row block keeps B's rows: the rule does not apply
        if found is None:
            found = _best_modelled(program, op, specs, isa, keep, core, one_row=False)
        if not found:
            raise ScheduleError(f"no schedule can compute {op.out}")
        result.append(found)
    return result


def _best_modelled(program: ix.Program, op: ix.Op, specs: tuple[ArgSpec, ...], isa: Isa,
                   keep: int, core: Core | None, one_row: bool
                   ) -> list[tuple[float, OpSchedule]]:
    """``options`` for one operation; ``one_row``: only one-row blocks along the output's
    rows, and only those that load B's rows once for all the rows (``_keeps_rows_of_b``).
    Along the rows of a short output, only blocks of all its rows (``_short_output_rows``)."""
    single = ix.Program(program.operands, (op,), program.dtype)
    found: list[tuple[float, OpSchedule]] = []
    built: set[k.Module] = set()  # kernels modelled, where they may repeat
    one_lane = isa.lanes(program.dtype) == 1
    rows = _short_output_rows(program, op, isa, core)
    ranked = sorted(((_lower_bound(program, op, s, isa), s)
                     for s in candidates(program, op, isa)
                     if not (one_row and s.vector == op.dims[1] and s.block[0] > 1)
                     and not (rows and s.vector == op.dims[1] and s.block[0] < rows)),
                    key=lambda bs: bs[0])
    for bound, sched in ranked:
        # one costing at least the last kept is dropped below, whatever it costs: it
        # is not built when its bound says so, and its modelling may stop there
        worst = found[-1][0] if len(found) >= keep else None
        if worst is not None and bound >= worst:
            continue
        try:
            module = build_module(single, specs, (sched,), isa, "probe")
        except ScheduleError:
            continue
        if (one_row and sched.vector == op.dims[1]
                and not _keeps_rows_of_b(single, specs, sched, isa, module, core)):
            continue
        if one_lane:
            # on the generic target lanes along a row are one wide: such a schedule
            # is a scalar one again, modelled already, which it would rank just
            # after (C = alpha*(A0 + A1)'*B + beta*C 16 x 4 x 16 f64: 29 of its 58)
            if module in built:
                continue
            built.add(module)
        need = _registers(single, op, sched, module, isa)
        found.append((model_cost(module, need, isa, core=core, above=worst), sched))
        found.sort(key=lambda o: o[0])
        del found[keep:]
    return found


#: The band of sizes, in multiples of ``L1_BYTES``, of an output in which a core with
#: ``Core.one_row_near_l1`` computes it one row at a time. On a Xeon of CPU model 167
#: (LGen's harness, AVX-512, the model's blocks against one-row blocks of 2 and 3
#: vectors): C = alpha*A*B + beta*C n x 4 x n f32, n = 64, 80, 100 (0.33, 0.52, 0.81 L1),
#: 218 -> 206, 393 -> 338, 867 -> 661 ns a call; f64 n = 64 (0.67 L1) 501 -> 460;
#: C = alpha*(A0 + A1)'*B + beta*C, f32 n = 80, 100, 377 -> 320, 772 -> 620; C = A*B
#: (only written) f32 n = 100 590 -> 519 (1 x 3), f64 n = 64 375 -> 347. The model
#: prices the blocks of 4 rows below one-row blocks, by the loads of B they share; it
#: does not see the rows of C they write at once. Beyond L1 (f64 n = 80, 100) one row
#: ran as fast when C is read back (945 -> 953-966, 1585 -> 1590-1626) and 0.75-0.77x
#: when only written (rows prefetched for writing); smaller outputs (f32 n = 48) alike.
ONE_ROW_BAND = (0.3, 1.0)


#: Outputs of at most this many rows, each of two vectors or more, that a core with
#: ``Core.whole_short_outputs`` computes in blocks of all their rows. The model prices
#: blocks of 2 rows x 4 vectors in straight-line code (each row of B loaded once per
#: block of rows) at their FMAs' issue time, and blocks of all 4 rows in a loop along
#: the row above that (the code before and after the loop priced apart); on a Xeon of
#: CPU model 167 (LGen's harness, the model's 2 x 4 blocks against 4 x 2 / 4 x 3) they
#: ran slower: C = A*B 4 x 4 x 100 f32 30.6 against 23.4 / 24.5 ns a call, 4 x 4 x 48
#: f64 21.1-22.0 against 19.1 / 17.5-18.5, C = alpha*A*B + beta*C 4 x 4 x 100 f32 38.9
#: against 32.1 / 33.2, 4 x 4 x 48 f64 28.1 against 24.6 / 25.6, 4 x 4 x 80 f64 45.0
#: against 41.4 / 40.8. Shorter rows are left out: outputs of 4 x 4 and 4 x 8 f32 and
#: 4 x 4 f64 in blocks of all their rows ran 0.78-0.95x as fast as in the model's
#: blocks of one or two rows.
SHORT_OUTPUT_ROWS = 4


def _short_output_rows(program: ix.Program, op: ix.Op, isa: Isa, core: Core | None) -> int:
    """The rows of ``op``'s output where a core with ``Core.whole_short_outputs`` computes
    it in blocks of all of them (``SHORT_OUTPUT_ROWS``, rows of two vectors of ``isa``
    or more), else 0: then ``options`` takes no block of fewer rows along its rows."""
    if not _core(core).whole_short_outputs or len(op.dims) != 2:
        return 0
    out = program.operand(op.out)
    if out.cols < 2 * isa.lanes(program.dtype):
        return 0
    return out.rows if 1 < out.rows <= SHORT_OUTPUT_ROWS else 0


def _one_row_near_l1(program: ix.Program, op: ix.Op, core: Core | None) -> bool:
    """Whether ``op`` computes an output that no other operation reads (read back by
    ``op`` itself or only written; not a temporary), which fills ``ONE_ROW_BAND`` of L1,
    on a core that computes such outputs one row at a time (``Core.one_row_near_l1``).
    Then ``options`` takes only blocks of one row along the output's rows, of those
    that load B's rows once for all the rows (``_keeps_rows_of_b``); where none does,
    any block."""
    if not _core(core).one_row_near_l1 or len(op.dims) != 2:
        return False
    out = program.operand(op.out)
    if out.temporary or any(r.operand == op.out for o in program.ops if o is not op
                            for r in ix.reads(o.body)):
        return False
    low, high = ONE_ROW_BAND
    return low * L1_BYTES < out.rows * out.cols * itemsize(program.dtype) <= high * L1_BYTES


#: How many vectors one-row blocks may load alike for every row (B's), in register
#: files of the ISA, for the C compiler to keep in registers or reload (``_keeps_rows_of_b``).
#: On a Xeon of CPU model 167 (C = A*B and C = alpha*A*B + beta*C n x K x n, one-row
#: blocks against the model's taller blocks, built into LGen's harness), C = A*B: K = 4
#: with 28 and 32 such vectors (n = 100 f32, 64 f64) 519 against 590 ns a call and 347
#: against 375; K = 8 with 32, 40 and 48 (n = 64, 80 f32, 48 f64) 330 against 477, 544
#: against 599, 420 against 489; K = 16 with 64 and 80 (n = 64, 80 f32) 809 against
#: 883, 1411 against 1421, with 96 (48 f64) 964 against 940; K = 32 with 128 (64 f32)
#: 2134-2249 against 1527. C = alpha*A*B + beta*C: K = 16 with 80 and 96 (80 f32, 48
#: f64) 1454 against 1559, 1083 against 1148; K = 32 with 128 (64 f32) 2161 against 1523.
ROWS_OF_B_KEPT = 3


def _keeps_rows_of_b(program: ix.Program, specs: tuple[ArgSpec, ...], sched: OpSchedule,
                     isa: Isa, module: k.Module, core: Core | None) -> bool:
    """Whether the kernel of ``sched``, a block of one row, loads the vectors it needs
    alike for every row (the rows of B) once for all the rows, for the C compiler to
    keep: no barrier reloads them each row (``_reload_per_iteration``; C = A*B 100 x 4
    x 100 f32 in 1 x 4 blocks ran 908 ns a call against 590 for the model's taller
    blocks, 64 x 4 x 64 f64 in 1 x 8 491 against 375, 100 x 8 x 100 f32 in 1 x 3 1729
    against 1209), and a row loads no more of them than ``ROWS_OF_B_KEPT`` register
    files. ``program`` holds the one operation. Asked of the kernel as emitted
    (``module`` where it is the same): with rows in straight lines
    (``Core.straight_rows_near_l1``, ``writes_near_l1``) a row's loop holds all of the
    row's columns."""
    if _core(core).straight_rows_near_l1 and writes_near_l1(program, program.ops[0]):
        module = build_module(program, specs, (sched,), isa, "probe", straight_near_l1=True,
                              shared_splats=_core(core).shared_splats)
    body = module.function(module.entry).body
    if nodes_of(body, k.Barrier):
        return False
    return all(_loads_alike_each_trip(loop) <= ROWS_OF_B_KEPT * isa.registers
               for loop in body if isinstance(loop, k.For))


def _loads_alike_each_trip(loop: k.For) -> int:
    """The vector loads an iteration of ``loop`` makes whose addresses do not depend on
    its counter, counted once per iteration of the loops within it."""
    def count(stmts: tuple[k.Stmt, ...], times: int) -> int:
        inner = sum(count(s.body, times * _trips(s)) for s in stmts if isinstance(s, k.For))
        alike = {e for s in stmts if not isinstance(s, k.For) for e in nodes_of(s, k.Load)
                 if e.lanes > 1 and loop.var.name not in names_used(e.index)}
        return inner + times * len(alike)
    return count(loop.body, 1)


def modelled_forms(forms: Sequence[ix.Program], specs: tuple[ArgSpec, ...], isa: Isa,
                   core: Core | None = None
                   ) -> list[tuple[ix.Program, list[list[tuple[float, OpSchedule]]]]]:
    """Each form with its ``options``: what ``cheapest_form`` chooses from."""
    return [(f, options(f, specs, isa, core=core)) for f in forms]


def cheapest_form(forms: Sequence[ix.Program], specs: tuple[ArgSpec, ...], isa: Isa,
                  core: Core | None = None, break_ties: bool = True,
                  modelled: list[tuple[ix.Program, list[list[tuple[float, OpSchedule]]]]]
                  | None = None
                  ) -> tuple[ix.Program, list[list[tuple[float, OpSchedule]]]]:
    """Of several index forms of one program (``index_notation.forms``), the one whose
    best-modelled schedule costs least, with its ``options``. Operations run one after
    another, so a form costs the sum of its operations' best, and the wait where one
    reads a temporary another's stores do not forward. Forms that tie go to the one
    cheapest modelled whole (``_whole_cost``), or with ``break_ties`` False to the
    first. ``modelled``: ``modelled_forms`` of ``forms``, where already computed."""
    if modelled is None:
        modelled = modelled_forms(forms, specs, isa, core)
    # one operation alone is already modelled whole
    probes = {id(f): _probe(f, specs, per_op, isa) if len(f.ops) > 1 else None
              for f, per_op in modelled}

    def cost(fo: tuple[ix.Program, list[list[tuple[float, OpSchedule]]]]) -> float:
        form, per_op = fo
        module = probes[id(form)]
        wait = 0.0
        if module is not None:
            body = module.function(module.entry).body
            scratch = frozenset(s.buf for s in body if isinstance(s, k.Local))
            wait = UNFORWARDED_ROUND_TRIP if _unforwarded_scratch_loads(body, scratch) else 0.0
        return round(sum(opts[0][0] for opts in per_op) + wait, 6)

    costs = [cost(fo) for fo in modelled]
    tied = [fo for fo, c in zip(modelled, costs, strict=True) if c == min(costs)]
    if not break_ties or len(tied) == 1:
        return tied[0]
    return min(tied, key=lambda fo: _whole_cost(fo[0], fo[1], probes[id(fo[0])], isa, core))


def _probe(form: ix.Program, specs: tuple[ArgSpec, ...],
           per_op: list[list[tuple[float, OpSchedule]]], isa: Isa) -> k.Module | None:
    """``form`` built with each operation's best-modelled schedule; None where those do
    not build together."""
    try:
        return build_module(form, specs, tuple(o[0][1] for o in per_op), isa, "probe",
                            write_prefetches=False)
    except ScheduleError:
        return None


def _whole_cost(form: ix.Program, per_op: list[list[tuple[float, OpSchedule]]],
                module: k.Module | None, isa: Isa, core: Core | None) -> float:
    """``program_cost`` of ``form``'s ``module`` (its operations with their best-modelled
    schedules; None: the sum of their costs, one operation's own), which sees what that
    sum does not: their chains overlap where they are independent, and a temporary read
    back element by element waits for its stores once. C = alpha*(A0 + A1)'*B + beta*C
    4 x 4 x 16 f32 on AVX-512: the fused form and the form with the sum in a temporary
    both cost 28 cycles as sums, 28 and 26 whole, and ran 8.6-9.0 and 7.0-7.4 ns a call
    (a Xeon, CPU model 167; LGen's harness). Taken for every choice of form (not only on
    ties) it also moved forms whose costs differ by half a cycle, both ways: y =
    alpha*A*x + beta*y 80 x 4 f32 0.90-0.94x, C = alpha*(A0 + A1)'*B + beta*C 12 x 4 x 12
    f32 (two temporaries) 0.81x."""
    if module is None:
        return sum(o[0][0] for o in per_op)
    schedule = tuple(o[0][1] for o in per_op)
    return program_cost(module, form, schedule, isa, core=core)


def choose(program: ix.Program, specs: tuple[ArgSpec, ...], isa: Isa, *,
           per_op: list[list[tuple[float, OpSchedule]]] | None = None,
           core: Core | None = None) -> tuple[OpSchedule, ...]:
    """The cost model's schedule: each operation's best-modelled one. ``per_op``:
    ``options(program, specs, isa, core=core)`` when already computed."""
    if per_op is None:
        per_op = options(program, specs, isa, core=core)
    return tuple(opts[0][1] for opts in per_op)


def search_pool(per_op: list[list[tuple[float, OpSchedule]]], search: str, *,
                budget: int = 24, seed: int = 0) -> list[tuple[float, tuple[OpSchedule, ...]]]:
    """The schedules a measuring search may time (LGen section 3.5), with their modelled
    cycles: combinations of each operation's options, the best-modelled first
    ('exhaustive'), or ``budget`` of them drawn with ``seed`` ('random')."""
    if search not in SEARCHES or search == "model":
        raise ScheduleError(f"a measuring search is 'exhaustive' or 'random', not {search!r}")
    combos = [(sum(cost for cost, _ in c), tuple(s for _, s in c))
              for c in itertools.product(*per_op)]
    if search == "random":
        return random.Random(seed).sample(combos, min(budget, len(combos)))
    return sorted(combos, key=lambda c: c[0])[:budget]


#: Where a kernel updates an operand in 512-bit vectors (``transform.split_updates``),
#: its next call's loads of that operand wait on this call's stores; moved in 256-bit
#: pieces they are forwarded sooner (about two cycles on Zen 5), or at all where a
#: masked 512-bit load would read a leftover stored as pieces, at the price of more
#: loads, stores and FMAs. Same-session A/B over LGen's 238 updates in place (y =
#: alpha*x + y, y = alpha*A*x + beta*y, C = alpha*A*B + beta*C, C = alpha*(A0 +
#: A1)'*B + beta*C; 2 x 7 rounds, Zen 5): every straight-line kernel modelled at most
#: ``SPLIT_BELOW_CYCLES`` whose updates split into at most ``SPLIT_PIECES`` pieces ran
#: 1.12-1.19x as fast (about 3.6 -> 3.1 ns a call), as did the two with masked
#: updates of 12 of 16 f32 (1.14x and 1.32x: 7.8 -> 6.8 and 6.7 -> 5.1 ns); split
#: everywhere, kernels modelled at 12 cycles and more ran 0.71-0.95x, more pieces
#: (y = alpha*x + y, 48 f64 or 100 f32) 0.90-0.94x, and loops 0.73-0.92x.
SPLIT_BELOW_CYCLES = 11.0
SPLIT_PIECES = 8


def split_short_updates(module: k.Module, program: ix.Program,
                        schedule: Sequence[OpSchedule], isa: Isa,
                        core: Core | None = None) -> k.Module:
    """``module`` with its updates of operands in place in 256-bit pieces where that
    pays (``SPLIT_BELOW_CYCLES``): a short straight-line kernel, or a masked update."""
    (entry,) = module.functions
    if nodes_of(entry.body, k.For):
        return module
    split = split_updates(entry.body, isa, max_pieces=SPLIT_PIECES)
    if split == entry.body:
        return module
    masked = any(s.count is not None and s.value.lanes * itemsize(s.value.dtype) == 64
                 for s in nodes_of(entry.body, k.Store))
    if not masked and program_cost(module, program, schedule, isa,
                                   core=core) > SPLIT_BELOW_CYCLES:
        return module
    return mark_past_end(replace(module, functions=(replace(entry, body=split),)), isa)
