"""Compile LLVM IR text (``backend.llvm``) to host machine code in-process, with llvmlite.

No C compiler and no files: ``emit_object`` runs LLVM's -O3 pipeline for the host CPU and
returns an object file's bytes (which a cache may store), and ``JitLibrary`` loads such
bytes into an MCJIT engine and hands out function addresses for ctypes.

LLVM state is process-global and llvmlite is not thread-safe, so every LLVM call here
holds one lock. Engines are never freed: a ctypes function made from an address must
stay valid for as long as the process runs.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import llvmlite.binding as llvm

__all__ = ["JitLibrary", "cpu_id", "emit_assembly", "emit_object", "host_target_machine",
           "optimize"]

_LOCK = threading.RLock()

#: Every engine made, kept alive for the life of the process (see the module docstring).
_ENGINES: list[llvm.ExecutionEngine] = []

#: C library functions the generated code calls, directly (the scratch buffers) or after
#: LLVM turned a loop into one (memset, memcpy).
_LIBC_SYMBOLS = ("aligned_alloc", "free", "memset", "memcpy", "memmove")


@functools.cache
def _initialize() -> None:
    """Once per process: the native target, libc's symbols for the JIT's linker, and
    -enable-matrix (clang's -fenable-matrix): LLVM's -O3 pipeline lowers the
    ``llvm.matrix.*`` intrinsics only under it, and code generation aborts on unlowered
    ones. Set for every module, so all kernels get the same pipeline."""
    llvm.set_option("blacc", "-enable-matrix")
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    if os.name != "posix":  # no aligned_alloc there (the C backend needs it as well)
        return
    libc = ctypes.CDLL(None)  # the process's global symbols, libc's among them
    for name in _LIBC_SYMBOLS:
        fn = getattr(libc, name, None)
        if fn is not None:
            llvm.add_symbol(name, ctypes.cast(fn, ctypes.c_void_p).value)


def _new_target_machine() -> llvm.TargetMachine:
    """The host CPU at -O3, for code that MCJIT loads: the JIT's code model (large on
    x86-64) because MCJIT maps code and constants separately, possibly more than the
    small model's +-2 GiB apart; the kernels' hot loops address no constants."""
    _initialize()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=3, reloc="pic", codemodel="jitdefault", jit=True)


@functools.cache
def host_target_machine() -> llvm.TargetMachine:
    """The host CPU with all its features, at -O3. Shared: code generation only reads it
    (an MCJIT engine takes ownership of its machine, so engines get their own)."""
    return _new_target_machine()


#: The optimization pipeline (part of ``cpu_id``, so cached objects follow it). SLP
#: vectorization is off in LLVM's pipeline options unless asked for (clang asks at -O2):
#: without it the copies of packing stay scalar, 64 single-float moves per row of a B
#: sliver (1000^3 f32 on the Xeon: packing B took 3.6% of the time).
PIPELINE = {"speed_level": 3, "slp_vectorization": True}


@functools.cache
def cpu_id() -> str:
    """What the machine code depends on besides the IR: CPU, its features, LLVM version.
    Belongs in the cache key of stored objects."""
    _initialize()
    version = ".".join(map(str, llvm.llvm_version_info))
    return (f"{llvm.get_host_cpu_name()};{llvm.get_host_cpu_features().flatten()};"
            f"llvm-{version};{llvm.get_process_triple()};{sorted(PIPELINE.items())}")


def optimize(ir_text: str) -> llvm.ModuleRef:
    """Parse and verify ``ir_text``, set the host's triple and data layout, and run the
    new pass manager's -O3 module pipeline on it."""
    tm = host_target_machine()
    with _LOCK:
        mod = llvm.parse_assembly(ir_text)
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=PIPELINE["speed_level"])
        pto.slp_vectorization = PIPELINE["slp_vectorization"]
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        mod.verify()
    return mod


def emit_object(ir_text: str) -> bytes:
    """Optimized object code for the host (ELF/Mach-O/COFF bytes)."""
    mod = optimize(ir_text)
    with _LOCK:
        return host_target_machine().emit_object(mod)


def emit_assembly(ir_text: str) -> str:
    """The optimized host assembly of ``ir_text``, to inspect what LLVM made of a kernel."""
    mod = optimize(ir_text)
    with _LOCK:
        return host_target_machine().emit_assembly(mod)


class JitLibrary:
    """Object code loaded into this process: like a shared library, without a file."""

    def __init__(self, obj: bytes) -> None:
        with _LOCK:
            tm = _new_target_machine()
            empty = llvm.parse_assembly("")
            empty.triple = tm.triple
            engine = llvm.create_mcjit_compiler(empty, tm)
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
            _ENGINES.append(engine)
        self._engine = engine

    def address(self, name: str) -> int:
        """The address of the exported function ``name``; KeyError when there is none."""
        with _LOCK:
            addr = self._engine.get_function_address(name)
        if not addr:
            raise KeyError(f"no exported function {name!r} in this library")
        return addr
