"""Render lowered kernel IR as LLVM IR text, for the in-process JIT (``backend.jit``).

``render(module, isa) -> str`` prints the same plain nodes as ``backend.c`` with the
meaning ``ir.interp`` gives them, so the backends agree on every program. Choices:

* every variable lives in an ``alloca`` of the entry block, as in unoptimized clang
  output; mem2reg/SROA turn them into SSA values, so loops and branches need no phis;
* pointer parameters are ``noalias`` (C's ``restrict``) and integer ``+ - *`` are
  ``nsw`` (C's signed ``int64_t`` arithmetic may not overflow);
* a vector ``Fma`` is ``llvm.fma`` (the ISA's fused intrinsic) and a scalar one is
  ``llvm.fmuladd`` (what clang makes of ``a * b + c``: fused where the target has it);
  no other fast-math flag is set, so nothing is reassociated;
* loads and stores carry only the element's alignment, as C's pointers do;
* matrix values (``MatrixLoad``, ``MatrixMultiply``, ``MatrixStore``) are LLVM's
  ``llvm.matrix.*`` intrinsics on flat vectors; the multiply, and an add of its product to
  an accumulator, carry ``contract`` so that LLVM's lowering may use multiply-adds (as
  ``llvm.fmuladd`` does for a scalar ``Fma``).
  LLVM lowers them in its -O3 pipeline only under ``-enable-matrix``, which ``backend.jit``
  sets once per process for every module.

The text has no target triple or data layout: ``backend.jit`` sets the host's.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np
from llvmlite.binding import llvm_version_info

from ..errors import ScheduleError
from ..ir import kernel as k
from ..ir.walk import read_back_buffers, rewrite
from ..target.isa import Isa

_SCALAR = {"f32": "float", "f64": "double", "i64": "i64", "i32": "i32", "bool": "i1",
           "ptr": "ptr"}
_SIZE = {"f32": 4, "f64": 8, "i64": 8, "i32": 4, "bool": 1}
_FLOATS = ("f32", "f64")
_ICMP = {"<": "slt", "<=": "sle", "==": "eq", "!=": "ne"}
_FCMP = {"<": "olt", "<=": "ole", "==": "oeq", "!=": "une"}  # C's comparisons on floats
_IARITH = {"+": "add nsw", "-": "sub nsw", "*": "mul nsw", "/": "sdiv", "%": "srem"}
_FARITH = {"+": "fadd", "-": "fsub", "*": "fmul", "/": "fdiv", "%": "frem"}

#: LLVM 22 moved the alignment of masked loads/stores from an i32 operand to an ``align``
#: attribute on the pointer; older versions want the operand.
_MASK_ALIGN_OPERAND = llvm_version_info[0] < 22


def _type(dtype: str, lanes: int) -> str:
    return _SCALAR[dtype] if lanes == 1 else f"<{lanes} x {_SCALAR[dtype]}>"


def _suffix(dtype: str, lanes: int) -> str:
    """The type suffix of an overloaded intrinsic: f32, v8f32, i64, ..."""
    name = {"f32": "f32", "f64": "f64", "i64": "i64", "i32": "i32", "bool": "i1"}[dtype]
    return name if lanes == 1 else f"v{lanes}{name}"


def _mtype(dtype: str, lanes: int) -> str:
    """A matrix value's LLVM type: always a vector, ``<1 x float>`` for one element."""
    return f"<{lanes} x {_SCALAR[dtype]}>"


def _msuffix(dtype: str, lanes: int) -> str:
    return f"v{lanes}{_suffix(dtype, 1)}"


def _literal(value: int | float, dtype: str) -> str:
    """A scalar constant. Floats are printed as the hex of their double value, which is
    exact (an f32 constant must be a double that is exactly representable as float)."""
    if dtype in _FLOATS:
        x = float(np.float32(value)) if dtype == "f32" else float(value)
        bits = struct.unpack("<Q", struct.pack("<d", x))[0]
        return f"0x{bits:016X}"
    if dtype == "bool":
        return "true" if value else "false"
    return str(int(value))


def _speculatable(e: k.Expr) -> bool:
    """Whether evaluating ``e`` unconditionally is safe: no loads (the address may be
    invalid on the path not taken) and no integer division (by zero)."""
    if isinstance(e, (k.Load, k.MatrixLoad)):
        return False
    if isinstance(e, k.Bin) and e.op in ("/", "%") and e.dtype not in _FLOATS:
        return False
    return all(_speculatable(getattr(e, f.name)) for f in dataclasses.fields(e)
               if isinstance(getattr(e, f.name), k.Expr))


def _allocs(body: tuple[k.Stmt, ...]) -> list[k.Alloc]:
    out: list[k.Alloc] = []
    for s in body:
        if isinstance(s, k.Alloc):
            out.append(s)
        elif isinstance(s, k.For):
            out += _allocs(s.body)
        elif isinstance(s, k.If):
            out += _allocs(s.then) + _allocs(s.orelse)
    return out


@dataclass(frozen=True)
class _Val:
    """An SSA value or constant: its text and its kernel IR type."""

    ref: str
    dtype: str
    lanes: int = 1

    @property
    def type(self) -> str:
        return _type(self.dtype, self.lanes)

    @property
    def typed(self) -> str:
        return f"{self.type} {self.ref}"


class _ModuleState:
    """What the functions of one module share: intrinsic declarations and loop ids."""

    def __init__(self, module: k.Module, isa: Isa) -> None:
        self.module = module
        self.isa = isa
        self.declares: dict[str, str] = {}
        self.loops = 0

    def declare(self, name: str, ret: str, args: str) -> None:
        self.declares.setdefault(name, f"declare {ret} @{name}({args})")

    def loop_id(self) -> str:
        """A fresh ``!llvm.loop`` id; ``!0`` is the shared ``mustprogress`` property."""
        self.loops += 1
        return f"!{self.loops}"

    def metadata(self) -> list[str]:
        if not self.loops:
            return []
        return ['!0 = !{!"llvm.loop.mustprogress"}',
                *[f"!{i} = distinct !{{!{i}, !0}}" for i in range(1, self.loops + 1)]]


class _FunctionWriter:
    """Prints one function: entry-block allocas, then the body's blocks."""

    def __init__(self, state: _ModuleState, func: k.Function) -> None:
        self.m = state
        self.f = func
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.count = 0
        self.slots: dict[tuple[str, str, int], str] = {}
        self.buffers: dict[str, tuple[str, str, bool]] = {}  # name -> (pointer, dtype, in slot)
        self.block = "entry.0"
        self.oom = False
        self.read_back = read_back_buffers(func.body)  # moved in plain pieces (plain_moves)

    # ------------------------------------------------------------------ emission helpers
    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}.{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def value(self, instr: str, dtype: str, lanes: int = 1) -> _Val:
        ref = "%" + self.fresh("t")
        self.emit(f"{ref} = {instr}")
        return _Val(ref, dtype, lanes)

    def start(self, label: str) -> None:
        self.lines.append(f"{label}:")
        self.block = label

    def branch(self, cond: _Val, then: str, orelse: str) -> None:
        self.emit(f"br i1 {cond.ref}, label %{then}, label %{orelse}")

    def call(self, name: str, ret: str, args: list[_Val | tuple[str, str]],
             flags: str = "") -> str:
        """``call [flags] ret @name(args)``, declaring ``name``. An argument is a value or a
        pair (type, text as passed: the type, attributes and the value)."""
        pairs = [(a.type, a.typed) if isinstance(a, _Val) else a for a in args]
        self.m.declare(name, ret, ", ".join(t for t, _ in pairs))
        head = f"call {flags} " if flags else "call "
        return f"{head}{ret} @{name}({', '.join(text for _, text in pairs)})"

    # ------------------------------------------------------------------ variables and buffers
    def slot(self, var: k.Var, create: bool = False) -> str:
        key = (var.name, var.dtype, var.lanes)
        if key not in self.slots:
            if not create:
                raise TypeError(f"{self.f.name}: variable {var.name!r} ({var.dtype} x "
                                f"{var.lanes}) is used before it is declared")
            n = sum(1 for name, _, _ in self.slots if name == var.name)
            ref = f"%{var.name}.addr" + (f".{n}" if n else "")
            self.allocas.append(f"  {ref} = alloca {_type(var.dtype, var.lanes)}")
            self.slots[key] = ref
        return self.slots[key]

    def buffer(self, name: str) -> tuple[str, str]:
        """(pointer value, element type) of a parameter or scratch buffer."""
        if name not in self.buffers:
            raise TypeError(f"{self.f.name}: unknown buffer {name!r}")
        ptr, dtype, in_slot = self.buffers[name]
        if in_slot:
            ptr = self.value(f"load ptr, ptr {ptr}", "ptr").ref
        return ptr, dtype

    def address(self, buf: str, index: k.Expr, *, inbounds: bool = True) -> str:
        """``&buf[index]``. Masked accesses and prefetches may point past the buffer, so
        their address is computed without ``inbounds``."""
        ptr, dtype = self.buffer(buf)
        idx = self.expr(index)
        if idx.ref == "0":
            return ptr
        gep = "getelementptr inbounds" if inbounds else "getelementptr"
        return self.value(f"{gep} {_SCALAR[dtype]}, ptr {ptr}, {idx.typed}", "ptr").ref

    # ------------------------------------------------------------------ expressions
    def expr(self, e: k.Expr) -> _Val:  # noqa: C901 - one case per node
        if isinstance(e, k.Const):
            v = _Val(_literal(e.value, e.dtype), e.dtype)
            return self.widen(v, e.lanes)
        if isinstance(e, k.Var):
            return self.value(f"load {_type(e.dtype, e.lanes)}, ptr {self.slot(e)}",
                              e.dtype, e.lanes)
        if isinstance(e, k.Bin):
            return self.binary(e)
        if isinstance(e, k.Load):
            return self.load(e)
        if isinstance(e, k.Broadcast):
            return self.widen(self.expr(e.value), e.lanes)
        if isinstance(e, k.Fma):
            a, b, c = (self.widen(self.expr(x), e.lanes) for x in (e.a, e.b, e.c))
            fused = e.lanes > 1 and ("fma", e.dtype) in self.m.isa.ops
            name = f"llvm.{'fma' if fused else 'fmuladd'}.{_suffix(e.dtype, e.lanes)}"
            return self.value(self.call(name, c.type, [a, b, c]), e.dtype, e.lanes)
        if isinstance(e, k.Select):
            return self.select(e)
        if isinstance(e, k.Reduce):  # a horizontal add, in any order (reassoc)
            x = self.expr(e.x)
            name = f"llvm.vector.reduce.fadd.{_suffix(e.dtype, x.lanes)}"
            start = _Val(_literal(-0.0, e.dtype), e.dtype)
            return self.value(self.call(name, _SCALAR[e.dtype], [start, x], flags="reassoc"),
                              e.dtype)
        if isinstance(e, k.Ref):
            return _Val(self.address(e.buf, e.index), "ptr")
        if isinstance(e, k.MatrixLoad):
            return self.matrix_load(e)
        if isinstance(e, k.MatrixMultiply):
            return self.matrix_multiply(e)
        if isinstance(e, k.BuildVector):  # one insertelement per lane
            vec = _Val("poison", e.dtype, e.lanes)
            for lane, x in enumerate(e.xs):
                vec = self.value(f"insertelement {vec.typed}, {self.expr(x).typed}, "
                                 f"i64 {lane}", e.dtype, e.lanes)
            return vec
        if isinstance(e, (k.Halves, k.HalfSplat, k.Half)):
            return self.halves(e)
        if isinstance(e, k.Spread):
            part = e.lanes // e.parts
            return self.shuffle(self.expr(e.x), None,
                                [q for q in range(e.parts) for _ in range(part)])
        if isinstance(e, k.Permute):
            y = None if e.y is None else self.expr(e.y)
            return self.shuffle(self.expr(e.x), y, list(e.lanes_from))
        if isinstance(e, k.ShiftDown):  # lanes of a zero vector past the end of x's
            x = self.expr(e.x)
            zeros = _Val("zeroinitializer", x.dtype, x.lanes)
            return self.shuffle(x, zeros, [*range(e.by, x.lanes), *[x.lanes] * e.by])
        if isinstance(e, (k.Zip, k.Unzip)):
            mask = (k.zip_lanes(e.lanes, e.half) if isinstance(e, k.Zip)
                    else k.unzip_lanes(e.lanes, e.odd))
            return self.shuffle(self.expr(e.a), self.expr(e.b), mask)
        raise TypeError(f"the LLVM backend cannot print {type(e).__name__}")

    def halves(self, e: k.Halves | k.HalfSplat | k.Half) -> _Val:
        """The half-vector nodes as one ``shufflevector`` each (the backend picks
        vinsertf128, vbroadcastf128, vpermilps or vextractf128)."""
        if isinstance(e, k.Halves):
            lo, hi = self.expr(e.lo), self.expr(e.hi)
            if lo.lanes == 1:  # <1 x T> halves do not exist: build the pair directly
                vec = _type(e.dtype, 2)
                one = self.value(f"insertelement {vec} poison, {lo.typed}, i64 0", e.dtype, 2)
                return self.value(f"insertelement {one.typed}, {hi.typed}, i64 1", e.dtype, 2)
            mask = list(range(e.lanes))
            return self.shuffle(lo, hi, mask)
        x = self.expr(e.x)
        h = x.lanes // 2
        if isinstance(e, k.HalfSplat):
            w = x.lanes // e.parts
            mask = [p * w + e.lane for p in range(e.parts) for _ in range(w)]
        elif h == 1:
            return self.value(f"extractelement {x.typed}, i64 {e.which}", e.dtype)
        else:
            mask = list(range(e.which * h, (e.which + 1) * h))
        return self.shuffle(x, None, mask)

    def shuffle(self, a: _Val, b: _Val | None, mask: list[int]) -> _Val:
        other = b.ref if b is not None else "poison"
        idx = ", ".join(f"i32 {i}" for i in mask)
        return self.value(f"shufflevector {a.typed}, {a.type} {other}, <{len(mask)} x i32> "
                          f"<{idx}>", a.dtype, len(mask))

    # ------------------------------------------------------------------ matrix values
    # The intrinsics take and return vectors, <1 x T> included, where the kernel IR has a
    # scalar for one lane: such values go in through insertelement, out through extract.
    def to_matrix(self, v: _Val) -> tuple[str, str]:
        """(type, typed text) of ``v`` as an intrinsic operand."""
        if v.lanes > 1:
            return v.type, v.typed
        vec = f"<1 x {v.type}>"
        ref = "%" + self.fresh("t")
        self.emit(f"{ref} = insertelement {vec} poison, {v.typed}, i64 0")
        return vec, f"{vec} {ref}"

    def from_matrix(self, call: str, dtype: str, lanes: int) -> _Val:
        """The value of an intrinsic call returning a ``lanes``-lane matrix."""
        if lanes > 1:
            return self.value(call, dtype, lanes)
        vec = self.value(call, dtype, lanes)  # its type is <1 x T>, whatever _Val says
        return self.value(f"extractelement <1 x {_SCALAR[dtype]}> {vec.ref}, i64 0", dtype)

    def matrix_multiply(self, e: k.MatrixMultiply) -> _Val:
        a, b = self.to_matrix(self.expr(e.a)), self.to_matrix(self.expr(e.b))
        name = (f"llvm.matrix.multiply.{_msuffix(e.dtype, e.lanes)}"
                f".{_msuffix(e.dtype, e.rows * e.inner)}.{_msuffix(e.dtype, e.inner * e.cols)}")
        dims = [("i32", f"i32 {n}") for n in (e.rows, e.inner, e.cols)]
        call = self.call(name, _mtype(e.dtype, e.lanes), [a, b, *dims], flags="contract")
        return self.from_matrix(call, e.dtype, e.lanes)

    def matrix_args(self, buf: str, index: k.Expr, stride: k.Expr, dtype: str, rows: int,
                    cols: int) -> list[tuple[str, str]]:
        """(ptr, stride, volatile, rows, cols) of a column-major load or store."""
        ptr = self.address(buf, index)
        step = self.expr(stride)
        return [("ptr", f"ptr align {_SIZE[dtype]} {ptr}"), ("i64", step.typed),
                ("i1", "i1 false"), ("i32", f"i32 {rows}"), ("i32", f"i32 {cols}")]

    def matrix_load(self, e: k.MatrixLoad) -> _Val:
        name = f"llvm.matrix.column.major.load.{_msuffix(e.dtype, e.lanes)}.i64"
        args = self.matrix_args(e.buf, e.index, e.stride, e.dtype, e.rows, e.cols)
        call = self.call(name, _mtype(e.dtype, e.lanes), args)
        return self.from_matrix(call, e.dtype, e.lanes)

    def matrix_store(self, s: k.MatrixStore) -> None:
        v = self.to_matrix(self.expr(s.value))
        lanes = s.rows * s.cols
        name = f"llvm.matrix.column.major.store.{_msuffix(s.value.dtype, lanes)}.i64"
        args = self.matrix_args(s.buf, s.index, s.stride, s.value.dtype, s.rows, s.cols)
        self.emit(self.call(name, "void", [v, *args]))

    def widen(self, v: _Val, lanes: int) -> _Val:
        """``v`` in every one of ``lanes`` lanes (insertelement + shufflevector)."""
        if v.lanes == lanes:
            return v
        if v.lanes != 1:
            raise TypeError(f"cannot widen a {v.lanes}-lane value to {lanes} lanes")
        vec = _type(v.dtype, lanes)
        one = self.value(f"insertelement {vec} poison, {v.typed}, i64 0", v.dtype, lanes)
        return self.value(f"shufflevector {one.typed}, {vec} poison, <{lanes} x i32> "
                          "zeroinitializer", v.dtype, lanes)

    def truth(self, v: _Val) -> _Val:
        """A condition as i1: C's ``x != 0`` for non-boolean values."""
        if v.dtype == "bool":
            return v
        zero = self.widen(_Val(_literal(0, v.dtype), v.dtype), v.lanes)
        cmp = "fcmp une" if v.dtype in _FLOATS else "icmp ne"
        return self.value(f"{cmp} {v.typed}, {zero.ref}", "bool", v.lanes)

    def binary(self, e: k.Bin) -> _Val:
        a, b = self.widen(self.expr(e.a), e.lanes), self.widen(self.expr(e.b), e.lanes)
        if e.op == "and":
            a, b = self.truth(a), self.truth(b)
            return self.value(f"and {a.typed}, {b.ref}", "bool", e.lanes)
        if a.dtype != b.dtype:
            raise TypeError(f"operands of {e.op!r} have types {a.dtype} and {b.dtype}")
        is_float = a.dtype in _FLOATS
        if e.op in _ICMP:
            cmp = f"fcmp {_FCMP[e.op]}" if is_float else f"icmp {_ICMP[e.op]}"
            return self.value(f"{cmp} {a.typed}, {b.ref}", "bool", e.lanes)
        if e.op in ("min", "max"):
            if is_float:
                name = f"llvm.{e.op}num.{_suffix(a.dtype, a.lanes)}"
                return self.value(self.call(name, a.type, [a, b]), a.dtype, a.lanes)
            pick = self.value(f"icmp {'slt' if e.op == 'min' else 'sgt'} {a.typed}, {b.ref}",
                              "bool", e.lanes)
            return self.value(f"select {pick.typed}, {a.typed}, {b.typed}", a.dtype, a.lanes)
        op = (_FARITH if is_float else _IARITH)[e.op]
        if is_float and e.op == "+" and any(isinstance(x, k.MatrixMultiply) for x in (e.a, e.b)):
            op += " contract"  # acc + A@B: the product's last multiply may fuse with the add
        return self.value(f"{op} {a.typed}, {b.ref}", a.dtype, a.lanes)

    def mask(self, count: k.Expr, lanes: int) -> _Val:
        """Lane i is on iff i < count (any count: negative means none, > lanes all)."""
        n = self.widen(self.expr(count), lanes)
        iota = ", ".join(f"i64 {i}" for i in range(lanes))
        return self.value(f"icmp sgt {n.typed}, <{iota}>", "bool", lanes)

    def masked(self, kind: str, dtype: str, lanes: int, ptr: str, mask: _Val,
               value: _Val | None = None) -> str:
        """A call of llvm.masked.load (``value`` None: zeros in the off lanes) or .store."""
        name = f"llvm.masked.{kind}.{_suffix(dtype, lanes)}.p0"
        align = _SIZE[dtype]
        ptr_args = ([("ptr", f"ptr {ptr}"), ("i32", f"i32 {align}")] if _MASK_ALIGN_OPERAND
                    else [("ptr", f"ptr align {align} {ptr}")])
        vec = _type(dtype, lanes)
        if value is None:
            return self.call(name, vec, [*ptr_args, mask, (vec, f"{vec} zeroinitializer")])
        return self.call(name, "void", [value, *ptr_args, mask])

    def load(self, e: k.Load) -> _Val:
        if e.count is None:
            ptr = self.address(e.buf, e.index)
            return self.value(f"load {_type(e.dtype, e.lanes)}, ptr {ptr}, align {_SIZE[e.dtype]}",
                              e.dtype, e.lanes)
        if e.lanes == 1:  # count > 0 ? buf[index] : 0, reading nothing when count <= 0
            plain = k.Load(e.buf, e.index, e.dtype)
            return self.select(k.Select(k.Bin("<", k.Const(0), e.count), plain,
                                        k.Const(0, e.dtype)))
        count = k.const_value(e.count)
        if self.m.isa.plain_moves("load", e.dtype, e.lanes, count,
                                  read_back=e.buf in self.read_back, past_end=e.past_end):
            # the first lanes with a plain load (LLVM picks the moves), zeros in the others
            ptr = self.address(e.buf, e.index)
            if count == 1:
                one = self.value(f"load {_SCALAR[e.dtype]}, ptr {ptr}, align {_SIZE[e.dtype]}",
                                 e.dtype)
                vec = _type(e.dtype, e.lanes)
                return self.value(f"insertelement {vec} zeroinitializer, {one.typed}, i64 0",
                                  e.dtype, e.lanes)
            part = self.value(f"load {_type(e.dtype, count)}, ptr {ptr}, align "
                              f"{_SIZE[e.dtype]}", e.dtype, count)
            zeros = _Val("zeroinitializer", e.dtype, count)
            return self.shuffle(part, zeros, [*range(count), *[count] * (e.lanes - count)])
        ptr = self.address(e.buf, e.index, inbounds=False)
        mask = self.mask(e.count, e.lanes)
        return self.value(self.masked("load", e.dtype, e.lanes, ptr, mask), e.dtype, e.lanes)

    def select(self, e: k.Select) -> _Val:
        if e.cond.lanes > 1 or (_speculatable(e.a) and _speculatable(e.b)):
            cond = self.truth(self.expr(e.cond))
            a, b = self.widen(self.expr(e.a), e.lanes), self.widen(self.expr(e.b), e.lanes)
            return self.value(f"select {cond.typed}, {a.typed}, {b.typed}", a.dtype, a.lanes)
        # Like C's ?:, evaluate only the chosen side.
        cond = self.truth(self.expr(e.cond))
        then, orelse, join = self.fresh("sel.then"), self.fresh("sel.else"), self.fresh("sel.end")
        self.branch(cond, then, orelse)
        arms = []
        for label, x in ((then, e.a), (orelse, e.b)):
            self.start(label)
            arms.append((self.widen(self.expr(x), e.lanes), self.block))
            self.emit(f"br label %{join}")
        self.start(join)
        (a, a_end), (b, b_end) = arms
        return self.value(f"phi {a.type} [ {a.ref}, %{a_end} ], [ {b.ref}, %{b_end} ]",
                          a.dtype, a.lanes)

    # ------------------------------------------------------------------ statements
    def stmts(self, body: tuple[k.Stmt, ...]) -> None:
        for s in body:
            self.stmt(s)

    def assign(self, var: k.Var, value: k.Expr, declare: bool) -> None:
        slot = self.slot(var, create=declare)
        v = self.widen(self.expr(value), var.lanes)
        if v.dtype != var.dtype:
            raise TypeError(f"{var.name} is {var.dtype} but is given a {v.dtype} value")
        self.emit(f"store {v.typed}, ptr {slot}")

    def stmt(self, s: k.Stmt) -> None:  # noqa: C901 - one case per node
        if isinstance(s, k.Comment):
            self.emit("; " + " ".join(s.text.split()))
        elif isinstance(s, (k.Decl, k.Assign)):
            self.assign(s.var, s.value, isinstance(s, k.Decl))
        elif isinstance(s, k.Store):
            self.store(s)
        elif isinstance(s, k.For):
            self.loop(s)
        elif isinstance(s, k.If):
            self.branches(s)
        elif isinstance(s, k.Alloc):
            self.alloc(s)
        elif isinstance(s, k.Free):
            self.free(s.buf)
        elif isinstance(s, k.Call):
            self.invoke(s)
        elif isinstance(s, k.MatrixStore):
            self.matrix_store(s)
        elif isinstance(s, k.Prefetch):
            ptr = self.address(s.buf, s.index, inbounds=False)
            args = [("ptr", f"ptr {ptr}"), *(("i32", f"i32 {x}") for x in (int(s.write), 3, 1))]
            self.emit(self.call("llvm.prefetch.p0", "void", args))
        elif isinstance(s, k.Barrier):
            self.emit('call void asm sideeffect "", "~{memory}"()')
        else:
            raise TypeError(f"the LLVM backend cannot print {type(s).__name__}; lower it first")

    def store(self, s: k.Store) -> None:
        if s.count is not None and s.value.lanes == 1:
            plain = k.Store(s.buf, s.index, s.value)
            self.branches(k.If(k.Bin("<", k.Const(0), s.count), (plain,)))
            return
        v = self.expr(s.value)
        if s.count is None:
            ptr = self.address(s.buf, s.index)
            self.emit(f"store {v.typed}, ptr {ptr}, align {_SIZE[v.dtype]}")
            return
        count = k.const_value(s.count)
        if self.m.isa.plain_moves("store", v.dtype, v.lanes, count,
                                  read_back=s.buf in self.read_back, past_end=s.past_end):
            ptr = self.address(s.buf, s.index)
            part = (self.value(f"extractelement {v.typed}, i64 0", v.dtype) if count == 1
                    else self.shuffle(v, None, list(range(count))))
            self.emit(f"store {part.typed}, ptr {ptr}, align {_SIZE[v.dtype]}")
            return
        ptr = self.address(s.buf, s.index, inbounds=False)
        self.emit(self.masked("store", v.dtype, v.lanes, ptr, self.mask(s.count, v.lanes), v))

    def loop(self, s: k.For) -> None:
        """As ``ir.interp`` runs it: start and stop are evaluated once, and a hidden counter
        sets the variable at each iteration, so the body cannot change the trip count. The
        latch branch carries the loop id."""
        if s.step <= 0:
            raise ScheduleError(f"loop over {s.var.name} has step {s.step}; it must be positive")
        var = self.slot(s.var, create=True)
        counter = "%" + self.fresh(f"{s.var.name}.iv")
        self.allocas.append(f"  {counter} = alloca i64")
        self.emit(f"store {self.expr(s.start).typed}, ptr {counter}")
        stop = self.expr(s.stop)
        cond, body, end = self.fresh("for.cond"), self.fresh("for.body"), self.fresh("for.end")
        self.emit(f"br label %{cond}")
        self.start(cond)
        i = self.value(f"load i64, ptr {counter}", "i64")
        self.branch(self.value(f"icmp slt {i.typed}, {stop.ref}", "bool"), body, end)
        self.start(body)
        self.emit(f"store {i.typed}, ptr {var}")
        self.stmts(s.body)
        nxt = self.value(f"add nsw {i.typed}, {s.step}", "i64")
        self.emit(f"store {nxt.typed}, ptr {counter}")
        self.emit(f"br label %{cond}, !llvm.loop {self.m.loop_id()}")
        self.start(end)

    def branches(self, s: k.If) -> None:
        cond = self.truth(self.expr(s.cond))
        then, end = self.fresh("if.then"), self.fresh("if.end")
        orelse = self.fresh("if.else") if s.orelse else end
        self.branch(cond, then, orelse)
        self.start(then)
        self.stmts(s.then)
        self.emit(f"br label %{end}")
        if s.orelse:
            self.start(orelse)
            self.stmts(s.orelse)
            self.emit(f"br label %{end}")
        self.start(end)

    def alloc(self, s: k.Alloc) -> None:
        """aligned_alloc needs a size that is a multiple of the alignment; NULL jumps to
        the function's out-of-memory block."""
        a = s.align
        n = self.expr(s.size)
        nbytes = self.value(f"mul nsw {n.typed}, {_SIZE[s.dtype]}", "i64")
        padded = self.value(f"add nsw {nbytes.typed}, {a - 1}", "i64")
        size = self.value(f"and {padded.typed}, {-a}", "i64")
        ptr = self.value(self.call("aligned_alloc", "ptr", [("i64", f"i64 {a}"), size]), "ptr")
        self.emit(f"store ptr {ptr.ref}, ptr {self.buffers[s.buf][0]}")
        null = self.value(f"icmp eq ptr {ptr.ref}, null", "bool")
        ok = self.fresh("alloc.ok")
        self.branch(null, "out_of_memory.0", ok)
        self.oom = True
        self.start(ok)

    def free(self, buf: str) -> None:
        self.emit(self.call("free", "void", [("ptr", f"ptr {self.buffer(buf)[0]}")]))

    def invoke(self, s: k.Call) -> None:
        callee = self.m.module.function(s.func)
        if len(callee.params) != len(s.args):
            raise TypeError(f"{s.func}() takes {len(callee.params)} arguments, "
                            f"got {len(s.args)}")
        args = []
        for p, a in zip(callee.params, s.args, strict=True):
            v = self.expr(a)
            want = "ptr" if p.pointer else _SCALAR[p.dtype]
            if v.type != want:
                raise TypeError(f"{s.func}(): argument {p.name} is {want}, got {v.type}")
            args.append(v.typed)
        returns = "i32" if callee.exported and callee.status else "void"
        self.emit(f"call {returns} @{s.func}({', '.join(args)})")

    # ------------------------------------------------------------------ the function
    def render(self) -> str:
        f = self.f
        allocs = _allocs(f.body)
        if allocs and not (f.exported and f.status):
            raise ScheduleError(f"{f.name}: scratch buffers belong to the entry function, "
                                "which returns a status")
        params, prologue = [], []
        for p in f.params:
            if p.pointer:
                params.append(f"ptr noalias %{p.name}")
                self.buffers[p.name] = (f"%{p.name}", p.dtype, False)
            else:
                params.append(f"{_SCALAR[p.dtype]} %{p.name}")
                prologue.append(f"  store {_SCALAR[p.dtype]} %{p.name}, ptr "
                                f"{self.slot(p.var, create=True)}")
        for s in allocs:  # scratch pointers start NULL so the failure path may free them all
            slot = f"%{s.buf}.buf"
            self.allocas.append(f"  {slot} = alloca ptr")
            prologue.append(f"  store ptr null, ptr {slot}")
            self.buffers[s.buf] = (slot, s.dtype, True)
        self.stmts(f.body)
        status = f.exported and f.status
        self.emit("ret i32 0" if status else "ret void")
        if self.oom:
            self.start("out_of_memory.0")
            for s in allocs:
                self.free(s.buf)
            self.emit("ret i32 1")
        head = (f"define {'i32' if status else 'void'} @{f.name}" if f.exported
                else f"define internal void @{f.name}")
        return "\n".join([f"{head}({', '.join(params)}) #0 {{", "entry.0:", *self.allocas,
                          *prologue, *self.lines, "}"])


def render(module: k.Module, isa: Isa) -> str:
    """The module as LLVM IR text (opaque pointers, no triple: the JIT sets the host's)."""
    for f in module.functions:
        for p in f.params:
            if p.dtype not in _SIZE:
                raise TypeError(f"{f.name}: parameter {p.name} has unknown type {p.dtype}")
    _check_vectors(module, isa)
    state = _ModuleState(module, isa)
    bodies = [_FunctionWriter(state, f).render() for f in module.functions]
    return "\n".join([
        f"; generated by blacc; target: {isa.name}",
        "", "\n\n".join(bodies), "",
        *sorted(state.declares.values()), "",
        'attributes #0 = { nounwind "no-trapping-math"="true" }',
        *state.metadata(), ""])


_MATRIX_NODES = (k.MatrixLoad, k.MatrixMultiply, k.MatrixStore)


def _check_vectors(module: k.Module, isa: Isa) -> bool:
    """Only the ISA's vector widths may appear, as in the C backend: LLVM would accept
    any width, but a program that the C backend rejects must not pass here. The one
    exception is matrix values: a function with matrix nodes may hold vectors as wide as
    its matrices. The other is the load that a ``Spread`` spreads, which the C backend
    reads inside the spread's own template. Returns whether the module has matrix
    nodes."""
    found = False
    for f in module.functions:
        shapes: set[tuple[str, int]] = set()
        spread: set[k.Load] = set()

        def collect(x: object, shapes: set[tuple[str, int]] = shapes,
                    spread: set[k.Load] = spread) -> object:
            if isinstance(x, k.MatrixStore):
                shapes.add((x.value.dtype, x.rows * x.cols))
            elif isinstance(x, _MATRIX_NODES):
                shapes.add((x.dtype, x.lanes))
            elif isinstance(x, k.Spread):
                spread.add(x.x)
            return x

        def visit(x: object, shapes: set[tuple[str, int]] = shapes,
                  spread: set[k.Load] = spread) -> object:
            if isinstance(x, k.Expr) and x.lanes > 1 and x.dtype != "bool" \
                    and isa.vector_type(x.dtype, x.lanes) is None \
                    and (x.dtype, x.lanes) not in shapes and x not in spread:
                raise ScheduleError(f"target {isa.name} has no {x.lanes}-lane {x.dtype} vector")
            return x

        rewrite(f.body, collect)
        rewrite(f.body, visit)
        found = found or bool(shapes)
    return found

