"""A fixed-size program of GEMMs computed by the spine: its C source.

For each step of the program (``transform.as_gemm.GemmProgram``), the spine's GEMM for
its shape and layouts (``strategy.gemm.plan_for``, lowered for the C backend; steps that
plan alike share one function), and an entry function with the program's own signature
(the one ``runtime.pycall.wrapper_source`` calls, parameters in ``arg_specs`` order) that
calls them in order with the fixed extents, strides and scalar factors. Statements that
are not GEMMs (``Others``) are calls, in their place, of the small path's kernels for
them, which the caller plans and this unit defines. A statement's
meaning is kept: where it reads its output (``beta*C``) and beta is 0 at run time, C is
first multiplied by 0, so that a NaN or infinity in it still reaches the result, as it
does on the small path; the spine alone would not read C then (BLAS). Other addends
(``D = A*B + E``) are summed into the output first, which the GEMM then adds the product
to (beta = 1). An operand of a product that is a sum of matrices is summed into a scratch
array, and a chain's products between steps go to scratch arrays too. The entry allocates
these and the GEMMs' packing buffers (``caller_scratch``; one buffer of each kind for
all steps, as large as the largest step needs) before anything is computed and frees
them at the end: where an allocation fails it returns 1 with no output written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..backend import c as c_backend
from ..ir import kernel as k
from ..ir.interp import value_of
from ..ir.kernel import Function, Module
from ..strategy.gemm import Plan, plan_for
from ..transform.as_gemm import Addend, Factor, GemmProgram, GemmStatement, Others
from .gemm import Target, lowered_gemm
from .signature import ARRAY, IN, SCALAR, ArgSpec

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


def caller_scratch(f: Function) -> tuple[Function, tuple[k.Alloc, ...]]:
    """``f`` with its scratch buffers given by its caller: each ``Alloc`` becomes a
    pointer parameter (after the others, named after the buffer) and its ``Free`` goes,
    so ``f`` cannot fail and returns nothing. The allocations are returned, to be made
    by the caller at ``f``'s extents."""
    allocs = tuple(s for s in f.body if isinstance(s, k.Alloc))
    body = tuple(s for s in f.body if not isinstance(s, (k.Alloc, k.Free)))
    params = (*f.params, *(k.Param(a.buf, a.dtype, pointer=True) for a in allocs))
    return replace(f, params=params, body=body, status=False), allocs


def _factor(f: Factor, params: dict[str, str], ctype: str) -> str:
    """C for a product of scalars, in the program's type."""
    literal = f.sign * f.literal
    return " * ".join([f"({ctype})({literal.hex()})", *(params[n] for n in f.names)])


class _Entry:
    """The entry function's body as it is written, step by step."""

    def __init__(self, specs: tuple[ArgSpec, ...], program: GemmProgram,
                 target: Target) -> None:
        self.pointers = {s.name: f"p{i}" for i, s in enumerate(specs) if s.by_pointer}
        # what names a parameter in C: an array's pointer, a scalar's value
        self.params = {s.name: f"(*p{i})" if s.kind == SCALAR and s.by_pointer else f"p{i}"
                       for i, s in enumerate(specs)}
        self.dtype = specs[0].dtype
        self.ctype = _C_TYPE[self.dtype]
        self.target = target
        self.arrays = {s.name: _Array(self.params[s.name], s.rows, s.cols, _strides(s))
                       for s in specs if s.kind == ARRAY}
        self.scratch: dict[str, int] = {}  # pointer -> elements
        for name, (rows, cols) in program.temps:
            self.arrays[name] = _Array(self._scratch(rows * cols), rows, cols, (cols, 1))
        self.body: list[str] = []
        # the GEMM module of each plan, its entry taking its packing buffers
        self.gemms: dict[Plan, tuple[Module, tuple[k.Alloc, ...]]] = {}
        self.parts: list[Module] = []  # the small path's kernels of the Others steps

    def _scratch(self, elements: int, pointer: str = "") -> str:
        """A scratch array of at least ``elements``, new or (``pointer`` given) the
        one of that name, grown to fit."""
        pointer = pointer or f"s{len(self.scratch)}"
        self.scratch[pointer] = max(elements, self.scratch.get(pointer, 0))
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
            module = lowered_gemm(self.dtype, plan, self.target.isa, "c",
                                  suffix=f"_{len(self.gemms)}")[2]
            entry, allocs = caller_scratch(module.function(module.entry))
            functions = tuple(entry if f.name == entry.name else f for f in module.functions)
            self.gemms[plan] = (replace(module, functions=functions), allocs)
        module, allocs = self.gemms[plan]
        return module.function(module.entry), allocs

    def others(self, module: Module, specs: tuple[ArgSpec, ...]) -> None:
        """The call of ``module``'s entry, the small path's kernel of an ``Others`` step,
        whose parameters are ``specs``."""
        entry = module.function(module.entry)
        args = ", ".join(self.pointers[s.name] if s.by_pointer else self.params[s.name]
                         for s in specs)
        call = f"{entry.name}({args})"
        self.body.append(f"if ({call}) goto done;" if entry.status else f"{call};")
        self.parts.append(module)

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
        entry, allocs = self.gemm(m, n, k, x[1], y[1])
        extents = [str(m), str(n), str(k)] if entry.params[0].dtype == "i64" else []
        # packing buffers shared by every step (one at a time), sized for this one too
        known = {"m": m, "n": n, "k": k}  # the GEMM's extents (``ir.structured.matmul``)
        packs = [self._scratch(value_of(a.size, known), f"pack_{a.buf}") for a in allocs]
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
                c.pointer, *map(str, c_st), *packs]
        lines.append(f"{entry.name}({', '.join(args)});")
        self.body += ["{", *("    " + line for line in lines), "}"]


def c_params(specs: tuple[ArgSpec, ...], names: list[str]) -> str:
    """The C parameter list of a program's entry: ``specs`` in order, called ``names``
    (arrays by restrict pointer, const where only read; input scalars by value, the
    others by pointer)."""
    params = [(f"{'const ' if s.role == IN else ''}{_C_TYPE[s.dtype]} *restrict {n}"
               if s.by_pointer else f"{_C_TYPE[s.dtype]} {n}")
              for s, n in zip(specs, names, strict=True)]
    return ", ".join(params) or "void"


def gemm_program_source(program: GemmProgram, specs: tuple[ArgSpec, ...], name: str,
                        target: Target, parts: Sequence[tuple[Module, tuple[ArgSpec, ...]]]
                        = ()) -> str:
    """C source defining ``int name(...)``: ``program``'s steps computed by the spine's
    GEMM on ``target``. Parameters are named ``p0, p1...`` after their place in
    ``specs`` (names the user gave never reach the C); the function returns 0, or 1
    where memory could not be allocated (then before it has written anything).
    ``parts``: for each ``Others`` step in order, the small path's kernel of its
    statements (for ``target``'s ISA; entry functions named apart) and its parameters."""
    entry = _Entry(specs, program, target)
    others = iter(parts)
    for stmt in program.steps:
        if isinstance(stmt, Others):
            entry.others(*next(others))
        else:
            entry.step(stmt)
    assert next(others, None) is None, "a kernel for each Others step"
    ctype = entry.ctype
    head: list[str] = []
    tail = ["return 0;"]  # where nothing is allocated and no part can fail
    if entry.scratch or any(m.function(m.entry).status for m in entry.parts):
        # all scratch is allocated before the first step writes anything; every pointer
        # is NULL or allocated where an allocation fails (blacc_free(NULL) does nothing)
        head = ["int status = 1;", *(f"{ctype} *{p} = NULL;" for p in entry.scratch)]
        head += [f"if (!({p} = ({ctype} *)blacc_alloc(64, sizeof({ctype}) * {elements}))) "
                 "goto done;" for p, elements in entry.scratch.items()]
        tail = ["status = 0;", "done:", *(f"blacc_free({p});" for p in entry.scratch),
                "return status;"]
    functions: dict[str, Function] = {}
    for module, _ in entry.gemms.values():
        for f in module.functions:  # the packing routines are the same in every plan
            assert functions.setdefault(f.name, f) == f, f.name
    unit = Module(tuple(functions.values()), entry=next(iter(functions)))
    entries = [m.entry for m, _ in entry.gemms.values()] + [m.entry for m in entry.parts]
    steps = f"{len(program.gemms)} GEMM step(s)" + (f", {len(entry.parts)} of the small path"
                                                   if entry.parts else "")
    return (c_backend.render_modules((unit, *entry.parts), target.isa, opaque=entries,
                                     allocates=bool(entry.scratch))
            + f"\n/* the program's signature: {steps} */\n"
            + f"int {name}({c_params(specs, [f'p{i}' for i in range(len(specs))])}) {{\n"
            + "".join(f"    {line}\n" for line in [*head, *entry.body, *tail]) + "}\n")
