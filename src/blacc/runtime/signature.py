"""The calling convention of a compiled fixed-size kernel, as data.

A kernel built from the expression language is one exported C function whose
parameters follow its operands in a fixed order. ``ArgSpec`` records, for each
parameter, what the caller must pass, so that the Python call wrapper, the
standalone C emitter and the documentation all derive from one description.

    y = alpha*A*x + y      ->  int kernel(double alpha, const double *A,
                                          const double *x, double *y)
"""

from __future__ import annotations

from dataclasses import dataclass

IN, OUT, INOUT = "in", "out", "inout"
ARRAY, SCALAR = "array", "scalar"


@dataclass(frozen=True)
class ArgSpec:
    """One parameter of a kernel's entry function.

    * ``kind`` 'array': a pointer to ``rows x cols`` elements of ``dtype``, element (r, c)
      at ``ptr[r*ld + c]`` for layout 'row' (``ld`` >= cols) or ``ptr[c*ld + r]`` for
      'col' (``ld`` >= rows); vectors are ``n x 1`` arrays (``ld`` irrelevant, unit stride).
    * ``kind`` 'scalar': an input scalar is passed by value; an output (or in/out) scalar
      by pointer to one element.
    * ``role``: 'in' (read only), 'out' (written, never read), 'inout' (read then written).
    * ``vector``: declared a Vector (a column of ``rows`` elements) rather than a
      Matrix: the C signature is the same, but Python allocates such an output 1-D.
    """

    name: str
    kind: str
    dtype: str
    role: str
    rows: int = 1
    cols: int = 1
    layout: str = "row"
    ld: int | None = None
    vector: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (ARRAY, SCALAR):
            raise ValueError(f"ArgSpec kind must be 'array' or 'scalar', not {self.kind!r}")
        if self.role not in (IN, OUT, INOUT):
            raise ValueError(f"ArgSpec role must be 'in', 'out' or 'inout', not {self.role!r}")
        if self.layout not in ("row", "col"):
            raise ValueError(f"ArgSpec layout must be 'row' or 'col', not {self.layout!r}")

    @property
    def leading_dimension(self) -> int:
        """Elements between consecutive rows ('row') or columns ('col')."""
        if self.ld is not None:
            return self.ld
        return self.cols if self.layout == "row" else self.rows

    @property
    def written(self) -> bool:
        return self.role != IN

    @property
    def by_pointer(self) -> bool:
        return self.kind == ARRAY or self.written

    @property
    def extent(self) -> int:
        """Elements the pointer spans: from the first to one past the last element."""
        if self.kind == SCALAR:
            return 1
        outer, inner = (self.rows, self.cols) if self.layout == "row" else (self.cols, self.rows)
        return (outer - 1) * self.leading_dimension + inner
