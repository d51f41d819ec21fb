"""Call a compiled GEMM kernel from Python without ctypes' per-call cost.

Reading three data pointers through ``ndarray.ctypes``/``__array_interface__`` and
converting fourteen ctypes arguments costs ~10 us per ``blacc.gemm`` call, more than a
32x32x32 product. This module compiles one small CPython extension per machine (cached
on disk like the kernels) whose ``call_f32``/``call_f64`` take the kernel's address and
the operand arrays, read pointers and strides through the buffer protocol, and call the
kernel; the GIL is released around large products.

The arrays reaching it are already checked by ``runtime.gemm`` (dtype, shapes, aliasing,
a unit stride in one dimension); the extension re-checks what memory safety depends on
(2-D, item size, whole-element strides, extents that agree, a writable C) and raises
``ValueError`` otherwise. Without a working C compiler :func:`gemm_caller` is None and
``runtime.gemm`` falls back to ctypes.

An optional last argument of flags serves ``runtime.gemm``'s fast path, which passes the
user's arrays as they are: transpose A or B, compute C^T = op(B)^T op(A)^T (``SWAP``),
require a unit column stride of what the kernel reads (``UNIT_*``, the plan's known
strides), and return ``MAY_OVERLAP`` without calling the kernel when C's memory range
meets A's or B's (``CHECK_OVERLAP``; the caller then takes the checked path).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import CompilerError
from .build import host_compiler
from .pycall import compile_extension

__all__ = ["CHECK_OVERLAP", "GIL_RELEASE_FLOPS", "MAY_OVERLAP", "SWAP", "TRANS_A", "TRANS_B",
           "UNIT_A", "UNIT_B", "UNIT_B_ROWS", "UNIT_C", "gemm_caller", "caller_source"]

#: Flags of the extension's optional last argument (its C gets them as #defines). UNIT_X:
#: the kernel needs a unit column stride of X; UNIT_B_ROWS: a unit row stride of B.
TRANS_A, TRANS_B, SWAP, UNIT_A, UNIT_B, UNIT_C, CHECK_OVERLAP = 1, 2, 4, 8, 16, 32, 64
UNIT_B_ROWS = 128
#: What the extension returns, without calling the kernel, when C may overlap A or B.
MAY_OVERLAP = -2
_DEFINES = {"TRANS_A": TRANS_A, "TRANS_B": TRANS_B, "SWAP": SWAP, "UNIT_A": UNIT_A,
            "UNIT_B": UNIT_B, "UNIT_C": UNIT_C, "UNIT_B_ROWS": UNIT_B_ROWS,
            "CHECK_OVERLAP": CHECK_OVERLAP,
            "MAY_OVERLAP": MAY_OVERLAP}

#: Release the GIL when m*n*k is at least this: below it the product takes less time
#: than releasing and re-taking the lock.
GIL_RELEASE_FLOPS = 1 << 15

_TEMPLATE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Shape and byte strides of a 2-D buffer, transposed when asked. */
static void view(const Py_buffer *v, long transposed, Py_ssize_t *shape, Py_ssize_t *strides) {
    int t = transposed != 0;
    shape[0] = v->shape[t]; shape[1] = v->shape[1 - t];
    strides[0] = v->strides[t]; strides[1] = v->strides[1 - t];
}

/* The byte range [lo, hi) a non-empty 2-D buffer spans. */
static void span(const Py_buffer *v, const char **lo, const char **hi) {
    const char *p = v->buf, *first = p, *last = p;
    for (int d = 0; d < 2; ++d) {
        Py_ssize_t reach = (v->shape[d] - 1) * v->strides[d];
        if (reach < 0) first += reach; else last += reach;
    }
    *lo = first; *hi = last + v->itemsize;
}

/* Whether two buffers' byte ranges intersect (what numpy.may_share_memory answers). */
static int overlap(const Py_buffer *x, const Py_buffer *y) {
    if (x->len == 0 || y->len == 0) return 0;
    const char *xl, *xh, *yl, *yh;
    span(x, &xl, &xh);
    span(y, &yl, &yh);
    return xl < yh && yl < xh;
}

/* A GEMM entry: with extents (sized) or compiled for one shape (fixed). */
#define DEFINE_CALL(T, NAME)                                                              \
typedef int (*NAME##_sized)(int64_t, int64_t, int64_t, T, const T *, int64_t, int64_t,   \
                            const T *, int64_t, int64_t, T, T *, int64_t, int64_t);       \
typedef int (*NAME##_fixed)(T, const T *, int64_t, int64_t, const T *, int64_t, int64_t, \
                            T, T *, int64_t, int64_t);                                    \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {          \
    (void)self;                                                                           \
    if (nargs != 7 && nargs != 8) {                                                       \
        PyErr_SetString(PyExc_TypeError,                                                  \
                        #NAME "(address, sized, alpha, a, b, beta, c[, flags])");         \
        return NULL;                                                                      \
    }                                                                                     \
    void *address = PyLong_AsVoidPtr(args[0]);                                            \
    int sized = PyObject_IsTrue(args[1]);                                                 \
    double alpha = PyFloat_AsDouble(args[2]), beta = PyFloat_AsDouble(args[5]);           \
    long flags = nargs == 8 ? PyLong_AsLong(args[7]) : 0;                                 \
    if (PyErr_Occurred() || sized < 0) return NULL;                                       \
    if (!address) {                                                                       \
        PyErr_SetString(PyExc_ValueError, "null kernel address");                         \
        return NULL;                                                                      \
    }                                                                                     \
    Py_buffer v[3];                                                                       \
    int held = 0;                                                                         \
    for (; held < 3; ++held) {                                                            \
        int want = held == 2 ? PyBUF_STRIDES | PyBUF_WRITABLE : PyBUF_STRIDES;            \
        if (PyObject_GetBuffer(args[held == 2 ? 6 : 3 + held], &v[held], want) != 0)      \
            goto fail;                                                                    \
        if (v[held].ndim != 2 || v[held].itemsize != (Py_ssize_t)sizeof(T) ||             \
            v[held].strides[0] % (Py_ssize_t)sizeof(T) ||                                 \
            v[held].strides[1] % (Py_ssize_t)sizeof(T)) {                                 \
            ++held;                                                                       \
            PyErr_SetString(PyExc_ValueError, "operands must be 2-D " #T " arrays");      \
            goto fail;                                                                    \
        }                                                                                 \
    }                                                                                     \
    /* shapes and strides as the kernel sees them: op(A), op(B), and with SWAP           \
       C^T = op(B)^T op(A)^T */                                                           \
    Py_ssize_t sa[2], sb[2], sc[2], ta[2], tb[2], tc[2];                                  \
    view(&v[0], flags & TRANS_A, sa, ta);                                                 \
    view(&v[1], flags & TRANS_B, sb, tb);                                                 \
    view(&v[2], 0, sc, tc);                                                               \
    const void *pa = v[0].buf, *pb = v[1].buf;                                            \
    if (flags & SWAP) {                                                                   \
        Py_ssize_t s0[2] = {sb[1], sb[0]}, t0[2] = {tb[1], tb[0]};                        \
        sb[0] = sa[1]; sb[1] = sa[0]; tb[0] = ta[1]; tb[1] = ta[0];                       \
        sa[0] = s0[0]; sa[1] = s0[1]; ta[0] = t0[0]; ta[1] = t0[1];                       \
        Py_ssize_t c0 = sc[0]; sc[0] = sc[1]; sc[1] = c0;                                 \
        c0 = tc[0]; tc[0] = tc[1]; tc[1] = c0;                                            \
        const void *p0 = pa; pa = pb; pb = p0;                                            \
    }                                                                                     \
    if (sa[0] != sc[0] || sb[1] != sc[1] || sa[1] != sb[0]) {                             \
        PyErr_SetString(PyExc_ValueError, "operand shapes do not agree");                 \
        goto fail;                                                                        \
    }                                                                                     \
    const Py_ssize_t e = (Py_ssize_t)sizeof(T);                                           \
    if (((flags & UNIT_A) && ta[1] != e) || ((flags & UNIT_B) && tb[1] != e) ||           \
        ((flags & UNIT_C) && tc[1] != e) || ((flags & UNIT_B_ROWS) && tb[0] != e)) {      \
        PyErr_SetString(PyExc_ValueError, "the kernel needs a unit stride");              \
        goto fail;                                                                        \
    }                                                                                     \
    if ((flags & CHECK_OVERLAP) && (overlap(&v[2], &v[0]) || overlap(&v[2], &v[1]))) {    \
        for (int i = 0; i < 3; ++i) PyBuffer_Release(&v[i]);                              \
        return PyLong_FromLong(MAY_OVERLAP);                                              \
    }                                                                                     \
    const int64_t m = sc[0], n = sc[1], k = sa[1];                                        \
    const int64_t a0 = ta[0] / e, a1 = ta[1] / e, b0 = tb[0] / e, b1 = tb[1] / e;         \
    const int64_t c0 = tc[0] / e, c1 = tc[1] / e;                                         \
    const T *a = pa, *b = pb;                                                             \
    T *c = v[2].buf;                                                                      \
    int status;                                                                           \
    int release = (double)m * (double)n * (double)k >= GIL_RELEASE_FLOPS;                 \
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;                             \
    if (sized)                                                                            \
        status = ((NAME##_sized)address)(m, n, k, (T)alpha, a, a0, a1, b, b0, b1,         \
                                         (T)beta, c, c0, c1);                             \
    else                                                                                  \
        status = ((NAME##_fixed)address)((T)alpha, a, a0, a1, b, b0, b1, (T)beta, c,      \
                                         c0, c1);                                         \
    if (release) PyEval_RestoreThread(ts);                                                \
    for (int i = 0; i < 3; ++i) PyBuffer_Release(&v[i]);                                  \
    return PyLong_FromLong(status);                                                       \
fail:                                                                                     \
    while (held-- > 0) PyBuffer_Release(&v[held]);                                        \
    return NULL;                                                                          \
}

DEFINE_CALL(float, call_f32)
DEFINE_CALL(double, call_f64)

static PyMethodDef methods[] = {
    {"call_f32", (PyCFunction)(void (*)(void))call_f32, METH_FASTCALL, "float32 GEMM call"},
    {"call_f64", (PyCFunction)(void (*)(void))call_f64, METH_FASTCALL, "float64 GEMM call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "@NAME@", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_@NAME@(void) { return PyModule_Create(&module); }
"""


def caller_source(module_name: str) -> str:
    """The extension's C source, for a module called ``module_name``."""
    defines = "".join(f"#define {name} ({value})\n" for name, value in _DEFINES.items())
    return (f"#define GIL_RELEASE_FLOPS {GIL_RELEASE_FLOPS}.0\n" + defines
            + _TEMPLATE.replace("@NAME@", module_name))


@functools.cache
def gemm_caller() -> dict[str, Callable[..., Any]] | None:
    """``{'f32': call_f32, 'f64': call_f64}`` of the compiled extension, or None when no C
    compiler works (then the caller uses ctypes)."""
    try:
        module = compile_extension(caller_source, "blacc_gemmcall", compiler=host_compiler())
    except CompilerError:
        return None
    return {"f32": module.call_f32, "f64": module.call_f64}
