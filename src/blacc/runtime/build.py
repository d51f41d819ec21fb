"""Turn a lowered kernel IR module into a callable native function, with either backend.

* ``c``: render C (backend.c) -> the system compiler -> a shared library -> ctypes;
* ``llvm``: render LLVM IR (backend.llvm) -> llvmlite's optimizer and code generator ->
  an object file -> the in-process JIT (backend.jit); no C compiler needed.

Both go through the disk cache (runtime.cache), keyed by a hash of the rendered source
(which carries program, schedule and target), the toolchain's identity and flags, and
blacc's version. ``auto`` is LLVM when llvmlite loads, else C (see resolve_backend).
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..backend import c as c_backend
from ..backend.compiler import Compiler, compile_shared, find_compiler
from ..errors import ArgumentError, CompilerError
from ..ir import kernel as k
from ..target.isa import Isa
from .cache import cache_key, default_cache

BACKENDS = ("c", "llvm", "auto")

_CTYPES = {"i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float,
           "f64": ctypes.c_double}

#: Optimization flags beside the ISA's own; -mtune=native only schedules, it adds no
#: instructions the ISA table did not ask for.
BASE_FLAGS = ("-O3", "-std=c11", "-fno-math-errno", "-mtune=native")


@functools.cache
def host_compiler() -> Compiler:
    """The compiler named by $CC (read once, here at the edge), else cc/gcc/clang."""
    return find_compiler(os.environ.get("CC") or None)


@functools.cache
def _llvm_available() -> bool:
    try:
        from ..backend import jit

        jit.host_target_machine()
    except Exception:  # noqa: BLE001 - any failure to load llvmlite means "not available"
        return False
    return True


@functools.cache
def environment_backend() -> str | None:
    """$BLACC_BACKEND, read once per process like $CC (reading the environment costs
    1.0-1.4 us here, about a third of a small ``blacc.gemm`` call);
    ``environment_backend.cache_clear()`` makes the next call read it again."""
    return os.environ.get("BLACC_BACKEND") or None


def resolve_backend(backend: str | None) -> str:
    """'c' or 'llvm' for a requested backend: the argument, else $BLACC_BACKEND (read once:
    ``environment_backend``), else 'auto': LLVM when llvmlite loads, the C compiler
    otherwise.

    LLVM is preferred because it allocates the registers of the GEMM micro-kernel better:
    its k loop is exactly mr*nr/vl FMAs, mr broadcasts and nr/vl loads of B per step,
    where gcc 12 re-loads B vectors as memory operands and shuffles registers (same-process
    runs of benchmarks/tune_gemm.py --backend c --backend llvm: LLVM 7-19% faster on four
    of six shapes, even or 2% slower on the other two)."""
    name = backend or environment_backend() or "auto"
    if name not in BACKENDS:
        raise ArgumentError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        return "llvm" if _llvm_available() else "c"
    return name


@dataclass(frozen=True)
class NativeKernel:
    """A compiled entry function and everything needed to explain it."""

    module: k.Module
    backend: str
    source: str
    artifact: str  # path of the cached shared library or object file
    function: Any  # a ctypes function

    def __call__(self, *args: object) -> int:
        return self.function(*args)


def _signature(entry: k.Function) -> tuple[Any, list[Any]]:
    args = [ctypes.c_void_p if p.pointer else _CTYPES[p.dtype] for p in entry.params]
    return (ctypes.c_int if entry.status else None), args


def build(module: k.Module, isa: Isa, *, backend: str = "c",
          compiler: Compiler | None = None) -> NativeKernel:
    """Compile ``module`` (fully lowered) for ``isa`` with ``backend`` and load its entry."""
    if backend == "c":
        return _build_c(module, isa, compiler or host_compiler())
    if backend == "llvm":
        return _build_llvm(module, isa)
    raise ArgumentError(f"build() needs backend 'c' or 'llvm', not {backend!r}")


def load_c(source: str, isa: Isa, cc: Compiler | None = None) -> ctypes.CDLL:
    """C ``source`` compiled for ``isa`` into a shared library (from the kernel cache when
    built before) and loaded."""
    cc = cc or host_compiler()
    flags = (*BASE_FLAGS, *isa.flags)
    key = cache_key(source=source, compiler=[cc.path, *cc.args, cc.version], flags=list(flags),
                    blacc=__version__)

    def compile_to(path: Path) -> None:
        compile_shared(cc, source, path, flags)

    return default_cache().library(key, compile_to)


def _build_c(module: k.Module, isa: Isa, cc: Compiler) -> NativeKernel:
    source = c_backend.render(module, isa)
    lib = load_c(source, isa, cc)
    entry = module.function(module.entry)
    fn = getattr(lib, entry.name)
    fn.restype, fn.argtypes = _signature(entry)
    return NativeKernel(module, "c", source, getattr(lib, "_name", ""), fn)


def _build_llvm(module: k.Module, isa: Isa) -> NativeKernel:
    try:
        from ..backend import jit, llvm
    except ImportError as exc:  # llvmlite is a dependency, but say so clearly if missing
        raise CompilerError(f"the LLVM backend needs llvmlite: {exc}") from exc
    source = llvm.render(module, isa)
    key = cache_key(llvm_ir=source, cpu=jit.cpu_id(), blacc=__version__)

    def compile_to(path: Path) -> None:
        path.write_bytes(jit.emit_object(source))

    def load(path: Path) -> jit.JitLibrary:
        return jit.JitLibrary(path.read_bytes())

    lib = default_cache().library(key, compile_to, suffix=".o", load=load)
    entry = module.function(module.entry)
    restype, argtypes = _signature(entry)
    fn = ctypes.CFUNCTYPE(restype, *argtypes)(lib.address(entry.name))
    return NativeKernel(module, "llvm", source, key, fn)
