"""Call a compiled fixed-size kernel from Python through a generated CPython extension.

ctypes spends 3-5 us per call converting arguments, more than NumPy spends on a whole
small ``np.matmul``. So each kernel gets its own extension module, compiled in the same
translation unit as the kernel: one ``METH_FASTCALL`` function ``call(*args)`` that
takes the kernel's arguments positionally in :class:`~blacc.runtime.signature.ArgSpec`
order, checks every array through the buffer protocol (format, shape, strides,
writability, alignment, overlap of outputs with other operands), converts scalars, and
only then calls the kernel, so nothing is written when a check fails.

* :func:`wrapper_source` renders the extension's C source;
* :func:`build_extension` compiles kernel + wrapper (cached on disk) and returns ``call``;
* :class:`FixedKernel` adds a by-name ``__call__`` that allocates omitted outputs.

The positional ``call`` (``FixedKernel.fast``) takes exactly one argument per spec. An
output scalar's slot is ignored (pass ``None``); an in/out scalar's slot is its initial
value. It returns the output scalars: ``None`` when there are none, a float for one, a
tuple of floats in spec order for several. Errors are blacc's (``ValueError`` or
``TypeError`` subclasses, see ``blacc.errors``) and name the argument::

    x: expected shape (9, 1) or (9,) float64 contiguous, got (4,) float64
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import keyword
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .. import __version__
from ..backend.compiler import Compiler, compile_shared, find_compiler
from ..errors import ArgumentError
from .cache import KernelCache, cache_key, default_cache
from .signature import ARRAY, IN, OUT, SCALAR, ArgSpec

__all__ = ["EXTENSION_FLAGS", "FixedKernel", "build_extension", "compile_extension",
           "wrapper_source"]

#: Flags every extension is compiled with, before the caller's (ISA) flags. Hidden
#: visibility keeps the kernel's symbol private (PyInit_* is exported explicitly by
#: PyMODINIT_FUNC), so the compiler may inline the kernel into ``call``.
EXTENSION_FLAGS: tuple[str, ...] = ("-O3", "-std=c11", "-fno-math-errno", "-fvisibility=hidden")

#: Release the GIL around the kernel when its arrays hold at least this many elements.
#: Releasing and re-taking it costs far more than a 4x4 product, so small kernels keep it.
GIL_RELEASE_ELEMENTS = 1 << 14

_C_TYPE = {"f32": "float", "f64": "double"}
_FORMAT = {"f32": "f", "f64": "d"}
_ITEMSIZE = {"f32": 4, "f64": 8}
_NP_DTYPE = {"f32": np.dtype(np.float32), "f64": np.dtype(np.float64)}
_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ------------------------------------------------------------------------ spec checks
def _check_specs(entry_name: str, specs: Sequence[ArgSpec]) -> None:
    """Reject specs the wrapper cannot serve, naming the offending argument."""
    if not _C_IDENT.fullmatch(entry_name):
        raise ArgumentError(f"kernel entry name {entry_name!r} is not a C identifier")
    seen: set[str] = set()
    for s in specs:
        if not isinstance(s, ArgSpec):
            raise ArgumentError(f"expected ArgSpec objects, got {type(s).__name__}")
        if not s.name or s.name in seen:
            raise ArgumentError(f"argument names must be unique and non-empty: {s.name!r}")
        seen.add(s.name)
        if s.dtype not in _C_TYPE:
            raise ArgumentError(f"{s.name}: dtype {s.dtype!r} is not supported (f32 or f64)")
        if s.kind != ARRAY:
            continue
        if s.rows < 1 or s.cols < 1:
            raise ArgumentError(f"{s.name}: array shape ({s.rows}, {s.cols}) must be positive")
        ld = s.leading_dimension
        outer, inner = (s.rows, s.cols) if s.layout == "row" else (s.cols, s.rows)
        if ld < 1 or (outer > 1 and ld < inner):
            raise ArgumentError(f"{s.name}: leading dimension {ld} < {inner} for a "
                                f"{s.layout}-layout ({s.rows}, {s.cols}) array")


def _is_vector(s: ArgSpec) -> bool:
    return s.rows == 1 or s.cols == 1


def _byte_strides(s: ArgSpec) -> tuple[int, int]:
    """Bytes between consecutive rows and between consecutive columns."""
    size, ld = _ITEMSIZE[s.dtype], s.leading_dimension
    return (ld * size, size) if s.layout == "row" else (size, ld * size)


def _natural(s: ArgSpec) -> bool:
    """True when the layout is plain C order ('row') or Fortran order ('col')."""
    if s.layout == "row":
        return s.rows == 1 or s.leading_dimension == s.cols
    return s.cols == 1 or s.leading_dimension == s.rows


def _expected(s: ArgSpec) -> str:
    """What an array argument must be, in words: 'shape (3, 2) float64 C-contiguous'."""
    shape = f"({s.rows}, {s.cols})"
    if s.rows == 1 and s.cols == 1:
        shape += ", (1,) or ()"
    elif _is_vector(s):
        shape += f" or ({s.rows * s.cols},)"
    dtype = _NP_DTYPE[s.dtype].name
    rs, cs = _byte_strides(s)
    if s.rows == 1 and s.cols == 1:
        layout = "array"
    elif _is_vector(s):
        step = rs if s.rows > 1 else cs
        layout = "contiguous" if step == _ITEMSIZE[s.dtype] else f"with element stride {step} bytes"
    elif s.layout == "row":
        layout = ("C-contiguous" if _natural(s) else
                  f"row-major with leading dimension {s.leading_dimension} "
                  f"(strides ({rs}, {cs}))")
    else:
        layout = ("Fortran-contiguous" if _natural(s) else
                  f"column-major with leading dimension {s.leading_dimension} "
                  f"(strides ({rs}, {cs}))")
    return f"shape {shape} {dtype} {layout}"


def _c_string(text: str) -> str:
    """``text`` as a C string literal (UTF-8, every non-printable byte escaped)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 32 <= byte < 127 and ch != "?":  # '?' could start a trigraph
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


# ------------------------------------------------------------------------ C source
_PRELUDE = r"""
/* ---- CPython entry point, generated by blacc.runtime.pycall ---- */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__GNUC__)
#define BLACC_PY_HELPER static __attribute__((unused))
#else
#define BLACC_PY_HELPER static
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define BLACC_PY_NATIVE_ORDER '>'
#else
#define BLACC_PY_NATIVE_ORDER '<'
#endif

/* What one array argument must look like; strides are in bytes. */
typedef struct {
    const char *name;
    const char *expected;   /* in words, for messages */
    char format;            /* struct-module code: 'f' or 'd' */
    int written;
    Py_ssize_t itemsize, rows, cols;
    Py_ssize_t row_stride, col_stride;
    Py_ssize_t extent;      /* bytes from the first element to one past the last */
} blacc_py_array;

static PyObject *blacc_py_dtype_error, *blacc_py_shape_error;
static PyObject *blacc_py_argument_error, *blacc_py_aliasing_error;

/* The element code of a one-item native format ("f", "<f", "=f", "@f"), else 0. */
BLACC_PY_HELPER char blacc_py_code(const char *format) {
    const char *f = format ? format : "B";
    if (*f == '@' || *f == '=' || *f == BLACC_PY_NATIVE_ORDER) f++;
    return (f[0] != '\0' && f[1] == '\0') ? f[0] : 0;
}

BLACC_PY_HELPER const char *blacc_py_dtype_name(const char *format, char *buf, size_t size) {
    const char *f = format ? format : "B";
    switch (blacc_py_code(f)) {
    case 'f': return "float32";
    case 'd': return "float64";
    case 'e': return "float16";
    case 'g': return "longdouble";
    case 'b': return "int8";
    case 'B': return "uint8";
    case 'h': return "int16";
    case 'H': return "uint16";
    case 'i': return "int32";
    case 'I': return "uint32";
    case 'l': case 'q': return "int64";
    case 'L': case 'Q': return "uint64";
    case '?': return "bool";
    case 'O': return "object";
    default: break;
    }
    snprintf(buf, size, "format '%.40s'", f);
    return buf;
}

/* Append "(a, b)" (or "(a,)") to buf, never overflowing it. */
BLACC_PY_HELPER void blacc_py_tuple(char *buf, size_t size, int n, const Py_ssize_t *v) {
    size_t used = strlen(buf);
    for (int i = 0; i <= n && used + 1 < size; i++) {
        int w = i < n ? snprintf(buf + used, size - used, "%s%zd", i == 0 ? "(" : ", ", v[i])
                      : snprintf(buf + used, size - used, "%s",
                                 n == 0 ? "()" : n == 1 ? ",)" : ")");
        if (w < 0) return;
        used = used + (size_t)w < size ? used + (size_t)w : size - 1;
    }
}

/* "(3, 2) float64", with " with strides (8, 24)" when asked. */
BLACC_PY_HELPER void blacc_py_describe(const Py_buffer *v, int strides, char *buf, size_t size) {
    char dt[64];
    buf[0] = '\0';
    blacc_py_tuple(buf, size, v->ndim, v->shape);
    size_t used = strlen(buf);
    snprintf(buf + used, size - used, " %s", blacc_py_dtype_name(v->format, dt, sizeof dt));
    if (strides && v->strides != NULL) {
        used = strlen(buf);
        snprintf(buf + used, size - used, " with strides ");
        blacc_py_tuple(buf, size, v->ndim, v->strides);
    }
}

/* Borrow obj's buffer into view and check it against a; 0, or -1 with an error set
   (and view released). */
BLACC_PY_HELPER int blacc_py_get_array(PyObject *obj, const blacc_py_array *a, Py_buffer *view) {
    char got[320];
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (a->written ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        if (a->written && PyObject_CheckBuffer(obj)) {
            Py_buffer probe;
            PyErr_Clear();
            if (PyObject_GetBuffer(obj, &probe, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
                int readonly = probe.readonly;
                blacc_py_describe(&probe, 0, got, sizeof got);
                PyBuffer_Release(&probe);
                if (readonly) {
                    PyErr_Format(blacc_py_argument_error,
                                 "%s: expected a writable array of %s, got a read-only %s",
                                 a->name, a->expected, got);
                    return -1;
                }
            }
        }
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected an array of %s, got %.200s",
                     a->name, a->expected, Py_TYPE(obj)->tp_name);
        return -1;
    }
    const Py_ssize_t *shape = view->shape, *st = view->strides;
    Py_ssize_t rs = a->row_stride, cs = a->col_stride;
    int shape_ok, strides_ok = 1;
    if (blacc_py_code(view->format) != a->format) {
        blacc_py_describe(view, 0, got, sizeof got);
        PyErr_Format(blacc_py_dtype_error, "%s: expected %s, got %s", a->name, a->expected, got);
        goto fail;
    }
    if (view->ndim == 2) {
        shape_ok = shape[0] == a->rows && shape[1] == a->cols;
        if (shape_ok && st != NULL)
            strides_ok = (a->rows == 1 || st[0] == rs) && (a->cols == 1 || st[1] == cs);
    } else if (view->ndim == 1) {
        shape_ok = (a->rows == 1 || a->cols == 1) && shape[0] == a->rows * a->cols;
        if (shape_ok && st != NULL)
            strides_ok = shape[0] == 1 || st[0] == (a->rows > 1 ? rs : cs);
    } else {
        shape_ok = view->ndim == 0 && a->rows == 1 && a->cols == 1;
    }
    if (!shape_ok) {
        blacc_py_describe(view, 0, got, sizeof got);
        PyErr_Format(blacc_py_shape_error, "%s: expected %s, got %s", a->name, a->expected, got);
        goto fail;
    }
    if (st == NULL && view->ndim == 2)  /* C-contiguous, as the exporter promised */
        strides_ok = (a->rows == 1 || a->cols * a->itemsize == rs)
                     && (a->cols == 1 || a->itemsize == cs);
    if (!strides_ok) {
        blacc_py_describe(view, 1, got, sizeof got);
        PyErr_Format(blacc_py_argument_error, "%s: expected %s, got %s", a->name, a->expected,
                     got);
        goto fail;
    }
    if ((uintptr_t)view->buf % (uintptr_t)a->itemsize != 0) {
        PyErr_Format(blacc_py_argument_error,
                     "%s: the array's data is not aligned to its %zd-byte elements",
                     a->name, a->itemsize);
        goto fail;
    }
    return 0;
fail:
    PyBuffer_Release(view);
    return -1;
}

/* 0 when the memory the kernel touches through a and b is disjoint; else -1 with an
   error naming both. */
BLACC_PY_HELPER int blacc_py_disjoint(const Py_buffer *va, const blacc_py_array *a,
                             const Py_buffer *vb, const blacc_py_array *b) {
    const char *pa = (const char *)va->buf, *pb = (const char *)vb->buf;
    if (pa < pb + b->extent && pb < pa + a->extent) {
        if (b->written)
            PyErr_Format(blacc_py_aliasing_error,
                         "%s and %s: outputs overlap in memory; pass separate arrays",
                         a->name, b->name);
        else
            PyErr_Format(blacc_py_aliasing_error,
                         "%s: output overlaps input %s in memory; pass a separate array",
                         a->name, b->name);
        return -1;
    }
    return 0;
}

BLACC_PY_HELPER int blacc_py_get_double(PyObject *obj, const char *name, double *out) {
    if (PyFloat_CheckExact(obj)) {
        *out = PyFloat_AS_DOUBLE(obj);
        return 0;
    }
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a real number, got bool", name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: expected a real number, got %.200s",
                         name, Py_TYPE(obj)->tp_name);
        } else {  /* e.g. OverflowError: keep its message, raise blacc's ValueError */
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_Format(blacc_py_argument_error, "%s: cannot convert %.200s to a float (%S)",
                         name, Py_TYPE(obj)->tp_name, value != NULL ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
        }
        return -1;
    }
    *out = v;
    return 0;
}

BLACC_PY_HELPER int blacc_py_get_float(PyObject *obj, const char *name, float *out) {
    double v;
    if (blacc_py_get_double(obj, name, &v) < 0) return -1;
    *out = (float)v;
    return 0;
}

BLACC_PY_HELPER int blacc_py_errors(void) {
    if (blacc_py_argument_error != NULL) return 0;
    PyObject *errors = PyImport_ImportModule("blacc.errors");
    if (errors == NULL) return -1;
    blacc_py_dtype_error = PyObject_GetAttrString(errors, "DTypeError");
    blacc_py_shape_error = PyObject_GetAttrString(errors, "ShapeError");
    blacc_py_aliasing_error = PyObject_GetAttrString(errors, "AliasingError");
    blacc_py_argument_error = PyObject_GetAttrString(errors, "ArgumentError");
    Py_DECREF(errors);
    if (blacc_py_dtype_error && blacc_py_shape_error && blacc_py_aliasing_error
        && blacc_py_argument_error)
        return 0;
    Py_CLEAR(blacc_py_dtype_error);
    Py_CLEAR(blacc_py_shape_error);
    Py_CLEAR(blacc_py_aliasing_error);
    Py_CLEAR(blacc_py_argument_error);
    return -1;
}
"""


def _array_entry(s: ArgSpec) -> str:
    rs, cs = _byte_strides(s)
    size = _ITEMSIZE[s.dtype]
    fields = [_c_string(s.name), _c_string(_expected(s)), f"'{_FORMAT[s.dtype]}'",
              str(int(s.written)), str(size), str(s.rows), str(s.cols), str(rs), str(cs),
              str(s.extent * size)]
    return "    {" + ", ".join(fields) + "},"


def _release_gil(specs: Sequence[ArgSpec]) -> bool:
    return sum(s.rows * s.cols for s in specs if s.kind == ARRAY) >= GIL_RELEASE_ELEMENTS


def wrapper_source(entry_name: str, specs: Sequence[ArgSpec], module_name: str, *,
                   release_gil: bool | None = None, status: bool = True) -> str:
    """C source of an extension module ``module_name`` whose ``call(*args)`` checks its
    arguments against ``specs`` and calls ``int entry_name(...)``, raising MemoryError
    where that returns a status other than 0, which says that scratch memory could not be
    allocated (``void entry_name(...)`` without ``status``).

    Append it to the kernel's C source (one translation unit). ``release_gil``: drop
    the GIL around the kernel; by default only when the arrays hold at least
    :data:`GIL_RELEASE_ELEMENTS` elements.
    """
    specs = tuple(specs)
    _check_specs(entry_name, specs)
    if not _C_IDENT.fullmatch(module_name):
        raise ArgumentError(f"module name {module_name!r} is not a C identifier")
    if release_gil is None:
        release_gil = _release_gil(specs)
    n = len(specs)
    arrays = [i for i, s in enumerate(specs) if s.kind == ARRAY]
    slot = {i: j for j, i in enumerate(arrays)}  # spec index -> views[] index
    outs = [i for i, s in enumerate(specs) if s.kind == SCALAR and s.written]
    names = ", ".join(s.name for s in specs)

    lines = [_PRELUDE]
    if arrays:
        lines.append(f"static const blacc_py_array blacc_py_arrays[{len(arrays)}] = {{")
        lines += [_array_entry(specs[i]) for i in arrays]
        lines.append("};")
        lines.append(f"static const int blacc_py_slots[{len(arrays)}] = "
                     f"{{{', '.join(map(str, arrays))}}};")
    lines += ["",
              "static PyObject *blacc_py_call(PyObject *self, PyObject *const *args,",
              "                               Py_ssize_t nargs) {"]
    body = ["(void)self;", "(void)args;"]
    if arrays:
        body += [f"Py_buffer views[{len(arrays)}];", "int acquired = 0;"]
    if status:
        body.append("int status;")
    for i, s in enumerate(specs):
        if s.kind == SCALAR:
            body.append(f"{_C_TYPE[s.dtype]} s{i} = 0;")
    body += [f"if (nargs != {n}) {{",
             f"    PyErr_Format(PyExc_TypeError, \"%s() takes exactly {n} arguments (%s), \"",
             f"                 \"got %zd\", {_c_string(entry_name)}, {_c_string(names)}, nargs);",
             "    return NULL;", "}"]
    for i, s in enumerate(specs):
        if s.kind == SCALAR and s.role != OUT:
            getter = "blacc_py_get_float" if s.dtype == "f32" else "blacc_py_get_double"
            body.append(f"if ({getter}(args[{i}], {_c_string(s.name)}, &s{i}) < 0) return NULL;")
    if arrays:
        body += [f"for (; acquired < {len(arrays)}; acquired++)",
                 "    if (blacc_py_get_array(args[blacc_py_slots[acquired]], "
                 "&blacc_py_arrays[acquired],",
                 "                           &views[acquired]) < 0) goto fail;"]
        # Every written array against every other array (each pair once).
        for a in range(len(arrays)):
            for b in range(len(arrays)):
                wa, wb = specs[arrays[a]].written, specs[arrays[b]].written
                if a != b and wa and (not wb or a < b):
                    body.append(f"if (blacc_py_disjoint(&views[{a}], &blacc_py_arrays[{a}], "
                                f"&views[{b}], &blacc_py_arrays[{b}]) < 0) goto fail;")
    params = []
    for i, s in enumerate(specs):
        ctype = _C_TYPE[s.dtype]
        if s.kind == ARRAY:
            const = "const " if s.role == IN else ""
            params.append(f"({const}{ctype} *)views[{slot[i]}].buf")
        else:
            params.append(f"&s{i}" if s.written else f"s{i}")
    call = f"{'status = ' if status else ''}{entry_name}({', '.join(params)});"
    if release_gil:
        body += ["Py_BEGIN_ALLOW_THREADS", call, "Py_END_ALLOW_THREADS"]
    else:
        body.append(call)
    if arrays:
        body.append("while (acquired > 0) PyBuffer_Release(&views[--acquired]);")
    if status:
        # the kernels' one failure: scratch memory, allocated before any output is written
        body += ["if (status != 0) {",
                 "    PyErr_Format(PyExc_MemoryError, \"kernel %s could not allocate its \"",
                 "                 \"scratch memory (status %d); no output was written\", "
                 f"{_c_string(entry_name)}, status);",
                 "    return NULL;", "}"]
    if not outs:
        body.append("Py_RETURN_NONE;")
    elif len(outs) == 1:
        body.append(f"return PyFloat_FromDouble((double)s{outs[0]});")
    else:
        fmt = "(" + "d" * len(outs) + ")"
        body.append(f"return Py_BuildValue(\"{fmt}\", "
                    f"{', '.join(f'(double)s{i}' for i in outs)});")
    if arrays:
        body += ["fail:", "while (acquired > 0) PyBuffer_Release(&views[--acquired]);",
                 "return NULL;"]
    lines += [("    " + line) if not line.endswith(":") else line for line in body]
    lines.append("}")

    if all(s.name.isidentifier() and not keyword.iskeyword(s.name) for s in specs):
        text_sig = f"call($module, {names}, /)\n--\n\n" if specs else "call($module, /)\n--\n\n"
    else:
        text_sig = ""
    result = ("None" if not outs else "float" if len(outs) == 1
              else "tuple of " + ", ".join(specs[i].name for i in outs))
    doc = (f"{text_sig}Call kernel {entry_name}({names}) after checking every argument; "
           f"returns {result}.")
    lines += [
        "",
        "static PyMethodDef blacc_py_methods[] = {",
        "    {\"call\", (PyCFunction)(void (*)(void))blacc_py_call, METH_FASTCALL,",
        f"     {_c_string(doc)}}},",
        "    {NULL, NULL, 0, NULL}",
        "};",
        "",
        "static struct PyModuleDef blacc_py_module = {",
        f"    PyModuleDef_HEAD_INIT, {_c_string(module_name)},",
        f"    {_c_string(f'Python entry point of the blacc kernel {entry_name}.')},",
        "    -1, blacc_py_methods, NULL, NULL, NULL, NULL",
        "};",
        "",
        f"PyMODINIT_FUNC PyInit_{module_name}(void) {{",
        "    if (blacc_py_errors() < 0) return NULL;",
        "    return PyModule_Create(&blacc_py_module);",
        "}",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------ building
def _extension_loader(name: str) -> Callable[[Path], Any]:
    """A cache ``load`` that imports a file as the extension module ``name``."""

    def load(path: Path) -> ModuleType:
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
        if spec is None:
            raise OSError(f"cannot make an import spec for {path}")
        try:
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except ImportError as exc:  # OSError makes the cache rebuild a stale entry
            raise OSError(f"cannot import kernel extension {path}: {exc}") from exc
        return module

    return load


def compile_extension(render: Callable[[str], str], prefix: str, *,
                      compiler: Compiler | None = None, flags: Sequence[str] = (),
                      cache: KernelCache | None = None) -> ModuleType:
    """Compile and import the CPython extension whose C source is ``render(module_name)``.

    The module name goes into ``PyInit_<name>`` and so into the source: the source rendered
    for ``prefix`` is keyed (it fixes the final source given the key), then the module is
    named ``<prefix>_<key>``. Flags: :data:`EXTENSION_FLAGS`, the Python include directory,
    then ``flags``. Cached on disk (``cache``, by default
    :func:`~blacc.runtime.cache.default_cache`), keyed by source, compiler, flags and the
    Python and blacc versions.
    """
    cc = compiler or find_compiler(os.environ.get("CC") or None)
    all_flags = (*EXTENSION_FLAGS, f"-I{sysconfig.get_paths()['include']}", *flags)
    key = cache_key(source=render(prefix), compiler=[cc.path, *cc.args, cc.version],
                    flags=list(all_flags), python=sys.version, blacc=__version__)
    name = f"{prefix}_{key[:16]}"

    def compile_to(path: Path) -> None:
        compile_shared(cc, render(name), path, all_flags)

    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return (cache or default_cache()).library(key, compile_to, suffix=suffix,
                                              load=_extension_loader(name))


def build_extension(kernel_c_source: str, entry_name: str, specs: Sequence[ArgSpec], *,
                    compiler: Compiler | None = None, flags: Sequence[str] = (),
                    release_gil: bool | None = None, status: bool = True,
                    cache: KernelCache | None = None) -> Callable[..., Any]:
    """Compile ``kernel_c_source`` (which defines ``int entry_name(...)``, or ``void``
    without ``status``) together with its CPython wrapper and return the module's
    positional ``call`` function.

    ``flags`` are the target's (ISA) flags (see :func:`compile_extension`).
    """
    specs = tuple(specs)

    def render(name: str) -> str:
        return kernel_c_source + wrapper_source(entry_name, specs, name,
                                                release_gil=release_gil, status=status)

    return compile_extension(render, "blacc_k", compiler=compiler, flags=flags,
                             cache=cache).call


# ------------------------------------------------------------------------ by-name calls
def _allocator(s: ArgSpec) -> Callable[[], np.ndarray]:
    """A function returning a new output array for ``s``, in the layout the kernel
    writes: C (or, for 'col', Fortran) order, padded to the leading dimension; a
    declared Vector is 1-D, as NumPy users hold vectors."""
    dtype, ld = _NP_DTYPE[s.dtype], s.leading_dimension
    if s.vector:
        return functools.partial(np.empty, (s.rows * s.cols,), dtype)
    if _natural(s):
        order = "F" if s.layout == "col" and not _is_vector(s) else "C"
        return functools.partial(np.empty, (s.rows, s.cols), dtype, order)
    if s.layout == "row":
        return lambda: np.empty((s.rows, ld), dtype)[:, : s.cols]
    return lambda: np.empty((ld, s.cols), dtype, order="F")[: s.rows, :]


def _outputs(specs: Sequence[ArgSpec]) -> list[tuple[str, int | None]]:
    """(name, where) per output in spec order: where is None for an array (returned as
    passed), -1 for the only output scalar (the whole result of ``fast``), else the
    index of the scalar in the tuple ``fast`` returns."""
    scalars = [s.name for s in specs if s.kind == SCALAR and s.written]
    return [(s.name, None if s.kind == ARRAY else -1 if len(scalars) == 1
             else scalars.index(s.name)) for s in specs if s.written]


def _specialized_call(specs: Sequence[ArgSpec], fast: Callable[..., Any],
                      name: str) -> Callable[..., Any] | None:
    """Generate ``__call__(self, /, *, <inputs>, <outputs>=None)`` for these specs, so
    that the interpreter binds the keywords; None when a name cannot be a parameter."""
    if any(not s.name.isidentifier() or keyword.iskeyword(s.name) or s.name == "self"
           or s.name.startswith("_blacc") for s in specs):
        return None
    namespace: dict[str, Any] = {"_blacc_fast": fast}
    required = [s.name for s in specs if s.role != OUT]
    optional = [f"{s.name}=None" for s in specs if s.kind == ARRAY and s.role == OUT]
    body = []
    for i, s in enumerate(specs):
        if s.kind == ARRAY and s.role == OUT:
            namespace[f"_blacc_new{i}"] = _allocator(s)
            body.append(f"if {s.name} is None:\n        {s.name} = _blacc_new{i}()")
    args = ["None" if s.kind == SCALAR and s.role == OUT else s.name for s in specs]
    body.append(f"_blacc_r = _blacc_fast({', '.join(args)})")
    values = [(n, n if where is None else "_blacc_r" if where < 0 else f"_blacc_r[{where}]")
              for n, where in _outputs(specs)]
    if len(values) <= 1:
        body.append(f"return {values[0][1] if values else None}")
    else:
        body.append("return {" + ", ".join(f"{n!r}: {v}" for n, v in values) + "}")
    params = ", ".join(["self", "/", *(["*"] if required or optional else []),
                        *required, *optional])
    text = f"def __call__({params}):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(text, f"<blacc kernel {name}>", "exec"), namespace)
    fn = namespace["__call__"]
    fn.__qualname__ = fn.__name__ = name
    return fn


class FixedKernel:
    """A compiled fixed-size kernel, callable by argument name.

    ``kernel(A=..., x=..., y=...)``: every input (and in/out) argument is required;
    an omitted output array is allocated (``np.empty`` of shape ``(n,)`` for a declared
    Vector, else ``(rows, cols)`` in the layout the kernel writes) and returned;
    output scalars are not passed, only returned. The result is the single output
    itself, or, when there are several, a dict mapping each output's name to its array
    or float (in spec order); None when the kernel has no outputs. Checks are those of
    the positional ``fast`` function (see :func:`wrapper_source`), which hot loops
    should call directly.

    Attributes: ``specs`` (the ArgSpecs), ``fast`` (the extension's positional
    ``call``), ``source`` (the kernel's C source), ``name`` (its entry function).

    Each instance gets its own subclass whose ``__call__`` is generated for its specs,
    so the interpreter itself binds the keyword arguments (missing and unknown names
    raise Python's usual TypeError); names that cannot be Python parameters fall back
    to a generic (slower) ``__call__``.
    """

    __slots__ = ("specs", "fast", "source", "name", "_accepted", "_required", "_plan",
                 "_outputs")

    def __new__(cls, specs: Sequence[ArgSpec], fast: Callable[..., Any], source: str = "",
                *, name: str = "kernel") -> FixedKernel:
        call = _specialized_call(tuple(specs), fast, name)
        if call is None:
            return super().__new__(cls)
        sub = type(cls.__name__, (cls,), {"__slots__": (), "__call__": call,
                                          "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
        return super().__new__(sub)

    def __init__(self, specs: Sequence[ArgSpec], fast: Callable[..., Any], source: str = "",
                 *, name: str = "kernel") -> None:
        self.specs: tuple[ArgSpec, ...] = tuple(specs)
        self.fast = fast
        self.source = source
        self.name = name
        # For the generic __call__: names, an allocator per output array, the outputs.
        specs = self.specs
        self._accepted = frozenset(s.name for s in specs if s.role != OUT or s.kind == ARRAY)
        self._required = frozenset(s.name for s in specs if s.role != OUT)
        self._plan = tuple((s.name, _allocator(s) if s.kind == ARRAY and s.role == OUT
                            else None) for s in specs)
        self._outputs = tuple(_outputs(specs))

    @classmethod
    def build(cls, kernel_c_source: str, entry_name: str, specs: Sequence[ArgSpec],
              **options: Any) -> FixedKernel:
        """Compile with :func:`build_extension` (``options`` are its keywords)."""
        fast = build_extension(kernel_c_source, entry_name, specs, **options)
        return cls(specs, fast, kernel_c_source, name=entry_name)

    def __call__(self, /, **arguments: Any) -> Any:
        """Generic by-name call, used when an argument name is not a Python identifier."""
        names = arguments.keys()
        if not (self._required <= names and self._accepted >= names):
            missing = [s.name for s in self.specs if s.name in self._required - names]
            unknown = sorted(names - self._accepted)
            parts = [f"missing {', '.join(map(repr, missing))}"] if missing else []
            parts += [f"unexpected {', '.join(map(repr, unknown))}"] if unknown else []
            raise TypeError(f"{self.name}() got bad arguments: {'; '.join(parts)}")
        args = []
        for name, allocate in self._plan:
            value = arguments.get(name)
            if value is None and allocate is not None:
                value = arguments[name] = allocate()
            args.append(value)
        result = self.fast(*args)
        values = {name: arguments[name] if where is None else result if where < 0
                  else result[where] for name, where in self._outputs}
        if len(values) <= 1:
            return next(iter(values.values()), None)
        return values

    def __repr__(self) -> str:
        args = ", ".join(f"{s.name}: {s.role} {s.dtype}"
                         + ("" if s.kind != ARRAY else f"[{s.rows * s.cols}]" if s.vector
                            else f"[{s.rows}x{s.cols}]")
                         for s in self.specs)
        return f"FixedKernel({self.name}({args}))"
