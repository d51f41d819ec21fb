"""Straight-line code ordered result by result (``transform.stores_as_ready``):

* a register block lowered step by step of its reduction comes out accumulator by
  accumulator, each store right after its accumulator's last update;
* dependences through variables and through memory keep their order;
* chains longer than ``MAX_CHAIN``, and statements across loops and barriers, stay;
* random straight-line code computes the same bits before and after (hypothesis);
* planned kernels store as they go, and agree with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blacc
from blacc.blacs import plan
from blacc.ir import interp
from blacc.ir import kernel as k
from blacc.transform.stores_as_ready import MAX_CHAIN, _reordered, stores_as_ready
from test_blac_programs import assert_matches, make_values, run_interp

F64x4 = ("f64", 4)
M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar


def _var(name: str) -> k.Var:
    return k.Var(name, *F64x4)


def _load(buf: str, at: int) -> k.Load:
    return k.Load(buf, k.Const(at), *F64x4)


def _block(rows: int, steps: int) -> tuple[k.Stmt, ...]:
    """C[r] = sum_s a[r*steps + s] * b[s], step by step: every row's first update, every
    row's second, ..., then the stores (how the lowering emits a register block)."""
    body: list[k.Stmt] = []
    for s in range(steps):
        body.append(k.Decl(_var(f"b{s}"), _load("b", 4 * s), in_register=True))
        for r in range(rows):
            a = k.Broadcast(k.Load("a", k.Const(r * steps + s), "f64", 1), 4)
            if s == 0:
                body.append(k.Decl(_var(f"acc{r}"), k.Bin("*", a, _var(f"b{s}"))))
            else:
                body.append(k.Assign(_var(f"acc{r}"), k.Fma(a, _var(f"b{s}"), _var(f"acc{r}"))))
    body += [k.Store("c", k.Const(4 * r), _var(f"acc{r}")) for r in range(rows)]
    return tuple(body)


def _written(s: k.Stmt) -> str:
    return s.var.name if isinstance(s, (k.Decl, k.Assign)) else f"store {s.value.name}"


def _module(body: tuple[k.Stmt, ...]) -> k.Module:
    params = (k.Param("a", "f64", pointer=True, const=True),
              k.Param("b", "f64", pointer=True, const=True), k.Param("c", "f64", pointer=True))
    return k.Module((k.Function("f", params, body, exported=True),), "f")


def _run(body: tuple[k.Stmt, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    args = {"a": rng.standard_normal(64), "b": rng.standard_normal(64),
            "c": rng.standard_normal(64)}
    interp.run(_module(body), args)
    return args["c"]


def test_a_block_comes_out_accumulator_by_accumulator():
    body = _block(rows=3, steps=2)
    out = stores_as_ready(body, 32)
    assert [_written(s) for s in out] == ["b0", "acc0", "b1", "acc0", "store acc0",
                                          "acc1", "acc1", "store acc1",
                                          "acc2", "acc2", "store acc2"]
    assert stores_as_ready(out, 32) == out
    assert np.array_equal(_run(out), _run(body))


def test_a_planned_block_stores_each_row_after_its_last_update():
    """C = A*B 16 x 4 x 16 f32 on AVX-512: one vector per row of C, four updates."""
    p = plan("C = A*B", target="avx512", A=M(16, 4, "f32"), B=M(4, 16, "f32"),
             C=M(16, 16, "f32"))
    body = [s for s in p.module.function(p.module.entry).body
            if isinstance(s, (k.Decl, k.Assign, k.Store))]
    stores = [i for i, s in enumerate(body) if isinstance(s, k.Store)]
    assert len(stores) == 16
    for i in stores:
        acc = body[i].value
        assert isinstance(acc, k.Var) and body[i - 1].var == acc  # its last update


def test_long_chains_keep_their_order():
    body = _block(rows=2, steps=MAX_CHAIN + 2)  # MAX_CHAIN + 1 updates after the first
    assert stores_as_ready(body, 32) == body
    shorter = _block(rows=2, steps=MAX_CHAIN + 1)
    assert stores_as_ready(shorter, 32) != shorter


def test_blocks_that_are_not_plain_products_keep_their_order():
    """A block that loads what it stores (beta*C), stores a value of two accumulators,
    reads a temporary, or shares more values among its accumulators than the target
    has registers to spare is left as it is."""
    block = _block(rows=3, steps=2)
    c_read = tuple(k.Store(s.buf, s.index, k.Bin("+", s.value, _load("c", 32)))
                   if isinstance(s, k.Store) else s for s in block)
    assert stores_as_ready(c_read, 32) == c_read
    mixed = block[:-1] + (k.Store("c", k.Const(8), k.Bin("+", _var("acc2"), _var("acc1"))),)
    assert stores_as_ready(mixed, 32) == mixed
    assert stores_as_ready(block, 32, scratch=frozenset({"a"})) == block
    assert stores_as_ready(block, 32) != block
    # the two rows of b shared by the accumulators, and one accumulator at a time
    assert stores_as_ready(block, 4) != block
    assert stores_as_ready(block, 3) == block  # would keep b in registers it has not


def test_memory_dependences_keep_their_order():
    """A load of what an earlier store wrote stays after it, and a store stays after the
    earlier loads of its buffer, even where the results would otherwise move ahead
    (``_reordered``, the reordering itself, which ``stores_as_ready`` applies only to
    blocks that load nothing they store)."""
    x, y, z = _var("x"), _var("y"), _var("z")
    body = (
        k.Decl(x, _load("c", 0)),
        k.Decl(y, _load("a", 0)),
        k.Store("c", k.Const(4), x),      # before: the load of c[0]
        k.Decl(z, _load("c", 4)),          # reads what was just stored
        k.Store("c", k.Const(0), k.Bin("+", y, z)),
        k.Store("c", k.Const(8), y),
    )
    out = tuple(_reordered(list(body)))
    assert out.index(body[0]) < out.index(body[2]) < out.index(body[3]) < out.index(body[4])
    assert np.array_equal(_run(out), _run(body))


def test_nothing_moves_across_a_barrier_or_a_loop():
    block = _block(rows=2, steps=2)
    loop = k.For(k.Var("i", "i64", 1), k.Const(0), k.Const(2), 1, block)
    body = block + (k.Barrier(),) + block + (loop,) + block
    out = stores_as_ready(body, 32)
    run = stores_as_ready(block, 32)
    in_loop = k.For(loop.var, loop.start, loop.stop, 1, run)
    assert out == run + (k.Barrier(),) + run + (in_loop,) + run


@st.composite
def straight_line(draw):
    """Random straight-line code over three buffers and a few vector variables: loads,
    sums and products, updates, stores (some into what is later read back)."""
    body: list[k.Stmt] = []
    names: list[str] = []
    for _ in range(draw(st.integers(1, 24))):
        kind = draw(st.sampled_from(["load", "load", "bin", "update", "store", "store"]))
        if kind == "load" or not names:
            name = f"v{len(names)}"
            buf = draw(st.sampled_from("abc"))
            body.append(k.Decl(_var(name), _load(buf, 4 * draw(st.integers(0, 3)))))
            names.append(name)
        elif kind == "bin":
            name = f"v{len(names)}"
            x, y = draw(st.sampled_from(names)), draw(st.sampled_from(names))
            body.append(k.Decl(_var(name), k.Bin(draw(st.sampled_from("+*")), _var(x), _var(y))))
            names.append(name)
        elif kind == "update":
            x, y, acc = (draw(st.sampled_from(names)) for _ in range(3))
            body.append(k.Assign(_var(acc), k.Fma(_var(x), _var(y), _var(acc))))
        else:
            body.append(k.Store("c", k.Const(4 * draw(st.integers(0, 3))),
                                _var(draw(st.sampled_from(names)))))
    return tuple(body)


@settings(max_examples=300, deadline=None)
@given(straight_line(), st.integers(0, 2**16))
def test_random_straight_line_code_computes_the_same(body, seed):
    for out in (tuple(_reordered(list(body))), stores_as_ready(body, 32)):
        assert sorted(map(repr, out)) == sorted(map(repr, body))
        assert np.array_equal(_run(out, seed), _run(body, seed))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("target", ["avx2", "avx512", "generic"])
@pytest.mark.parametrize(("source", "shapes"), [
    ("C = A*B", dict(A=(16, 4), B=(4, 16), C=(16, 16))),
    ("C = alpha*A*B + beta*C", dict(A=(7, 5), B=(5, 9), C=(7, 9))),
    ("C = alpha*(A0 + A1)'*B + beta*C", dict(A0=(4, 6), A1=(4, 6), B=(4, 5), C=(6, 5))),
    ("y = alpha*A*x + beta*B*x", dict(A=(13, 4), B=(13, 4), x=(4,), y=(13,))),
])
def test_planned_kernels_store_as_they_go(source, shapes, dtype, target):
    decls = {n: (V(s[0], dtype) if len(s) == 1 else M(*s, dtype)) for n, s in shapes.items()}
    decls.update({n: S(dtype) for n in ("alpha", "beta") if n in source})
    p = plan(source, target=target, **decls)
    body = p.module.function(p.module.entry).body
    assert stores_as_ready(body, p.isa.registers) == body  # the lowering ordered it so
    values = make_values(decls, dtype, np.random.default_rng(7))
    got = run_interp(p.module, p.specs, p.typed, values)
    assert_matches(p.typed, values, got, f"{source} {target} {p.schedule}")
