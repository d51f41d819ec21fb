"""Kernel IR as readable text (Python-like), for ``explain`` and debugging."""

from __future__ import annotations

from . import kernel as k

_INFIX = {"+", "-", "*", "/", "%", "<", "<=", "==", "!=", "and"}


def expr(e: k.Expr) -> str:
    if isinstance(e, k.Const):
        return repr(e.value)
    if isinstance(e, k.Var):
        return e.name
    if isinstance(e, k.Bin):
        if e.op in _INFIX:
            return f"({expr(e.a)} {e.op} {expr(e.b)})"
        return f"{e.op}({expr(e.a)}, {expr(e.b)})"
    if isinstance(e, k.Load):
        mask = (f", count={expr(e.count)}" if e.count is not None else "") + (
            ", past_end" if e.past_end else "")
        if e.lanes == 1 and e.count is None:
            return f"{e.buf}[{expr(e.index)}]"
        return f"load{e.lanes}({e.buf}[{expr(e.index)}]{mask})"
    if isinstance(e, k.Broadcast):
        return f"bcast{e.lanes}({expr(e.value)})"
    if isinstance(e, k.Fma):
        return f"fma({expr(e.a)}, {expr(e.b)}, {expr(e.c)})"
    if isinstance(e, k.Select):
        return f"({expr(e.a)} if {expr(e.cond)} else {expr(e.b)})"
    if isinstance(e, k.Ref):
        return f"&{e.buf}[{expr(e.index)}]"
    if isinstance(e, k.Reduce):
        return f"hsum({expr(e.x)})"
    if isinstance(e, k.SumLanes):
        name = {1: "sumlanes", 2: "sumhalves"}.get(e.rows_per_vector, "sumquarters")
        return f"{name}({', '.join(expr(x) for x in e.xs)})"
    if isinstance(e, k.SumRows):
        return f"sumrows({', '.join(expr(x) for x in e.xs)})"
    if isinstance(e, k.BuildVector):
        return f"vector({', '.join(expr(x) for x in e.xs)})"
    if isinstance(e, k.Halves):
        if e.lo == e.hi:
            return f"dup{e.lanes}({expr(e.lo)})"
        return f"halves{e.lanes}({expr(e.lo)}, {expr(e.hi)})"
    if isinstance(e, k.HalfSplat):
        name = "halfsplat" if e.parts == 2 else "quartersplat"
        return f"{name}({expr(e.x)}, {e.lane})"
    if isinstance(e, k.Spread):
        return f"spread{e.lanes}({expr(e.x)})"
    if isinstance(e, k.Half):
        return f"half({expr(e.x)}, {e.which})"
    if isinstance(e, k.Permute):
        second = "" if e.y is None else f", {expr(e.y)}"
        return f"permute({expr(e.x)}{second}, {list(e.lanes_from)})"
    if isinstance(e, k.ShiftDown):
        return f"shift_down({expr(e.x)}, {e.by})"
    if isinstance(e, k.Zip):
        return f"zip{'_hi' if e.half else '_lo'}({expr(e.a)}, {expr(e.b)})"
    if isinstance(e, k.Unzip):
        return f"unzip{'_odd' if e.odd else '_even'}({expr(e.a)}, {expr(e.b)})"
    if isinstance(e, k.MatrixLoad):
        return f"mload{e.rows}x{e.cols}({e.buf}[{expr(e.index)}], stride={expr(e.stride)})"
    if isinstance(e, k.MatrixMultiply):
        return f"mmul{e.rows}x{e.inner}x{e.cols}({expr(e.a)}, {expr(e.b)})"
    raise TypeError(f"cannot print {type(e).__name__}")


def _operand(o: k.Operand2D) -> str:
    return f"{o.buf}[{expr(o.offset)} : rs={expr(o.rs)}, cs={expr(o.cs)}]"


def stmt(s: k.Stmt, indent: int = 0) -> list[str]:
    pad = "  " * indent
    if isinstance(s, k.Comment):
        return [f"{pad}# {s.text}"]
    if isinstance(s, k.Decl):
        kind = f"{s.var.dtype}x{s.var.lanes}" if s.var.lanes > 1 else s.var.dtype
        pinned = "  # in register" if s.in_register else ""
        return [f"{pad}{s.var.name}: {kind} = {expr(s.value)}{pinned}"]
    if isinstance(s, k.Assign):
        return [f"{pad}{s.var.name} = {expr(s.value)}"]
    if isinstance(s, k.Store):
        mask = (f", count={expr(s.count)}" if s.count is not None else "") + (
            ", past_end" if s.past_end else "")
        if s.value.lanes == 1 and s.count is None:
            return [f"{pad}{s.buf}[{expr(s.index)}] = {expr(s.value)}"]
        return [f"{pad}store{s.value.lanes}({s.buf}[{expr(s.index)}] <- {expr(s.value)}{mask})"]
    if isinstance(s, k.For):
        step = f", {s.step}" if s.step != 1 else ""
        hint = f"  # unroll {s.unroll}" if s.unroll > 1 else ""
        head = f"{pad}for {s.var.name} in range({expr(s.start)}, {expr(s.stop)}{step}):{hint}"
        return [head, *block(s.body, indent + 1)]
    if isinstance(s, k.If):
        lines = [f"{pad}if {expr(s.cond)}:", *block(s.then, indent + 1)]
        if s.orelse:
            lines += [f"{pad}else:", *block(s.orelse, indent + 1)]
        return lines
    if isinstance(s, k.Alloc):
        return [f"{pad}{s.buf} = alloc({s.dtype}, {expr(s.size)}, align={s.align})"]
    if isinstance(s, k.Local):
        return [f"{pad}{s.buf} = zeros({s.dtype}, {s.size})"]
    if isinstance(s, k.Free):
        return [f"{pad}free({s.buf})"]
    if isinstance(s, k.Call):
        return [f"{pad}{s.func}({', '.join(expr(a) for a in s.args)})"]
    if isinstance(s, k.Barrier):
        return [f"{pad}barrier{' (locals too)' if s.locals else ''}"]
    if isinstance(s, k.Prefetch):
        return [f"{pad}prefetch({s.buf}[{expr(s.index)}]{', write' if s.write else ''})"]
    if isinstance(s, k.PackSlivers):
        return [f"{pad}pack_slivers({s.dst} <- {_operand(s.src)}, rows={expr(s.rows)}, "
                f"cols={expr(s.cols)}, width={s.width})"]
    if isinstance(s, k.TileZero):
        return [f"{pad}{_tile(s.tile)} = 0"]
    if isinstance(s, k.TileMMA):
        return [f"{pad}tile_mma({_tile(s.tile)} += {_operand(s.a)} x "
                f"{_operand(s.b)}, k={expr(s.k)}, rows={expr(s.rows)}, cols={expr(s.cols)}, "
                f"padded={s.padded}, unroll={s.unroll})"]
    if isinstance(s, k.MatrixStore):
        return [f"{pad}mstore{s.rows}x{s.cols}({s.buf}[{expr(s.index)}], stride={expr(s.stride)} "
                f"<- {expr(s.value)})"]
    if isinstance(s, k.TileStore):
        return [f"{pad}tile_store({_operand(s.c)} <- {expr(s.alpha)}*{s.tile.name} + "
                f"{expr(s.beta)}*C, rows={expr(s.rows)}, cols={expr(s.cols)})"]
    raise TypeError(f"cannot print {type(s).__name__}")


def _tile(t: k.Tile) -> str:
    return f"{t.name}[{t.rows}x{t.cols}{', along k' if t.along == 'k' else ''}]"


def block(body: tuple[k.Stmt, ...], indent: int) -> list[str]:
    lines = [line for s in body for line in stmt(s, indent)]
    return lines or ["  " * indent + "pass"]


def function(f: k.Function) -> str:
    def param(p: k.Param) -> str:
        return f"{p.name}: {'const ' if p.const else ''}{p.dtype}{'*' if p.pointer else ''}"

    params = ", ".join(param(p) for p in f.params)
    head = f"{'export ' if f.exported else ''}def {f.name}({params}):"
    return "\n".join([head, *block(f.body, 1)])


def module(m: k.Module) -> str:
    return "\n\n".join(function(f) for f in m.functions)
