"""Lower ``PackSlivers`` to a packing function of plain loops.

    pack_slivers(Ap <- A[off : rs, cs], rows, cols, width=6)
      ->  blacc_pack_f32_w6(&Ap[0], &A[off], rs, cs, rows, cols)

The function copies whole slivers with the ``width`` copies of the inner loop
unrolled, zero-fills the last partial sliver, and is specialized for the two
common layouts (``rs == 1`` and ``cs == 1``) so the C compiler sees unit-stride
loops it can vectorize.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import kernel as k
from ..ir.walk import rewrite, simplify, substitute


def lower_packs(module: k.Module) -> k.Module:
    needed: dict[str, k.Function] = {}

    def visit(x: object) -> object:
        if not isinstance(x, k.PackSlivers):
            return x
        func = _pack_function(x.dtype, x.width)
        needed[func.name] = func
        args = (k.Ref(x.dst, k.Const(0)), k.Ref(x.src.buf, x.src.offset), x.src.rs, x.src.cs,
                x.rows, x.cols)
        return k.Call(func.name, args)

    funcs = tuple(replace(f, body=rewrite(f.body, visit)) for f in module.functions)
    return k.Module((*needed.values(), *funcs), module.entry, module.attributes)


def _pack_function(dtype: str, width: int) -> k.Function:
    i64 = "i64"
    params = (k.Param("dst", dtype, pointer=True), k.Param("src", dtype, True, True),
              k.Param("rs", i64), k.Param("cs", i64), k.Param("rows", i64), k.Param("cols", i64))
    rs, cs, rows, cols = (k.Var(n) for n in ("rs", "cs", "rows", "cols"))
    s, c, h = k.Var("s"), k.Var("c"), k.Var("h")

    def dst_at(r: int) -> k.Expr:
        return s * cols + c * width + r

    def src_at(r: int) -> k.Expr:
        return (s + r) * rs + c * cs

    whole = k.For(c, k.Const(0), cols, 1, tuple(
        k.Store("dst", dst_at(r), k.Load("src", src_at(r), dtype)) for r in range(width)))
    zero = k.Const(0.0, dtype)
    partial = k.For(c, k.Const(0), cols, 1, tuple(
        k.If(k.Bin("<", k.Const(r), h),
             (k.Store("dst", dst_at(r), k.Load("src", src_at(r), dtype)),),
             (k.Store("dst", dst_at(r), zero),))
        for r in range(width)))
    slivers = k.For(s, k.Const(0), rows, width, (
        k.Decl(h, k.minimum(width, rows - s)),
        k.If(k.Bin("==", h, k.Const(width)), (whole,), (partial,)),
    ))
    one = k.Const(1)
    body = (k.If(k.Bin("==", rs, one), simplify(substitute((slivers,), {"rs": one})),
                 (k.If(k.Bin("==", cs, one), simplify(substitute((slivers,), {"cs": one})),
                       (slivers,)),)),)
    return k.Function(f"blacc_pack_{dtype}_w{width}", params, body)
