"""The cost model's choices, remembered in the kernel cache.

Choosing a form and schedules for a small program builds and models every candidate
(0.02-2 s); compiling the chosen kernel is then a cache hit from the second process on.
So the choice is cached too: a small JSON entry (which index form, and each operation's
``OpSchedule``) in the kernel cache, under a key made of the program's statements, its
operand specs, the target, the pipes the model gives it on this machine
(``strategy.small.core_for``) and a hash of blacc's own sources, so that any change to the
planner makes new entries. Entries go through ``KernelCache`` (private directory, atomic
publication, SHA-256 checked before reading) and are parsed as JSON and checked field by
field; anything unexpected is ignored and the choice is made again.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ..transform.blac import OpSchedule
from .cache import cache_key, default_cache

__all__ = ["Choice", "remembered", "source_fingerprint"]

#: (index of the chosen form in ``index_notation.forms``, one schedule per operation)
Choice = tuple[int, tuple[OpSchedule, ...]]

_SUFFIX = ".plan.json"


@functools.cache
def source_fingerprint() -> str:
    """A hash of blacc's Python sources: choices are reused only while they are unchanged."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def remembered(parts: dict[str, Any], decide: Callable[[], Choice],
               check: Callable[[Choice], bool]) -> Choice:
    """The choice cached under ``parts`` (JSON values), else ``decide()``, stored.

    ``check`` says whether a cached choice fits the program (e.g. its schedules build);
    a choice that does not is decided again."""
    key = cache_key(kind="plan", blacc=source_fingerprint(), **parts)
    decided: list[Choice] = []

    def build(path: Path) -> None:
        decided.append(decide())
        path.write_text(_encode(decided[0]), encoding="utf-8")

    entry = default_cache().library(key, build, suffix=_SUFFIX, load=_load)
    if decided:
        return decided[0]
    if entry is not None and check(entry):
        return entry
    return decide()


def _encode(choice: Choice) -> str:
    form, schedules = choice
    return json.dumps({"form": form, "schedules": [asdict(s) for s in schedules]},
                      sort_keys=True)


def _load(path: Path) -> Choice | None:
    try:
        return _decode(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


#: ``OpSchedule``'s fields, and those of them that are flags
_FIELDS = {f.name for f in fields(OpSchedule)}
_FLAGS = tuple(f.name for f in fields(OpSchedule) if f.type in (bool, "bool"))


def _decode(data: object) -> Choice | None:
    """The choice in ``data``, or None unless every field has the expected type."""
    if not isinstance(data, dict) or set(data) != {"form", "schedules"}:
        return None
    form, raw = data["form"], data["schedules"]
    if not _is_int(form) or form < 0 or not isinstance(raw, list) or not raw:
        return None
    schedules = []
    for s in raw:
        if not isinstance(s, dict) or set(s) != _FIELDS:
            return None
        block = s["block"]
        if not (s["vector"] is None or isinstance(s["vector"], str)):
            return None
        if not (isinstance(block, list) and len(block) == 2 and all(map(_is_int, block))):
            return None
        if not (_is_int(s["unroll"]) and _is_int(s["split"])
                and all(isinstance(s[f], bool) for f in _FLAGS)):
            return None
        schedules.append(OpSchedule(**{**s, "block": (block[0], block[1])}))
    return form, tuple(schedules)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
