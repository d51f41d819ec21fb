"""blacc.emit: a standalone .c/.h pair that compiles warning-free on its own, links into a
shared library and computes the program (called through ctypes with NumPy buffers).

* target 'generic': ``cc -std=c99 -pedantic -Wall -Wextra -Werror``, no intrinsics;
* targets 'avx2', 'avx512' and 'host': ``cc -std=c99 -O2 -Wall -Wextra -Werror`` and the
  ISA's flags (``-mavx2 -mfma``; ``-mavx512f -mavx512dq -mavx512vl -mfma``), skipped
  when the CPU lacks them or no ``cc`` is found.

Arrays are passed as flat buffers laid out as the declarations say (column-major with a
leading dimension, row-major with ld > cols), surrounded by sentinels that must survive;
scalar outputs are passed by pointer.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import blacc
from blacc.blacs import host_isas, plan
from blacc.ir import kernel as kir
from blacc.ir import printer
from blacc.ir.walk import nodes_of
from blacc.target.isa import ISAS
from blacc.target.machine import detect_machine
from blacc.transform import blac
from blacc.transform.blac import build_module, candidates
from blacc.transform.index_notation import forms
from test_blac_programs import (
    SENTINEL,
    assert_matches,
    check_untouched,
    interp_buffers,
    make_values,
    read_buffer,
    unplanned,
)

M, V, S = blacc.Matrix, blacc.Vector, blacc.Scalar
CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler 'cc' on PATH")

HAS_AVX2 = detect_machine().has("avx2", "fma")
HAS_AVX512 = detect_machine().has(*ISAS["avx512"].requires)
GENERIC_FLAGS = ["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O2"]
STRICT_FLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror"]
AVX2_FLAGS = [*STRICT_FLAGS, "-mavx2", "-mfma"]
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="the CPU lacks AVX2 or FMA")
needs_avx512 = pytest.mark.skipif(not HAS_AVX512, reason="the CPU lacks AVX-512 F/DQ/VL")

TARGETS = [pytest.param("generic", id="generic"),
           pytest.param("avx2", id="avx2", marks=needs_avx2),
           pytest.param("avx512", id="avx512", marks=needs_avx512)]


def flags_for(target: str) -> list[str]:
    if target == "generic":
        return GENERIC_FLAGS
    isa = host_isas()[-1] if target == "host" else ISAS[target]
    return [*STRICT_FLAGS, *isa.flags]


def build(c_path: Path, target: str) -> ctypes.CDLL:
    """Compile ``c_path`` with the target's strict flags into a shared library; load it."""
    lib = c_path.with_suffix(".so")
    cmd = [CC, *flags_for(target), "-fPIC", "-shared", str(c_path), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr  # not even a note
    return ctypes.CDLL(str(lib))


def call(fn, specs, dtype: str, values: dict, *, misalign: bool, status: bool = False,
         expect: int = 0) -> dict:
    """Call the emitted function on sentinel-padded buffers; return the buffers by name.
    A function with a ``status`` must return ``expect``."""
    bufs = interp_buffers(specs, values, dtype)
    ctype = ctypes.c_float if dtype == "f32" else ctypes.c_double
    args, argtypes = [], []
    for s in specs:
        b = bufs[s.name]
        if isinstance(b, np.ndarray):
            if misalign:  # start one element past an aligned address
                shifted = np.full(b.size + 1, SENTINEL, b.dtype)
                shifted[1:] = b
                b = bufs[s.name] = shifted[1:]
            args.append(b.ctypes.data_as(ctypes.c_void_p))
            argtypes.append(ctypes.c_void_p)
        else:
            args.append(ctype(b))
            argtypes.append(ctype)
    fn.argtypes, fn.restype = argtypes, ctypes.c_int if status else None
    returned = fn(*args)
    assert not status or returned == expect, f"returned {returned}, not {expect}"
    return bufs


def emit_and_run(tmp_path: Path, source: str, decls: dict, dtype: str, target: str,
                 name: str = "kern", *, misalign: bool = False, seed: int = 0) -> tuple:
    c_path, h_path = blacc.emit(source, tmp_path / name, target=target, **decls)
    assert c_path == tmp_path / f"{name}.c" and h_path == tmp_path / f"{name}.h"
    p = plan(source, name=name, target=target, **decls)
    run_emitted(c_path, p, decls, dtype, target, name, misalign=misalign, seed=seed,
                context=source)
    return c_path, h_path, p


def run_emitted(c_path: Path, p, decls: dict, dtype: str, target: str, name: str, *,
                misalign: bool = False, seed: int = 0, context: str = "",
                status: bool = False) -> None:
    """Build ``c_path`` (``p``'s kernel ``name``: its ``specs`` and ``typed``), call it
    on sentinel-padded buffers and check it against NumPy, its inputs and the sentinels
    untouched; one with a ``status`` must return 0."""
    lib = build(c_path, target)
    values = make_values(decls, dtype, np.random.default_rng(seed))
    before = {n: np.array(v) for n, v in values.items() if isinstance(v, np.ndarray)}
    bufs = call(getattr(lib, name), p.specs, dtype, values, misalign=misalign,
                status=status)
    got = {}
    for s in p.specs:
        b = bufs[s.name]
        if s.kind == "scalar":
            if s.role != "in":
                got[s.name] = float(b[0])
            continue
        check_untouched(s, b)
        value = read_buffer(s, b)
        if s.role == "in":
            np.testing.assert_array_equal(value.reshape(-1), before[s.name].reshape(-1))
        else:
            got[s.name] = value
    assert_matches(p.typed, values, got, f"{context} {target} {dtype}")


CASES = [
    ("gemv-f32", "y = alpha*A*x + beta*y", "f32",
     dict(A=M(7, 13, "f32"), x=V(13, "f32"), y=V(7, "f32"), alpha=S("f32"), beta=S("f32"))),
    ("bilinear-f64", "alpha = x'*A*y", "f64",
     dict(x=V(6), A=M(6, 9), y=V(9), alpha=S())),
    ("fused-dot-f32", "beta = (A*x + alpha*y)'*z + beta", "f32",
     dict(A=M(5, 3, "f32"), x=V(3, "f32"), y=V(5, "f32"), z=V(5, "f32"), alpha=S("f32"),
          beta=S("f32"))),
    ("gemm-layouts-f64", "C = alpha*A*B + beta*C", "f64",
     dict(A=M(5, 7, layout="col", ld=9), B=M(7, 6, ld=10), C=M(5, 6, ld=8), alpha=S(),
          beta=S())),
    ("gemm-layouts-f32", "C = alpha*A*B + beta*C", "f32",
     dict(A=M(9, 4, "f32", layout="col", ld=11), B=M(4, 11, "f32", ld=13),
          C=M(9, 11, "f32", layout="col", ld=10), alpha=S("f32"), beta=S("f32"))),
    ("chain-f64", "D = A*B*C", "f64",
     dict(A=M(3, 5), B=M(5, 4), C=M(4, 6), D=M(3, 6))),
    ("two-statements-f32", "t = A*x; y = B*t + y; s = t'*t", "f32",
     dict(A=M(6, 5, "f32"), x=V(5, "f32"), t=V(6, "f32"), B=M(9, 6, "f32"), y=V(9, "f32"),
          s=S("f32"))),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("case", "source", "dtype", "decls"), CASES, ids=[c[0] for c in CASES])
def test_emitted_kernel_computes_the_program(tmp_path, case, source, dtype, decls, target):
    c_path, h_path, p = emit_and_run(tmp_path, source, decls, dtype, target,
                                     misalign=case.endswith("f32"), seed=len(case))
    text = c_path.read_text()
    assert text.startswith('#include "kern.h"\n')
    if target == "generic":
        assert "_mm" not in text and "immintrin" not in text and "__m256" not in text
        assert "__m128" not in text
    else:
        assert "#include <immintrin.h>" in text


@pytest.mark.parametrize("target", TARGETS)
def test_the_entry_starts_on_a_cache_line(tmp_path, target):
    """The kernel starts on a 64-byte boundary (GNU C's aligned attribute): a call of a
    few nanoseconds runs at the speed of the fetch blocks it spans, not of where the
    linker put it (C = A*B 4 x 4 x 4 f32 on Zen 5: 1.00 ns from 16 bytes into a line,
    1.28 from 32 bytes in)."""
    decls = dict(A=M(4, 4, "f32"), B=M(4, 4, "f32"), C=M(4, 4, "f32"))
    c_path, _ = blacc.emit("C = A*B", tmp_path / "kern", target=target, **decls)
    assert "BLACC_ENTRY void kern(" in c_path.read_text()
    # linked after a function that starts on a line and ends 20 bytes into it, which
    # leaves the next 16-byte boundary (gcc's default) 32 bytes into the line
    pad = tmp_path / "pad.c"
    pad.write_text('__attribute__((aligned(64))) void pad(void) { __asm__(".skip 19"); }\n')
    lib = tmp_path / "kern.so"
    cmd = [CC, *flags_for(target), "-fPIC", "-shared", str(pad), str(c_path), "-o", str(lib)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(lib))
    assert ctypes.cast(lib.pad, ctypes.c_void_p).value % 64 == 0
    assert ctypes.cast(lib.kern, ctypes.c_void_p).value % 64 == 0


@needs_avx2
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=[CASES[0][0], CASES[4][0]])
def test_host_target(tmp_path, case):
    """'host' is one of this machine's ISAs for small programs (AVX2, or on an AVX-512
    machine whichever of AVX2 and AVX-512 the model prefers), whose flags the header
    names and the strict build uses. (y = alpha*A*x + beta*y with A 7 x 13 f32 takes
    AVX-512 for its masked 256-bit loads.)"""
    _, source, dtype, decls = case
    c_path, h_path, p = emit_and_run(tmp_path, source, decls, dtype, "host", seed=7)
    assert p.isa in host_isas()
    assert f"needs <immintrin.h> and {' '.join(p.isa.flags)}" in h_path.read_text()
    code = c_path.read_text()
    if p.isa.name == "avx512":  # 512-bit vectors, or narrower ones with mask registers
        assert "_mm512_" in code or "__mmask" in code
    else:
        assert "_mm256_" in code


def test_emitted_header_declares_and_documents(tmp_path):
    source = "C = alpha*A*B + beta*C; s = x'*x + s"
    decls = dict(A=M(3, 4, layout="col", ld=5), B=M(4, 2, ld=3), C=M(3, 2), alpha=S(),
                 beta=S(), x=V(3), s=S())
    c_path, h_path = blacc.emit(source, tmp_path / "my-kernel", target="generic", **decls)
    assert h_path.name == "my-kernel.h"
    header = h_path.read_text()
    # the function (named after the file, '-' made '_'), declared once, in an include guard
    proto = re.search(r"^void my_kernel\((.*)\);$", header, re.M)
    assert proto, header
    params = [re.sub(r"\s+", " ", x.strip()) for x in proto.group(1).split(",")]
    assert params == ["double alpha", "const double *restrict A", "const double *restrict B",
                      "double beta", "double *restrict C", "const double *restrict x",
                      "double *restrict s"], params
    assert "#ifndef MY_KERNEL_H" in header and "#define MY_KERNEL_H" in header
    assert header.rstrip().endswith("#endif")
    for doc in ("alpha: scalar, input, by value",
                "A: 3x4 matrix, input, column-major, leading dimension 5",
                "B: 4x2 matrix, input, row-major, leading dimension 3",
                "C: 3x2 matrix, input and output, row-major, leading dimension 2",
                "x: vector of 3 contiguous elements, input",
                "s: scalar, input and output, by pointer to one element",
                "element type f64", "plain C99", "void my_kernel("):
        assert doc in header, (doc, header)
    assert "Returns" not in header  # it allocates nothing, so cannot fail
    assert "C = alpha*A*B + beta*C" in header
    # the header compiles on its own, and a caller using it compiles and links
    main = tmp_path / "main.c"
    main.write_text('#include "my-kernel.h"\n'
                    "int main(void) {\n"
                    "    double A[20] = {0}, B[12] = {0}, C[6] = {0}, x[3] = {0}, s = 1;\n"
                    "    my_kernel(1.0, A, B, 0.5, C, x, &s);\n"
                    "    return s == 1 ? 0 : 1;\n"
                    "}\n")
    exe = tmp_path / "main"
    cmd = [CC, *GENERIC_FLAGS, str(main), str(c_path), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert subprocess.run([str(exe)]).returncode == 0


@needs_avx2
def test_avx2_header_names_the_flags(tmp_path):
    _, h_path = blacc.emit("y = A*x", tmp_path / "mv", target="avx2",
                           A=M(5, 9, "f32"), x=V(9, "f32"), y=V(5, "f32"))
    header = h_path.read_text()
    assert "needs <immintrin.h> and -mavx2 -mfma" in header
    assert "element type f32" in header
    assert re.search(r"^void mv\(const float \*restrict A, const float \*restrict x, "
                     r"float \*restrict y\);$", header, re.M), header


SPINE_CASES = [
    ("gemm-f64", "C = alpha*A*B' + beta*C", "f64",
     dict(A=M(130, 150), B=M(140, 150, layout="col", ld=160), C=M(130, 140, layout="col",
                                                                  ld=133),
          alpha=S(), beta=S())),
    ("chain-f32", "E = A*B*F", "f32",
     dict(A=M(120, 90, "f32"), B=M(90, 110, "f32", ld=117), F=M(110, 100, "f32"),
          E=M(120, 100, "f32"))),
    # statements that are not GEMMs, by the small path's kernels, between the GEMMs
    ("mixed-f64", "C = A*B; y = C*x + y; s = y'*y; D = s*C' + D", "f64",
     dict(A=M(120, 90), B=M(90, 110, layout="col"), C=M(120, 110), x=V(110), y=V(120),
          s=S(), D=M(110, 120, ld=121))),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("case", "source", "dtype", "decls"), SPINE_CASES,
                         ids=[c[0] for c in SPINE_CASES])
def test_large_gemm_programs_are_emitted_as_the_spine(tmp_path, case, source, dtype, decls,
                                                      target):
    """GEMMs on operands too large for L1 are emitted as the spine computes them (as
    ``compile`` does): cache-blocked, packed where the plan packs, the buffers
    allocated (C99: from malloc, aligned by hand), the function returning 0, or 1 where
    that failed."""
    c_path, h_path = blacc.emit(source, tmp_path / "kern", target=target, **decls)
    text, header = c_path.read_text(), h_path.read_text()
    assert "blacc_gemm_" in text and "aligned_alloc" not in text  # C11
    assert "Returns 0, or 1 where a scratch allocation failed (then before anything\n" in header
    assert ("_mm" in text) == (target != "generic")
    p = unplanned(source, decls)
    ctype = "float" if dtype == "f32" else "double"
    params = [f"{'const ' if s.role == 'in' else ''}{ctype} *restrict {s.name}"
              if s.kind == "array" or s.role != "in" else f"{ctype} {s.name}"
              for s in p.specs]
    assert f"int kern({', '.join(params)});" in header  # the operands' own names
    run_emitted(c_path, p, decls, dtype, target, "kern", misalign=dtype == "f32",
                seed=len(case), context=source, status=True)


# malloc for ``check_failed_allocations``: fails once ``left`` allocations have
# succeeded (never where ``left`` < 0), and counts those that did
FAILING_MALLOC = """
#include <stdlib.h>
static int left = -1, made = 0;
void set_left(int n) { left = n; made = 0; }
int allocations(void) { return made; }
void *failing_malloc(size_t size) {
    if (left == 0) return NULL;
    left -= left > 0;
    made++;
    return malloc(size);
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_an_emitted_spine_kernel_that_cannot_allocate_writes_nothing(tmp_path, target):
    """Every scratch array and packing buffer of a program is allocated before its first
    step writes: whichever allocation fails, the kernel returns 1 with its outputs as they
    were (here T, which the first step computes and the second reads, and D)."""
    source, dtype = "T = A*B; D = T*(F + G) + D", "f64"
    decls = dict(A=M(120, 90), B=M(90, 110, ld=117), T=M(120, 110), F=M(110, 100),
                 G=M(110, 100), D=M(120, 100, layout="col", ld=121))
    c_path = blacc.emit(source, tmp_path / "kern", target=target, **decls)[0]
    assert "blacc_gemm_" in c_path.read_text()
    p = unplanned(source, decls)
    # F + G, and the two packing buffers both steps share
    check_failed_allocations(c_path, p, decls, dtype, target, 3)


def check_failed_allocations(c_path: Path, p, decls: dict, dtype: str, target: str,
                             allocations: int) -> None:
    """Build ``c_path`` with a malloc that fails on demand: the kernel makes
    ``allocations``; whichever fails, it returns 1 with every array as it was; with
    none failing it computes the program."""
    objects = []
    for path, defines in [(c_path, ["-Dmalloc=failing_malloc"]),
                          (c_path.with_name("failing_malloc.c"), [])]:
        if not defines:
            path.write_text(FAILING_MALLOC)
        cmd = [CC, *flags_for(target), *defines, "-fPIC", "-c", str(path), "-o",
               str(path.with_suffix(".o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        objects.append(str(path.with_suffix(".o")))
    lib_path = c_path.with_name("failing.so")
    subprocess.run([CC, "-shared", *objects, "-o", str(lib_path)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    values = make_values(decls, dtype, np.random.default_rng(7))
    lib.set_left(-1)
    call(lib.kern, p.specs, dtype, values, misalign=False, status=True)
    assert lib.allocations() == allocations
    before = interp_buffers(p.specs, values, dtype)
    for left in range(allocations):
        lib.set_left(left)
        after = call(lib.kern, p.specs, dtype, values, misalign=False, status=True,
                     expect=1)
        for s in p.specs:
            if s.by_pointer:
                np.testing.assert_array_equal(after[s.name], before[s.name],
                                              err_msg=f"{s.name}, allocation {left} failed")
    lib.set_left(-1)
    run_emitted(c_path, p, decls, dtype, target, "kern", context="failing malloc",
                status=True)


@pytest.mark.parametrize("target", TARGETS)
def test_temporaries_too_large_for_the_stack_are_allocated(tmp_path, target, monkeypatch):
    """Past ``blac.STACK_BYTES`` (0 here) a kernel's temporaries are allocated when it
    starts, before it writes anything, and freed when it returns; it returns a status,
    and the header says so."""
    monkeypatch.setattr(blac, "STACK_BYTES", 0)
    source, dtype = "D = (A*B + C)*E; s = x'*D*y", "f32"
    decls = dict(A=M(5, 3, "f32"), B=M(3, 6, "f32"), C=M(5, 6, "f32", layout="col"),
                 E=M(6, 7, "f32"), D=M(5, 7, "f32", ld=9), x=V(5, "f32"), y=V(7, "f32"),
                 s=S("f32"))
    c_path, h_path = blacc.emit(source, tmp_path / "kern", target=target, **decls)
    p = plan(source, name="kern", target=target, **decls)
    heap = [s for s in p.module.function("kern").body if isinstance(s, kir.Local)]
    assert heap and all(s.heap for s in heap)
    assert "Returns 0, or 1 where a scratch allocation failed" in h_path.read_text()
    assert "int kern(" in h_path.read_text()
    check_failed_allocations(c_path, p, decls, dtype, target, len(heap))


def test_two_emitted_spine_kernels_link_together(tmp_path):
    """Each file keeps its GEMM and packing routines to itself (static)."""
    paths = [blacc.emit(source, tmp_path / f"k{i}", target="generic", **decls)[0]
             for i, (_, source, _, decls) in enumerate(SPINE_CASES)]
    lib = tmp_path / "both.so"
    cmd = [CC, *flags_for("generic"), "-fPIC", "-shared", *map(str, paths), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    lib = ctypes.CDLL(str(lib))
    assert lib.k0 and lib.k1


def test_emit_name_and_padding_untouched(tmp_path):
    """An explicit name; a row-major operand with ld > cols given as a padded NumPy buffer
    whose padding (NaN: reading it would show) is neither read nor written."""
    decls = dict(A=M(4, 6, ld=9), x=V(6), y=V(4), C=M(4, 6, ld=7))
    source = "y = A*x; C = 2*A - C"
    c_path, _ = blacc.emit(source, tmp_path / "file", name="custom_name", target="generic",
                           **decls)
    lib = build(c_path, "generic")
    fn = lib.custom_name
    fn.argtypes = [ctypes.c_void_p] * 4
    fn.restype = None
    rng = np.random.default_rng(3)
    Abuf = np.full((4, 9), np.nan)
    Abuf[:, :6] = rng.uniform(-1, 1, (4, 6))
    Cbuf = np.full((4, 7), -1.0)
    Cbuf[:, :6] = rng.uniform(-1, 1, (4, 6))
    C0 = Cbuf[:, :6].copy()
    x = rng.uniform(-1, 1, 6)
    y = np.full(4, np.nan)
    p = plan(source, name="custom_name", target="generic", **decls)
    # parameters: inputs (C is read, so it is one), then outputs that are not read
    assert [s.name for s in p.specs] == ["A", "x", "C", "y"]
    fn(*[a.ctypes.data_as(ctypes.c_void_p) for a in (Abuf, x, Cbuf, y)])
    np.testing.assert_allclose(y, Abuf[:, :6] @ x, rtol=1e-13)
    np.testing.assert_allclose(Cbuf[:, :6], 2 * Abuf[:, :6] - C0, rtol=1e-13)
    assert np.isnan(Abuf[:, 6:]).all() and (Cbuf[:, 6:] == -1.0).all()


def test_emit_accepts_a_dict_program(tmp_path):
    A, x, y = M(3, 3), V(3), V(3)
    c_path, h_path = blacc.emit({"y": A @ x + y}, tmp_path / "built", target="generic",
                                A=A, x=x, y=y)
    assert "void built(" in h_path.read_text()
    build(c_path, "generic")


def test_emit_command_line(tmp_path, capsys):
    """``blacc emit``: files written and compiling; a bad declaration, a program that does
    not type-check and an output path that cannot be written give one line naming the
    problem and status 2, no traceback, and write nothing."""
    from blacc.cli import main

    out = tmp_path / "axpy"
    decls = ["--decl", "x=Vector(5)", "--decl", "y=Vector(5)", "--decl", "alpha=Scalar"]
    assert main(["emit", "y = alpha*x + y", *decls, "--dtype", "f32", "--target", "generic",
                 "-o", str(out)]) == 0
    assert "void axpy(float alpha, const float *restrict x, float *restrict y)" \
        in out.with_suffix(".h").read_text()
    build(out.with_suffix(".c"), "generic")
    capsys.readouterr()
    bad = [(["y = A*x", "--decl", "A=Matrix(3,3", "--decl", "x=Vector(3)"],
            "bad declaration 'A=Matrix(3,3'"),
           (["y = A*x", "--decl", "A=Matrix(3,3)", "--decl", "x=Vector(4)",
             "--decl", "y=Vector(3)"], "A*x: A is 3x3 but x has length 4"),
           (["y = alpha*x + y", *decls, "-o", str(tmp_path / "no" / "dir" / "k")],
            f"cannot write {tmp_path / 'no' / 'dir' / 'k'}.")]
    for args, message in bad:
        if "-o" not in args:
            args = [*args, "-o", str(tmp_path / "bad")]
        assert main(["emit", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blacc: error: ") and message in err, err
        assert "Traceback" not in err
    assert not list(tmp_path.glob("bad*")) and not (tmp_path / "no").exists()


def test_emit_command_line_with_a_measuring_search(tmp_path, capsys):
    from blacc.cli import main

    out = tmp_path / "gemv"
    decls = ["--decl", "A=Matrix(6,5)", "--decl", "x=Vector(5)", "--decl", "y=Vector(6)"]
    assert main(["emit", "y = A*x + y", *decls, "--target", "generic", "--search",
                 "exhaustive", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    build(out.with_suffix(".c"), "generic")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_generic_target_has_no_vectors_even_for_wide_sizes(tmp_path, dtype):
    decls = dict(A=M(16, 17, dtype), x=V(17, dtype), y=V(16, dtype))
    c_path, _, _ = emit_and_run(tmp_path, "y = A*x + y", decls, dtype, "generic")
    text = c_path.read_text()
    assert not re.search(r"_mm\d*_|__m\d+|immintrin", text)


@needs_avx2
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump to disassemble with")
def test_a_vector_shared_by_a_register_tile_is_loaded_once(tmp_path):
    """A row of B used by every row of a C tile is loaded once per term and kept in a
    register (``BLACC_IN_REGISTER``): no two FMAs take the same memory operand, where gcc
    would fold the shared load into each of them and double the loads of the tile."""
    decls = dict(A=M(4, 4), B=M(4, 16), C=M(4, 16))
    c_path, _, p = emit_and_run(tmp_path, "C = A*B", decls, "f64", "avx2")
    assert p.schedule[0].block[0] > 1  # several rows of C share each vector of B
    ir = printer.module(p.module)
    assert "# in register" in ir and "barrier" in ir
    assert "BLACC_IN_REGISTER(" in c_path.read_text()
    obj = tmp_path / "kern.o"
    cmd = [CC, *AVX2_FLAGS, "-O3", "-c", str(c_path), "-o", str(obj)]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    memory = re.findall(r"vfn?m(?:add|sub)\w+\s+(-?(?:0x[0-9a-f]+)?\([^)]*\))", asm)
    repeated = sorted({m for m in memory if memory.count(m) > 1})
    assert not repeated, f"FMAs load the same vector again: {repeated}"
    # the blocks of straight-line code do not keep each other's loads live: no spills
    assert not re.search(r"\(%r[sb]p\)", asm), "the kernel spills to the stack"


def _row_loop(rows: int, cols: int, block: tuple[int, int]):
    """The loop over blocks of rows of ``C(rows x cols) = A(rows x 4)*B(4 x cols)`` f32
    lowered with ``block`` (vectors along the columns)."""
    p = plan("C = A*B", target="avx2", A=M(rows, 4), B=M(4, cols), C=M(rows, cols))
    op = p.indexed.ops[0]
    sched = next(s for s in candidates(p.indexed, op, p.isa)
                 if s.block == block and s.vector == op.dims[1] and not s.pairs)
    module = build_module(p.indexed, p.specs, (sched,), p.isa, "k")
    loops = nodes_of(module, kir.For)
    assert len(loops) == 1, printer.module(module)
    return loops[0]


def test_a_row_loop_reloads_b_only_when_b_would_not_fit_in_registers():
    """In a loop over blocks of rows the C compiler hoists the loads of B out of the loop;
    where they do not fit in the registers a block leaves it spills them (4 x 3 blocks of
    C(24x24) = A*B(4x24) f32: 12 vectors of B next to 12 accumulators), so the loop body
    starts with a barrier and loads them again. B(4x8) next to 2 x 1 blocks fits."""
    spills = _row_loop(24, 24, (4, 3))
    assert isinstance(spills.body[0], kir.Barrier)
    assert sum(isinstance(s, kir.Barrier) for s in spills.body) == 1
    fits = _row_loop(24, 8, (2, 1))
    assert not any(isinstance(s, kir.Barrier) for s in fits.body)


def test_blocks_keep_shared_loads_only_when_they_fit_in_registers():
    """Straight-line blocks are separated by compiler barriers only where the vectors they
    load alike would not fit in registers next to a block: B(4x4) of C(12x4) = A*B (four
    vectors) is better kept in registers for every block of rows than loaded again."""
    fits = plan("C = A*B", target="avx2", A=M(12, 4), B=M(4, 4), C=M(12, 4))
    assert "barrier" not in printer.module(fits.module)
    spills = plan("C = A*B", target="avx2", A=M(4, 4), B=M(4, 32), C=M(4, 32))
    assert "barrier" in printer.module(spills.module)


def _is_gcc() -> bool:
    if CC is None:
        return False
    version = subprocess.run([CC, "--version"], capture_output=True, text=True).stdout
    return "Free Software Foundation" in version and "clang" not in version


@pytest.mark.skipif(not _is_gcc(), reason="gcc's hoisting past a memory clobber")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump to disassemble with")
def test_a_row_loop_reloads_a_temporary_too(tmp_path):
    """C = alpha*A*B + beta*C 48 x 4 x 48 f32 on AVX-512 with alpha*B in the local array
    t0 and 6 x 1 blocks: the loop over blocks of rows starts with a barrier (24 broadcasts
    of A beside the 12 vectors of t0 that the unrolled loop along the row loads), and it
    must hold for t0 as for a parameter (``Barrier.locals``). gcc lets a memory clobber
    pass a local whose address does not escape: it hoisted t0's vectors out of the loop
    and spilled them (30 FMAs and multiplies took an operand from the stack; 1.3x as
    slow in LGen's harness), so the barrier names t0.
    Compiled only: the test needs no AVX-512 CPU."""
    from blacc.backend.c import render
    from blacc.strategy.small import OpSchedule

    isa = ISAS["avx512"]
    decls = dict(A=M(48, 4, "f32"), B=M(4, 48, "f32"), C=M(48, 48, "f32"),
                 alpha=S("f32"), beta=S("f32"))
    p = plan("C = alpha*A*B + beta*C", target="avx512", **decls)
    form = next(f for f in forms(p.typed) if any(o.temporary for o in f.operands))
    schedule = (OpSchedule("j", (4, 2)), OpSchedule("j", (6, 1)))
    module = build_module(form, p.specs, schedule, isa, "kern")
    (row_loop,) = [s for s in module.function("kern").body if isinstance(s, kir.For)]
    assert isinstance(row_loop.body[0], kir.Barrier) and row_loop.body[0].locals
    text = render(module, isa)
    assert re.search(r"BLACC_BARRIER\(\);\n\s*BLACC_IN_MEMORY\(t0\);", text), text
    c_path, obj = tmp_path / "kern.c", tmp_path / "kern.o"
    c_path.write_text(text)
    cmd = [CC, *STRICT_FLAGS, *isa.flags, "-O3", "-c", str(c_path), "-o", str(obj)]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    spilled = re.findall(r"v(?:fn?m(?:add|sub)|mul|add)\w*\s+-?(?:0x[0-9a-f]+)?\(%rsp\)",
                         asm)
    assert not spilled, f"arithmetic on spilled registers: {spilled}"


def test_a_row_loop_leaves_a_temporary_to_gcc_where_its_loads_fit():
    """The same program 32 x 4 x 32 f32 on AVX2 (blocks of 4 rows x 2 vectors): its row
    loop reloads B (the vectors do not fit beside the block) but not the temporary
    alpha*B, which gcc keeps or computes again from B; reloading it ran 0.91x."""
    decls = dict(A=M(32, 4, "f32"), B=M(4, 32, "f32"), C=M(32, 32, "f32"),
                 alpha=S("f32"), beta=S("f32"))
    p = plan("C = alpha*A*B + beta*C", target="avx2", **decls)
    assert any(o.temporary for o in p.indexed.operands)
    barriers = nodes_of(p.module, kir.Barrier)
    assert barriers and not any(b.locals for b in barriers)
    assert "BLACC_IN_MEMORY" not in p.source


@needs_avx2
@pytest.mark.skipif(not _is_gcc(), reason="the model follows gcc's complete unrolling")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump to disassemble with")
@pytest.mark.parametrize(("n", "split"), [(64, 1), (128, 1), (200, 1), (256, 4)])
def test_gcc_unrolls_the_loops_the_model_takes_as_straight_line(tmp_path, n, split):
    """The cost model takes a reduction loop of few, short trips as the straight-line code
    gcc -O3 makes of it (``strategy.small._peeled``): the compiled kernel has a backward
    branch exactly where the model keeps a loop."""
    from blacc.backend.c import render
    from blacc.strategy import small
    from blacc.transform.blac import OpSchedule

    isa = ISAS["avx2"]
    p = plan("alpha = x'*A*y", target="avx2", x=V(4, "f32"), A=M(4, n, "f32"),
             y=V(n, "f32"), alpha=S("f32"))
    module = build_module(p.indexed, p.specs, (OpSchedule("k1", split=split),), isa, "kern")
    assert nodes_of(module, kir.For)
    c_path, obj = tmp_path / "kern.c", tmp_path / "kern.o"
    c_path.write_text(render(module, isa))
    cmd = [CC, *AVX2_FLAGS, "-O3", "-c", str(c_path), "-o", str(obj)]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    backward = [m for m in re.finditer(r"^\s*([0-9a-f]+):\s+j\w+\s+([0-9a-f]+)", asm, re.M)
                if int(m.group(2), 16) < int(m.group(1), 16)]
    body = module.function(module.entry).body
    assert bool(backward) is small._cycles(body, isa).looped
