"""Element types of the IRs, by short name, and their NumPy equivalents."""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError

#: Floating-point types kernels compute in.
FLOAT_TYPES = ("f32", "f64")
#: Index arithmetic type of the kernel IR.
INDEX = "i64"

_NUMPY = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an IR element type name."""
    return np.dtype(_NUMPY[name])


def itemsize(name: str) -> int:
    return numpy_dtype(name).itemsize


def float_type_of(dtype: object) -> str:
    """'f32' or 'f64' for anything NumPy accepts as a dtype; DTypeError for the rest."""
    if isinstance(dtype, str) and dtype in FLOAT_TYPES:
        return dtype
    try:
        d = np.dtype(dtype)
    except TypeError as exc:
        raise DTypeError(f"unsupported dtype {dtype!r}: blacc computes in float32 or "
                         "float64") from exc
    if d == np.float32:
        return "f32"
    if d == np.float64:
        return "f64"
    raise DTypeError(f"unsupported dtype {d}: blacc computes in float32 or float64")
