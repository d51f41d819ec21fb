"""Render lowered kernel IR as C99 (with the ISA's intrinsics when it has vectors).

``render(module, isa) -> str``. Rendering is separate from compiling: see
``backend.compiler`` and ``runtime.cache``. Vector operations are printed with the
ISA's templates; scalar ones with C operators. Exported functions that allocate scratch
return ``int``: 0 on success, 1 when a scratch allocation failed (``Function.status``);
the others return nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from ..errors import ScheduleError
from ..ir import kernel as k
from ..ir.dtypes import itemsize
from ..ir.walk import names_used, read_back_buffers, rewrite, simplify
from ..target.isa import GENERIC, Isa

_SCALAR = {"f32": "float", "f64": "double", "i64": "int64_t", "i32": "int32_t", "bool": "int"}
_INFIX = {"+", "-", "*", "/", "%", "<", "<=", "==", "!=", "and"}


class _Renderer:
    def __init__(self, isa: Isa) -> None:
        self.isa = isa
        self.read_back: frozenset[str] = frozenset()  # of the function being printed
        self.locals: list[str] = []  # its local arrays declared so far
        self.heap: dict[str, k.Local] = {}  # those of them allocated, by name
        self.written: list[str] = []  # its local arrays stored to so far

    # ------------------------------------------------------------------ types and values
    def type(self, dtype: str, lanes: int) -> str:
        if lanes == 1:
            return _SCALAR[dtype]
        vec = self.isa.vector_type(dtype, lanes)
        if vec is None:
            raise ScheduleError(f"target {self.isa.name} has no {lanes}-lane {dtype} vector")
        return vec.c_name

    def const(self, e: k.Const) -> str:
        if e.dtype == "f32":
            return f"{float(e.value)!r}f"
        if e.dtype == "f64":
            return repr(float(e.value))
        return str(int(e.value))

    def addr(self, buf: str, index: k.Expr) -> str:
        idx = self.expr(index)
        return buf if idx == "0" else f"&{buf}[{idx}]"

    def mask(self, dtype: str, count: k.Expr, lanes: int) -> str:
        return self.isa.op("mask", dtype, lanes).format(count=self.expr(count))

    def expr(self, e: k.Expr) -> str:  # noqa: C901 - one case per node
        if isinstance(e, k.Const):
            return self.const(e)
        if isinstance(e, k.Var):
            return e.name
        if isinstance(e, k.Bin):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.lanes > 1:
                return self.isa.op(e.op, e.dtype, e.lanes).format(a=a, b=b)
            if e.op == "min":
                return f"({a} < {b} ? {a} : {b})"
            if e.op == "max":
                return f"({a} > {b} ? {a} : {b})"
            op = "&&" if e.op == "and" else e.op
            return f"({a} {op} {b})"
        if isinstance(e, k.Load):
            if e.lanes == 1:
                return f"{e.buf}[{self.expr(e.index)}]"
            addr = self.addr(e.buf, e.index)
            if e.count is None:
                return self.isa.op("load", e.dtype, e.lanes).format(addr=addr)
            if self.isa.plain_moves("load", e.dtype, e.lanes, k.const_value(e.count),
                                    read_back=e.buf in self.read_back, past_end=e.past_end):
                return self.load_first(e)
            mask = self.mask(e.dtype, e.count, e.lanes)
            return self.isa.op("mask_load", e.dtype, e.lanes).format(addr=addr, mask=mask)
        if isinstance(e, k.Broadcast):
            v = e.value
            if isinstance(v, k.Load) and v.lanes == 1 and v.count is None:
                addr = self.addr(v.buf, v.index)
                return self.isa.op("broadcast_load", e.dtype, e.lanes).format(addr=addr)
            return self.isa.op("splat", e.dtype, e.lanes).format(x=self.expr(v))
        if isinstance(e, k.Fma):
            a, b, c = self.expr(e.a), self.expr(e.b), self.expr(e.c)
            if e.lanes > 1:
                return self.isa.op("fma", e.dtype, e.lanes).format(a=a, b=b, c=c)
            return f"({a} * {b} + {c})"
        if isinstance(e, k.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, k.Ref):
            return self.addr(e.buf, e.index)
        if isinstance(e, k.Reduce):
            return self.isa.op("hsum", e.dtype, e.x.lanes).format(x=self.expr(e.x))
        if isinstance(e, k.SumLanes):
            xs = {f"x{i}": self.expr(x) for i, x in enumerate(e.xs)}
            name = {1: "sum_lanes", 2: "sum_halves"}.get(e.rows_per_vector, "sum_quarters")
            return self.isa.op(name, e.dtype, e.lanes).format(**xs)
        if isinstance(e, k.SumRows):
            xs = {f"x{i}": self.expr(x) for i, x in enumerate(e.xs)}
            return self.isa.op(f"sum_rows{len(e.xs)}", e.dtype, e.xs[0].lanes).format(**xs)
        if isinstance(e, k.BuildVector):
            xs = ", ".join(self.expr(x) for x in e.xs)
            return self.isa.op("build", e.dtype, e.lanes).format(xs=xs)
        if isinstance(e, (k.Halves, k.HalfSplat, k.Half)):
            return self.halves(e)
        if isinstance(e, k.Spread):  # a load into every lane of each part, one shuffle
            self.type(e.dtype, e.lanes)
            return self.isa.op(f"spread{e.parts}", e.dtype, e.lanes).format(
                addr=self.addr(e.x.buf, e.x.index))
        if isinstance(e, k.Permute):  # on the whole vector, then its first lanes
            index = ", ".join(map(str, e.lanes_from + (0,) * (e.x.lanes - e.lanes)))
            whole = (self.isa.op("permute", e.dtype, e.x.lanes).format(x=self.expr(e.x),
                                                                       index=index)
                     if e.y is None else
                     self.isa.op("permute2", e.dtype, e.x.lanes).format(
                         x=self.expr(e.x), y=self.expr(e.y), index=index))
            part = {1: None, 2: "half_lo", 4: "quarter_lo"}[e.x.lanes // e.lanes]
            return whole if part is None else self.isa.op(part, e.dtype, e.x.lanes).format(
                x=whole)
        if isinstance(e, k.ShiftDown):  # the target's template takes the shift in bytes
            return self.isa.op("shift_down", e.dtype, e.lanes).format(
                x=self.expr(e.x), bytes=e.by * itemsize(e.dtype))
        if isinstance(e, (k.Zip, k.Unzip)):
            name = (("zip_lo", "zip_hi")[e.half] if isinstance(e, k.Zip)
                    else ("unzip_even", "unzip_odd")[e.odd])
            return self.isa.op(name, e.dtype, e.lanes).format(a=self.expr(e.a),
                                                               b=self.expr(e.b))
        raise TypeError(f"the C backend cannot print {type(e).__name__}")

    # A leftover vector of a known count moves as plain loads and stores of its first
    # lanes where they beat masked ones (``Isa.plain_moves``); a full vector as its halves.
    def load_first(self, e: k.Load) -> str:
        """Plain loads of the first lanes (``Isa.plain_moves``): the low half zero-extended
        to the full width, or joined with the rest in the high half."""
        count, half = int(e.count.value), e.lanes // 2
        if e.lanes == self.isa.widths(e.dtype)[-2]:  # the narrowest vector
            return self.isa.op(f"load_first{count}", e.dtype, e.lanes).format(
                addr=self.addr(e.buf, e.index))
        if count > half:
            lo = k.Load(e.buf, e.index, e.dtype, half)
            hi = replace(e, index=simplify(e.index + half), lanes=half,
                         count=k.Const(count - half))
            return self.isa.op("join", e.dtype, e.lanes).format(lo=self.expr(lo),
                                                                 hi=self.expr(hi))
        lo = replace(e, lanes=half, count=None if count == half else e.count)
        return self.isa.op("zext", e.dtype, e.lanes).format(x=self.expr(lo))

    def store_first(self, buf: str, index: k.Expr, x: str, dtype: str, lanes: int,
                    count: int) -> list[str]:
        half = lanes // 2
        if lanes == self.isa.widths(dtype)[-2]:  # the narrowest vector
            return [self.isa.op(f"store_first{count}", dtype, lanes).format(
                addr=self.addr(buf, index), x=x)]
        lo = self.isa.op("half_lo", dtype, lanes).format(x=x)
        if count < half:
            return self.store_first(buf, index, lo, dtype, half, count)
        out = [self.isa.op("store", dtype, half).format(addr=self.addr(buf, index), x=lo)]
        if count > half:
            hi = self.isa.op("half_hi", dtype, lanes).format(x=x)
            out += self.store_first(buf, simplify(index + half), hi, dtype, half, count - half)
        return out

    def halves(self, e: k.Halves | k.HalfSplat | k.Half) -> str:
        """The half-vector nodes; the full vector must be one of the target's."""
        full = e.x.lanes if isinstance(e, k.Half) else e.lanes
        self.type(e.dtype, full)  # rejects a width the target lacks
        if isinstance(e, k.Halves):
            lo = e.lo
            if lo == e.hi and isinstance(lo, k.Load) and lo.count is None and lo.lanes > 1:
                # one load duplicated into both halves (vbroadcastf128)
                addr = self.addr(lo.buf, lo.index)
                return self.isa.op("dup_load", e.dtype, e.lanes).format(addr=addr)
            quarter = k.quartered_load(e)
            if quarter is not None:  # one load in all four quarters (vbroadcastf32x4)
                addr = self.addr(quarter.buf, quarter.index)
                return self.isa.op("quad_load", e.dtype, e.lanes).format(addr=addr)
            return self.isa.op("halves", e.dtype, e.lanes).format(lo=self.expr(lo),
                                                                  hi=self.expr(e.hi))
        if isinstance(e, k.HalfSplat):
            name = "half_splat" if e.parts == 2 else "quarter_splat"
            return self.isa.op(f"{name}{e.lane}", e.dtype, e.lanes).format(
                x=self.expr(e.x))
        name = "half_hi" if e.which else "half_lo"
        return self.isa.op(name, e.dtype, e.x.lanes).format(x=self.expr(e.x))

    # ------------------------------------------------------------------ statements
    def stmts(self, body: tuple[k.Stmt, ...], indent: int) -> list[str]:
        return [line for s in body for line in self.stmt(s, indent)]

    def stmt(self, s: k.Stmt, indent: int) -> list[str]:  # noqa: C901 - one case per node
        pad = "    " * indent
        if isinstance(s, k.Comment):
            return [f"{pad}/* {s.text} */"]
        if isinstance(s, k.Decl):
            decl = (f"{pad}{self.type(s.var.dtype, s.var.lanes)} {s.var.name} = "
                    f"{self.expr(s.value)};")
            if s.in_register and s.var.lanes > 1 and self.isa.register_constraint:
                return [decl, f"{pad}BLACC_IN_REGISTER({s.var.name});"]
            return [decl]
        if isinstance(s, k.Assign):
            return [f"{pad}{s.var.name} = {self.expr(s.value)};"]
        if isinstance(s, k.Store):
            if s.buf in self.locals and s.buf not in self.written:
                self.written.append(s.buf)
            lanes = s.value.lanes
            if lanes == 1:
                return [f"{pad}{s.buf}[{self.expr(s.index)}] = {self.expr(s.value)};"]
            addr, x = self.addr(s.buf, s.index), self.expr(s.value)
            dt = s.value.dtype
            if s.count is None:
                return [f"{pad}{self.isa.op('store', dt, lanes).format(addr=addr, x=x)};"]
            if self.isa.plain_moves("store", dt, lanes, k.const_value(s.count),
                                    read_back=s.buf in self.read_back, past_end=s.past_end):
                # the value is used by several stores: computed once, in a block of its own
                part = "blacc_part"
                stores = self.store_first(s.buf, s.index, part, dt, lanes, int(s.count.value))
                return [f"{pad}{{", f"{pad}    {self.type(dt, lanes)} {part} = {x};",
                        *(f"{pad}    {line};" for line in stores), f"{pad}}}"]
            mask = self.mask(dt, s.count, lanes)
            store = self.isa.op("mask_store", dt, lanes).format(addr=addr, mask=mask, x=x)
            return [f"{pad}{store};"]
        if isinstance(s, k.For):
            v = s.var.name
            head = (f"{pad}for (int64_t {v} = {self.expr(s.start)}; {v} < {self.expr(s.stop)}; "
                    f"{v} += {s.step}) {{")
            hint = (["#if defined(__GNUC__)", f"{pad}#pragma GCC unroll {s.unroll}", "#endif"]
                    if s.unroll > 1 else [])
            return [*hint, head, *self.stmts(s.body, indent + 1), f"{pad}}}"]
        if isinstance(s, k.If):
            lines = [f"{pad}if ({self.expr(s.cond)}) {{", *self.stmts(s.then, indent + 1)]
            if s.orelse:
                lines += [f"{pad}}} else {{", *self.stmts(s.orelse, indent + 1)]
            return [*lines, f"{pad}}}"]
        if isinstance(s, k.Local):
            self.locals.append(s.buf)
            if s.heap:  # allocated where the function starts
                return []
            return [f"{pad}{_SCALAR[s.dtype]} {s.buf}[{s.size}];"]
        if isinstance(s, k.Alloc):
            t = _SCALAR[s.dtype]
            size = f"(size_t)({self.expr(s.size)}) * sizeof({t})"
            return [f"{pad}{s.buf} = ({t} *)blacc_alloc({s.align}, {size});",
                    f"{pad}if (!{s.buf}) goto out_of_memory;"]
        if isinstance(s, k.Free):
            return [f"{pad}blacc_free({s.buf});"]
        if isinstance(s, k.Call):
            return [f"{pad}{s.func}({', '.join(self.expr(a) for a in s.args)});"]
        if isinstance(s, k.Barrier):
            # gcc lets a memory clobber pass a local array whose address never escapes,
            # so a barrier that holds for locals names those written so far
            return [f"{pad}BLACC_BARRIER();", *(f"{pad}BLACC_IN_MEMORY({self.array(buf)});"
                                                for buf in (self.written if s.locals else ()))]
        if isinstance(s, k.Prefetch):
            return [f"{pad}BLACC_PREFETCH({self.addr(s.buf, s.index)}, {int(s.write)});"]
        raise TypeError(f"the C backend cannot print {type(s).__name__}; lower it first")

    # ------------------------------------------------------------------ functions
    def param(self, p: k.Param) -> str:
        if p.pointer:
            return f"{'const ' if p.const else ''}{_SCALAR[p.dtype]} *restrict {p.name}"
        return f"{_SCALAR[p.dtype]} {p.name}"

    def signature(self, f: k.Function) -> str:
        # Helpers stay out of line: inlined into the loop nest, the micro-kernel's
        # accumulators compete with the nest's variables and the register allocator
        # starts moving them around inside the k loop.
        ret = ("int" if f.status else "void") if f.exported else "BLACC_NOINLINE static void"
        return f"{ret} {f.name}({', '.join(self.param(p) for p in f.params)})"

    def array(self, buf: str) -> str:
        """A local array as an lvalue of its whole extent (a heap one through its
        pointer), for an asm statement to read and write."""
        if buf not in self.heap:
            return buf
        local = self.heap[buf]
        return f"*({_SCALAR[local.dtype]} (*)[{local.size}]){buf}"

    def function(self, f: k.Function) -> str:
        allocs = [s for s in f.body if isinstance(s, k.Alloc)]
        self.heap = {s.buf: s for s in f.body if isinstance(s, k.Local) and s.heap}
        heap_lines = [line for s in self.heap.values()
                      for line in self.stmts((k.Alloc(s.buf, s.dtype, k.Const(s.size)),), 1)]
        if (allocs or self.heap) and not (f.exported and f.status):
            raise ScheduleError(f"{f.name}: scratch buffers belong to the entry function, "
                                "which returns a status")
        # Scratch pointers start NULL so that the failure path may free them all.
        # An entry keeps its ABI even where a parameter was fixed at compile time.
        used = names_used(f.body)
        self.read_back = read_back_buffers(f.body)
        self.locals, self.written = [], []
        # An entry starts on a cache line: where a kernel of a few nanoseconds starts
        # decides how many 64-byte fetch blocks it spans, and so its speed (C = A*B
        # 4 x 4 x 4 f32 on Zen 5 ran 1.00-1.01 ns starting 1 or 16 bytes into a line,
        # 1.27-1.28 at 32 or 48).
        head = f"BLACC_ENTRY {self.signature(f)}" if f.exported else self.signature(f)
        scratch = [*allocs, *self.heap.values()]
        lines = [head + " {",
                 *[f"    (void){p.name};" for p in f.params if p.name not in used],
                 *[f"    {_SCALAR[s.dtype]} *restrict {s.buf} = NULL;" for s in scratch],
                 *heap_lines,  # before anything is written
                 *self.stmts(f.body, 1)]
        if f.exported and f.status:
            lines += [*(f"    blacc_free({s.buf});" for s in self.heap.values()),
                      "    return 0;"]
        if scratch:
            lines += ["out_of_memory:", *[f"    blacc_free({s.buf});" for s in scratch],
                      "    return 1;"]
        lines.append("}")
        return "\n".join(lines)


def _reject_matrix_values(module: k.Module) -> None:
    """C has no matrix intrinsics: matrix values must have been expanded before."""
    def visit(x: object) -> object:
        if isinstance(x, (k.MatrixLoad, k.MatrixMultiply, k.MatrixStore)):
            raise ScheduleError(f"the C backend cannot print {type(x).__name__}: expand matrix "
                                "values first (transform.lower_matrix.expand_matrix, which "
                                "lower(..., backend='c') runs)")
        return x

    for f in module.functions:
        rewrite(f.body, visit)


def signature(func: k.Function) -> str:
    """The C prototype of ``func`` (without the trailing semicolon)."""
    return _Renderer(GENERIC).signature(func)


def render(module: k.Module, isa: Isa) -> str:
    """The module as one C translation unit."""
    return render_modules((module,), isa)


# Aligned scratch from malloc alone: aligned_alloc is C11 and posix_memalign POSIX, and
# an emitted kernel is C99. The block malloc returned is kept just before the aligned one.
_ALIGNED_ALLOC = """\
static void *blacc_alloc(size_t align, size_t size) {
    unsigned char *block;
    uintptr_t start;
    if (size > SIZE_MAX - align - sizeof(void *)) return NULL;
    block = (unsigned char *)malloc(size + align + sizeof(void *));
    if (!block) return NULL;
    start = ((uintptr_t)(block + sizeof(void *)) + (align - 1)) & ~(uintptr_t)(align - 1);
    ((void **)start)[-1] = block;
    return (void *)start;
}
static void blacc_free(void *p) {
    if (p) free(((void **)p)[-1]);
}"""


def render_modules(modules: Sequence[k.Module], isa: Isa, opaque: Collection[str] = (),
                   allocates: bool = False) -> str:
    """Several modules as one C translation unit, which includes the ISA's header and
    defines the helpers once (a measuring search compiles its candidates together:
    parsing immintrin.h is most of the time gcc takes for a small kernel). Their
    functions' names must differ. The exported functions named in ``opaque`` are
    declared static (called within the unit only), and so that calls from code added to
    the unit see neither their bodies nor their arguments' values (GCC's ``noipa``):
    called with constant extents and strides, gcc 12 otherwise compiled a copy of a
    spine GEMM for them, 8 x 1000 x 1000 f32 at 0.83x the speed of the same function
    called from outside. ``allocates``: code added to the unit allocates scratch with
    ``blacc_alloc``/``blacc_free``, which are defined even where no function here does."""
    functions = [f for m in modules for f in m.functions]
    if len({f.name for f in functions}) < len(functions):
        raise ScheduleError("modules rendered into one translation unit need distinct "
                            "function names")
    for m in modules:
        _reject_matrix_values(m)
    r = _Renderer(isa)
    head = ["/* generated by blacc; target: " + isa.name + " */",
            "#include <stdint.h>", "#include <stdlib.h>", "#include <stddef.h>"]
    if isa.header:
        head.append(f"#include <{isa.header}>")
    protos = [r.signature(f) + ";" for f in functions if not f.exported]
    # static: the unit's own entry calls them, and two units linked together (two
    # emitted kernels) must not both export a GEMM of the same name
    protos += [f"BLACC_OPAQUE static {r.signature(f)};" for f in functions
               if f.exported and f.name in opaque]
    bodies = [r.function(f) for f in functions]
    text = "\n".join(bodies)
    # Empty asm statements, for GNU C compilers only, defined where used:
    # BLACC_IN_REGISTER(v) takes v in a vector register, so the compiler cannot fold v's
    # load into each of its uses (``k.Decl.in_register``); BLACC_BARRIER() is a compiler
    # barrier (``k.Barrier``), and BLACC_IN_MEMORY(a) extends it to the local array a.
    optional = {
        "BLACC_IN_REGISTER(v)": f'__asm__("" : "+{isa.register_constraint}"(v))',
        "BLACC_BARRIER()": '__asm__ __volatile__("" ::: "memory")',
        "BLACC_IN_MEMORY(a)": '__asm__ __volatile__("" : "+m"(a))',
    }
    used_asm = [macro for macro in optional if macro.split("(")[0] + "(" in text]
    head += ["#if defined(__GNUC__)",
             "#define BLACC_PREFETCH(p, w) __builtin_prefetch((p), (w), 3)",
             "#define BLACC_NOINLINE __attribute__((noinline))",
             "#define BLACC_ENTRY __attribute__((aligned(64)))",
             *(f"#define {macro} {optional[macro]}" for macro in used_asm),
             "#else",
             "#define BLACC_PREFETCH(p, w) ((void)0)",
             "#define BLACC_NOINLINE",
             "#define BLACC_ENTRY",
             *(f"#define {macro} ((void)0)" for macro in used_asm),
             "#endif"]
    if opaque:
        head += ["#if defined(__GNUC__) && !defined(__clang__)",
                 "#define BLACC_OPAQUE __attribute__((noipa))",
                 "#elif defined(__GNUC__)",
                 "#define BLACC_OPAQUE __attribute__((noinline))",
                 "#else",
                 "#define BLACC_OPAQUE",
                 "#endif"]
    if allocates or "blacc_alloc(" in text:
        head.append(_ALIGNED_ALLOC)
    # Helpers in dependency order (the table lists callees first); one may call another.
    used = [name for name in isa.prelude if name in text]
    used += [name for name in isa.prelude
             if name not in used and any(name in isa.prelude[u] for u in used)]
    head += [isa.prelude[name] for name in isa.prelude if name in used]
    return "\n".join(head) + "\n\n" + "\n".join(protos) + "\n\n" + "\n\n".join(bodies) + "\n"
