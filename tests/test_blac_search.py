"""The measuring schedule searches of blacc.compile: search='exhaustive' and 'random'
compile candidate kernels, time them in a C loop and keep the fastest (``blacs.plan``
with ``strategy.small.search_pool``).

One tiny program goes through the real thing (a few C compilations); the selection logic
is checked through ``plan(..., measure_with=...)`` with a fake clock, the C timing loop
(``runtime.measure``) in test_measure.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc import blacs
from blacc.backend import c as c_backend
from blacc.blacs import SEARCH_BUDGET, plan
from blacc.errors import ScheduleError
from blacc.strategy.small import choose, options, search_pool
from blacc.target.isa import AVX2, AVX512
from test_blac_programs import assert_matches, make_values

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar


@pytest.mark.parametrize("search", ["exhaustive", "random"])
def test_measuring_search_compiles_a_correct_kernel(search):
    """y = A*x + y, 3x5 f64: the top candidates render to three distinct kernels."""
    decls = dict(A=M(3, 5), x=V(5), y=V(3))
    kernel = blacc.compile("y = A*x + y", search=search, name=f"tuned_{search}", **decls)
    values = make_values(decls, "f64", np.random.default_rng(0))
    y = values["y"].copy()
    out = kernel(A=values["A"], x=values["x"], y=y)
    assert out is y
    p = plan("y = A*x + y", **decls)
    assert_matches(p.typed, values, {"y": out}, search)


def fake_clock(preferred_block):
    """A measure() preferring ``preferred_block``, recording every candidate it is given."""
    seen = []

    def cost(candidate):
        return sum(0.0 if s.block == preferred_block else 1.0 + s.block[0] / 100
                   for s in candidate.schedule)

    def measure(pool):
        seen.extend(pool)
        return [cost(c) for c in pool]

    return measure, seen, cost


def test_exhaustive_keeps_the_fastest_measured():
    decls = dict(A=M(6, 6), B=M(6, 6), C=M(6, 6))
    measure, seen, cost = fake_clock((2, 2))
    p = plan("C = A*B", search="exhaustive", measure_with=measure, target="avx2", **decls)
    assert 1 <= len(seen) <= SEARCH_BUDGET
    best = min(seen, key=cost)
    assert (best.schedule, best.isa) == (p.schedule, p.isa)
    assert p.schedule[0].block == (2, 2)
    # the measured pool is the best-modelled candidates, one per distinct kernel
    sources = [c_backend.render(c.module, c.isa) for c in seen]
    assert len(set(sources)) == len(sources), "a kernel was timed twice"
    modelled = [s for _, s in options(p.indexed, p.specs, p.isa)[0]]
    assert seen[0].schedule == (modelled[0],)


def test_host_search_times_both_isas_against_each_other(monkeypatch):
    """On an AVX-512 machine 'host' means AVX2 or AVX-512: a measuring search times the
    candidates of both in one pool, so the call's cost is in the comparison."""
    monkeypatch.setattr(blacs, "host_isas", lambda: (AVX2, AVX512))
    decls = dict(A=M(12, 4, "f32"), x=V(4, "f32"), y=V(12, "f32"))
    seen = []

    def measure(pool):
        seen.extend(pool)
        return [0.0 if c.isa is AVX512 and c is pool[-1] else 1.0 for c in pool]

    p = plan("y = A*x", search="exhaustive", measure_with=measure, **decls)
    assert {c.isa for c in seen} == {AVX2, AVX512}
    assert p.isa is AVX512 and p.schedule == seen[-1].schedule
    assert all(len([c for c in seen if c.isa is isa]) <= SEARCH_BUDGET for isa in (AVX2, AVX512))


def test_random_samples_within_the_budget_reproducibly():
    """Two operations: 8 x 8 combinations, more than the budget that random draws."""
    decls = dict(A=M(4, 4), B=M(4, 4), C=M(4, 4), x=V(4), y=V(4))
    source = "C = A*B; y = C*x"
    runs = []
    for _ in range(2):
        measure, seen, cost = fake_clock((1, 2))
        p = plan(source, search="random", measure_with=measure, target="avx2", **decls)
        runs.append((p.schedule, [c.schedule for c in seen]))
        assert 1 < len(seen) <= SEARCH_BUDGET
        assert p.schedule == min(seen, key=cost).schedule
    assert runs[0] == runs[1], "random search with its fixed seed must be reproducible"


def test_random_search_draws_from_every_index_form():
    """y = alpha*A*x + beta*B*x, 16 x 4 f32, has three index forms, each with more
    distinct kernels than the budget: the random pool holds kernels of all of them."""
    decls = dict(A=M(16, 4, "f32"), B=M(16, 4, "f32"), x=V(4, "f32"), y=V(16, "f32"),
                 alpha=S("f32"), beta=S("f32"))
    measure, seen, _ = fake_clock((1, 2))
    plan("y = alpha*A*x + beta*B*x", search="random", measure_with=measure, target="avx2",
         **decls)
    assert len({c.indexed for c in seen}) == 3, "the random pool left out an index form"


def test_search_pool_is_for_the_measuring_searches():
    p = plan("y = A*x", A=M(3, 3), x=V(3), y=V(3))
    per_op = options(p.indexed, p.specs, p.isa)
    with pytest.raises(ScheduleError, match="measuring search"):
        search_pool(per_op, "model")
    pool = search_pool(per_op, "exhaustive", budget=3)
    assert [c for c, _ in pool] == sorted(c for c, _ in pool) and len(pool) == 3
    assert pool[0][1] == choose(p.indexed, p.specs, p.isa)


def test_unknown_search_is_refused_before_anything_is_modelled():
    with pytest.raises(ScheduleError, match="search must be one of"):
        plan("y = A*x", search="fastest", A=M(3, 3), x=V(3), y=V(3))


def test_emit_with_a_measuring_search(tmp_path):
    c_path, h_path = blacc.emit("y = A*x + y", tmp_path / "tuned", target="host",
                                search="exhaustive", A=M(3, 5), x=V(5), y=V(3))
    assert c_path.exists() and h_path.exists()
