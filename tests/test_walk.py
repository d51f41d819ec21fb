"""The generic IR walks (``ir.walk``): what they visit, in which order, what they rebuild,
and that the fields they skip as scalars never hold a node."""

from __future__ import annotations

import dataclasses

import pytest

import blacc
from blacc.blacs import plan
from blacc.ir import kernel as k
from blacc.ir.walk import _SCALAR_FIELDS, any_node, names_used, nodes_of, rewrite

M, S, V = blacc.Matrix, blacc.Scalar, blacc.Vector

PROGRAMS = [
    ("y = A*x", dict(A=M(3, 5, "f32"), x=V(5, "f32"), y=V(3, "f32"))),
    ("C = alpha*A*B + beta*C", dict(A=M(7, 4, "f64"), B=M(4, 9, "f64"), C=M(7, 9, "f64"),
                                    alpha=S("f64"), beta=S("f64"))),
    ("y = alpha*x + y", dict(x=V(37, "f32"), y=V(37, "f32"), alpha=S("f32"))),
]


def _every_node(node: object) -> list[object]:
    """Every dataclass instance in ``node``, found through all its fields (none skipped)."""
    found = []
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            found.append(x)
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
    return found


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("program", PROGRAMS, ids=[p for p, _ in PROGRAMS])
def test_scalar_fields_hold_no_nodes(program, isa):
    """The walks skip fields annotated as scalars: in real kernels those hold none, so
    ``nodes_of`` finds every node a walk through every field finds."""
    text, decls = program
    module = plan(text, target=isa, **decls).module
    everything = _every_node(module)
    for x in everything:
        for f in dataclasses.fields(x):
            if f.type in _SCALAR_FIELDS:
                assert not _every_node(getattr(x, f.name)), (type(x).__name__, f.name)
    assert len(nodes_of(module, object)) == len(everything)


def test_children_come_before_their_parents():
    e = k.Bin("+", k.Var("a", "i64"), k.Bin("*", k.Var("b", "i64"), k.Const(2)))
    order = nodes_of(e, (k.Var, k.Bin, k.Const))
    assert order == [e.a, e.b.a, e.b.b, e.b, e]
    assert names_used(e) == {"a", "b"}


def test_rewrite_keeps_what_it_does_not_change():
    """An unchanged node (and tuple) is returned as is; a change rebuilds its parents."""
    body = (k.Assign(k.Var("a", "i64"), k.Bin("+", k.Var("a", "i64"), k.Const(1))),)
    assert rewrite(body, lambda x: x) is body
    renamed = rewrite(body, lambda x: k.Var("b", "i64") if x == k.Var("a", "i64") else x)
    assert renamed is not body and names_used(renamed) == {"b"} and names_used(body) == {"a"}


def test_any_node_stops_at_the_first():
    seen = []

    def test(x):
        seen.append(x)
        return isinstance(x, k.Const)

    e = k.Bin("+", k.Bin("*", k.Var("b", "i64"), k.Var("c", "i64")), k.Const(1))
    assert any_node(e, test)
    assert len(seen) < len(nodes_of(e, object))
    assert not any_node(e, lambda x: isinstance(x, k.Load))
