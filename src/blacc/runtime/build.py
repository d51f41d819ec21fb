"""Turn a lowered kernel IR module into a callable native function.

Render (backend.c) -> compile (backend.compiler) -> cache (runtime.cache) -> ctypes.
The cache key is a hash of the C source (which carries the program, schedule and
target), the compiler's identity and flags, and blacc's version.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..backend.c import render
from ..backend.compiler import Compiler, compile_shared, find_compiler
from ..ir import kernel as k
from ..target.isa import Isa
from .cache import cache_key, default_cache

_CTYPES = {"i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float,
           "f64": ctypes.c_double}

#: Optimization flags beside the ISA's own; -mtune=native only schedules, it adds no
#: instructions the ISA table did not ask for.
BASE_FLAGS = ("-O3", "-std=c11", "-fno-math-errno", "-mtune=native")


@functools.lru_cache(maxsize=None)
def host_compiler() -> Compiler:
    """The compiler named by $CC (read once, here at the edge), else cc/gcc/clang."""
    return find_compiler(os.environ.get("CC") or None)


@dataclass(frozen=True)
class NativeKernel:
    """A compiled entry function and everything needed to explain it."""

    module: k.Module
    source: str
    library_path: str
    function: ctypes._CFuncPtr  # type: ignore[name-defined]

    def __call__(self, *args: object) -> int:
        return self.function(*args)


def build(module: k.Module, isa: Isa, *, compiler: Compiler | None = None) -> NativeKernel:
    """Compile ``module`` (fully lowered) for ``isa`` and load its entry function."""
    cc = compiler or host_compiler()
    source = render(module, isa)
    flags = (*BASE_FLAGS, *isa.flags)
    key = cache_key(source=source, compiler=[cc.path, *cc.args, cc.version], flags=list(flags),
                    blacc=__version__)

    def compile_to(path: Path) -> None:
        compile_shared(cc, source, path, flags)

    lib = default_cache().library(key, compile_to)
    entry = module.function(module.entry)
    fn = getattr(lib, entry.name)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p if p.pointer else _CTYPES[p.dtype] for p in entry.params]
    return NativeKernel(module, source, getattr(lib, "_name", ""), fn)
