"""Layer 2 for whole statements: structured operations in index notation.

A BLAC statement such as ``beta = (A*x + alpha*y)'*z + beta`` becomes one
operation whose body computes one output element from input elements, with the
reductions of its matrix products nested inside:

    beta[] = sum_i ( (sum_k A[i,k]*x[k,0]) + alpha[]*y[i,0] ) * z[i,0]  + beta[]

Extents are fixed integers (the sizes are known when generating). Every operand
is 2-D (vectors are n x 1, scalars 1 x 1); an index position is an index name or
0 for a unit dimension. A program is a sequence of operations; temporaries that
fusion cannot avoid are operations writing a temporary operand. The reference
interpreter evaluates bodies with NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IndexRef = str | int  # an index name, or 0 for a unit dimension


class Node:
    """Base of element expressions."""


@dataclass(frozen=True)
class Read(Node):
    operand: str
    index: tuple[IndexRef, IndexRef]


@dataclass(frozen=True)
class Lit(Node):
    value: float


@dataclass(frozen=True)
class Neg(Node):
    x: Node


@dataclass(frozen=True)
class Add(Node):
    a: Node
    b: Node


@dataclass(frozen=True)
class Mul(Node):
    a: Node
    b: Node


@dataclass(frozen=True)
class Sum(Node):
    """sum over ``index`` in range(extent) of ``body``."""

    index: str
    extent: int
    body: Node


@dataclass(frozen=True)
class Operand:
    """A 2-D operand: ``rows x cols`` elements; ``temporary`` ones live in the kernel."""

    name: str
    rows: int
    cols: int
    temporary: bool = False


@dataclass(frozen=True)
class Op:
    """``out[i, j] = body`` for i < out.rows and j < out.cols (``dims`` name i and j)."""

    out: str
    dims: tuple[str, str]
    body: Node


@dataclass(frozen=True)
class Program:
    operands: tuple[Operand, ...]
    ops: tuple[Op, ...]
    dtype: str

    def operand(self, name: str) -> Operand:
        for o in self.operands:
            if o.name == name:
                return o
        raise KeyError(name)


# ----------------------------------------------------------------------------- queries


def children(n: Node) -> tuple[Node, ...]:
    if isinstance(n, (Neg,)):
        return (n.x,)
    if isinstance(n, (Add, Mul)):
        return (n.a, n.b)
    if isinstance(n, Sum):
        return (n.body,)
    return ()


def reads(n: Node) -> list[Read]:
    if isinstance(n, Read):
        return [n]
    return [r for c in children(n) for r in reads(c)]


def indices_used(n: Node) -> set[str]:
    """Index names the value of ``n`` depends on (free ones; sums bind theirs)."""
    if isinstance(n, Read):
        return {i for i in n.index if isinstance(i, str)}
    if isinstance(n, Sum):
        return indices_used(n.body) - {n.index}
    out: set[str] = set()
    for c in children(n):
        out |= indices_used(c)
    return out


def has_sum(n: Node) -> bool:
    return isinstance(n, Sum) or any(has_sum(c) for c in children(n))


# ----------------------------------------------------------------------------- reference


def _eval(n: Node, env: dict[str, np.ndarray], sizes: dict[str, int], free: tuple[str, ...]):
    """Evaluate ``n`` as an array over the axes ``free`` (broadcasting where unused)."""
    if isinstance(n, Lit):
        return np.full((1,) * len(free), float(n.value))
    if isinstance(n, Read):
        arr = env[n.operand]
        sel = tuple(slice(None) if isinstance(i, str) else i for i in n.index)
        names = [i for i in n.index if isinstance(i, str)]
        val = arr[sel]
        if len(names) == 2 and names[0] == names[1]:  # a diagonal access X[i,i]
            val, names = np.diagonal(val), names[:1]
        order = [names.index(f) if f in names else None for f in free]
        # bring the used axes into the order of ``free`` and add unit axes for the rest
        perm = [o for o in order if o is not None]
        val = np.transpose(val, perm) if perm else val
        shape = [sizes[f] if o is not None else 1 for f, o in zip(free, order, strict=True)]
        return val.reshape(shape)
    if isinstance(n, Neg):
        return -_eval(n.x, env, sizes, free)
    if isinstance(n, Add):
        return _eval(n.a, env, sizes, free) + _eval(n.b, env, sizes, free)
    if isinstance(n, Mul):
        return _eval(n.a, env, sizes, free) * _eval(n.b, env, sizes, free)
    if isinstance(n, Sum):
        inner = _eval(n.body, env, {**sizes, n.index: n.extent}, (*free, n.index))
        return inner.sum(axis=-1)
    raise TypeError(f"cannot evaluate {type(n).__name__}")


def evaluate(program: Program, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the program in float64 on 2-D arrays; returns every operand's final value."""
    env = {name: np.array(v, dtype=np.float64).reshape(program.operand(name).rows,
                                                        program.operand(name).cols)
           for name, v in values.items()}
    for o in program.operands:
        env.setdefault(o.name, np.zeros((o.rows, o.cols)))
    for op in program.ops:
        out = program.operand(op.out)
        sizes = {op.dims[0]: out.rows, op.dims[1]: out.cols}
        val = _eval(op.body, env, sizes, op.dims)
        env[op.out] = np.broadcast_to(val, (out.rows, out.cols)).copy()
    return env
