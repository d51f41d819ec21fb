"""Index forms of one program: fully fused, with a product operand that combines several
arrays element-wise (``(A0 + A1)'*B``) computed once into a temporary, with the scalars
of a product moved onto its right operand scaled once (``alpha*A*x`` -> ``A*t0``,
``t0 = alpha*x``) and added sums merged, or both (``index_notation.forms``), and the cost
model's choice between them.

* which programs have which forms, and what their temporaries are (the combination in
  its own orientation, scalings and transposes left in the product; the scaled right
  operand; one merged sum);
* every form, under the planned schedule of each operation and under every candidate
  schedule of the temporary's operation, against the float64 reference in the
  interpreter (temporaries are NaN-filled there: a read before the write would show);
* every form compiled (``-Wall -Wextra -Werror``) and called on operands against guard
  pages with sentinel padding;
* the planner takes the form with the lower modelled cost;
* a temporary whose elements are splatted often is read back from memory (a barrier).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import blacc
from blacc.blacs import _typed, plan
from blacc.errors import ScheduleError
from blacc.ir import indexed as ix
from blacc.ir import kernel as kir
from blacc.ir.walk import nodes_of
from blacc.strategy.small import cheapest_form, choose, options
from blacc.target.isa import AVX2, GENERIC
from blacc.transform.blac import build_module, candidates
from blacc.transform.index_notation import arg_specs, forms
from guard import run_isolated
from test_blac_leftovers import _call, _padding_untouched
from test_blac_pairs import _c_function, needs_native
from test_blac_programs import assert_matches, make_values, run_interp, seed_of

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar

# name -> (source, declarations from (m, n, k) and the dtype)
PROGRAMS = {
    "gemam": ("C = alpha*(A0 + A1)'*B + beta*C",
              lambda m, n, k, dt: dict(alpha=S(dt), A0=M(k, m, dt), A1=M(k, m, dt),
                                       B=M(k, n, dt), beta=S(dt), C=M(m, n, dt))),
    "both_sides": ("C = (A - 2*A1)*(B0 + B1)' + C",
                   lambda m, n, k, dt: dict(A=M(m, k, dt), A1=M(m, k, dt), B0=M(n, k, dt),
                                            B1=M(n, k, dt), C=M(m, n, dt))),
    "negated": ("C = -(A0 + beta*A1)'*B'",
                lambda m, n, k, dt: dict(beta=S(dt), A0=M(k, m, dt), A1=M(k, m, dt),
                                         B=M(n, k, dt), C=M(m, n, dt))),
    "in_a_chain": ("D = (A0 + A1)*B*E",
                   lambda m, n, k, dt: dict(A0=M(m, k, dt), A1=M(m, k, dt), B=M(k, n, dt),
                                            E=M(n, 3, dt), D=M(m, 3, dt))),
    "gesummv": ("y = alpha*A*x + beta*B*x",
                lambda m, n, k, dt: dict(alpha=S(dt), A=M(m, k, dt), x=V(k, dt), beta=S(dt),
                                         B=M(m, k, dt), y=V(m, dt))),
    "scaled_twice": ("C = (2*(alpha*A))*(beta*B') - C",
                     lambda m, n, k, dt: dict(alpha=S(dt), A=M(m, k, dt), beta=S(dt),
                                              B=M(n, k, dt), C=M(m, n, dt))),
}

COMBINING = ("gemam", "both_sides", "negated", "in_a_chain")  # have a combine-once form
SHAPES = [(1, 1, 1), (1, 5, 3), (4, 4, 4), (5, 3, 1), (7, 9, 2), (6, 17, 4)]
COMPILED_SHAPES = [(4, 4, 4), (7, 9, 2), (13, 6, 5)]


def _forms(name: str, m: int, n: int, k: int, dtype: str):
    source, decls_of = PROGRAMS[name]
    decls = decls_of(m, n, k, dtype)
    typed = _typed(source, decls)
    return decls, typed, arg_specs(typed), forms(typed)


def _temporaries(program: ix.Program) -> list[ix.Operand]:
    return [o for o in program.operands if o.temporary]


# ----------------------------------------------------------------------------- the forms


def test_the_combination_is_computed_in_its_own_orientation():
    _, _, _, (fused, once, *_) = _forms("gemam", 6, 5, 3, "f64")
    assert not _temporaries(fused)
    (t,) = _temporaries(once)
    assert (t.rows, t.cols) == (3, 6), "A0 + A1 is 3 x 6; its transpose is read"
    make, use = once.ops
    assert make.out == t.name
    assert {r.operand for r in ix.reads(make.body)} == {"A0", "A1"}, \
        "alpha stays in the product: the temporary holds A0 + A1 only"
    (read,) = [r for r in ix.reads(use.body) if r.operand == t.name]
    assert read.index[1] == "i", "the product reads the temporary transposed"


@pytest.mark.parametrize(("source", "decls", "count"), [
    ("C = A*B", dict(A=M(4, 3), B=M(3, 5), C=M(4, 5)), 1),
    ("y = (A0 + A1)*x", dict(A0=M(4, 3), A1=M(4, 3), x=V(3), y=V(4)), 1),  # met once
    ("C = (A + A)*B", dict(A=M(4, 3), B=M(3, 5), C=M(4, 5)), 1),  # one array
    ("C = (A0 + A1)*B", dict(A0=M(4, 3), A1=M(4, 3), B=M(3, 5), C=M(4, 5)), 2),
    ("C = A*(B0 - B1)", dict(A=M(4, 3), B0=M(3, 5), B1=M(3, 5), C=M(4, 5)), 2),
    ("C = x*(y0 + y1)'", dict(x=V(4), y0=V(5), y1=V(5), C=M(4, 5)), 2),
])
def test_which_programs_have_a_second_form(source, decls, count):
    assert len(forms(_typed(source, decls))) == count


def test_gesummv_scales_x_once_and_sums_in_one_chain():
    _, _, _, (fused, scaled, _) = _forms("gesummv", 16, 1, 4, "f32")
    assert not _temporaries(fused)
    t0, t1 = _temporaries(scaled)
    assert (t0.rows, t0.cols) == (t1.rows, t1.cols) == (4, 1)
    make0, make1, use = scaled.ops
    assert [make0.out, make1.out] == [t0.name, t1.name]
    assert {r.operand for r in ix.reads(make0.body)} == {"alpha", "x"}
    assert {r.operand for r in ix.reads(make1.body)} == {"beta", "x"}
    assert isinstance(use.body, ix.Sum), "the two products' sums are merged into one"
    assert {r.operand for r in ix.reads(use.body)} == {"A", "B", t0.name, t1.name}


def test_gesummv_scales_x_in_place_in_a_form_of_its_own():
    """The last form of alpha*A*x + beta*B*x moves both scalars onto x inside the sums,
    with no temporary (``scalars_inside``); it comes after the others, which a tie goes
    to."""
    _, _, _, all_forms = _forms("gesummv", 16, 1, 4, "f32")
    inside = all_forms[-1]
    assert not _temporaries(inside) and inside not in all_forms[:-1]
    body = inside.ops[0].body
    assert isinstance(body, ix.Add)
    first, second = body.a, body.b
    for total, matrix, scalar in ((first, "A", "alpha"), (second, "B", "beta")):
        assert isinstance(total, ix.Sum)
        term = total.body
        assert term.a == ix.Read(matrix, ("i", total.index))
        assert term.b == ix.Mul(ix.Read(scalar, (0, 0)), ix.Read("x", (total.index, 0)))


@pytest.mark.parametrize(("source", "decls", "inside"), [
    ("y = alpha*A*x + beta*B*x", dict(alpha=S(), beta=S(), A=M(5, 3), B=M(5, 3), x=V(3),
                                      y=V(5)), True),
    ("y = alpha*A*x - beta*(B*x)", dict(alpha=S(), beta=S(), A=M(5, 3), B=M(5, 3),
                                        x=V(3), y=V(5)), True),
    ("y = alpha*A*x + beta*B*x", dict(alpha=S(), beta=S(), A=M(5, 5), B=M(5, 5), x=V(5),
                                      y=V(5)), True),
    # x longer than y: scaled in every step of the sums, it costs more than it saves
    ("y = alpha*A*x + beta*B*x", dict(alpha=S(), beta=S(), A=M(5, 6), B=M(5, 6), x=V(6),
                                      y=V(5)), False),
    ("y = alpha*(A*x + B*x)", dict(alpha=S(), A=M(5, 3), B=M(5, 3), x=V(3), y=V(5)), False),
    ("y = alpha*A*x + beta*y", dict(alpha=S(), beta=S(), A=M(5, 3), x=V(3), y=V(5)), False),
    ("C = alpha*A*B + beta*C", dict(alpha=S(), beta=S(), A=M(5, 3), B=M(3, 4),
                                    C=M(5, 4)), False),
    ("y = A*x + B*x", dict(A=M(5, 3), B=M(5, 3), x=V(3), y=V(5)), False),
])
def test_which_programs_scale_in_place(source, decls, inside):
    """Only a sum of two or more scaled products gets the form (one saves too little to
    model another form), and only where the operand scaled is no larger than the
    result."""
    from blacc.transform.index_notation import scalars_inside, to_indexed

    typed = _typed(source, decls)
    assert (scalars_inside(to_indexed(typed)) is not None) == inside
    assert (scalars_inside(to_indexed(typed)) in forms(typed)) == inside


@pytest.mark.parametrize(("source", "decls", "scaled"), [
    ("y = alpha*A*x", dict(alpha=S(), A=M(8, 4), x=V(4), y=V(8)), True),
    ("C = alpha*A*B", dict(alpha=S(), A=M(8, 4), B=M(4, 4), C=M(8, 4)), True),
    ("C = A*(alpha*B)", dict(alpha=S(), A=M(8, 4), B=M(4, 4), C=M(8, 4)), True),
    ("C = A*B", dict(A=M(8, 4), B=M(4, 4), C=M(8, 4)), False),  # no scalar
    # the right operand is as large as the result: scaling the result is no dearer
    ("C = alpha*A*B", dict(alpha=S(), A=M(4, 4), B=M(4, 9), C=M(4, 9)), False),
    # the right operand combines arrays: left to the combined form
    ("C = alpha*A*(B0 + B1)", dict(alpha=S(), A=M(8, 4), B0=M(4, 4), B1=M(4, 4),
                                   C=M(8, 4)), False),
    # x is met once (one row of result)
    ("z = alpha*x'*A", dict(alpha=S(), x=V(4), A=M(4, 4), z=M(1, 4)), False),
])
def test_which_products_move_their_scalars(source, decls, scaled):
    def scaled_temporaries(program):
        return [o for o in _temporaries(program)
                if any(r.operand == "alpha" for op in program.ops if op.out == o.name
                       for r in ix.reads(op.body))]

    assert any(scaled_temporaries(f) for f in forms(_typed(source, decls))) == scaled


def test_merge_sums():
    from blacc.transform.index_notation import merge_sums

    def dot(a: str, k: str, extent: int = 4) -> ix.Sum:
        return ix.Sum(k, extent, ix.Mul(ix.Read(a, ("i", k)), ix.Read("x", (k, 0))))

    merged = merge_sums(ix.Add(dot("A", "k1"), ix.Add(dot("B", "k2"), dot("C", "k3"))))
    assert isinstance(merged, ix.Sum) and merged.extent == 4
    assert all(merged.index in r.index for r in ix.reads(merged))
    assert {r.operand for r in ix.reads(merged)} == {"A", "B", "C", "x"}
    kept = ix.Add(dot("A", "k1"), dot("B", "k2", 5))  # different extents
    assert merge_sums(kept) == kept
    scaled = ix.Add(ix.Mul(ix.Read("alpha", (0, 0)), dot("A", "k1")), dot("B", "k2"))
    assert merge_sums(scaled) == scaled  # a scalar outside a sum stays outside


# ----------------------------------------------------------------------------- every form


def _schedules(program: ix.Program, specs, isa):
    """The planned schedule of ``program``, then every candidate of each temporary's
    operation with the other operations at their planned schedules."""
    planned = choose(program, specs, isa)
    yield planned
    temps = {t.name for t in _temporaries(program)}
    for i, op in enumerate(program.ops):
        if op.out in temps:
            for sched in candidates(program, op, isa):
                yield (*planned[:i], sched, *planned[i + 1:])


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_form_interpreted(name, dtype):
    for m, n, k in SHAPES:
        decls, typed, specs, all_forms = _forms(name, m, n, k, dtype)
        if m > 1 and n > 1 and name in COMBINING:
            assert len(all_forms) >= 2
        values = make_values(decls, dtype, np.random.default_rng(seed_of(name, m, n, k)))
        for form in all_forms:
            for schedule in _schedules(form, specs, AVX2):
                try:
                    module = build_module(form, specs, schedule, AVX2, "f")
                except ScheduleError:
                    continue
                got = run_interp(module, specs, typed, values)
                assert_matches(typed, values, got, f"{name} {m}x{n}x{k} {dtype} {schedule}")


@needs_native
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_form_compiled_against_guard_pages(tmp_path, name, dtype):
    cases = []
    for m, n, k in COMPILED_SHAPES:
        decls, typed, specs, all_forms = _forms(name, m, n, k, dtype)
        operands = SimpleNamespace(typed=typed, specs=specs)
        values = make_values(decls, dtype, np.random.default_rng(seed_of(name, m, n, k)))
        for form in all_forms:
            module = build_module(form, specs, choose(form, specs, AVX2), AVX2, "f")
            cases.append((f"{name} {m}x{n}x{k} {dtype}", _c_function(tmp_path, module),
                          operands, values))

    def body() -> None:
        for where, fn, p, values in cases:
            for side in ("after", "before"):
                got, arrays = _call(fn, p, values, side)
                assert_matches(p.typed, values, got, f"{where} {side}")
                for a in arrays.values():
                    assert _padding_untouched(a), where

    run_isolated(body)


# ----------------------------------------------------------------------------- the choice


def _cost(program: ix.Program, specs) -> float:
    return sum(opts[0][0] for opts in options(program, specs, AVX2))


@pytest.mark.parametrize(("name", "shape"), [("gemam", (48, 4, 4)), ("gemam", (4, 4, 100)),
                                             ("gemam", (2, 2, 2)), ("both_sides", (9, 9, 9)),
                                             ("gesummv", (16, 1, 4)), ("gesummv", (4, 1, 16))])
def test_planner_takes_the_cheaper_form(name, shape):
    decls, _, specs, all_forms = _forms(name, *shape, "f32")
    chosen, per_op = cheapest_form(all_forms, specs, AVX2)
    assert chosen in all_forms
    assert _cost(chosen, specs) == min(_cost(f, specs) for f in all_forms)
    assert per_op == options(chosen, specs, AVX2)
    assert plan(PROGRAMS[name][0], target="avx2", **decls).indexed == chosen


def test_tied_forms_go_to_the_one_cheaper_whole(monkeypatch, tmp_path):
    """C = alpha*(A0 + A1)'*B + beta*C 4 x 4 x 16 f32 on AVX-512, priced as on Intel's
    cores: the fused form and the form with the sum in a temporary cost the same as sums
    of their operations, and the temporary's form less as a whole kernel (its broadcasts
    are loads; the fused form's sums and broadcasts share two pipes with the FMAs). The
    tie goes to it, or with ``break_ties`` False to the first form, the fused one. A plan
    for 'host' compares its ISAs with ties left to the first form, then breaks the tie in
    the ISA it takes."""
    from blacc import blacs
    from blacc.runtime import gemm as gemm_runtime
    from blacc.runtime import plan_cache
    from blacc.runtime.cache import KernelCache
    from blacc.strategy import small
    from blacc.target.isa import AVX512
    from blacc.target.machine import Machine

    xeon = Machine("xeon", "x86_64", cores=2, vendor="GenuineIntel", family=6,
                   features=frozenset(("avx2", "fma", "avx512f", "avx512dq", "avx512vl")))
    core = small.core_for(xeon, AVX512)
    decls, _, specs, all_forms = _forms("gemam", 4, 16, 4, "f32")
    first, first_ops = cheapest_form(all_forms, specs, AVX512, core, break_ties=False)
    broken, broken_ops = cheapest_form(all_forms, specs, AVX512, core)
    assert len(first.ops) == 1 and len(broken.ops) == 2
    assert (sum(o[0][0] for o in first_ops) == sum(o[0][0] for o in broken_ops))

    def whole(form, per_op):
        schedule = choose(form, specs, AVX512, per_op=per_op)
        module = build_module(form, specs, schedule, AVX512, "k")
        return small.program_cost(module, form, schedule, AVX512, core=core)

    assert whole(broken, broken_ops) < whole(first, first_ops)

    monkeypatch.setattr(blacs, "host_target", lambda: gemm_runtime.Target(xeon, AVX512))
    monkeypatch.setattr(blacs, "core_for", small.core_for)  # not the suite's constants
    monkeypatch.setattr(blacs, "wider_gain", small.wider_gain)
    cache = KernelCache(tmp_path)  # nothing remembered: every plan models its forms
    monkeypatch.setattr(plan_cache, "default_cache", lambda: cache)
    ties = []
    real = blacs.cheapest_form
    monkeypatch.setattr(blacs, "cheapest_form",
                        lambda *a: ties.append((a[2].name, a[4])) or real(*a))
    p = blacs.plan(PROGRAMS["gemam"][0], target="host", **decls)
    assert ties[:2] == [("avx512", False), ("avx2", False)]  # the widest first (_host_isa)
    assert ties[2:] == [(p.isa.name, True)]
    assert p.indexed == broken and p.isa is AVX512


def test_gemam_panel_computes_the_sum_once():
    """C = alpha*(A0 + A1)'*B + beta*C with (A0 + A1)' 48 x 4: the sum is vector adds of
    A0 and A1 (computed once into a temporary, or fused into tiles down the columns of
    C, where A0 and A1 are vectors), not two broadcasts and an add per row and k, as
    fused rows of C would take."""
    decls, _, _, _ = _forms("gemam", 48, 4, 4, "f32")
    p = plan(PROGRAMS["gemam"][0], target="avx2", **decls)
    adds = [e for e in nodes_of(p.module, kir.Bin) if e.op == "+" and e.lanes == 8
            and {x.buf for x in (e.a, e.b) if isinstance(x, kir.Load)} == {"A0", "A1"}]
    assert adds, p.schedule
    assert not [e for e in nodes_of(p.module, kir.Broadcast) if isinstance(e.value, kir.Load)
                and e.value.buf in ("A0", "A1")]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_temporaries_avoid_declared_names(dtype):
    """Operands called t0 and t1: the temporaries (a combination, a product) take
    other names."""
    source = "C = (t0 + A1)'*B; D = t1'*B*B'*B"
    decls = dict(t0=M(3, 5, dtype), A1=M(3, 5, dtype), B=M(3, 4, dtype), C=M(5, 4, dtype),
                 t1=M(3, 5, dtype), D=M(5, 4, dtype))
    typed = _typed(source, decls)
    specs = arg_specs(typed)
    values = make_values(decls, dtype, np.random.default_rng(5))
    for form in forms(typed):
        names = [o.name for o in form.operands]
        assert len(names) == len(set(names)), names
        assert len(_temporaries(form)) >= 1
        module = build_module(form, specs, choose(form, specs, AVX2), AVX2, "f")
        assert_matches(typed, values, run_interp(module, specs, typed, values), str(names))


@needs_native
def test_measuring_search_for_another_target_times_the_planned_form(tmp_path):
    """emit(target='generic', search='exhaustive') on a machine with AVX2: the two
    targets' models prefer different forms (one operation or two); the candidates timed
    must be schedules of the form planned for the target."""
    decls = dict(alpha=S(), A0=M(4, 16), A1=M(4, 16), B=M(4, 4), beta=S(), C=M(16, 4))
    source = PROGRAMS["gemam"][0]
    typed = _typed(source, decls)
    specs = arg_specs(typed)
    generic, _ = cheapest_form(forms(typed), specs, GENERIC)
    assert len(generic.ops) != len(cheapest_form(forms(typed), specs, AVX2)[0].ops)
    c_path, _ = blacc.emit(source, output=tmp_path / "g", target="generic",
                           search="exhaustive", **decls)
    assert "immintrin" not in c_path.read_text()



def _barrier_after_temporary(source: str, isa, reads: str | None = None, **decls) -> bool:
    """Whether the kernel of the model's best form with a temporary, the output of a first
    operation that reads ``reads`` (None: any; the fused forms and the others are left
    out, as the model may prefer them), has a compiler barrier between the stores into
    the temporary and the reads of it."""
    typed = _typed(source, decls)
    specs = arg_specs(typed)
    indexed, per_op = cheapest_form(
        [f for f in forms(typed) if len(f.ops) > 1
         and (reads is None or reads in {r.operand for r in nodes_of(f.ops[0].body, ix.Read)})],
        specs, isa)
    module = build_module(indexed, specs, choose(indexed, specs, isa, per_op=per_op), isa,
                          "k")
    temp = indexed.ops[0].out
    assert indexed.operand(temp).temporary
    body = module.function(module.entry).body
    barriers = [i for i, s in enumerate(body) if isinstance(s, kir.Barrier)]
    if not barriers:
        return False
    cut = barriers[0]
    return (all(st.buf != temp for st in nodes_of(body[cut:], kir.Store))
            and all(ld.buf != temp for ld in nodes_of(body[:cut], kir.Load))
            and any(ld.buf == temp for ld in nodes_of(body[cut:], kir.Load)))


def test_a_temporary_splatted_often_is_read_back_from_memory():
    """alpha*B (4 x 4) in a temporary whose 16 elements are splatted: a barrier after it,
    so that gcc loads the splats instead of building them from registers with shuffles;
    a 2 x 2 temporary's 4 splats are left to gcc."""
    gemam = dict(A0=M(4, 32, "f32"), A1=M(4, 32, "f32"), B=M(4, 4, "f32"), C=M(32, 4, "f32"),
                 alpha=S("f32"), beta=S("f32"))
    assert _barrier_after_temporary("C = alpha*(A0 + A1)'*B + beta*C", AVX2, "B", **gemam)
    tiny = dict(A0=M(2, 2, "f64"), A1=M(2, 2, "f64"), B=M(2, 2, "f64"), C=M(2, 2, "f64"),
                alpha=S("f64"), beta=S("f64"))
    assert not _barrier_after_temporary("C = alpha*(A0 + A1)'*B + beta*C", AVX2, **tiny)
