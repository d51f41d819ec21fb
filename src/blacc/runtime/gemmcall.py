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
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..errors import CompilerError
from .build import host_compiler
from .pycall import compile_extension

__all__ = ["GIL_RELEASE_FLOPS", "gemm_caller", "caller_source"]

#: Release the GIL when m*n*k is at least this: below it the product takes less time
#: than releasing and re-taking the lock.
GIL_RELEASE_FLOPS = 1 << 15

_TEMPLATE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A GEMM entry: with extents (sized) or compiled for one shape (fixed). */
#define DEFINE_CALL(T, NAME)                                                              \
typedef int (*NAME##_sized)(int64_t, int64_t, int64_t, T, const T *, int64_t, int64_t,   \
                            const T *, int64_t, int64_t, T, T *, int64_t, int64_t);       \
typedef int (*NAME##_fixed)(T, const T *, int64_t, int64_t, const T *, int64_t, int64_t, \
                            T, T *, int64_t, int64_t);                                    \
static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {          \
    (void)self;                                                                           \
    if (nargs != 7) {                                                                     \
        PyErr_SetString(PyExc_TypeError, #NAME "(address, sized, alpha, a, b, beta, c)"); \
        return NULL;                                                                      \
    }                                                                                     \
    void *address = PyLong_AsVoidPtr(args[0]);                                            \
    int sized = PyObject_IsTrue(args[1]);                                                 \
    double alpha = PyFloat_AsDouble(args[2]), beta = PyFloat_AsDouble(args[5]);           \
    if (PyErr_Occurred() || sized < 0) return NULL;                                       \
    if (!address) {                                                                       \
        PyErr_SetString(PyExc_ValueError, "null kernel address");                         \
        return NULL;                                                                      \
    }                                                                                     \
    Py_buffer v[3];                                                                       \
    int held = 0;                                                                         \
    for (; held < 3; ++held) {                                                            \
        int flags = held == 2 ? PyBUF_STRIDES | PyBUF_WRITABLE : PyBUF_STRIDES;           \
        if (PyObject_GetBuffer(args[held == 2 ? 6 : 3 + held], &v[held], flags) != 0)     \
            goto fail;                                                                    \
        if (v[held].ndim != 2 || v[held].itemsize != (Py_ssize_t)sizeof(T) ||             \
            v[held].strides[0] % (Py_ssize_t)sizeof(T) ||                                 \
            v[held].strides[1] % (Py_ssize_t)sizeof(T)) {                                 \
            ++held;                                                                       \
            PyErr_SetString(PyExc_ValueError, "operands must be 2-D " #T " arrays");      \
            goto fail;                                                                    \
        }                                                                                 \
    }                                                                                     \
    const Py_ssize_t *sa = v[0].shape, *sb = v[1].shape, *sc = v[2].shape;                \
    if (sa[0] != sc[0] || sb[1] != sc[1] || sa[1] != sb[0]) {                             \
        PyErr_SetString(PyExc_ValueError, "operand shapes do not agree");                 \
        goto fail;                                                                        \
    }                                                                                     \
    const int64_t m = sc[0], n = sc[1], k = sa[1], e = (int64_t)sizeof(T);                \
    const int64_t a0 = v[0].strides[0] / e, a1 = v[0].strides[1] / e;                     \
    const int64_t b0 = v[1].strides[0] / e, b1 = v[1].strides[1] / e;                     \
    const int64_t c0 = v[2].strides[0] / e, c1 = v[2].strides[1] / e;                     \
    const T *a = v[0].buf, *b = v[1].buf;                                                 \
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
    return (f"#define GIL_RELEASE_FLOPS {GIL_RELEASE_FLOPS}.0\n"
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
