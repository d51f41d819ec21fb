"""The public API for fixed-size programs of the expression language: compile, emit.

    k = blacc.compile("y = alpha*A*x + y", A=blacc.Matrix(5, 9, "f32"),
                      x=blacc.Vector(9, "f32"), y=blacc.Vector(5, "f32"),
                      alpha=blacc.Scalar("f32"))
    k(A=A, x=x, y=y, alpha=2.0)            # y updated in place and returned
    blacc.emit("y = A*x", output="matvec", A=blacc.Matrix(4, 4), x=..., y=...)

The pipeline: parse -> type check (frontend) -> index notation with fusion
(transform.index_notation) -> form and schedule choice (strategy.small) -> vectorized kernel
IR (transform.blac) -> C (backend.c) -> a CPython extension (runtime.pycall) or a
standalone .c/.h pair.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .backend import c as c_backend
from .errors import ArgumentError, ScheduleError
from .frontend import TypedProgram, check, parse, to_program
from .frontend.typecheck import part
from .frontend.types import Decl
from .ir import indexed as ix
from .ir import kernel as k
from .runtime.gemm import Target, host_target
from .runtime.measure import time_kernels
from .runtime.plan_cache import Choice, remembered
from .runtime.signature import ArgSpec
from .strategy.route import program_to_spine
from .strategy.small import (
    SEARCHES,
    Core,
    cheapest_form,
    choose,
    core_for,
    fewest_cycles,
    isa_choice_cost,
    modelled_forms,
    options,
    search_pool,
    split_short_updates,
    wider_gain,
    worth_wider,
)
from .target.isa import AVX2, AVX512, GENERIC, Isa, requested_isa
from .transform.as_gemm import Others, gemm_program
from .transform.blac import OpSchedule, build_module
from .transform.blac import candidates as schedule_candidates
from .transform.index_notation import arg_specs, forms

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
TARGETS = {"host": None, "avx512": AVX512, "avx2": AVX2, "generic": GENERIC}


@dataclass(frozen=True)
class Plan:
    """Everything decided for one program: typed program, index form, schedule, IR."""

    typed: TypedProgram
    indexed: ix.Program
    specs: tuple[ArgSpec, ...]
    schedule: tuple[OpSchedule, ...]
    module: k.Module
    isa: Isa

    @property
    def source(self) -> str:
        return c_backend.render(self.module, self.isa)


def _typed(program: object, operands: Mapping[str, Decl]) -> TypedProgram:
    if isinstance(program, str):
        return check(parse(program), operands)
    if isinstance(program, Mapping):
        ast, decls = to_program(program, operands)
        return check(ast, decls)
    raise ArgumentError("a program is source text, or a dict {output name: expression} "
                        f"built with operators, not {type(program).__name__}")


def _check_request(name: str, search: str) -> None:
    if not _IDENT.fullmatch(name) or name.startswith(("blacc_", "__")):
        raise ArgumentError(f"kernel name {name!r} is not a valid C identifier for blacc")
    if search not in SEARCHES:
        raise ScheduleError(f"search must be one of {', '.join(SEARCHES)}, not {search!r}")


def _is_host(target: str | Isa | None) -> bool:
    return not isinstance(target, Isa) and (target or "host") == "host"


def _isa(target: str | Isa | None) -> Isa:
    """The ISA ``target`` names; for 'host', the widest of ``host_isas``."""
    if isinstance(target, Isa):
        return target
    name = target or "host"
    if name not in TARGETS:
        raise ArgumentError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
    return TARGETS[name] or host_isas()[-1]


def host_isas() -> tuple[Isa, ...]:
    """What 'host' may mean for a fixed-size program, narrowest first: this machine's ISA
    (``isa_for``), and on an AVX-512 machine both AVX2 and AVX-512 unless ``BLACC_ISA``
    names one. The cost model then picks one per program (``strategy.small.worth_wider``):
    small operands fill few of a 512-bit vector's lanes, wide outputs run up to 1.8x as
    fast on them. On a Xeon with AVX-512, LGen's 510 cases ran 1.10x as fast all on
    AVX-512 as all on AVX2 (geomean; 0.82x before AVX-512 had 128-bit leftovers), and
    1.13x with the choice per program. Zen 4 runs 512-bit instructions over 256-bit
    pipes, and the choice models them so (``Machine.vector_datapath``): there AVX-512
    often ties, and a tie goes to it (``strategy.small.wider_gain``), which dispatches
    half the instructions."""
    isa = host_target().isa
    if isa is AVX512 and not requested_isa():
        return (AVX2, AVX512)
    return (isa,)


def _runnable(isa: Isa, what: str) -> Isa:
    """``isa`` if this machine runs its code (``what`` needs to run it), else an error."""
    missing = isa.missing(host_target().machine)
    if missing:
        raise ArgumentError(f"{what} runs the kernel here, and this machine cannot run "
                            f"target {isa.name!r} (it lacks {', '.join(missing)})")
    return isa


@dataclass(frozen=True)
class Candidate:
    """One way a measuring search may compute a program: a target, an index form of the
    program and a schedule per operation of it."""

    isa: Isa
    indexed: ix.Program
    schedule: tuple[OpSchedule, ...]
    module: k.Module = field(compare=False, repr=False)


def plan(program: object, *, name: str = "blac_kernel", target: str | Isa | None = None,
         search: str = "model", measure_with: object = None,
         **operands: Decl) -> Plan:
    """Decide how to compute ``program``: see ``compile``. ``measure_with`` (a callable
    taking a list of ``Candidate``s and returning seconds per call of each) times the
    candidates of the measuring searches; by default they are compiled here and timed in
    a C loop (``runtime.measure``)."""
    _check_request(name, search)
    typed = _typed(program, operands)
    specs = arg_specs(typed)
    candidates = forms(typed)
    if _is_host(target) and len(isas := host_isas()) > 1:
        if search == "model":
            # one plan per ISA by the model, and the one worth its wider vectors; the
            # ISA is chosen on the forms the first of tied forms gives (``_model_plan``)
            memo: dict[str, list] = {}  # each ISA's forms modelled once for both plans
            isa = _host_isa(typed, specs, candidates, isas, name, memo)
            return _split_updates(_model_plan(typed, specs, isa, candidates, name,
                                              memo=memo))
        targets = isas  # timed against each other: the call's cost is in the timings
    else:
        isa = _isa(target)
        if search == "model":
            return _split_updates(_model_plan(typed, specs, isa, candidates, name))
        targets = (_runnable(isa, "search") if measure_with is None else isa,)
    pool = [c for isa in targets for c in _search_pool(candidates, specs, isa, search, name)]
    # kernels for 'host' are built with all of this machine's instructions (compile)
    measure = measure_with or _measurer(specs, _build_isa(target, targets[-1]))
    times = list(measure(pool))
    best = pool[times.index(min(times))]
    return Plan(typed, best.indexed, specs, best.schedule, best.module, best.isa)


def isa_choice_costs(typed: TypedProgram, specs: tuple[ArgSpec, ...],
                     candidates: tuple[ix.Program, ...], isas: tuple[Isa, ...], name: str,
                     memo: dict[str, list] | None = None) -> list[float]:
    """What 'host' compares between ``isas``: each one's model plan with ties left to the
    first form (``_model_plan``), priced as this machine's choice sees it
    (``isa_choice_cost``). ``memo``: as for ``_model_plan``."""
    memo = {} if memo is None else memo
    machine = host_target().machine
    plans = [_model_plan(typed, specs, isa, candidates, name, break_ties=False, memo=memo)
             for isa in isas]
    return [isa_choice_cost(p.module, p.indexed, p.schedule, p.isa, machine) for p in plans]


def _host_isa(typed: TypedProgram, specs: tuple[ArgSpec, ...],
              candidates: tuple[ix.Program, ...], isas: tuple[Isa, ...], name: str,
              memo: dict[str, list]) -> Isa:
    """The ISA of ``isas`` (narrowest first) that 'host' takes for the model's plan:
    ``worth_wider`` of their ``isa_choice_costs``. The widest is modelled first, and
    where the narrowest cannot cost less than its ``fewest_cycles`` and even that is
    slower by the wider one's gain, the narrowest is not modelled: the choice is the
    same. C = A*B 15 x 15 x 15 f64 on AVX-512 is modelled at 245 cycles, and AVX2 can
    do no better than 422, so half the planning went into a plan never taken."""
    gain = wider_gain(host_target().machine)
    widest = isa_choice_costs(typed, specs, candidates, isas[-1:], name, memo)
    if worth_wider([fewest_cycles(candidates, isas[0]), *widest], gain=gain) == 1:
        return isas[-1]
    costs = isa_choice_costs(typed, specs, candidates, isas[:-1], name, memo) + widest
    return isas[worth_wider(costs, gain=gain)]


#: Schedules per operation a measuring search considers (the model's ``keep`` is 8):
#: the model's best few often differ only in register blocks that fully unrolled code
#: does not show, and kernels with the same source are timed once.
SEARCH_OPTIONS = 24
#: Distinct kernels a measuring search times per ISA.
SEARCH_BUDGET = 24


def _search_pool(candidates: tuple[ix.Program, ...], specs: tuple[ArgSpec, ...], isa: Isa,
                 search: str, name: str) -> list[Candidate]:
    """The kernels a measuring search times for ``isa``: schedules of every index form of
    the program (``strategy.small.search_pool``), the best-modelled first for
    'exhaustive' and in a random order for 'random', one per distinct C source, at most
    ``SEARCH_BUDGET``."""
    core = _core(isa)
    ranked = [(cost, form, schedule) for i, form in enumerate(candidates)
              for cost, schedule in search_pool(
                  options(form, specs, isa, keep=SEARCH_OPTIONS, core=core),
                  search, budget=SEARCH_BUDGET, seed=i)]
    if search == "exhaustive":
        ranked.sort(key=lambda c: c[0])
    else:  # every form's draws in one random order: the first form must not fill the pool
        random.Random(0).shuffle(ranked)
    pool: dict[str, Candidate] = {}
    for _, form, schedule in ranked:
        try:
            module = build_module(form, specs, schedule, isa, name,
                                  **_build_flags(core))
        except ScheduleError:  # each operation's schedule builds, but not this combination
            continue
        module = split_short_updates(module, form, schedule, isa, core)
        pool.setdefault(c_backend.render(module, isa), Candidate(isa, form, schedule, module))
        if len(pool) == SEARCH_BUDGET:
            break
    return list(pool.values())


def _build_flags(core: Core) -> dict[str, bool]:
    """``build_module``'s choices that follow this machine: write prefetches ahead of
    interleaved stores (``Machine.prefetches_store_streams``), straight-line rows near
    L1 (``Machine.straight_rows_near_l1``) and splats shared between widths
    (``Core.shared_splats``)."""
    machine = host_target().machine
    return {"write_prefetches": machine.prefetches_store_streams,
            "straight_near_l1": machine.straight_rows_near_l1,
            "shared_splats": core.shared_splats}


def _core(isa: Isa) -> Core:
    """The pipes the cost model gives ``isa`` on this machine (``core_for``)."""
    return core_for(host_target().machine, isa)


def _split_updates(p: Plan) -> Plan:
    """``p`` with its updates in place split where that pays (``split_short_updates``),
    once the ISA is chosen: the choice between ISAs was fitted on kernels without."""
    return replace(p, module=split_short_updates(p.module, p.indexed, p.schedule, p.isa,
                                                 _core(p.isa)))


def _model_plan(typed: TypedProgram, specs: tuple[ArgSpec, ...], isa: Isa,
                candidates: tuple[ix.Program, ...], name: str, break_ties: bool = True,
                memo: dict[str, list] | None = None) -> Plan:
    """The cost model's form and schedules, remembered in the kernel cache: modelling every
    candidate takes up to ~2 s, and a program is usually compiled again and again. A
    remembered choice is checked by building it, and that build is the plan's module.
    ``break_ties``: as for ``cheapest_form``. Between ISAs the plans are compared with
    ties left to the first form: a form a tie goes to reads a temporary back element by
    element, which the model prices lower on AVX-512 than it runs, and the three kernels
    of LGen's cases it moved from AVX2 to AVX-512 on a Xeon (CPU model 167) ran
    0.87-1.02x (micro C = alpha*(A0 + A1)'*B + beta*C 5 x 5 f64 0.87-0.89x, below the
    loops). ``memo``: the forms modelled (``modelled_forms``) by ISA, shared by plans of
    one program."""
    built: dict[Choice, k.Module] = {}
    core = _core(isa)
    memo = {} if memo is None else memo

    def decide() -> Choice:
        if isa.name not in memo:
            memo[isa.name] = modelled_forms(candidates, specs, isa, core)
        indexed, per_op = cheapest_form(candidates, specs, isa, core, break_ties,
                                        memo[isa.name])
        return candidates.index(indexed), choose(indexed, specs, isa, per_op=per_op)

    def fits(choice: Choice) -> bool:
        """Only a choice the model could have made: a form of this program, and for each
        operation one of its candidate schedules, that builds."""
        form, schedule = choice
        if form >= len(candidates) or len(schedule) != len(candidates[form].ops):
            return False
        program = candidates[form]
        if any(s not in schedule_candidates(program, op, isa)
               for op, s in zip(program.ops, schedule, strict=True)):
            return False
        try:
            built[choice] = build_module(program, specs, schedule, isa, name,
                                         **_build_flags(core))
        except ScheduleError:
            return False
        return True

    parts = {"statements": _statement_text(typed), "specs": [asdict(s) for s in specs],
             "target": isa.name, "core": asdict(core), "break_ties": break_ties}
    form, schedule = choice = remembered(parts, decide, fits)
    indexed = candidates[form]
    module = built.get(choice) or build_module(indexed, specs, schedule, isa, name,
                                                **_build_flags(core))
    return Plan(typed, indexed, specs, schedule, module, isa)


def compile(program: object, *, search: str = "model", name: str = "blac_kernel",
            target: str | Isa | None = None, **operands: Decl):
    """Compile a fixed-size program into a kernel callable with NumPy arrays.

    ``program``: source text (``"y = A*x + y"``, statements separated by newlines or
    ';') or ``{"y": A @ x + y}`` built from the declarations with operators. Operands
    are declared by keyword: ``A=blacc.Matrix(5, 9, 'f32')``, ``x=blacc.Vector(9, 'f32')``,
    ``alpha=blacc.Scalar('f32')``. ``search``: 'model' (default: a cost model, nothing
    measured), 'exhaustive' or 'random' (compile candidates, time them, keep the
    fastest). ``target``: 'host' (default: this machine's ISA; on an AVX-512
    machine AVX2 or AVX-512, whichever the model finds faster, see ``host_isas``) or
    another ISA this machine runs ('avx512', 'avx2', 'generic'). The kernel
    takes operands by name; array outputs are written in place (allocated when omitted)
    and scalar outputs returned. A program that is GEMMs (``C = alpha*op(A)*op(B) +
    beta*C``, statements of such, products of several matrices, ``transform.as_gemm``)
    on operands too large for L1 runs the spine's cache-blocked GEMM instead, for the
    target's ISA (for 'host' the widest), whatever ``search`` says
    (``strategy.route``); its other statements (``y = C*x``) run between the GEMMs as
    the small path's kernels, planned by the model."""
    from .runtime.pycall import FixedKernel

    isa = _runnable(_isa(target), "compile")
    _check_request(name, search)
    if (spine := spine_source(program, name, isa, operands)) is not None:
        return FixedKernel.build(spine.source, name, spine.specs, flags=spine.isa.flags,
                                 status=True)
    chosen = plan(program, name=name, target=target, search=search, **operands)
    return FixedKernel.build(chosen.source, name, chosen.specs,
                             flags=_build_isa(target, chosen.isa).flags,
                             status=chosen.module.function(chosen.module.entry).status)


@dataclass(frozen=True)
class SpineSource:
    """A program of large GEMMs as the spine computes it: C source defining ``int
    name(...)`` (0, or 1 where memory could not be allocated), parameters in ``specs``
    order."""

    typed: TypedProgram
    specs: tuple[ArgSpec, ...]
    source: str
    isa: Isa


def spine_source(program: object, name: str, isa: Isa,
                 operands: Mapping[str, Decl]) -> SpineSource | None:
    """``program`` computed by the spine's GEMM in ``isa``'s instructions, blocked for
    this machine's caches, where its GEMMs are on operands large enough
    (``transform.as_gemm``, ``strategy.route``), else None: the small path computes
    it. Its statements that are not GEMMs are computed between them by kernels of the
    small path's, planned by the model for ``isa``."""
    from .runtime.gemm_program import gemm_program_source

    typed = _typed(program, operands)
    gemms = gemm_program(typed, others=True)
    target = Target(host_target().machine, isa)
    if gemms is None or not program_to_spine(gemms, typed, target.machine,
                                             vectors=isa is not GENERIC):
        return None
    parts = []  # the statements between GEMMs, each run a kernel of the small path's
    for i, step in enumerate(s for s in gemms.steps if isinstance(s, Others)):
        sub = part(typed, step.statements)
        sub_specs = arg_specs(sub)
        chosen = _split_updates(_model_plan(sub, sub_specs, isa, forms(sub),
                                            f"blacc_part_{i}"))
        parts.append((chosen.module, sub_specs))
    specs = arg_specs(typed)
    return SpineSource(typed, specs, gemm_program_source(gemms, specs, name, target, parts),
                       isa)


def _build_isa(target: str | Isa | None, isa: Isa) -> Isa:
    """The instructions a kernel planned for ``isa`` is compiled with: for 'host', all of
    this machine's (an AVX2 plan on an AVX-512 machine may use AVX-512VL's broadcasts
    from memory and two-source permutes: a 2 x 2 product ran 0.76 ns against 0.87),
    else ``isa``'s, what the target asks for."""
    return host_isas()[-1] if _is_host(target) else isa


def _measurer(specs: tuple[ArgSpec, ...], build_isa: Isa):
    """Time candidates on this machine: compile them (with ``build_isa``'s flags), one
    translation unit per ISA planned for, and call them in C loops."""

    def measure(pool: list[Candidate]) -> list[float]:
        named = [_renamed(c.module, f"blacc_candidate_{i}") for i, c in enumerate(pool)]
        units = {isa: c_backend.render_modules([m for m, c in zip(named, pool, strict=True)
                                                if c.isa is isa], isa)
                 for isa in dict.fromkeys(c.isa for c in pool)}
        # a candidate returns a status where it allocates a temporary (build_module)
        status = {m.entry: m.function(m.entry).status for m in named}
        return time_kernels([(units[c.isa], m.entry, build_isa)
                             for m, c in zip(named, pool, strict=True)], specs,
                            status=status)

    return measure


def _renamed(module: k.Module, name: str) -> k.Module:
    """A one-function module (what ``build_module`` makes) with its function renamed."""
    (entry,) = module.functions
    return k.Module((replace(entry, name=name),), entry=name)


def emit(program: object, output: str | Path, *, name: str | None = None,
         target: str = "host", search: str = "model", **operands: Decl) -> tuple[Path, Path]:
    """Write ``output.c`` and ``output.h``: one C function computing ``program`` with no
    dependency on blacc. Returns the two paths. ``target``: 'host' (this machine's
    intrinsics, ``host_isas``), 'avx512', 'avx2', or 'generic' (plain C99 for any
    compiler). A ``search`` other than 'model' times candidates here, so needs a target
    this machine runs. As in ``compile``, a program that is GEMMs on operands too large
    for L1 is computed by the spine's GEMM, blocked for this machine's caches (whatever
    ``search`` says), its other statements between the GEMMs by the small path's code;
    that function allocates its scratch and packing buffers first and returns 0, or 1
    where an allocation failed (then nothing is written)."""
    out = Path(output)
    fname = name or re.sub(r"\W", "_", out.stem)
    _check_request(fname, search)
    spine = spine_source(program, fname, _isa(target), operands)
    if spine is not None:  # declared with the operands' names (defined with p0, p1...)
        from .runtime.gemm_program import c_params

        params = c_params(spine.specs, [s.name for s in spine.specs])
        return _write(out, _header(fname, spine.typed, spine.specs, spine.isa,
                                   f"int {fname}({params})", True), spine.source)
    return write_standalone(plan(program, name=fname, target=target, search=search,
                                 **operands), out)


def write_standalone(p: Plan, output: str | Path) -> tuple[Path, Path]:
    """Write plan ``p``'s kernel as ``output.c`` and ``output.h`` (``standalone_c``), the
    source including the header; returns the two paths."""
    return _write(Path(output), *standalone_c(p))


def _write(out: Path, header: str, source: str) -> tuple[Path, Path]:
    c_path, h_path = out.with_suffix(".c"), out.with_suffix(".h")
    h_path.write_text(header, encoding="utf-8")
    c_path.write_text(f'#include "{h_path.name}"\n' + source, encoding="utf-8")
    return c_path, h_path


def _param_doc(s: ArgSpec) -> str:
    role = {"in": "input", "out": "output", "inout": "input and output"}[s.role]
    if s.kind == "scalar":
        how = "by value" if s.role == "in" else "by pointer to one element"
        return f"{s.name}: scalar, {role}, {how}"
    if (s.cols == 1 or s.rows == 1) and s.leading_dimension == 1:
        return f"{s.name}: vector of {s.rows * s.cols} contiguous elements, {role}"
    order = "row-major" if s.layout == "row" else "column-major"
    return (f"{s.name}: {s.rows}x{s.cols} matrix, {role}, {order}, "
            f"leading dimension {s.leading_dimension}")


def standalone_c(p: Plan) -> tuple[str, str]:
    """(header, source) of the standalone kernel."""
    entry = p.module.function(p.module.entry)
    header = _header(entry.name, p.typed, p.specs, p.isa, c_backend.signature(entry),
                     entry.status)
    return header, c_backend.render(p.module, p.isa)


def _header(name: str, typed: TypedProgram, specs: tuple[ArgSpec, ...], isa: Isa,
            signature: str, status: bool) -> str:
    """The header declaring a standalone kernel, ``signature``, and saying what it needs
    and what its parameters are."""
    guard = f"{name.upper()}_H"
    doc = "\n".join(f" *   {_param_doc(s)}" for s in specs)
    isa_note = ("plain C99" if not isa.header else
                f"needs <{isa.header}> and {' '.join(isa.flags)}")
    # a kernel that allocates nothing cannot fail and returns nothing
    returns = (" * Returns 0, or 1 where a scratch allocation failed (then before anything\n"
               " * was written).\n" if status else "")
    return (f"/* Generated by blacc: {' ; '.join(_statement_text(typed))}\n"
            f" * element type {typed.dtype}; {isa_note}.\n"
            f" * Parameters (pointers must not overlap unless noted):\n{doc}\n"
            f"{returns} */\n"
            f"#ifndef {guard}\n#define {guard}\n\n#include <stdint.h>\n\n"
            f"{signature};\n\n#endif\n")


def _statement_text(typed: TypedProgram) -> list[str]:
    from .frontend.typed import format_texpr

    return [f"{s.target} = {format_texpr(s.expr)}" for s in typed.statements]
