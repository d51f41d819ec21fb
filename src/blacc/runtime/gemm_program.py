"""A fixed-size program of GEMMs computed by the spine: its C source.

For each step of the program (``transform.as_gemm.GemmProgram``), the spine's GEMM for
its shape and layouts (``strategy.gemm.plan_for``, lowered for the C backend; steps that
plan alike share one function), and an entry function with the program's own signature
(the one ``runtime.pycall.wrapper_source`` calls, parameters in ``arg_specs`` order) that
calls them in order with the fixed extents, strides and scalar factors. A statement's
meaning is kept: where it reads its output (``beta*C``) and beta is 0 at run time, C is
first multiplied by 0, so that a NaN or infinity in it still reaches the result, as it
does on the small path; the spine alone would not read C then (BLAS). Other addends
(``D = A*B + E``) are summed into the output first, which the GEMM then adds the product
to (beta = 1). An operand of a product that is a sum of matrices is summed into a scratch
array, and a chain's products between steps go to scratch arrays too; all are
``malloc``ed before anything is computed and freed at the end (the entry returns 1 where
that fails, as the GEMM does for its packing buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backend import c as c_backend
from ..ir.kernel import Function, Module
from ..strategy.gemm import Plan, plan_for
from ..transform.as_gemm import Addend, Factor, GemmProgram, GemmStatement
from .gemm import Target, lowered_gemm
from .signature import ARRAY, IN, ArgSpec

_C_TYPE = {"f32": "float", "f64": "double"}


@dataclass(frozen=True)
class _Array:
    """An array the entry reads or writes: its pointer in the C, shape and strides
    (elements between consecutive rows, consecutive columns)."""

    pointer: str
    rows: int
    cols: int
    strides: tuple[int, int]


def _strides(s: ArgSpec) -> tuple[int, int]:
    """Elements between consecutive rows and consecutive columns of ``s``."""
    ld = s.leading_dimension
    return (ld, 1) if s.layout == "row" else (1, ld)


def _factor(f: Factor, params: dict[str, str], ctype: str) -> str:
    """C for a product of scalars, in the program's type."""
    literal = f.sign * f.literal
    return " * ".join([f"({ctype})({literal.hex()})", *(params[n] for n in f.names)])


class _Entry:
    """The entry function's body as it is written, step by step."""

    def __init__(self, specs: tuple[ArgSpec, ...], program: GemmProgram,
                 target: Target) -> None:
        self.params = {s.name: f"p{i}" for i, s in enumerate(specs)}
        self.dtype = specs[0].dtype
        self.ctype = _C_TYPE[self.dtype]
        self.target = target
        self.arrays = {s.name: _Array(self.params[s.name], s.rows, s.cols, _strides(s))
                       for s in specs if s.kind == ARRAY}
        self.scratch: list[tuple[str, int]] = []  # (pointer, elements)
        for name, (rows, cols) in program.temps:
            self.arrays[name] = _Array(self._scratch(rows * cols), rows, cols, (cols, 1))
        self.body: list[str] = []
        self.gemms: dict[Plan, Module] = {}  # the GEMM functions of each plan

    def _scratch(self, elements: int) -> str:
        pointer = f"s{len(self.scratch)}"
        self.scratch.append((pointer, elements))
        return pointer

    def strides(self, x: Addend, flip: bool = False) -> tuple[int, int]:
        """Strides of op(X), or of its transpose where ``flip``."""
        return self.arrays[x.name].strides[:: -1 if x.trans != flip else 1]

    def sum_into(self, dest: str, dest_strides: tuple[int, int], rows: int, cols: int,
                 terms: tuple[Addend, ...], label: str, flip: bool = False) -> list[str]:
        """Loops setting ``dest`` (rows x cols) to the sum of ``terms`` (transposed where
        ``flip``), along ``dest``'s memory; one factor per term, named after ``label``."""
        lines, sums = [], []
        for i, x in enumerate(terms):
            s0, s1 = self.strides(x, flip)
            lines.append(f"{self.ctype} {label}{i} = "
                         f"{_factor(x.factor, self.params, self.ctype)};")
            sums.append(f"{label}{i} * {self.arrays[x.name].pointer}[i * {s0} + j * {s1}]")
        loops = [("i", rows), ("j", cols)][:: 1 if dest_strides[1] == 1 else -1]
        lines.extend(f"{'    ' * d}for (int64_t {v} = 0; {v} < {extent}; {v}++)"
                     for d, (v, extent) in enumerate(loops))
        r, q = dest_strides
        lines.append(f"        {dest}[i * {r} + j * {q}] = {' + '.join(sums)};")
        return lines

    def operand(self, terms: tuple[Addend, ...], rows: int, cols: int, label: str,
                lines: list[str]) -> tuple[str, tuple[int, int]]:
        """A pointer to op(X) (rows x cols) and its strides: the operand itself, or a
        scratch array holding the sum of its terms (the loops appended to ``lines``)."""
        if len(terms) == 1 and terms[0].factor == Factor():
            return self.arrays[terms[0].name].pointer, self.strides(terms[0])
        buf = self._scratch(rows * cols)
        # where every term is transposed, the sum is formed as the terms lie (rows read
        # along memory) and passed transposed
        if all(x.trans for x in terms):
            lines += self.sum_into(buf, (rows, 1), cols, rows, terms, label, flip=True)
            return buf, (1, rows)
        lines += self.sum_into(buf, (cols, 1), rows, cols, terms, label)
        return buf, (cols, 1)

    def gemm(self, m: int, n: int, k: int, a_strides: tuple[int, int],
             b_strides: tuple[int, int]) -> Function:
        """The spine's GEMM function for this shape and these layouts (C by rows)."""
        plan = plan_for("auto", m, n, k, self.dtype, machine=self.target.machine,
                        isa=self.target.isa, a_unit_cols=a_strides[1] == 1,
                        b_unit_cols=b_strides[1] == 1, b_unit_rows=b_strides[0] == 1)
        if plan not in self.gemms:
            self.gemms[plan] = lowered_gemm(self.dtype, plan, self.target.isa, "c",
                                            suffix=f"_{len(self.gemms)}")[2]
        module = self.gemms[plan]
        return module.function(module.entry)

    def step(self, stmt: GemmStatement) -> None:
        """The lines computing ``stmt``, in a block of their own."""
        ctype, lines = self.ctype, []
        m, n, k = stmt.extents({name: (a.rows, a.cols) for name, a in self.arrays.items()})
        x = self.operand(stmt.a, m, k, "a", lines)
        y = self.operand(stmt.b, k, n, "b", lines)
        c = self.arrays[stmt.out]
        c_st = c.strides
        if c_st[1] != 1:  # C by columns: compute C' = op(B)' op(A)', rows C's columns
            x, y = (y[0], y[1][::-1]), (x[0], x[1][::-1])
            m, n, c_st = n, m, c_st[::-1]
        entry = self.gemm(m, n, k, x[1], y[1])
        extents = [str(m), str(n), str(k)] if entry.params[0].dtype == "i64" else []
        lines.append(f"{ctype} alpha = {_factor(stmt.alpha, self.params, ctype)};")
        full = (c.pointer, c.strides, c.rows, c.cols)
        if not stmt.addends:
            lines.append(f"{ctype} beta = 0;")
        elif (beta := stmt.beta) is not None:
            lines += [f"{ctype} beta = {_factor(beta, self.params, ctype)};",
                      "if (beta == 0) {  /* 0*C, as written: NaN and infinity stay */"]
            zero = Addend(stmt.out, False, Factor(literal=0.0))
            lines += ["    " + line for line in self.sum_into(*full, (zero,), "z")]
            lines += ["    beta = 1;", "}"]
        else:  # C = the sum of the addends, then C += alpha op(A) op(B)
            lines += self.sum_into(*full, stmt.addends, "f")
            lines.append(f"{ctype} beta = 1;")
        args = [*extents, "alpha", x[0], *map(str, x[1]), y[0], *map(str, y[1]), "beta",
                c.pointer, *map(str, c_st)]
        lines.append(f"if ({entry.name}({', '.join(args)})) goto done;")
        self.body += ["{", *("    " + line for line in lines), "}"]


def c_params(specs: tuple[ArgSpec, ...], names: list[str]) -> str:
    """The C parameter list of a program's entry: ``specs`` in order, called ``names``
    (arrays by restrict pointer, const where only read; scalars by value)."""
    params = [(f"{'const ' if s.role == IN else ''}{_C_TYPE[s.dtype]} *restrict {n}"
               if s.kind == ARRAY else f"{_C_TYPE[s.dtype]} {n}")
              for s, n in zip(specs, names, strict=True)]
    return ", ".join(params) or "void"


def gemm_program_source(program: GemmProgram, specs: tuple[ArgSpec, ...], name: str,
                        target: Target) -> str:
    """C source defining ``int name(...)``: ``program``'s steps computed by the spine's
    GEMM on ``target``. Parameters are named ``p0, p1...`` after their place in
    ``specs`` (names the user gave never reach the C); the function returns 0, or 1
    where memory could not be allocated."""
    entry = _Entry(specs, program, target)
    for stmt in program.steps:
        entry.step(stmt)
    ctype = entry.ctype
    # every scratch pointer is NULL or allocated when a step fails (free(NULL) is no-op)
    head = ["int status = 1;", *(f"{ctype} *{p} = NULL;" for p, _ in entry.scratch)]
    for pointer, elements in entry.scratch:
        head.append(f"if (!({pointer} = malloc(sizeof({ctype}) * {elements}))) goto done;")
    tail = ["status = 0;", "done:", *(f"free({p});" for p, _ in entry.scratch),
            "return status;"]
    functions: dict[str, Function] = {}
    for module in entry.gemms.values():
        for f in module.functions:  # the packing routines are the same in every plan
            assert functions.setdefault(f.name, f) == f, f.name
    unit = Module(tuple(functions.values()), entry=next(iter(functions)))
    entries = [m.entry for m in entry.gemms.values()]
    return (c_backend.render_modules((unit,), target.isa, opaque=entries)
            + f"\n/* the program's signature: {len(program.steps)} GEMM step(s) */\n"
            + f"int {name}({c_params(specs, [f'p{i}' for i in range(len(specs))])}) {{\n"
            + "".join(f"    {line}\n" for line in [*head, *entry.body, *tail]) + "}\n")
