"""The lowering pipeline: a named sequence of small passes, each Module -> Module.

``lower(module, isa)`` returns the final module and every intermediate level, so
``explain`` (and tests) can print or interpret the IR after each pass.

With ``matrix_kr`` the register tiles go through LLVM's matrix-multiply intrinsic (seed
000's micro kernel) instead of blacc's outer products; for a backend other than LLVM the
intrinsics are then expanded into plain IR (the seed's "generic lowering"):

    lower(m, isa)                                   lower-packs, lower-tiles
    lower(m, isa, matrix_kr=4, backend="llvm")  ->  lower-packs, lower-matrix, lower-tiles
    lower(m, isa, matrix_kr=4, backend="c")         lower-packs, lower-matrix, expand-matrix,
                                                    lower-tiles
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ArgumentError
from ..ir import kernel as k
from ..target.isa import Isa
from .lower_matrix import expand_matrix, lower_tiles_to_matrix_intrinsic
from .lower_pack import lower_packs
from .lower_tile import lower_tiles

Pass = Callable[[k.Module, Isa], k.Module]

PASSES: tuple[tuple[str, Pass], ...] = (
    ("lower-packs", lambda m, isa: lower_packs(m)),
    ("lower-tiles", lower_tiles),
)

#: For the C backend the register tiles' k loop stays rolled with an unroll hint: GCC
#: unrolls it with better register allocation than it gives our unrolled copy.
C_PASSES: tuple[tuple[str, Pass], ...] = (
    PASSES[0],
    ("lower-tiles", lambda m, isa: lower_tiles(m, isa, hint_unroll=True)),
)


#: Backends that print the matrix intrinsics themselves; the others get them expanded.
MATRIX_BACKENDS = ("llvm",)


def passes(*, backend: str | None = None,
           matrix_kr: int | None = None) -> tuple[tuple[str, Pass], ...]:
    """The pass list: ``PASSES`` (``C_PASSES`` for the C backend), with the matrix
    intrinsic passes when ``matrix_kr`` asks for them."""
    if backend not in (None, "c", "llvm"):
        raise ArgumentError(f"lower() needs backend 'c', 'llvm' or None, not {backend!r}")
    base = C_PASSES if backend == "c" else PASSES
    if matrix_kr is None:
        return base
    matrix: list[tuple[str, Pass]] = [
        ("lower-matrix", lambda m, isa: lower_tiles_to_matrix_intrinsic(m, isa, matrix_kr))]
    if backend not in MATRIX_BACKENDS:
        matrix.append(("expand-matrix", expand_matrix))
    return (base[0], *matrix, *base[1:])


def lower(module: k.Module, isa: Isa, *, backend: str | None = None,
          matrix_kr: int | None = None) -> tuple[k.Module, tuple[tuple[str, k.Module], ...]]:
    """Run every pass; returns (final module, ((pass name, module after it), ...)).

    ``matrix_kr``: lower register tiles with the matrix intrinsic, ``matrix_kr`` reduction
    steps per multiply (None: blacc's outer products). ``backend``: the backend the result
    is built with; the intrinsics survive only for 'llvm' (None, 'c': expanded, so the
    result builds with either backend)."""
    levels = []
    for name, run in passes(backend=backend, matrix_kr=matrix_kr):
        module = run(module, isa)
        levels.append((name, module))
    return module, tuple(levels)
