"""A reference interpreter of the kernel IR over NumPy buffers.

It runs every level — tile operations before lowering, vector operations after —
so each lowering pass can be tested on its own against NumPy. Buffers are 1-D
NumPy arrays; a pointer argument is a view starting at the referenced element.
Reads and writes are bounds-checked: an index outside a buffer raises
``IndexError`` instead of touching other memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import kernel as k
from .dtypes import numpy_dtype

_BIN = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "%": lambda a, b: a % b, "min": np.minimum, "max": np.maximum,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b, "and": lambda a, b: bool(a) and bool(b),
}


class _Env:
    def __init__(self, module: k.Module, values: dict[str, Any]) -> None:
        self.module = module
        self.values = values


def _index(buf: np.ndarray, i: int, n: int) -> slice:
    if n == 0:  # a fully masked access touches no memory
        return slice(0, 0)
    if i < 0 or i + n > buf.shape[0]:
        raise IndexError(f"access [{i}, {i + n}) outside a buffer of {buf.shape[0]} elements")
    return slice(i, i + n)


def value_of(e: k.Expr, values: dict[str, Any]) -> Any:
    """``e``'s value where its variables have ``values`` (an expression of scalars: no
    buffers or calls), e.g. a buffer's size at known extents."""
    return evaluate(e, _Env(k.Module((), entry=""), values))


def evaluate(e: k.Expr, env: _Env) -> Any:
    v = env.values
    if isinstance(e, k.Const):
        return numpy_dtype(e.dtype).type(e.value) if e.dtype in ("f32", "f64") else e.value
    if isinstance(e, k.Var):
        return v[e.name]
    if isinstance(e, k.Bin):
        if e.op == "/":
            a, b = evaluate(e.a, env), evaluate(e.b, env)
            return a // b if isinstance(a, int) else a / b
        r = _BIN[e.op](evaluate(e.a, env), evaluate(e.b, env))
        return int(r) if isinstance(r, np.integer) else r
    if isinstance(e, k.Load):
        buf = v[e.buf]
        i = int(evaluate(e.index, env))
        if e.count is None:
            vals = buf[_index(buf, i, e.lanes)]
            return vals[0] if e.lanes == 1 else vals.copy()
        n = max(0, min(e.lanes, int(evaluate(e.count, env))))
        out = np.zeros(e.lanes, dtype=numpy_dtype(e.dtype))
        out[:n] = buf[_index(buf, i, n)]
        return out
    if isinstance(e, k.Broadcast):
        x = evaluate(e.value, env)
        return np.full(e.lanes, x, dtype=numpy_dtype(e.dtype))
    if isinstance(e, k.Fma):
        a, b, c = evaluate(e.a, env), evaluate(e.b, env), evaluate(e.c, env)
        return (a * b + c).astype(numpy_dtype(e.dtype)) if e.lanes > 1 else c.dtype.type(a * b + c)
    if isinstance(e, k.Select):
        return evaluate(e.a, env) if evaluate(e.cond, env) else evaluate(e.b, env)
    if isinstance(e, k.Reduce):
        x = evaluate(e.x, env)
        return x.dtype.type(np.sum(x, dtype=x.dtype))
    if isinstance(e, k.SumLanes):
        rows = np.concatenate([evaluate(x, env) for x in e.xs]).reshape(e.lanes, -1)
        return np.array([np.sum(r, dtype=r.dtype) for r in rows], dtype=numpy_dtype(e.dtype))
    if isinstance(e, k.SumRows):
        rows = [evaluate(x, env) for x in e.xs]
        return np.array([np.sum(r, dtype=r.dtype) for r in rows], dtype=numpy_dtype(e.dtype))
    if isinstance(e, k.BuildVector):
        return np.array([evaluate(x, env) for x in e.xs], dtype=numpy_dtype(e.dtype))
    if isinstance(e, k.Halves):
        return np.concatenate([np.atleast_1d(evaluate(e.lo, env)),
                               np.atleast_1d(evaluate(e.hi, env))])
    if isinstance(e, k.HalfSplat):
        x = evaluate(e.x, env).reshape(e.parts, -1)
        return np.repeat(x[:, e.lane], x.shape[1])
    if isinstance(e, k.Spread):
        return np.repeat(evaluate(e.x, env), e.lanes // e.parts)
    if isinstance(e, k.Half):
        x = evaluate(e.x, env)
        h = e.lanes
        part = x[e.which * h:(e.which + 1) * h].copy()
        return part[0] if h == 1 else part
    if isinstance(e, k.Permute):
        both = [evaluate(x, env) for x in (e.x, e.y) if x is not None]
        return np.concatenate(both)[list(e.lanes_from)]
    if isinstance(e, k.ShiftDown):
        x = evaluate(e.x, env)
        return np.concatenate([x[e.by:], np.zeros(e.by, dtype=x.dtype)])
    if isinstance(e, (k.Zip, k.Unzip)):
        both = np.concatenate([evaluate(e.a, env), evaluate(e.b, env)])
        lanes = (k.zip_lanes(e.lanes, e.half) if isinstance(e, k.Zip)
                 else k.unzip_lanes(e.lanes, e.odd))
        return both[lanes]
    if isinstance(e, k.Ref):
        buf = v[e.buf]
        i = int(evaluate(e.index, env))
        if not 0 <= i <= buf.shape[0]:
            raise IndexError(f"pointer {e.buf}+{i} outside a buffer of {buf.shape[0]} elements")
        return buf[i:]
    if isinstance(e, k.MatrixLoad):
        buf = v[e.buf]
        return buf[_matrix_indices(buf, e.index, e.stride, e.rows, e.cols, env)].copy()
    if isinstance(e, k.MatrixMultiply):
        a = evaluate(e.a, env).reshape(e.inner, e.rows).T  # column-major -> (rows, inner)
        b = evaluate(e.b, env).reshape(e.cols, e.inner).T
        return (a @ b).T.reshape(-1).astype(numpy_dtype(e.dtype))
    raise TypeError(f"cannot evaluate {type(e).__name__}")


def _matrix_indices(buf: np.ndarray, index: k.Expr, stride: k.Expr, rows: int, cols: int,
                    env: _Env) -> np.ndarray:
    """The buffer positions of a column-major ``rows x cols`` matrix, lane order,
    bounds-checked; columns may not overlap (``stride >= rows``, as LLVM requires)."""
    i, s = int(evaluate(index, env)), int(evaluate(stride, env))
    if s < rows:
        raise ValueError(f"matrix access with stride {s} < {rows} rows: columns overlap")
    for c in range(cols):
        _index(buf, i + c * s, rows)
    return (i + np.arange(cols)[:, None] * s + np.arange(rows)[None, :]).reshape(-1)


def _tile_element_reads(s: k.TileMMA, env: _Env) -> tuple[np.ndarray, np.ndarray]:
    """The a and b panels a tile product reads, element by element, bounds-checked."""
    kk, t = int(evaluate(s.k, env)), s.tile
    rows = t.rows if s.padded else int(evaluate(s.rows, env))
    cols = t.cols if s.padded else int(evaluate(s.cols, env))
    dt = numpy_dtype(t.dtype)
    a = np.zeros((t.rows, kk), dtype=dt)
    b = np.zeros((kk, t.cols), dtype=dt)
    for op, arr, nr, nc in ((s.a, a, rows, kk), (s.b, b, kk, cols)):
        buf = env.values[op.buf]
        off, rs, cs = (int(evaluate(x, env)) for x in (op.offset, op.rs, op.cs))
        for r in range(nr):
            for c in range(nc):
                arr[r, c] = buf[_index(buf, off + r * rs + c * cs, 1)][0]
    return a, b


def execute(body: tuple[k.Stmt, ...], env: _Env) -> None:
    for s in body:
        _execute(s, env)


def _execute(s: k.Stmt, env: _Env) -> None:
    v = env.values
    if isinstance(s, (k.Comment, k.Prefetch, k.Free, k.Barrier)):
        return
    if isinstance(s, (k.Decl, k.Assign)):
        v[s.var.name] = evaluate(s.value, env)
    elif isinstance(s, k.Store):
        buf = v[s.buf]
        i = int(evaluate(s.index, env))
        val = evaluate(s.value, env)
        lanes = s.value.lanes
        n = lanes if s.count is None else max(0, min(lanes, int(evaluate(s.count, env))))
        buf[_index(buf, i, n)] = val[:n] if lanes > 1 else val
    elif isinstance(s, k.For):
        start, stop = int(evaluate(s.start, env)), int(evaluate(s.stop, env))
        for i in range(start, stop, s.step):
            v[s.var.name] = i
            execute(s.body, env)
    elif isinstance(s, k.If):
        execute(s.then if evaluate(s.cond, env) else s.orelse, env)
    elif isinstance(s, (k.Local, k.Alloc)):
        # NaN-filled so that reading scratch before writing it shows up in results.
        size = s.size if isinstance(s, k.Local) else int(evaluate(s.size, env))
        v[s.buf] = np.full(size, np.nan, dtype=numpy_dtype(s.dtype))
    elif isinstance(s, k.Call):
        func = env.module.function(s.func)
        args = {p.name: evaluate(a, env) for p, a in zip(func.params, s.args, strict=True)}
        execute(func.body, _Env(env.module, args))
    elif isinstance(s, k.PackSlivers):
        _pack(s, env)
    elif isinstance(s, k.TileZero):
        v[s.tile.name] = np.zeros((s.tile.rows, s.tile.cols), dtype=numpy_dtype(s.tile.dtype))
    elif isinstance(s, k.TileMMA):
        a, b = _tile_element_reads(s, env)
        v[s.tile.name] = (v[s.tile.name] + a @ b).astype(numpy_dtype(s.tile.dtype))
    elif isinstance(s, k.TileStore):
        _tile_store(s, env)
    elif isinstance(s, k.MatrixStore):
        buf = v[s.buf]
        buf[_matrix_indices(buf, s.index, s.stride, s.rows, s.cols, env)] = evaluate(s.value, env)
    else:
        raise TypeError(f"cannot execute {type(s).__name__}")


def _pack(s: k.PackSlivers, env: _Env) -> None:
    dst, src = env.values[s.dst], env.values[s.src.buf]
    rows, cols = int(evaluate(s.rows, env)), int(evaluate(s.cols, env))
    off, rs, cs = (int(evaluate(x, env)) for x in (s.src.offset, s.src.rs, s.src.cs))
    w = s.width
    for r0 in range(0, rows, w):
        for c in range(cols):
            for r in range(w):
                i = r0 * cols + c * w + r
                val = src[_index(src, off + (r0 + r) * rs + c * cs, 1)][0] if r0 + r < rows else 0
                dst[_index(dst, i, 1)] = val


def _tile_store(s: k.TileStore, env: _Env) -> None:
    buf = env.values[s.c.buf]
    acc = env.values[s.tile.name]
    rows, cols = int(evaluate(s.rows, env)), int(evaluate(s.cols, env))
    alpha, beta = evaluate(s.alpha, env), evaluate(s.beta, env)
    off, rs, cs = (int(evaluate(x, env)) for x in (s.c.offset, s.c.rs, s.c.cs))
    for r in range(rows):
        for c in range(cols):
            j = _index(buf, off + r * rs + c * cs, 1)
            val = alpha * acc[r, c]
            buf[j] = val if beta == 0 else val + beta * buf[j][0]


def run(module: k.Module, args: dict[str, Any], entry: str | None = None) -> None:
    """Run a function of ``module`` (its entry by default) on NumPy buffers and scalars.

    Pointer parameters take 1-D arrays (views; written in place); scalar parameters
    take Python numbers."""
    func = module.function(entry or module.entry)
    values: dict[str, Any] = {}
    for p in func.params:
        if p.name not in args:
            raise TypeError(f"{func.name}() is missing argument {p.name!r}")
        a = args[p.name]
        if p.pointer:
            if not (isinstance(a, np.ndarray) and a.ndim == 1 and a.dtype == numpy_dtype(p.dtype)):
                raise TypeError(f"argument {p.name!r} must be a 1-D {p.dtype} array")
            values[p.name] = a
        elif p.dtype in ("f32", "f64"):
            values[p.name] = numpy_dtype(p.dtype).type(a)
        else:
            values[p.name] = int(a)
    execute(func.body, _Env(module, values))
