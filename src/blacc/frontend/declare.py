"""Declarations written as text, for the command line: ``A=Matrix(5,9)``.

Parsed with a regular grammar — never evaluated:

    decl   := NAME '=' kind [ '(' args ')' ]
    kind   := 'Matrix' | 'Vector' | 'Scalar'
    args   := arg (',' arg)*        arg := INT | key '=' value   (key: layout, ld, dtype)
"""

from __future__ import annotations

import re

from ..errors import ArgumentError
from .types import Decl, Matrix, Scalar, Vector

_DECL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(Matrix|Vector|Scalar)\s*(?:\((.*)\))?\s*")
_ARG = re.compile(r"\s*(?:([a-z]+)\s*=\s*)?([A-Za-z0-9_]+)\s*")
_KINDS = {"Matrix": Matrix, "Vector": Vector, "Scalar": Scalar}


def parse_declaration(text: str, dtype: str = "f64") -> tuple[str, Decl]:
    """``'A=Matrix(5,9,layout=col)'`` -> ``('A', Matrix(5, 9, dtype, layout='col'))``."""
    m = _DECL.fullmatch(text)
    if not m:
        raise ArgumentError(f"bad declaration {text!r}: expected NAME=Matrix(rows,cols), "
                            "NAME=Vector(n) or NAME=Scalar")
    name, kind, raw = m.group(1), m.group(2), m.group(3) or ""
    positional: list[int] = []
    keywords: dict[str, object] = {"dtype": dtype}
    for part in filter(str.strip, raw.split(",")) if raw.strip() else ():
        a = _ARG.fullmatch(part)
        if not a:
            raise ArgumentError(f"bad argument {part.strip()!r} in declaration {text!r}")
        key, value = a.group(1), a.group(2)
        if key is None:
            if not value.isdigit():
                raise ArgumentError(f"size {value!r} in {text!r} is not a positive integer")
            positional.append(int(value))
        elif key in ("layout", "dtype"):
            keywords[key] = value
        elif key == "ld" and value.isdigit():
            keywords[key] = int(value)
        else:
            raise ArgumentError(f"unknown or bad keyword {key}={value} in {text!r}")
    if kind != "Matrix" and ({"layout", "ld"} & keywords.keys()):
        raise ArgumentError(f"{kind} takes no layout or ld ({text!r})")
    want = {"Matrix": 2, "Vector": 1, "Scalar": 0}[kind]
    if len(positional) != want:
        raise ArgumentError(f"{kind} needs {want} size(s), got {len(positional)} in {text!r}")
    return name, _KINDS[kind](*positional, **keywords)
