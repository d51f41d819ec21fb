"""Generic traversal of IR values: rebuild a node with its children rewritten."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from .kernel import Expr, Load, Store, Var

T = TypeVar("T")


#: Field annotations that never hold an IR node: walks skip such fields.
_SCALAR_FIELDS = frozenset({"str", "int", "bool", "float", "int | float", "int | None",
                            "str | None", "tuple[int, ...]", "tuple[str, ...]",
                            "tuple[tuple[str, str], ...]", "tuple[tuple[str, int], ...]"})


#: ``_field_names`` per class, filled as classes are met: a plain dict lookup, since the
#: cost model and the passes walk millions of nodes (through ``functools.cache`` and a
#: callback per node, ``nodes_of`` took 1.2-1.5x as long).
_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The fields of dataclass ``cls`` that may hold IR nodes (None for other types)."""
    try:
        return _FIELDS[cls]
    except KeyError:
        names = (tuple(f.name for f in dataclasses.fields(cls) if f.type not in _SCALAR_FIELDS)
                 if dataclasses.is_dataclass(cls) else None)
        _FIELDS[cls] = names
        return names


def rewrite(node: Any, fn: Callable[[Any], Any]) -> Any:
    """Rebuild ``node`` bottom-up, replacing every IR node ``x`` by ``fn(x)`` (after its
    children were rewritten). Tuples are walked; other leaves are kept. What ``fn``
    leaves unchanged is returned as is, not copied."""
    if isinstance(node, tuple):
        items = tuple(rewrite(x, fn) for x in node)
        return node if all(a is b for a, b in zip(items, node, strict=True)) else items
    names = _field_names(type(node))
    if names is None:
        return node
    changes = {}
    for name in names:
        old = getattr(node, name)
        new = rewrite(old, fn)
        if new is not old:
            changes[name] = new
    rebuilt = dataclasses.replace(node, **changes) if changes else node
    return fn(rebuilt)


def _visit(node: Any, fn: Callable[[Any], object]) -> None:
    """Call ``fn`` on every IR node in ``node``, children before their parents (what
    ``rewrite`` visits, without rebuilding anything)."""
    if isinstance(node, tuple):
        for x in node:
            _visit(x, fn)
        return
    names = _field_names(type(node))
    if names is None:
        return
    for name in names:
        _visit(getattr(node, name), fn)
    fn(node)


def any_node(node: Any, test: Callable[[Any], bool]) -> bool:
    """Whether some IR node in ``node`` passes ``test``: stops at the first."""
    stack = [node]
    pop, push = stack.pop, stack.append  # bound once: passes ask this of every statement
    while stack:
        x = pop()
        if isinstance(x, tuple):
            stack.extend(x)
            continue
        names = _field_names(type(x))
        if names is None:
            continue
        if test(x):
            return True
        for name in names:
            push(getattr(x, name))
    return False


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
    _collect(node, kind, found)
    return found


def _collect(node: Any, kind: type | tuple[type, ...], found: list) -> None:
    """``nodes_of``'s walk: ``_visit`` with the test inline, as the planner's passes call
    it hundreds of thousands of times."""
    if isinstance(node, tuple):
        for x in node:
            _collect(x, kind, found)
        return
    names = _field_names(type(node))
    if names is None:
        return
    for name in names:
        _collect(getattr(node, name), kind, found)
    if isinstance(node, kind):
        found.append(node)


def names_used(node: Any) -> set[str]:
    """Every variable and buffer name that ``node`` reads or writes."""
    from .kernel import Load, Operand2D, Prefetch, Ref, Store

    names: set[str] = set()

    def visit(x: Any) -> None:
        if isinstance(x, Var):
            names.add(x.name)
        elif isinstance(x, (Load, Store, Ref, Prefetch, Operand2D)):
            names.add(x.buf)

    _visit(node, visit)
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
    moves = nodes_of(node, (Load, Store))
    return (frozenset(m.buf for m in moves if isinstance(m, Load))
            & frozenset(m.buf for m in moves if isinstance(m, Store)))
