"""The lowering pipeline: a named sequence of small passes, each Module -> Module.

``lower(module, isa)`` returns the final module and every intermediate level, so
``explain`` (and tests) can print or interpret the IR after each pass.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import kernel as k
from ..target.isa import Isa
from .lower_pack import lower_packs
from .lower_tile import lower_tiles

Pass = Callable[[k.Module, Isa], k.Module]

PASSES: tuple[tuple[str, Pass], ...] = (
    ("lower-packs", lambda m, isa: lower_packs(m)),
    ("lower-tiles", lower_tiles),
)


def lower(module: k.Module, isa: Isa) -> tuple[k.Module, tuple[tuple[str, k.Module], ...]]:
    """Run every pass; returns (final module, ((pass name, module after it), ...))."""
    levels = []
    for name, run in PASSES:
        module = run(module, isa)
        levels.append((name, module))
    return module, tuple(levels)
