"""Layer 3: schedules as values.

A schedule is a tuple of frozen transformation records applied in order by
``apply`` (see ``transform.apply``). Records print as Python and round-trip
through JSON, so the tuner can store schedules rather than binaries.

    (Tile((("j", 4080),)), Tile((("k", 256),), balanced=True), Pack("B", 16),
     Tile((("i", 144),)), Pack("A", 6), Tile((("j", 16), ("i", 6))), UnrollJam("k", 4),
     Vectorize("j", 8))
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from ..errors import ScheduleError


@dataclass(frozen=True)
class Tile:
    """Strip-mine dimensions into loops over tiles, nested in the order given.

    ``Tile((("j", 16), ("i", 6)))``: for j in steps of 16: for i in steps of 6: ...

    ``balanced=True`` keeps the number of tiles, count = ceil(extent / size), but sizes them
    at run time to ceil(extent / count) (never more than ``size``; the last one is shorter
    by less than count): k = 330 in blocks of 320 becomes 165 + 165 instead of 320 + 10, so
    no block is too short to hide the cost of reading and writing C around it. Where a later
    Tile splits the same dimension, the step is rounded up to whole tiles of it (within
    ``size``): n = 1531 in panels of 1024 over 64-wide slivers runs 768 + 763."""

    sizes: tuple[tuple[str, int], ...]
    balanced: bool = False

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ScheduleError("Tile needs at least one (dimension, size) pair")
        seen = set()
        for dim, size in self.sizes:
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ScheduleError(f"Tile size for {dim!r} must be a positive integer, "
                                    f"got {size!r}")
            if dim in seen:
                raise ScheduleError(f"Tile names dimension {dim!r} twice")
            seen.add(dim)
        if not isinstance(self.balanced, bool):
            raise ScheduleError(f"Tile balanced must be True or False, got {self.balanced!r}")


@dataclass(frozen=True)
class Pack:
    """Copy the operand's current tile (inside the loops made so far) into a scratch
    buffer of ``sliver``-wide slivers along its non-reduction dimension, zero-padded to
    a whole number of slivers, so the micro-kernel reads it with unit stride."""

    operand: str
    sliver: int

    def __post_init__(self) -> None:
        if not isinstance(self.sliver, int) or isinstance(self.sliver, bool) or self.sliver < 1:
            raise ScheduleError(f"Pack sliver of {self.operand!r} must be a positive integer")


@dataclass(frozen=True)
class UnrollJam:
    """Unroll the reduction loop of the register tile ``factor`` times and jam the copies."""

    dim: str
    factor: int

    def __post_init__(self) -> None:
        if not isinstance(self.factor, int) or self.factor < 1:
            raise ScheduleError(f"UnrollJam factor must be a positive integer, got {self.factor!r}")


@dataclass(frozen=True)
class Vectorize:
    """Map ``dim`` of the register tile onto SIMD lanes, ``lanes`` at a time: the output's
    columns (outer products of a broadcast of A and vectors of B), or the reduction (each
    tile element a dot product of rows of A and columns of B, summed across lanes at the
    store: for a matrix times a vector)."""

    dim: str
    lanes: int

    def __post_init__(self) -> None:
        if not isinstance(self.lanes, int) or self.lanes < 1:
            raise ScheduleError(f"Vectorize lanes must be a positive integer, got {self.lanes!r}")


@dataclass(frozen=True)
class Prefetch:
    """Prefetch a packed operand's panel ``distance`` reduction steps ahead inside the
    register tile's k loop, so slivers arriving from L2/L3 do not stall the FMAs."""

    operand: str
    distance: int

    def __post_init__(self) -> None:
        if not isinstance(self.distance, int) or self.distance < 1:
            raise ScheduleError(f"Prefetch distance must be a positive integer, got "
                                f"{self.distance!r}")


@dataclass(frozen=True)
class NarrowEdges:
    """At the last, partial tile of ``dim`` (the vectorized columns of the output), call
    a register tile only as many vectors wide as the columns left need, not the full tile
    over padding: C 80 columns wide in tiles of 64 then computes 64 + 16 columns, not
    64 + 64."""

    dim: str


Transform = Tile | Pack | UnrollJam | Vectorize | Prefetch | NarrowEdges
Schedule = tuple[Transform, ...]

_KINDS = {cls.__name__: cls
          for cls in (Tile, Pack, UnrollJam, Vectorize, Prefetch, NarrowEdges)}


def to_json(schedule: Schedule) -> str:
    return json.dumps([{"kind": type(t).__name__, **asdict(t)} for t in schedule])


def from_json(text: str) -> Schedule:
    """Parse what ``to_json`` wrote; anything malformed raises ScheduleError."""
    try:
        raw_items = json.loads(text)
        if not isinstance(raw_items, list):
            raise ScheduleError("schedule JSON must be a list of transformations")
        items = []
        for raw in raw_items:
            fields = dict(raw)
            kind = fields.pop("kind", None)
            if kind not in _KINDS:
                raise ScheduleError(f"unknown transformation {kind!r} in schedule JSON")
            if kind == "Tile":
                fields["sizes"] = tuple((d, s) for d, s in fields["sizes"])
            items.append(_KINDS[kind](**fields))
    except (TypeError, KeyError, ValueError) as exc:
        if isinstance(exc, ScheduleError):
            raise
        raise ScheduleError(f"malformed schedule JSON: {exc}") from exc
    return tuple(items)


def show(schedule: Schedule) -> str:
    """The schedule as the Python expression that builds it."""
    if len(schedule) == 1:
        return f"({schedule[0]!r},)"
    return "(" + ",\n ".join(repr(t) for t in schedule) + ")"
