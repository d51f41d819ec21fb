"""A one-GEMM fixed-size program computed by the spine: its C source.

The spine's GEMM for the program's shape and layouts (``strategy.gemm.plan_for``, lowered
for the C backend), and an entry function with the program's own signature (the one
``runtime.pycall.wrapper_source`` calls, parameters in ``arg_specs`` order) that passes
the fixed extents, strides and scalar factors on. The statement's meaning is kept: where
it reads its output (``beta*C``) and beta is 0 at run time, C is first multiplied by 0,
so that a NaN or infinity in it still reaches the result, as it does on the small path;
the spine alone would not read C then (BLAS). Other addends (``D = A*B + E``) are summed
into the output first, which the GEMM then adds the product to (beta = 1); an operand
of the product that is a sum of matrices is summed into a scratch array (``malloc``; the
entry returns 1 where that fails, as the GEMM does for its packing buffers).
"""

from __future__ import annotations

from ..backend import c as c_backend
from ..strategy.gemm import plan_for
from ..transform.as_gemm import Addend, Factor, GemmStatement
from .gemm import Target, lowered_gemm
from .signature import ARRAY, IN, ArgSpec

_C_TYPE = {"f32": "float", "f64": "double"}


def _strides(s: ArgSpec) -> tuple[int, int]:
    """Elements between consecutive rows and consecutive columns of ``s``."""
    ld = s.leading_dimension
    return (ld, 1) if s.layout == "row" else (1, ld)


def _factor(f: Factor, params: dict[str, str], ctype: str) -> str:
    """C for a product of scalars, in the program's type."""
    literal = f.sign * f.literal
    return " * ".join([f"({ctype})({literal.hex()})", *(params[n] for n in f.names)])


def gemm_program_source(stmt: GemmStatement, specs: tuple[ArgSpec, ...], name: str,
                        target: Target) -> str:
    """C source defining ``int name(...)``: ``stmt`` computed by the spine's GEMM on
    ``target``. Parameters are named ``p0, p1...`` after their place in ``specs`` (names
    the user gave never reach the C)."""
    by_name = {s.name: s for s in specs}
    params = {s.name: f"p{i}" for i, s in enumerate(specs)}
    c = by_name[stmt.out]
    dtype = c.dtype
    ctype = _C_TYPE[dtype]
    m, n, k = stmt.extents({s.name: (s.rows, s.cols) for s in specs})
    body: list[str] = []
    scratch: list[str] = []

    def strides(x: Addend, flip: bool = False) -> tuple[int, int]:
        """Strides of op(X), or of its transpose where ``flip``."""
        return _strides(by_name[x.name])[:: -1 if x.trans != flip else 1]

    def sum_into(dest: str, dest_strides: tuple[int, int], rows: int, cols: int,
                 terms: tuple[Addend, ...], label: str, flip: bool = False,
                 indent: str = "") -> None:
        """Loops setting ``dest`` (rows x cols) to the sum of ``terms`` (transposed where
        ``flip``), along ``dest``'s memory; one factor per term, named after ``label``."""
        lines, sums = [], []
        for i, x in enumerate(terms):
            s0, s1 = strides(x, flip)
            lines.append(f"{ctype} {label}{i} = {_factor(x.factor, params, ctype)};")
            sums.append(f"{label}{i} * {params[x.name]}[i * {s0} + j * {s1}]")
        loops = [("i", rows), ("j", cols)][:: 1 if dest_strides[1] == 1 else -1]
        lines.extend(f"{'    ' * d}for (int64_t {v} = 0; {v} < {extent}; {v}++)"
                     for d, (v, extent) in enumerate(loops))
        r, q = dest_strides
        lines.append(f"        {dest}[i * {r} + j * {q}] = {' + '.join(sums)};")
        body.extend(indent + line for line in lines)

    def operand(terms: tuple[Addend, ...], rows: int, cols: int, label: str
                ) -> tuple[str, tuple[int, int]]:
        """A pointer to op(X) (rows x cols) and its strides: the operand itself, or a
        scratch array holding the sum of its terms."""
        if len(terms) == 1 and terms[0].factor == Factor():
            return params[terms[0].name], strides(terms[0])
        buf = f"t{label}"
        scratch.append(buf)
        body.append(f"{ctype} *{buf} = malloc(sizeof({ctype}) * {rows * cols});")
        body.append(f"if (!{buf}) {{ {' '.join(f'free({b});' for b in scratch[:-1])} "
                    "return 1; }")
        # where every term is transposed, the sum is formed as the terms lie (rows read
        # along memory) and passed transposed
        if all(x.trans for x in terms):
            sum_into(buf, (rows, 1), cols, rows, terms, buf, flip=True)
            return buf, (1, rows)
        sum_into(buf, (cols, 1), rows, cols, terms, buf)
        return buf, (cols, 1)

    # op(A) (m x k) and op(B) (k x n) as pointers and strides
    x = operand(stmt.a, m, k, "a")
    y = operand(stmt.b, k, n, "b")
    c_st = _strides(c)
    if c_st[1] != 1:  # C by columns: compute C' = op(B)' op(A)', whose rows are C's columns
        x, y = (y[0], y[1][::-1]), (x[0], x[1][::-1])
        m, n, c_st = n, m, c_st[::-1]
    plan = plan_for("auto", m, n, k, dtype, machine=target.machine, isa=target.isa,
                    a_unit_cols=x[1][1] == 1, b_unit_cols=y[1][1] == 1,
                    b_unit_rows=y[1][0] == 1)
    _, _, module = lowered_gemm(dtype, plan, target.isa, "c")
    entry = module.function(module.entry)
    extents = [str(m), str(n), str(k)] if entry.params[0].dtype == "i64" else []

    signature = []
    for i, s in enumerate(specs):
        if s.kind == ARRAY:
            const = "const " if s.role == IN else ""
            signature.append(f"{const}{ctype} *restrict p{i}")
        else:
            signature.append(f"{ctype} p{i}")
    body.append(f"{ctype} alpha = {_factor(stmt.alpha, params, ctype)};")
    out = params[stmt.out]
    if not stmt.addends:
        body.append(f"{ctype} beta = 0;")
    elif (beta := stmt.beta) is not None:
        body += [f"{ctype} beta = {_factor(beta, params, ctype)};",
                 "if (beta == 0) {  /* 0*C, as written: NaN and infinity stay */"]
        zero = Addend(stmt.out, False, Factor(literal=0.0))
        sum_into(out, _strides(c), c.rows, c.cols, (zero,), "z", indent="    ")
        body += ["    beta = 1;", "}"]
    else:  # C = the sum of the addends, then C += alpha op(A) op(B)
        sum_into(out, _strides(c), c.rows, c.cols, stmt.addends, "f")
        body.append(f"{ctype} beta = 1;")
    args = [*extents, "alpha", x[0], *map(str, x[1]), y[0], *map(str, y[1]), "beta",
            out, *map(str, c_st)]
    if scratch:
        body += [f"int status = {entry.name}({', '.join(args)});",
                 *(f"free({b});" for b in scratch), "return status;"]
    else:
        body.append(f"return {entry.name}({', '.join(args)});")
    return (c_backend.render(module, target.isa)
            + "\n/* the program's signature: C = alpha * op(A) * op(B) + beta * C */\n"
            + f"int {name}({', '.join(signature) or 'void'}) {{\n"
            + "".join(f"    {line}\n" for line in body) + "}\n")

