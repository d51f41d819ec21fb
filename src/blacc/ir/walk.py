"""Generic traversal of IR values: rebuild a node with its children rewritten."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from .kernel import Expr, Load, Store, Var

T = TypeVar("T")


def rewrite(node: Any, fn: Callable[[Any], Any]) -> Any:
    """Rebuild ``node`` bottom-up, replacing every IR node ``x`` by ``fn(x)`` (after its
    children were rewritten). Tuples are walked; other leaves are kept."""
    if isinstance(node, tuple):
        return tuple(rewrite(x, fn) for x in node)
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        old = getattr(node, f.name)
        new = rewrite(old, fn)
        if new is not old:
            changes[f.name] = new
    rebuilt = dataclasses.replace(node, **changes) if changes else node
    return fn(rebuilt)


def substitute(node: Any, mapping: dict[str, Expr]) -> Any:
    """Replace variables by expressions, e.g. a stride known to be 1 by ``Const(1)``."""

    def visit(x: Any) -> Any:
        if isinstance(x, Var) and x.name in mapping:
            return mapping[x.name]
        return x

    return rewrite(node, visit)


def simplify(node: Any) -> Any:
    """Fold constants left behind by substitution (``x*1``, ``0+x``, ``1 == 1``)."""
    from .kernel import Bin, Const, add, mul, sub

    def visit(x: Any) -> Any:
        if not isinstance(x, Bin):
            return x
        if x.op == "+":
            return add(x.a, x.b)
        if x.op == "-":
            return sub(x.a, x.b)
        if x.op == "*":
            return mul(x.a, x.b)
        if isinstance(x.a, Const) and isinstance(x.b, Const) and x.op == "==":
            return Const(int(x.a.value == x.b.value), "bool")
        return x

    return rewrite(node, visit)


def nodes_of(node: Any, kind: type[T] | tuple[type, ...]) -> list[T]:
    """Every IR node of type ``kind`` (or of one of the types) in ``node``, children
    before their parents."""
    found: list[T] = []

    def visit(x: Any) -> Any:
        if isinstance(x, kind):
            found.append(x)
        return x

    rewrite(node, visit)
    return found


def names_used(node: Any) -> set[str]:
    """Every variable and buffer name that ``node`` reads or writes."""
    from .kernel import Load, Operand2D, Prefetch, Ref, Store

    names: set[str] = set()

    def visit(x: Any) -> Any:
        if isinstance(x, Var):
            names.add(x.name)
        elif isinstance(x, (Load, Store, Ref, Prefetch, Operand2D)):
            names.add(x.buf)
        return x

    rewrite(node, visit)
    return names


def loaded_buffers(node: Any) -> frozenset[str]:
    """The buffers ``node`` (a kernel, a statement) loads from."""
    return frozenset(e.buf for e in nodes_of(node, Load))


def map_bodies(s: Any, fn: Callable[[tuple], tuple]) -> Any:
    """Statement ``s`` with ``fn`` applied to the statement lists it holds (a loop's
    body, a branch's two)."""
    from .kernel import For, If

    if isinstance(s, For):
        return dataclasses.replace(s, body=fn(s.body))
    if isinstance(s, If):
        return dataclasses.replace(s, then=fn(s.then), orelse=fn(s.orelse))
    return s


def read_back_buffers(node: Any) -> frozenset[str]:
    """The buffers ``node`` both stores into and loads from: operands it updates,
    temporaries."""
    return loaded_buffers(node) & frozenset(s.buf for s in nodes_of(node, Store))
