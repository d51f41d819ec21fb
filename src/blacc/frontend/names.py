"""Which operand names are allowed: identifiers that are safe to use as-is in generated C.

A name must match ``[A-Za-z_][A-Za-z0-9_]*`` (ASCII only) and must not be a C keyword,
a type or macro name generated code relies on, or a name reserved for C implementations
(``__x``, ``_X``) or for blacc itself (``blacc_x``, any case).
"""

from __future__ import annotations

import re

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: C keywords, C89 through C23.
C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch
    typedef union unsigned void volatile while
    _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert
    _Thread_local _BitInt _Decimal32 _Decimal64 _Decimal128
    alignas alignof bool constexpr false nullptr static_assert thread_local true typeof
    typeof_unqual
""".split())

#: Types, macros and functions generated code may use.
C_RESERVED_NAMES = frozenset("""
    NULL size_t ptrdiff_t intptr_t uintptr_t int8_t int16_t int32_t int64_t uint8_t uint16_t
    uint32_t uint64_t fma fmaf sqrt sqrtf fabs fabsf memcpy memset main
""".split())

RESERVED_WORDS = C_KEYWORDS | C_RESERVED_NAMES


def reserved_reason(name: str) -> str | None:
    """Why ``name`` may not name an operand, or None if it may (assumes an identifier)."""
    if name in C_KEYWORDS:
        return "a C keyword"
    if name in C_RESERVED_NAMES:
        return "a name generated C code uses"
    if name.startswith("__") or (name.startswith("_") and name[1:2].isupper()):
        return "reserved in C (names starting with '__' or '_' and a capital)"
    if name.lower().startswith("blacc_"):
        return "reserved for blacc (names starting with 'blacc_')"
    return None


def name_problem(name: object) -> str | None:
    """A sentence saying why ``name`` cannot be an operand name, or None if it can."""
    if not isinstance(name, str):
        return f"operand names must be strings, got {name!r}"
    if not IDENTIFIER.fullmatch(name):
        return f"{name!r} is not a valid name (letters, digits and '_', not starting with a digit)"
    reason = reserved_reason(name)
    if reason is not None:
        return f"{name!r} is {reason} and cannot name an operand; choose another name"
    return None
