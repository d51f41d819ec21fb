"""The measuring schedule searches of blacc.compile: search='exhaustive' and 'random'
compile candidate kernels, time them and keep the fastest (strategy.small.choose).

One tiny program goes through the real thing (a few C compilations); the selection logic
is checked through ``plan(..., measure_with=...)`` with a fake clock.
"""

from __future__ import annotations

import numpy as np
import pytest

import blacc
from blacc.blacs import plan
from blacc.errors import ScheduleError
from blacc.strategy.small import choose, options
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
    """A measure() preferring ``preferred_block``, recording every schedule it is given."""
    seen = []

    def cost(schedule):
        return sum(0.0 if s.block == preferred_block else 1.0 + s.block[0] / 100
                   for s in schedule)

    def measure(schedule):
        seen.append(schedule)
        return cost(schedule)

    return measure, seen, cost


def test_exhaustive_keeps_the_fastest_measured():
    decls = dict(A=M(6, 6), B=M(6, 6), C=M(6, 6))
    measure, seen, cost = fake_clock((2, 2))
    p = plan("C = A*B", search="exhaustive", measure_with=measure, target="avx2", **decls)
    assert 1 <= len(seen) <= 24
    assert len(set(seen)) == len(seen), "a candidate was timed twice"
    assert min(seen, key=cost) == p.schedule
    assert p.schedule[0].block == (2, 2)
    # the measured pool is the best-modelled candidates
    modelled = [s for _, s in options(p.indexed, p.specs, p.isa)[0][:8]]
    assert [s[0] for s in seen] == modelled[:len(seen)]


def test_random_samples_within_the_budget_reproducibly():
    """Two operations: 8 x 8 combinations, more than the budget of 24 that random draws."""
    decls = dict(A=M(4, 4), B=M(4, 4), C=M(4, 4), x=V(4), y=V(4))
    source = "C = A*B; y = C*x"
    runs = []
    for _ in range(2):
        measure, seen, cost = fake_clock((1, 2))
        p = plan(source, search="random", measure_with=measure, **decls)
        runs.append((p.schedule, seen))
        assert len(seen) == 24
        assert p.schedule == min(seen, key=cost)
    assert runs[0] == runs[1], "random search with its fixed seed must be reproducible"


@pytest.mark.parametrize("search", ["exhaustive", "random"])
def test_measuring_search_needs_a_clock(search):
    """``choose`` itself times nothing; ``plan`` gives it one that runs kernels here."""
    p = plan("y = A*x", A=M(3, 3), x=V(3), y=V(3))
    with pytest.raises(ScheduleError, match="needs measure"):
        choose(p.indexed, p.specs, p.isa, search=search)


def test_unknown_search_is_refused_before_anything_is_modelled():
    with pytest.raises(ScheduleError, match="search must be one of"):
        plan("y = A*x", search="fastest", A=M(3, 3), x=V(3), y=V(3))


def test_emit_with_a_measuring_search(tmp_path):
    c_path, h_path = blacc.emit("y = A*x + y", tmp_path / "tuned", target="host",
                                search="exhaustive", A=M(3, 5), x=V(5), y=V(3))
    assert c_path.exists() and h_path.exists()
