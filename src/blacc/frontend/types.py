"""Operand declarations: ``Matrix(rows, cols)``, ``Vector(n)`` (a column), ``Scalar()``.

A declaration fixes an operand's shape, element type ('f32' or 'f64') and, for matrices,
its memory layout (``layout='row'`` for row-major, ``'col'`` for column-major) and leading
dimension ``ld`` (the distance between consecutive rows, or columns; ``None`` means packed
and is stored as ``cols`` for row layout, ``rows`` for column layout). Vectors are
contiguous. Declarations are frozen and compare by value; in Python they also build
expressions (see ``builder``): ``A @ x + alpha * y``.

Bad arguments raise ``ArgumentError``.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import numpy as np

from ..errors import ArgumentError
from .builder import Operand

#: Element types a program may compute in.
DTYPES = ("f32", "f64")
LAYOUTS = ("row", "col")


def dtype_name(dtype: object) -> str:
    """'f32' or 'f64' for 'f32', 'f64', 'float32', 'float64', np.float32, np.dtype('f8'), ..."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    d = None
    if dtype is not None:  # np.dtype(None) would be float64
        try:
            d = np.dtype(dtype)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            pass
    if d == np.float32:
        return "f32"
    if d == np.float64:
        return "f64"
    raise ArgumentError(f"dtype must be 'f32' or 'f64' (or float32 / float64), got {dtype!r}")


def _size(value: object, what: str) -> int:
    """``value`` as a positive int; ArgumentError naming ``what`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{what} must be a positive int, got {value!r} "
                            f"({type(value).__name__})")
    if value <= 0:
        raise ArgumentError(f"{what} must be a positive int, got {value}")
    return int(value)


def _extra(dtype: str, **keywords: object) -> str:
    parts = [] if dtype == "f64" else [repr(dtype)]
    parts += [f"{k}={v!r}" for k, v in keywords.items()]
    return "".join(", " + p for p in parts)


class Decl(Operand):
    """Base of the declarations. ``shape`` is (rows, cols); vectors are n x 1."""

    __slots__ = ()
    kind: str = ""
    dtype: str

    @property
    def shape(self) -> tuple[int, int]:
        raise NotImplementedError


@dataclass(frozen=True, repr=False)
class Matrix(Decl):
    """A rows x cols matrix. ``layout`` 'row' or 'col'; ``ld`` >= cols (row) or rows (col)."""

    rows: int
    cols: int
    dtype: str = "f64"
    _: KW_ONLY
    layout: str = "row"
    ld: int | None = None
    kind = "matrix"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "rows", _size(self.rows, "Matrix rows"))
        set_(self, "cols", _size(self.cols, "Matrix cols"))
        set_(self, "dtype", dtype_name(self.dtype))
        if self.layout not in LAYOUTS:
            raise ArgumentError(f"Matrix layout must be 'row' or 'col', got {self.layout!r}")
        natural = self.cols if self.layout == "row" else self.rows
        if self.ld is None:
            set_(self, "ld", natural)
            return
        ld = _size(self.ld, "Matrix ld (leading dimension)")
        if ld < natural:
            what = "columns" if self.layout == "row" else "rows"
            raise ArgumentError(
                f"Matrix({self.rows}, {self.cols}, layout={self.layout!r}) needs ld >= "
                f"{natural} (its number of {what}), got ld={ld}")
        set_(self, "ld", ld)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def __repr__(self) -> str:
        natural = self.cols if self.layout == "row" else self.rows
        keywords: dict[str, object] = {} if self.layout == "row" else {"layout": "col"}
        if self.ld != natural:
            keywords["ld"] = self.ld
        return f"Matrix({self.rows}, {self.cols}{_extra(self.dtype, **keywords)})"


@dataclass(frozen=True, repr=False)
class Vector(Decl):
    """A column vector of length n (shape n x 1, contiguous); ``x'`` is a row."""

    n: int
    dtype: str = "f64"
    kind = "vector"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _size(self.n, "Vector length n"))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, 1)

    def __repr__(self) -> str:
        return f"Vector({self.n}{_extra(self.dtype)})"


@dataclass(frozen=True, repr=False)
class Scalar(Decl):
    """A scalar (shape 1 x 1)."""

    dtype: str = "f64"
    kind = "scalar"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @property
    def shape(self) -> tuple[int, int]:
        return (1, 1)

    def __repr__(self) -> str:
        return f"Scalar({'' if self.dtype == 'f64' else repr(self.dtype)})"
