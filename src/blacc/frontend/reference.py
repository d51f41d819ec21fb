"""A float64 NumPy interpreter of typed programs: the reference later layers test against.

    evaluate(check(parse("y = A*x + y"), decls), {"A": A, "x": x, "y": y})  # {"y": A @ x + y}

Statements run in order; each output is returned as a new array (inputs are never
written): a Matrix as a (rows, cols) array, a Vector as an (n,) array, a Scalar as a float.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import ArgumentError, ShapeError
from .typed import TAdd, TExpr, TMul, TNeg, TNum, TRef, TSub, TTranspose, TypedProgram
from .types import Decl, Matrix, Scalar, Vector

Value = np.ndarray | float


def evaluate(typed: TypedProgram, values: Mapping[str, Value]) -> dict[str, Value]:
    """Run ``typed`` on ``values`` (every input by name; extra names are ignored)."""
    if not isinstance(typed, TypedProgram):
        raise ArgumentError(f"evaluate takes a TypedProgram (from check), got "
                            f"{type(typed).__name__}")
    missing = [n for n in typed.inputs if n not in values]
    if missing:
        raise ArgumentError(f"missing values for the inputs {', '.join(missing)}")
    env = {n: _load(n, typed.decls[n], values[n]) for n in typed.inputs}
    for st in typed.statements:
        env[st.target] = _eval(st.expr, env)
    return {n: _store(typed.decls[n], env[n]) for n in typed.outputs}


def _load(name: str, decl: Decl, value: object) -> np.ndarray:
    """``value`` as a float64 2-D array of ``decl``'s shape."""
    try:
        a = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{name}: expected numbers, got {type(value).__name__}") from exc
    rows, cols = decl.shape
    accepted = {(rows, cols)}
    if isinstance(decl, Vector):
        accepted.add((rows,))
    if isinstance(decl, Scalar):
        accepted |= {(), (1,)}
    if a.shape not in accepted:
        raise ShapeError(f"{name} is declared {decl!r} but its value has shape {a.shape}")
    return a.reshape(rows, cols)


def _store(decl: Decl, a: np.ndarray) -> Value:
    if isinstance(decl, Scalar):
        return float(a[0, 0])
    if isinstance(decl, Vector):
        return a.reshape(decl.n).copy()
    assert isinstance(decl, Matrix)
    return a.copy()


def _eval(e: TExpr, env: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, TNum):
        return np.full((1, 1), e.value)
    if isinstance(e, TRef):
        return env[e.name]
    if isinstance(e, TNeg):
        return -_eval(e.x, env)
    if isinstance(e, TTranspose):
        return _eval(e.x, env).T
    a, b = _eval(e.a, env), _eval(e.b, env)
    if isinstance(e, TAdd):
        return a + b
    if isinstance(e, TSub):
        return a - b
    assert isinstance(e, TMul)
    if e.op == "scale":
        return a[0, 0] * b if e.a.shape == (1, 1) else a * b[0, 0]
    return a @ b
