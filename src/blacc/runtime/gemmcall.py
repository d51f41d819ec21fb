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

An optional last argument of flags lets the extension take the user's arrays as they
are: transpose A or B, compute C^T = op(B)^T op(A)^T (``SWAP``), require a unit column
stride of what the kernel reads (``UNIT_*``, the plan's known strides), and return
``MAY_OVERLAP`` without calling the kernel when C's memory range meets A's or B's
(``CHECK_OVERLAP``; the caller then takes the checked path).

That serves ``runtime.gemm``'s fast path, kept in the extension: ``remember`` records a
call that succeeded without a copy (route, transposes, and each array's format, shape and
strides, with the kernel and its flags) in a table of 32 slots; ``fast`` finds a call with
the same record and repeats it, allocating C (``numpy.empty``) when none is given, or
returns None so that the checked path decides. Building that record in Python (a tuple
of dtypes, shapes and strides, hashed) cost ~0.9 us of a 4x4 call's 1.3 us.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import CompilerError
from .build import host_compiler
from .pycall import compile_extension

__all__ = ["CHECK_OVERLAP", "GIL_RELEASE_FLOPS", "MAY_OVERLAP", "SWAP", "TRANS_A", "TRANS_B",
           "UNIT_A", "UNIT_B", "UNIT_B_ROWS", "UNIT_C", "caller_source", "extension",
           "gemm_caller"]

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

/* What run() returns when it raised (a Python exception is set). */
#define RAISED (-1000)

/* A GEMM entry: with extents (sized) or compiled for one shape (fixed). */
#define DEFINE_CALL(T, NAME)                                                              \
typedef int (*NAME##_sized)(int64_t, int64_t, int64_t, T, const T *, int64_t, int64_t,   \
                            const T *, int64_t, int64_t, T, T *, int64_t, int64_t);       \
typedef int (*NAME##_fixed)(T, const T *, int64_t, int64_t, const T *, int64_t, int64_t, \
                            T, T *, int64_t, int64_t);                                    \
/* Check the held buffers v = {a, b, c} against the flags and call the kernel: its      \
   status, MAY_OVERLAP, or RAISED */                                                      \
static int NAME##_run(const Py_buffer *v, void *address, int sized, long flags,           \
                      double alpha, double beta) {                                        \
    for (int i = 0; i < 3; ++i) {                                                         \
        if (v[i].ndim != 2 || v[i].itemsize != (Py_ssize_t)sizeof(T) ||                   \
            v[i].strides[0] % (Py_ssize_t)sizeof(T) ||                                    \
            v[i].strides[1] % (Py_ssize_t)sizeof(T)) {                                    \
            PyErr_SetString(PyExc_ValueError, "operands must be 2-D " #T " arrays");      \
            return RAISED;                                                                \
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
        return RAISED;                                                                    \
    }                                                                                     \
    const Py_ssize_t e = (Py_ssize_t)sizeof(T);                                           \
    /* a stride along a dimension of extent 1 is never applied: it counts as unit */      \
    if (((flags & UNIT_A) && ta[1] != e && sa[1] != 1) ||                                 \
        ((flags & UNIT_B) && tb[1] != e && sb[1] != 1) ||                                 \
        ((flags & UNIT_C) && tc[1] != e && sc[1] != 1) ||                                 \
        ((flags & UNIT_B_ROWS) && tb[0] != e && sb[0] != 1)) {                            \
        PyErr_SetString(PyExc_ValueError, "the kernel needs a unit stride");              \
        return RAISED;                                                                    \
    }                                                                                     \
    if ((flags & CHECK_OVERLAP) && (overlap(&v[2], &v[0]) || overlap(&v[2], &v[1])))      \
        return MAY_OVERLAP;                                                               \
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
    return status;                                                                        \
}                                                                                         \
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
            break;                                                                        \
    }                                                                                     \
    int status = held == 3 ? NAME##_run(v, address, sized, flags, alpha, beta) : RAISED;  \
    while (held-- > 0) PyBuffer_Release(&v[held]);                                        \
    return status == RAISED ? NULL : PyLong_FromLong(status);                             \
}

DEFINE_CALL(float, call_f32)
DEFINE_CALL(double, call_f64)

/* ------------------------------------------------------------------ the fast path
   Calls that succeeded before with no copy, by everything their checks and choices
   depended on but the arrays' addresses and writability: the route (backend and strategy
   asked for, numbered by the caller), transposes, and each operand's format, shape and
   strides; C absent (allocated here) or given. A slot holds a reference to what keeps
   its kernel loaded. */
#define SLOTS 32

typedef struct {
    PyObject *keep;  /* NULL: an empty slot */
    PyObject *dtype; /* of a C to allocate */
    long route;
    int trans, given;
    char format;     /* 'f' or 'd' */
    Py_ssize_t shape[3][2], strides[3][2];
    void *address;
    int sized;
    long flags;
} slot_t;

static slot_t slots[SLOTS];
static int next_slot, last_hit;
static PyObject *array_type, *empty;

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "configure(numpy.ndarray, numpy.empty)");
        return NULL;
    }
    Py_XSETREF(array_type, Py_NewRef(args[0]));
    Py_XSETREF(empty, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* Hold the buffers of a, b (and c when given, writable); 0, or -1 with nothing held and
   no exception set. */
static int hold(PyObject *a, PyObject *b, PyObject *c, Py_buffer *v) {
    PyObject *ops[3] = {a, b, c};
    int n = c == Py_None ? 2 : 3;
    for (int i = 0; i < n; ++i) {
        int want = PyBUF_STRIDES | PyBUF_FORMAT | (i == 2 ? PyBUF_WRITABLE : 0);
        if (Py_TYPE(ops[i]) != (PyTypeObject *)array_type ||
            PyObject_GetBuffer(ops[i], &v[i], want) != 0) {
            PyErr_Clear();
            while (i-- > 0) PyBuffer_Release(&v[i]);
            return -1;
        }
    }
    return 0;
}

static void release(Py_buffer *v, int n) {
    for (int i = 0; i < n; ++i) PyBuffer_Release(&v[i]);
}

/* The one-letter format of a float32 or float64 buffer, else 0. */
static char float_format(const Py_buffer *v) {
    const char *f = v->format;
    return f && (f[0] == 'f' || f[0] == 'd') && f[1] == 0 && v->ndim == 2 ? f[0] : 0;
}

static int matches(const slot_t *s, long route, int trans, int given, const Py_buffer *v) {
    if (!s->keep || s->route != route || s->trans != trans || s->given != given) return 0;
    for (int i = 0; i < 2 + given; ++i) {
        if (float_format(&v[i]) != s->format) return 0;
        for (int d = 0; d < 2; ++d)
            if (v[i].shape[d] != s->shape[i][d] || v[i].strides[d] != s->strides[i][d])
                return 0;
    }
    return 1;
}

static int find(long route, int trans, int given, const Py_buffer *v) {
    if (matches(&slots[last_hit], route, trans, given, v)) return last_hit;
    for (int i = 0; i < SLOTS; ++i)
        if (matches(&slots[i], route, trans, given, v)) return last_hit = i;
    return -1;
}

static int flag(PyObject *x, int *out) {
    if (x != Py_True && x != Py_False) return -1;
    *out = x == Py_True;
    return 0;
}

/* fast(route, a, b, c, alpha, beta, trans_a, trans_b): C (the given one or a new one)
   computed as the remembered call with these arguments was; None when the checked path
   must decide (no such call, alpha == 0, arguments of other types, a read-only C, C
   possibly overlapping A or B); the kernel's status when it failed. */
static PyObject *fast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "fast(route, a, b, c, alpha, beta, trans_a, trans_b)");
        return NULL;
    }
    long route = PyLong_AsLong(args[0]);
    if (route == -1 && PyErr_Occurred()) return NULL;
    int ta, tb;
    if (!array_type || !PyFloat_CheckExact(args[4]) || !PyFloat_CheckExact(args[5]) ||
        flag(args[6], &ta) || flag(args[7], &tb))
        Py_RETURN_NONE;
    double alpha = PyFloat_AS_DOUBLE(args[4]), beta = PyFloat_AS_DOUBLE(args[5]);
    if (alpha == 0) Py_RETURN_NONE;
    PyObject *c = args[3];
    int given = c != Py_None;
    Py_buffer v[3];
    if (hold(args[1], args[2], c, v)) Py_RETURN_NONE;
    int at = find(route, ta | tb << 1, given, v);
    if (at < 0) {
        release(v, 2 + given);
        Py_RETURN_NONE;
    }
    slot_t s = slots[at];
    /* the slot may be replaced while the GIL is released (or by code numpy.empty runs) */
    Py_INCREF(s.keep);
    Py_INCREF(s.dtype);
    if (given) {
        Py_INCREF(c);
    } else {
        beta = 0.0;
        c = PyObject_CallFunction(empty, "(nn)O", s.shape[2][0], s.shape[2][1], s.dtype);
        if (!c || PyObject_GetBuffer(c, &v[2], PyBUF_STRIDES | PyBUF_WRITABLE) != 0) {
            Py_XDECREF(c);
            Py_DECREF(s.keep);
            Py_DECREF(s.dtype);
            release(v, 2);
            return NULL;
        }
    }
    int status = s.format == 'f' ? call_f32_run(v, s.address, s.sized, s.flags, alpha, beta)
                                 : call_f64_run(v, s.address, s.sized, s.flags, alpha, beta);
    release(v, 3);
    Py_DECREF(s.keep);
    Py_DECREF(s.dtype);
    if (status == 0) return c;
    Py_DECREF(c);
    if (status == RAISED) return NULL;
    if (status == MAY_OVERLAP) Py_RETURN_NONE;
    return PyLong_FromLong(status);
}

/* remember(route, a, b, c, trans_a, trans_b, keep, address, sized, flags, dtype): a call
   with these arguments succeeded (c: None when the caller allocated C, of dtype, in C
   order); let fast() repeat it. */
static PyObject *remember(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "remember(route, a, b, c, trans_a, trans_b, keep, "
                                         "address, sized, flags, dtype)");
        return NULL;
    }
    long route = PyLong_AsLong(args[0]), flags = PyLong_AsLong(args[9]);
    void *address = PyLong_AsVoidPtr(args[7]);
    int sized = PyObject_IsTrue(args[8]), ta, tb;
    if (PyErr_Occurred() || sized < 0) return NULL;
    PyObject *c = args[3];
    int given = c != Py_None;
    Py_buffer v[3];
    if (!array_type || !address || flag(args[4], &ta) || flag(args[5], &tb) ||
        hold(args[1], args[2], c, v))
        Py_RETURN_NONE; /* not a call fast() could see */
    char format = float_format(&v[0]);
    int ok = format != 0;
    for (int i = 1; i < 2 + given; ++i) ok = ok && float_format(&v[i]) == format;
    if (ok) {
        int at = find(route, ta | tb << 1, given, v);
        if (at < 0) {
            at = next_slot;
            next_slot = (next_slot + 1) % SLOTS;
        }
        slot_t *s = &slots[at];
        Py_XSETREF(s->keep, Py_NewRef(args[6]));
        Py_XSETREF(s->dtype, Py_NewRef(args[10]));
        s->route = route;
        s->trans = ta | tb << 1;
        s->given = given;
        s->format = format;
        s->address = address;
        s->sized = sized;
        s->flags = flags;
        for (int i = 0; i < 2 + given; ++i)
            for (int d = 0; d < 2; ++d) {
                s->shape[i][d] = v[i].shape[d];
                s->strides[i][d] = v[i].strides[d];
            }
        if (!given) { /* the C fast() allocates: m x n as op(A) x op(B), in C order */
            Py_ssize_t item = format == 'f' ? 4 : 8;
            s->shape[2][0] = v[0].shape[ta];
            s->shape[2][1] = v[1].shape[1 - tb];
            s->strides[2][0] = s->shape[2][1] * item;
            s->strides[2][1] = item;
        }
        last_hit = at;
    }
    release(v, 2 + given);
    Py_RETURN_NONE;
}

/* lookup(route, a, b, c, trans_a, trans_b): the keep object of the slot a call with these
   arguments would use, or None. */
static PyObject *lookup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    int ta, tb;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "lookup(route, a, b, c, trans_a, trans_b)");
        return NULL;
    }
    long route = PyLong_AsLong(args[0]);
    if (route == -1 && PyErr_Occurred()) return NULL;
    Py_buffer v[3];
    int given = args[3] != Py_None;
    if (!array_type || flag(args[4], &ta) || flag(args[5], &tb) ||
        hold(args[1], args[2], args[3], v))
        Py_RETURN_NONE;
    int at = find(route, ta | tb << 1, given, v);
    release(v, 2 + given);
    if (at < 0) Py_RETURN_NONE;
    return Py_NewRef(slots[at].keep);
}

static PyObject *forget(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    for (int i = 0; i < SLOTS; ++i) {
        Py_CLEAR(slots[i].keep);
        Py_CLEAR(slots[i].dtype);
    }
    next_slot = last_hit = 0;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"call_f32", (PyCFunction)(void (*)(void))call_f32, METH_FASTCALL, "float32 GEMM call"},
    {"call_f64", (PyCFunction)(void (*)(void))call_f64, METH_FASTCALL, "float64 GEMM call"},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "the array type and allocator of the fast path"},
    {"fast", (PyCFunction)(void (*)(void))fast, METH_FASTCALL, "repeat a remembered call"},
    {"remember", (PyCFunction)(void (*)(void))remember, METH_FASTCALL,
     "remember a successful call"},
    {"lookup", (PyCFunction)(void (*)(void))lookup, METH_FASTCALL, "a remembered call"},
    {"forget", forget, METH_NOARGS, "forget every remembered call"},
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
def extension() -> ModuleType | None:
    """The compiled extension, its fast path given NumPy's array type and allocator; None
    when no C compiler works."""
    try:
        module = compile_extension(caller_source, "blacc_gemmcall", compiler=host_compiler())
    except CompilerError:
        return None
    module.configure(np.ndarray, np.empty)
    return module


def gemm_caller() -> dict[str, Callable[..., Any]] | None:
    """``{'f32': call_f32, 'f64': call_f64}`` of the compiled extension, or None when no C
    compiler works (then the caller uses ctypes)."""
    module = extension()
    return None if module is None else {"f32": module.call_f32, "f64": module.call_f64}
