"""Instruction sets as data: vector width, register count, compiler flags, and per
(operation, element type) a C intrinsic template.

A new target is a new table. Templates name their operands in braces: ``{addr}``
(a pointer expression), ``{a}``, ``{b}``, ``{c}``, ``{x}`` (values), ``{mask}`` and
``{count}``. The scalar meaning of each operation is the kernel IR's (see
``ir.interp``); the renderer picks the template.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .machine import Machine


@dataclass(frozen=True)
class VectorType:
    c_name: str
    lanes: int


@dataclass(frozen=True)
class Isa:
    name: str
    registers: int
    flags: tuple[str, ...]
    header: str | None
    vectors: dict[str, VectorType] = field(default_factory=dict, hash=False)
    ops: dict[tuple[str, str], str] = field(default_factory=dict, hash=False)

    def lanes(self, dtype: str) -> int:
        """Lanes of one vector register for ``dtype`` (1 when the ISA has no vectors)."""
        v = self.vectors.get(dtype)
        return v.lanes if v else 1

    def op(self, name: str, dtype: str) -> str:
        try:
            return self.ops[(name, dtype)]
        except KeyError:
            raise KeyError(f"ISA {self.name} has no {name} for {dtype}") from None


def _avx2_ops() -> dict[tuple[str, str], str]:
    ops = {}
    for dt, s in (("f32", "ps"), ("f64", "pd")):
        ops.update({
            ("load", dt): f"_mm256_loadu_{s}({{addr}})",
            ("store", dt): f"_mm256_storeu_{s}({{addr}}, {{x}})",
            ("mask_load", dt): f"_mm256_maskload_{s}({{addr}}, {{mask}})",
            ("mask_store", dt): f"_mm256_maskstore_{s}({{addr}}, {{mask}}, {{x}})",
            ("broadcast_load", dt): f"_mm256_broadcast_s{s[1]}({{addr}})",
            ("splat", dt): f"_mm256_set1_{s}({{x}})",
            ("fma", dt): f"_mm256_fmadd_{s}({{a}}, {{b}}, {{c}})",
            ("+", dt): f"_mm256_add_{s}({{a}}, {{b}})",
            ("-", dt): f"_mm256_sub_{s}({{a}}, {{b}})",
            ("*", dt): f"_mm256_mul_{s}({{a}}, {{b}})",
            ("prefetch", dt): "_mm_prefetch((const char *)({addr}), _MM_HINT_T0)",
        })
    # Lane i is on when i < count: compare a splat of count with 0, 1, 2, ...
    ops[("mask", "f32")] = ("_mm256_cmpgt_epi32(_mm256_set1_epi32((int)({count})), "
                            "_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))")
    ops[("mask", "f64")] = ("_mm256_cmpgt_epi64(_mm256_set1_epi64x({count}), "
                            "_mm256_setr_epi64x(0, 1, 2, 3))")
    return ops


AVX2 = Isa(
    name="avx2",
    registers=16,
    flags=("-mavx2", "-mfma"),
    header="immintrin.h",
    vectors={"f32": VectorType("__m256", 8), "f64": VectorType("__m256d", 4)},
    ops=_avx2_ops(),
)

#: Plain C with no intrinsics: any CPU, any C compiler. Tiles use scalar
#: accumulators and the C compiler may auto-vectorize.
GENERIC = Isa(name="generic", registers=16, flags=(), header=None)

ISAS = {isa.name: isa for isa in (AVX2, GENERIC)}


def isa_for(machine: Machine) -> Isa:
    """The best ISA table this machine can run."""
    if machine.has("avx2", "fma"):
        return AVX2
    return GENERIC
