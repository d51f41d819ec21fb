"""Layer 2: structured operations (linalg-style contractions).

A contraction names an iteration domain, an indexing map per operand, an
iterator kind per dimension and a scalar body. GEMM is one instance:

    contract C[i,j] = alpha * sum_k A[i,k] * B[k,j] + beta * C[i,j]

Extents are symbols bound at run time (``m``, ``n``, ``k``) or integers. The
reference interpreter is ``numpy.einsum`` plus the epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .dtypes import FLOAT_TYPES

PARALLEL = "parallel"
REDUCTION = "reduction"


@dataclass(frozen=True)
class Dim:
    """One dimension of the iteration domain: a name, an extent, an iterator kind."""

    name: str
    extent: str | int
    kind: str = PARALLEL


@dataclass(frozen=True)
class Access:
    """An operand and its indexing map: the domain dimensions that index each axis."""

    operand: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class Contraction:
    """out[out.dims] = alpha * sum_{reduction dims} prod(inputs) + beta * out."""

    name: str
    domain: tuple[Dim, ...]
    inputs: tuple[Access, ...]
    output: Access
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in FLOAT_TYPES:
            raise ValueError(f"contraction dtype must be one of {FLOAT_TYPES}, not {self.dtype!r}")
        names = {d.name for d in self.domain}
        for acc in (*self.inputs, self.output):
            unknown = set(acc.dims) - names
            if unknown:
                raise ValueError(f"{acc.operand} is indexed by unknown dims {sorted(unknown)}")
        reduced = {d.name for d in self.domain if d.kind == REDUCTION}
        if reduced & set(self.output.dims):
            raise ValueError("the output cannot be indexed by a reduction dimension")

    def dim(self, name: str) -> Dim:
        for d in self.domain:
            if d.name == name:
                return d
        raise KeyError(name)

    def access(self, operand: str) -> Access:
        for acc in (*self.inputs, self.output):
            if acc.operand == operand:
                return acc
        raise KeyError(operand)

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.domain if d.kind == REDUCTION)

    @property
    def parallel_dims(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.domain if d.kind == PARALLEL)

    def einsum_spec(self) -> str:
        ins = ",".join("".join(a.dims) for a in self.inputs)
        return f"{ins}->{''.join(self.output.dims)}"

    def __str__(self) -> str:
        def ref(a: Access) -> str:
            return f"{a.operand}[{','.join(a.dims)}]"

        product = " * ".join(ref(a) for a in self.inputs)
        sums = "".join(f"sum_{r} " for r in self.reduction_dims)
        dom = ", ".join(f"{d.name}<{d.extent}" for d in self.domain)
        kinds = ", ".join(d.kind for d in self.domain)
        maps = "  ".join(f"{a.operand}:({','.join(a.dims)})" for a in (*self.inputs, self.output))
        return (
            f"contract {self.name}: {ref(self.output)} = alpha * {sums}{product}"
            f" + beta * {ref(self.output)}\n"
            f"  domain  {dom}   iterators ({kinds})\n"
            f"  maps    {maps}   dtype {self.dtype}"
        )


def matmul(dtype: str, *, trans_a: bool = False, trans_b: bool = False) -> Contraction:
    """GEMM as a contraction; a transposed operand is a transposed indexing map."""
    return Contraction(
        name="gemm",
        domain=(Dim("i", "m"), Dim("j", "n"), Dim("k", "k", REDUCTION)),
        inputs=(
            Access("A", ("k", "i") if trans_a else ("i", "k")),
            Access("B", ("j", "k") if trans_b else ("k", "j")),
        ),
        output=Access("C", ("i", "j")),
        dtype=dtype,
    )


def extents_of(op: Contraction, arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """Bind every domain dimension to a size from the operands' shapes, checking agreement."""
    sizes: dict[str, int] = {}
    for acc in (*op.inputs, op.output):
        arr = arrays[acc.operand]
        if arr.ndim != len(acc.dims):
            raise ShapeError(f"{acc.operand} must be {len(acc.dims)}-D, got shape {arr.shape}")
        for dim, size in zip(acc.dims, arr.shape, strict=True):
            if sizes.setdefault(dim, size) != size:
                raise ShapeError(f"dimension {dim!r} is {sizes[dim]} elsewhere but {size} in "
                                 f"{acc.operand} (shape {arr.shape})")
    return sizes


def interpret(op: Contraction, arrays: dict[str, np.ndarray], *, alpha: float = 1.0,
              beta: float = 0.0) -> np.ndarray:
    """Reference semantics in float64: returns the new output (the inputs are not modified)."""
    extents_of(op, arrays)
    ins = [np.asarray(arrays[a.operand], dtype=np.float64) for a in op.inputs]
    acc = np.einsum(op.einsum_spec(), *ins)
    out = alpha * acc
    if beta != 0:
        out = out + beta * np.asarray(arrays[op.output.operand], dtype=np.float64)
    return out
