"""Instruction sets as data: vector width, register count, compiler flags, and per
(operation, element type) a C intrinsic template.

A new target is a new table. Templates name their operands in braces: ``{addr}``
(a pointer expression), ``{a}``, ``{b}``, ``{c}``, ``{x}`` (values), ``{mask}`` and
``{count}``. The scalar meaning of each operation is the kernel IR's (see
``ir.interp``); the renderer picks the template.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import ArgumentError
from ..ir.kernel import unzip_lanes, zip_lanes
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
    #: Narrower vectors for leftovers, widest first, each half the one before (128-bit
    #: on AVX2; 256- and 128-bit on AVX-512); their ops are keyed by ``"f32x4"``-style
    #: names.
    narrow: dict[str, tuple[VectorType, ...]] = field(default_factory=dict, hash=False)
    #: C helper functions the templates call (e.g. horizontal sums), by name; a
    #: translation unit includes those it uses.
    prelude: dict[str, str] = field(default_factory=dict, hash=False)
    #: GNU inline-assembly constraint of a vector register (``"x"`` on x86), with which
    #: the C backend pins a value to a register (``Decl.in_register``); None: not pinned.
    register_constraint: str | None = None
    #: CPU flags (as /proc/cpuinfo names them) a machine needs to run this ISA's code.
    requires: tuple[str, ...] = ()
    #: The packed GEMM micro-kernel as (rows, vectors), where measurement beat the first
    #: of ``strategy.gemm.tile_shapes``; and its kc, where it beat the L1 model's
    #: (``target.blocking``; the B sliver then leaves L1, and this kc bounds the blocking
    #: that keeps the A sliver there instead). None: the model's.
    gemm_tile: tuple[int, int] | None = None
    gemm_kc: int | None = None
    #: Register tiles as (rows, vectors), in order of preference, that run over the
    #: operands in place (no packing) with narrow edge tiles (``NarrowEdges``), and the
    #: largest m*n*k that runs so rather than packed, where measurement beat the model's
    #: choice (``strategy.gemm.choose``). None: the model's.
    in_place_tiles: tuple[tuple[int, int], ...] | None = None
    in_place_work: int | None = None
    #: Masked moves take a mask register and are one fast instruction (AVX-512), not
    #: AVX2's vmaskmov, whose stores are microcoded on AMD cores.
    mask_registers: bool = False

    def missing(self, machine: Machine) -> list[str]:
        """The flags of ``requires`` that ``machine`` lacks (empty: it runs this ISA)."""
        return [f for f in self.requires if not machine.has(f)]

    def lanes(self, dtype: str) -> int:
        """Lanes of one full vector register for ``dtype`` (1 when the ISA has no vectors)."""
        v = self.vectors.get(dtype)
        return v.lanes if v else 1

    def _levels(self, dtype: str) -> tuple[VectorType, ...]:
        full = self.vectors.get(dtype)
        return (full, *self.narrow.get(dtype, ())) if full else ()

    def widths(self, dtype: str) -> tuple[int, ...]:
        """Every vector width the ISA has for ``dtype``, widest first (1 = scalars)."""
        return (*(v.lanes for v in self._levels(dtype)), 1)

    def vector_type(self, dtype: str, lanes: int) -> VectorType | None:
        return next((v for v in self._levels(dtype) if v.lanes == lanes), None)

    def partial_pieces(self, dtype: str, lanes: int, count: int) -> tuple[int, ...] | None:
        """The widths, widest first, of the plain moves that load or store the first
        ``count`` of ``lanes`` lanes (0 < count < lanes), or None where this ISA has none
        and a masked move is used. A wider vector moves as its two halves: the low one
        whole (``count`` >= half) and the rest in the high one, e.g. 6 of 8 as 4 + 2; the
        narrowest by ``store_first`` templates."""
        widths = self.widths(dtype)[:-1]
        if len(widths) < 2 or lanes not in widths or not 0 < count < lanes:
            return None
        if lanes == widths[-1]:
            if (f"store_first{count}", f"{dtype}x{lanes}") not in self.ops:
                return None
            return tuple(1 << b for b in reversed(range(lanes.bit_length())) if count >> b & 1)
        half = lanes // 2
        if half not in widths or not self.has_op("zext", dtype, lanes):
            return None
        if count == half:
            return (half,)
        if count < half:
            return self.partial_pieces(dtype, half, count)
        tail = self.partial_pieces(dtype, half, count - half)
        return None if tail is None else (half, *tail)

    def plain_moves(self, kind: str, dtype: str, lanes: int, count: int | None, *,
                    read_back: bool = False, past_end: bool = False
                    ) -> tuple[int, ...] | None:
        """``partial_pieces`` where they beat one masked move of ``kind`` ('load' or
        'store'): always for stores (an AVX2 masked store is microcoded on AMD cores,
        about 12 cycles), for loads only as one move (a masked load is one fast
        instruction; joining pieces costs shuffles: 3 of 4 f32 measured 20% slower), with
        mask registers too.
        A buffer the kernel both stores into and loads from (``read_back``: an operand it
        updates, a temporary) is also loaded in pieces without mask registers, as it was
        stored, so that each load is forwarded from one store: C = alpha*(A0 + A1)'*B +
        beta*C, 3 x 3 x 3 f32 with AVX2 on Zen 5, 6.2 ns a call with masked loads of C,
        4.7 with 2 + 1. With mask registers (AVX-512) a masked store is one fast
        instruction too, but a load of what it wrote is not forwarded and waits for it to
        reach the cache: such a buffer is stored in plain pieces, and loaded masked (or
        by one plain move, as any buffer). 7 x 7
        x 7 f64 with rows of C as masked vectors: 48.1 ns with masked stores, 15.5 with
        4 + 2 + 1 (AVX2's plan, three vectors a row, 30.9); loaded in pieces joined, 0.94x
        as fast. A move whose masked-off lanes may lie past the end of its operand
        (``past_end``) is always pieces where they exist: a masked one takes ~140 ns
        where those lanes fall on an unmapped page (``transform.past_end``). None for a
        count not known when the code is generated (``count`` None)."""
        if count is None:
            return None
        pieces = self.partial_pieces(dtype, lanes, count)
        if pieces is None:
            return None
        if kind == "store":
            return pieces if read_back or past_end or not self.mask_registers else None
        if past_end and self._loads_first(dtype, lanes, count):
            return pieces
        vectors = self.widths(dtype)[:-1]
        one = len(pieces) == 1 and (pieces[0] in vectors
                                    or (f"load_first{count}", f"{dtype}x{vectors[-1]}")
                                    in self.ops)
        if self.mask_registers:
            # one plain load zero-extended, not a masked one: y = A*x 10 x 10 f64 (rows
            # as 8 + 2 lanes) ran 5.32 ns a call with twenty masked 512-bit loads of two
            # lanes and 4.34 with 128-bit ones (Zen 5, the LGen harness)
            return pieces if one else None
        if read_back and self._loads_first(dtype, lanes, count):
            return pieces  # as they were stored, so that each load is forwarded
        return pieces if one else None

    def _loads_first(self, dtype: str, lanes: int, count: int) -> bool:
        """Whether the first ``count`` of ``lanes`` lanes load as plain pieces: the
        narrowest vector's by a ``load_first`` template, a wider one's as its low half
        zero-extended, or joined with the rest in its high half."""
        widths = self.widths(dtype)[:-1]
        if lanes == widths[-1]:
            return self.has_op(f"load_first{count}", dtype, lanes)
        half = lanes // 2
        if count <= half:
            return self.has_op("zext", dtype, lanes) and (
                count == half or self._loads_first(dtype, half, count))
        return self.has_op("join", dtype, lanes) and self._loads_first(dtype, half,
                                                                        count - half)

    def _key(self, dtype: str, lanes: int | None) -> str:
        return dtype if lanes is None or lanes == self.lanes(dtype) else f"{dtype}x{lanes}"

    def has_op(self, name: str, dtype: str, lanes: int | None = None) -> bool:
        """Whether ``op`` has a template for ``name`` on ``lanes`` lanes of ``dtype``."""
        return (name, self._key(dtype, lanes)) in self.ops

    def op(self, name: str, dtype: str, lanes: int | None = None) -> str:
        key = self._key(dtype, lanes)
        try:
            return self.ops[(name, key)]
        except KeyError:
            raise KeyError(f"ISA {self.name} has no {name} for {key}") from None


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
            ("build", dt): f"_mm256_setr_{s}({{xs}})",
        })
    # Lane i is on when i < count: compare a splat of count with 0, 1, 2, ...
    ops[("mask", "f32")] = ("_mm256_cmpgt_epi32(_mm256_set1_epi32((int)({count})), "
                            "_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))")
    ops[("mask", "f64")] = ("_mm256_cmpgt_epi64(_mm256_set1_epi64x({count}), "
                            "_mm256_setr_epi64x(0, 1, 2, 3))")
    # Two 128-bit vectors as the halves of one 256-bit vector (two rows of a 4-wide f32
    # or 2-wide f64 output in one register): join, duplicate from memory, split, and
    # splat lane i within each half (``half_splat{i}``: vpermilps/vpermilpd immediates).
    for dt, s, v, join in (("f32", "ps", "__m128", "_mm256_set_m128"),
                           ("f64", "pd", "__m128d", "_mm256_set_m128d")):
        ops.update({
            ("halves", dt): f"{join}({{hi}}, {{lo}})",
            ("dup_load", dt): f"_mm256_broadcast_{s}((const {v} *)({{addr}}))",
            ("half_lo", dt): f"_mm256_cast{s}256_{s}128({{x}})",
            ("half_hi", dt): f"_mm256_extractf128_{s}({{x}}, 1)",
        })
    for lane in range(4):
        ops[(f"half_splat{lane}", "f32")] = f"_mm256_permute_ps({{x}}, {lane * 0x55})"
    for lane in range(2):
        ops[(f"half_splat{lane}", "f64")] = f"_mm256_permute_pd({{x}}, {lane * 0xF})"
    # two elements side by side, one per half (``Spread``): both in every 128-bit lane
    # from memory, then the first or the second into each lane of a half, in-lane
    # (vbroadcastsd from memory is a load; _mm_loadu_si64 and a broadcast from the register
    # made gcc emit vmovq and a lane-crossing shuffle: gemam n x 4 x 4 f32 0.61-0.88x)
    ops[("spread2", "f32")] = (
        "_mm256_permutevar_ps(_mm256_castpd_ps(_mm256_broadcast_sd((const double *)({addr}))), "
        "_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1))")
    ops[("spread2", "f64")] = ("_mm256_permute_pd(_mm256_broadcast_pd((const __m128d *)"
                               "({addr})), 12)")
    ops[("hsum", "f32")] = "blacc_hsum8_ps({x})"
    ops[("hsum", "f64")] = "blacc_hsum4_pd({x})"
    # 128-bit vectors for leftovers of 4 (f32) or 2 (f64) elements.
    for dt, s in (("f32x4", "ps"), ("f64x2", "pd")):
        ops.update({
            ("load", dt): f"_mm_loadu_{s}({{addr}})",
            ("store", dt): f"_mm_storeu_{s}({{addr}}, {{x}})",
            ("mask_load", dt): f"_mm_maskload_{s}({{addr}}, {{mask}})",
            ("mask_store", dt): f"_mm_maskstore_{s}({{addr}}, {{mask}}, {{x}})",
            ("broadcast_load", dt): ("_mm_broadcast_ss({addr})" if s == "ps"
                                     else "_mm_loaddup_pd({addr})"),
            ("splat", dt): f"_mm_set1_{s}({{x}})",
            ("fma", dt): f"_mm_fmadd_{s}({{a}}, {{b}}, {{c}})",
            ("+", dt): f"_mm_add_{s}({{a}}, {{b}})",
            ("-", dt): f"_mm_sub_{s}({{a}}, {{b}})",
            ("*", dt): f"_mm_mul_{s}({{a}}, {{b}})",
            ("build", dt): f"_mm_setr_{s}({{xs}})",
        })
    ops[("mask", "f32x4")] = ("_mm_cmpgt_epi32(_mm_set1_epi32((int)({count})), "
                              "_mm_setr_epi32(0, 1, 2, 3))")
    ops[("mask", "f64x2")] = ("_mm_cmpgt_epi64(_mm_set1_epi64x({count}), "
                              "_mm_set_epi64x(1, 0))")
    ops[("hsum", "f32x4")] = "blacc_hsum4_ps({x})"
    ops[("hsum", "f64x2")] = "blacc_hsum2_pd({x})"
    # the sums of n vectors of n lanes as one vector (``SumLanes``): transposes and adds
    ops[("sum_lanes", "f32x4")] = "blacc_sum4x4_ps({x0}, {x1}, {x2}, {x3})"
    ops[("sum_lanes", "f32")] = ("blacc_sum8x8_ps({x0}, {x1}, {x2}, {x3}, {x4}, {x5}, {x6}, "
                                 "{x7})")
    # (not hadd: y = alpha*A*x + beta*B*x 2 x 2 f64 on Zen 3 ran 0.91-1.00x the loops'
    # speed with two hadds, 1.02-1.06x with unpacks and adds)
    ops[("sum_lanes", "f64x2")] = "blacc_sum2x2_pd({x0}, {x1})"
    ops[("sum_lanes", "f64")] = "blacc_sum4x4_pd({x0}, {x1}, {x2}, {x3})"
    # ... of n rows wider than n lanes (``SumRows``): transposed and added within the
    # 128-bit halves, then the halves added
    ops[("sum_rows4", "f32")] = "blacc_sum4x8_ps({x0}, {x1}, {x2}, {x3})"
    ops[("sum_rows2", "f64")] = "blacc_sum2x4_pd({x0}, {x1})"
    # ... and of n rows held two per vector, one in each 128-bit half
    ops[("sum_halves", "f32")] = "blacc_sum8x4_ps({x0}, {x1}, {x2}, {x3})"
    ops[("sum_halves", "f64")] = "blacc_sum4x2_pd({x0}, {x1})"
    # Lanes of two vectors interleaved and split again (``Zip``, ``Unzip``): unpacks
    # within the 128-bit halves, then the halves put in order
    for dt, s, unzip in (("f32", "ps", "_mm256_castpd_ps(_mm256_permute4x64_pd("
                                       "_mm256_castps_pd(_mm256_shuffle_ps({{a}}, {{b}}, "
                                       "{imm})), 0xD8))"),
                         ("f64", "pd", "_mm256_permute4x64_pd(_mm256_unpack{lohi}_pd("
                                       "{{a}}, {{b}}), 0xD8)")):
        unpacks = f"_mm256_unpacklo_{s}({{a}}, {{b}}), _mm256_unpackhi_{s}({{a}}, {{b}})"
        ops.update({
            ("zip_lo", dt): f"_mm256_permute2f128_{s}({unpacks}, 0x20)",
            ("zip_hi", dt): f"_mm256_permute2f128_{s}({unpacks}, 0x31)",
            ("unzip_even", dt): unzip.format(imm="0x88", lohi="lo"),
            ("unzip_odd", dt): unzip.format(imm="0xDD", lohi="hi"),
        })
    ops.update({
        ("zip_lo", "f32x4"): "_mm_unpacklo_ps({a}, {b})",
        ("zip_hi", "f32x4"): "_mm_unpackhi_ps({a}, {b})",
        ("unzip_even", "f32x4"): "_mm_shuffle_ps({a}, {b}, 0x88)",
        ("unzip_odd", "f32x4"): "_mm_shuffle_ps({a}, {b}, 0xDD)",
        ("zip_lo", "f64x2"): "_mm_unpacklo_pd({a}, {b})",
        ("zip_hi", "f64x2"): "_mm_unpackhi_pd({a}, {b})",
        ("unzip_even", "f64x2"): "_mm_unpacklo_pd({a}, {b})",
        ("unzip_odd", "f64x2"): "_mm_unpackhi_pd({a}, {b})",
    })
    # Leftovers of a known count move their first lanes with plain loads and stores
    # (``partial_pieces``, ``plain_moves``): an AVX2 masked store is microcoded on AMD
    # cores. Loads zero the other lanes, as a masked load does; a 256-bit vector is two
    # 128-bit halves.
    ops.update({
        ("load_first1", "f32x4"): "_mm_load_ss({addr})",
        ("load_first2", "f32x4"): "_mm_castsi128_ps(_mm_loadu_si64({addr}))",
        ("store_first1", "f32x4"): "_mm_store_ss({addr}, {x})",
        ("store_first2", "f32x4"): "_mm_storeu_si64({addr}, _mm_castps_si128({x}))",
        ("store_first3", "f32x4"): ("(_mm_storeu_si64({addr}, _mm_castps_si128({x})), "
                                    "_mm_store_ss(({addr}) + 2, _mm_movehl_ps({x}, {x})))"),
        ("load_first3", "f32x4"): ("_mm_movelh_ps(_mm_castsi128_ps(_mm_loadu_si64({addr})), "
                                   "_mm_load_ss(({addr}) + 2))"),
        ("load_first1", "f64x2"): "_mm_load_sd({addr})",
        ("store_first1", "f64x2"): "_mm_store_sd({addr}, {x})",
        ("zext", "f32"): "_mm256_zextps128_ps256({x})",
        ("zext", "f64"): "_mm256_zextpd128_pd256({x})",
        ("join", "f32"): "_mm256_set_m128({hi}, {lo})",
        ("join", "f64"): "_mm256_set_m128d({hi}, {lo})",
    })
    # A 128-bit vector's upper lanes moved down, zeros above (``k.ShiftDown``): one byte
    # shift. Wider vectors have none (``transform.past_end`` loads them in pieces).
    ops.update({
        ("shift_down", "f32x4"): "_mm_castsi128_ps(_mm_srli_si128(_mm_castps_si128({x}), "
                                 "{bytes}))",
        ("shift_down", "f64x2"): "_mm_castsi128_pd(_mm_srli_si128(_mm_castpd_si128({x}), "
                                 "{bytes}))",
    })
    return ops


_AVX2_PRELUDE = {
    "blacc_hsum4_ps": """static inline float blacc_hsum4_ps(__m128 v) {
    __m128 s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}""",
    "blacc_hsum8_ps": """static inline float blacc_hsum8_ps(__m256 v) {
    return blacc_hsum4_ps(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}""",
    "blacc_hsum2_pd": """static inline double blacc_hsum2_pd(__m128d v) {
    return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v)));
}""",
    "blacc_hsum4_pd": """static inline double blacc_hsum4_pd(__m256d v) {
    return blacc_hsum2_pd(_mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1)));
}""",
    # Transposes by shuffles and adds, not hadd trees: on Zen 3 a hadd costs more than
    # the two shuffles and the add it stands for (four f32 rows: 1.9 -> 1.2 ns a sum;
    # eight: 3.7 -> 2.7; four f64: 1.3 -> 1.0, best of interleaved loops in L1). Only
    # in-lane two-source shufps/shufpd and blends: on a Xeon (CPU model 167) those of
    # 128 and 256 bits issue two a cycle, where unpcks, movlhps, movhlps, vpermilps and
    # lane-crossing permutes issue one; on AMD's cores all of them two. (The C compiler
    # makes shufps 0x44 a movlhps and shufpd 0 or 3 an unpack, so the sums take the even
    # and odd lanes, 0x88 and 0xDD, and pairs of f64 a shufpd 1 beside a blend.)
    "blacc_sum2x2_pd": """static inline __m128d blacc_sum2x2_pd(__m128d a, __m128d b) {
    return _mm_add_pd(_mm_shuffle_pd(a, b, 1), _mm_blend_pd(a, b, 2));  /* a1 b0 + a0 b1 */
}""",
    "blacc_pairs_added_pd": """static inline __m256d blacc_pairs_added_pd(__m256d a, __m256d b) {
    /* [a0+a1, b0+b1 | a2+a3, b2+b3] */
    return _mm256_add_pd(_mm256_shuffle_pd(a, b, 5), _mm256_blend_pd(a, b, 10));
}""",
    "blacc_sum4x4_ps": """static inline __m128 blacc_sum4x4_ps(__m128 a, __m128 b, __m128 c,
                                     __m128 d) {
    __m128 ab = _mm_add_ps(_mm_shuffle_ps(a, b, 0x88), _mm_shuffle_ps(a, b, 0xDD));
    __m128 cd = _mm_add_ps(_mm_shuffle_ps(c, d, 0x88), _mm_shuffle_ps(c, d, 0xDD));
    return _mm_add_ps(_mm_shuffle_ps(ab, cd, 0x88), _mm_shuffle_ps(ab, cd, 0xDD));
}""",
    # [a b c d] summed within each 128-bit half, then the halves added
    "blacc_sum4x4x2_ps": """static inline __m256 blacc_sum4x4x2_ps(__m256 a, __m256 b, __m256 c,
                                       __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
    __m256 cd = _mm256_add_ps(_mm256_shuffle_ps(c, d, 0x88), _mm256_shuffle_ps(c, d, 0xDD));
    return _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x88), _mm256_shuffle_ps(ab, cd, 0xDD));
}""",
    "blacc_sum8x8_ps": """static inline __m256 blacc_sum8x8_ps(__m256 a, __m256 b, __m256 c,
                                     __m256 d, __m256 e, __m256 f,
                                     __m256 g, __m256 h) {
    __m256 abcd = blacc_sum4x4x2_ps(a, b, c, d), efgh = blacc_sum4x4x2_ps(e, f, g, h);
    return _mm256_add_ps(_mm256_blend_ps(abcd, efgh, 0xF0),
                         _mm256_permute2f128_ps(abcd, efgh, 0x21));
}""",
    # rows [0|1] [2|3] [4|5] [6|7] sum to [0 2 4 6 | 1 3 5 7] within the halves: one
    # permute puts them in order
    "blacc_sum8x4_ps": """static inline __m256 blacc_sum8x4_ps(__m256 a, __m256 b, __m256 c,
                                     __m256 d) {
    return _mm256_permutevar8x32_ps(blacc_sum4x4x2_ps(a, b, c, d),
                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}""",
    "blacc_sum4x2_pd": """static inline __m256d blacc_sum4x2_pd(__m256d a, __m256d b) {
    return _mm256_permute4x64_pd(blacc_pairs_added_pd(a, b), 0xD8);  /* [0 2 | 1 3] -> [0 1 2 3] */
}""",
    "blacc_sum4x4_pd": """static inline __m256d blacc_sum4x4_pd(__m256d a, __m256d b, __m256d c,
                                      __m256d d) {
    __m256d ab = blacc_pairs_added_pd(a, b), cd = blacc_pairs_added_pd(c, d);
    return _mm256_add_pd(_mm256_blend_pd(ab, cd, 0xC), _mm256_permute2f128_pd(ab, cd, 0x21));
}""",
    # four rows of 8 f32: half h of the transposed sums holds [a_h b_h c_h d_h]; the
    # halves added (11 instructions, where each row halved and then transposed took 17)
    "blacc_sum4x8_ps": """static inline __m128 blacc_sum4x8_ps(__m256 a, __m256 b, __m256 c,
                                     __m256 d) {
    __m256 t = blacc_sum4x4x2_ps(a, b, c, d);
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}""",
    # two rows of 4 f64: [a01 b01 | a23 b23], the halves added
    "blacc_sum2x4_pd": """static inline __m128d blacc_sum2x4_pd(__m256d a, __m256d b) {
    __m256d s = blacc_pairs_added_pd(a, b);
    return _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
}""",
}


AVX2 = Isa(
    name="avx2",
    registers=16,
    flags=("-mavx2", "-mfma"),
    header="immintrin.h",
    vectors={"f32": VectorType("__m256", 8), "f64": VectorType("__m256d", 4)},
    ops=_avx2_ops(),
    narrow={"f32": (VectorType("__m128", 4),), "f64": (VectorType("__m128d", 2),)},
    prelude=_AVX2_PRELUDE,
    register_constraint="x",
    requires=("avx2", "fma"),
)


def _avx512_ops() -> dict[tuple[str, str], str]:
    """AVX-512 (F, DQ, VL): 512-bit vectors, and 256- and 128-bit ones for leftovers (12
    f32 as 8 + 4, each moved whole: a masked store into an operand the next call loads
    makes that load wait, ``READ_BACK_CYCLES``). Partial vectors are masked moves with a
    mask register (``__mmask16``/``__mmask8``): one fast instruction that suppresses
    faults on the lanes it leaves, so no ``load_first`` pieces; stores into a buffer the
    kernel reads back are plain pieces (``Isa.plain_moves``)."""
    ops = {}
    # Lane i is on when i < count; a count <= 0 (a vector past the edge of C) clears all
    # lanes and one >= lanes sets all, as the AVX2 compare does.
    for dt, s, wide, narrow in (("f32", "ps", 16, 8), ("f64", "pd", 8, 4)):
        levels = ((dt, "_mm512", wide), (f"{dt}x{narrow}", "_mm256", narrow),
                  (f"{dt}x{narrow // 2}", "_mm", narrow // 2))
        for key, pre, lanes in levels:
            ops.update({
                ("load", key): f"{pre}_loadu_{s}({{addr}})",
                ("store", key): f"{pre}_storeu_{s}({{addr}}, {{x}})",
                ("mask_load", key): f"{pre}_maskz_loadu_{s}({{mask}}, {{addr}})",
                ("mask_store", key): f"{pre}_mask_storeu_{s}({{addr}}, {{mask}}, {{x}})",
                ("broadcast_load", key): f"{pre}_set1_{s}(*({{addr}}))",
                ("splat", key): f"{pre}_set1_{s}({{x}})",
                ("fma", key): f"{pre}_fmadd_{s}({{a}}, {{b}}, {{c}})",
                ("+", key): f"{pre}_add_{s}({{a}}, {{b}})",
                ("-", key): f"{pre}_sub_{s}({{a}}, {{b}})",
                ("*", key): f"{pre}_mul_{s}({{a}}, {{b}})",
                ("mask", key): f"(__mmask{max(lanes, 8)})blacc_first_lanes({{count}}, {lanes})",
                ("build", key): f"{pre}_setr_{s}({{xs}})",
            })
        ops[("prefetch", dt)] = "_mm_prefetch((const char *)({addr}), _MM_HINT_T0)"
        ops[("hsum", dt)] = f"_mm512_reduce_add_{s}({{x}})"
        # ``Zip`` and ``Unzip``: one two-source permute (vpermt2ps) each
        for key, pre, lanes in levels[:2]:
            ints = f"{pre}_setr_epi{32 if s == 'ps' else 64}{'x' if lanes == 4 else ''}"
            for name, lanes_of in (("zip_lo", lambda n: zip_lanes(n, 0)),
                                   ("zip_hi", lambda n: zip_lanes(n, 1)),
                                   ("unzip_even", lambda n: unzip_lanes(n, 0)),
                                   ("unzip_odd", lambda n: unzip_lanes(n, 1))):
                index = ", ".join(map(str, lanes_of(lanes)))
                ops[(name, key)] = f"{pre}_permutex2var_{s}({{a}}, {ints}({index}), {{b}})"
    # the two 256-bit halves of a 512-bit vector, for sums of accumulators (``Half``)
    ops.update({
        ("half_lo", "f32"): "_mm512_castps512_ps256({x})",
        ("half_hi", "f32"): "_mm512_extractf32x8_ps({x}, 1)",
        ("half_lo", "f64"): "_mm512_castpd512_pd256({x})",
        ("half_hi", "f64"): "_mm512_extractf64x4_pd({x}, 1)",
        ("hsum", "f32x8"): "blacc_hsum8_ps({x})",
        ("hsum", "f64x4"): "blacc_hsum4_pd({x})",
        ("sum_lanes", "f32x8"): ("blacc_sum8x8_ps({x0}, {x1}, {x2}, {x3}, {x4}, {x5}, {x6}, "
                                 "{x7})"),
        ("sum_lanes", "f64x4"): "blacc_sum4x4_pd({x0}, {x1}, {x2}, {x3})",
        # a vector's worth of rows a whole vector long summed at once, not half as many
        # at a time from their halves added; and of rows of 4 f64 held two per vector
        # (``OpSchedule.pairs``), not from the 256-bit halves
        ("sum_lanes", "f64"): ("blacc_sum8x8_pd({x0}, {x1}, {x2}, {x3}, {x4}, {x5}, {x6}, "
                               "{x7})"),
        ("sum_lanes", "f32"): "blacc_sum16x16_ps({})".format(
            ", ".join(f"{{x{i}}}" for i in range(16))),
        ("sum_halves", "f64"): "blacc_sum8x2_pd({x0}, {x1}, {x2}, {x3})",
        # rows wider than the result (``SumRows``)
        ("sum_rows4", "f32"): "blacc_sum4x16_ps({x0}, {x1}, {x2}, {x3})",
        ("sum_rows4", "f32x8"): "blacc_sum4x8_ps({x0}, {x1}, {x2}, {x3})",
        ("sum_rows4", "f64"): "blacc_sum4x8_pd({x0}, {x1}, {x2}, {x3})",
        ("sum_rows2", "f64x4"): "blacc_sum2x4_pd({x0}, {x1})",
        # rows of 4 f64 held two per vector (``OpSchedule.pairs``): two 256-bit halves
        # joined or one duplicated from memory, and lane i splatted within each half
        # (vpermpd with an immediate permutes the halves alike)
        ("halves", "f64"): "_mm512_insertf64x4(_mm512_castpd256_pd512({lo}), {hi}, 1)",
        ("dup_load", "f64"): "_mm512_broadcast_f64x4(_mm256_loadu_pd({addr}))",
        **{(f"half_splat{lane}", "f64"): f"_mm512_permutex_pd({{x}}, {lane * 0x55})"
           for lane in range(4)},
        # rows of 4 f32 held four per vector (``OpSchedule.quads``): a row of x in every
        # 128-bit quarter, and sixteen rows summed from four vectors at once
        ("quad_load", "f32"): "_mm512_broadcast_f32x4(_mm_loadu_ps({addr}))",
        # ... and lane i splatted within each quarter (rows of 4 f32 of an output)
        **{(f"quarter_splat{lane}", "f32"): f"_mm512_permute_ps({{x}}, {lane * 0x55})"
           for lane in range(4)},
        ("sum_quarters", "f32"): "blacc_sum16x4_ps({x0}, {x1}, {x2}, {x3})",
        # two or four elements side by side, one per half or quarter (``Spread``): a
        # 128-bit load, each element into its part by one lane-crossing vpermps/vpermpd.
        # (In every 128-bit lane by vbroadcastf32x4, then in-lane by vpermilps with a
        # vector control, each spread and its FMA took 1.8 cycles on Zen 5 against 0.8:
        # C = A*B 4 x n x 4 f32, n = 32-100, with the terms in the quarters, ran
        # 0.60-0.65x as fast in the LGen harness.)
        ("spread2", "f64"): ("_mm512_permutexvar_pd(_mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1), "
                             "_mm512_castpd128_pd512(_mm_loadu_pd({addr})))"),
        ("spread4", "f32"): ("_mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, "
                             "2, 2, 2, 2, 3, 3, 3, 3), "
                             "_mm512_castps128_ps512(_mm_loadu_ps({addr})))"),
        # (rows of 8 f32 or 2 f64: the terms of a sum two or four to a vector, ``folds``)
        ("spread2", "f32"): ("_mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, "
                             "1, 1, 1, 1, 1, 1, 1, 1), "
                             "_mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadu_si64({addr}))))"),
        ("spread4", "f64"): ("_mm512_permutexvar_pd(_mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3), "
                             "_mm512_castpd256_pd512(_mm256_loadu_pd({addr})))"),
    })
    # lanes of one vector in any order, or of two (``Permute``: the columns of a small
    # row-major block, one lane-crossing vpermps/vpermpd or vpermt2ps/vpermt2pd each),
    # and its first quarter
    ops.update({
        ("permute", "f32"): "_mm512_permutexvar_ps(_mm512_setr_epi32({index}), {x})",
        ("permute", "f64"): "_mm512_permutexvar_pd(_mm512_setr_epi64({index}), {x})",
        ("permute2", "f32"): "_mm512_permutex2var_ps({x}, _mm512_setr_epi32({index}), {y})",
        ("permute2", "f64"): "_mm512_permutex2var_pd({x}, _mm512_setr_epi64({index}), {y})",
        ("quarter_lo", "f32"): "_mm512_castps512_ps128({x})",
        ("quarter_lo", "f64"): "_mm512_castpd512_pd128({x})",
    })
    # 128-bit sums and shuffles as AVX2 has them, and the 256-bit halves they come from
    ops.update({key: op for key, op in _avx2_ops().items()
                if key[1] in ("f32x4", "f64x2") and key[0] in (
                    "hsum", "sum_lanes", "zip_lo", "zip_hi", "unzip_even", "unzip_odd")})
    ops.update({
        ("half_lo", "f32x8"): "_mm256_castps256_ps128({x})",
        ("half_hi", "f32x8"): "_mm256_extractf128_ps({x}, 1)",
        ("half_lo", "f64x4"): "_mm256_castpd256_pd128({x})",
        ("half_hi", "f64x4"): "_mm256_extractf128_pd({x}, 1)",
    })
    # plain stores of a leftover's first lanes into a buffer read back, and plain loads
    # of one piece (``plain_moves``): the halves, then AVX2's moves of the first lanes of
    # 128 bits; the zero-extensions are what ``partial_pieces`` asks of a width split in
    # halves
    ops.update({key: op for key, op in _avx2_ops().items()
                if key[1] in ("f32x4", "f64x2") and key[0].startswith(("store_first",
                                                                         "load_first"))})
    # (and the joins of halves that load the first lanes of a vector reaching past the
    # end of its operand in pieces, ``transform.past_end``)
    ops.update({
        ("zext", "f32"): "_mm512_zextps256_ps512({x})",
        ("zext", "f64"): "_mm512_zextpd256_pd512({x})",
        ("zext", "f32x8"): "_mm256_zextps128_ps256({x})",
        ("zext", "f64x4"): "_mm256_zextpd128_pd256({x})",
        ("join", "f32"): "_mm512_insertf32x8(_mm512_castps256_ps512({lo}), {hi}, 1)",
        ("join", "f64"): "_mm512_insertf64x4(_mm512_castpd256_pd512({lo}), {hi}, 1)",
        ("join", "f32x8"): "_mm256_set_m128({hi}, {lo})",
        ("join", "f64x4"): "_mm256_set_m128d({hi}, {lo})",
    })
    # ``k.ShiftDown`` of 128 bits, AVX2's
    ops.update({key: op for key, op in _avx2_ops().items() if key[0] == "shift_down"})
    return ops


_AVX512_PRELUDE = {
    **_AVX2_PRELUDE,
    "blacc_first_lanes": """static inline unsigned blacc_first_lanes(long count, int lanes) {
    return count <= 0 ? 0u : count >= lanes ? (1u << lanes) - 1u : (1u << count) - 1u;
}""",
    # a = [row 0 | row 1], b = [2 | 3], c, d: unpacks and adds leave in ab sums of two
    # elements of rows 0-3 (per 128-bit lane: r0 k01, r2 k01 | r0 k23, r2 k23 | r1 k01,
    # r3 k01 | r1 k23, r3 k23), in cd of rows 4-7; one two-source permute gathers the
    # first pairs in row order, another the second pairs, and one add finishes: nine
    # instructions for eight rows, where two sums of four from the 256-bit halves took
    # twenty-two (Zen 5, y = alpha*A*x + beta*B*x with A n x 4 f64: n = 32 12.1 -> 8.1
    # ns, n = 100 31.0 -> 20.3 in the LGen harness)
    "blacc_sum8x2_pd": """static inline __m512d blacc_sum8x2_pd(__m512d a, __m512d b, __m512d c,
                                      __m512d d) {
    __m512d ab = _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
    __m512d cd = _mm512_add_pd(_mm512_unpacklo_pd(c, d), _mm512_unpackhi_pd(c, d));
    return _mm512_add_pd(
        _mm512_permutex2var_pd(ab, _mm512_setr_epi64(0, 4, 1, 5, 8, 12, 9, 13), cd),
        _mm512_permutex2var_pd(ab, _mm512_setr_epi64(2, 6, 3, 7, 10, 14, 11, 15), cd));
}""",
    # rows a..h of 8 f64: unpacks and adds leave in ab the sums of two elements of rows a
    # and b in each 128-bit lane; 128-bit lanes exchanged between ab and cd and added
    # leave sums of four (a0123 b0123 a4567 b4567 c0123 ...); two two-source permutes
    # and an add finish: 21 instructions for eight rows, where two sums of four from
    # halves added took 34
    "blacc_sum8x8_pd": """static inline __m512d blacc_sum8x8_pd(__m512d a, __m512d b, __m512d c,
                                      __m512d d, __m512d e, __m512d f,
                                      __m512d g, __m512d h) {
    __m512d ab = _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
    __m512d cd = _mm512_add_pd(_mm512_unpacklo_pd(c, d), _mm512_unpackhi_pd(c, d));
    __m512d ef = _mm512_add_pd(_mm512_unpacklo_pd(e, f), _mm512_unpackhi_pd(e, f));
    __m512d gh = _mm512_add_pd(_mm512_unpacklo_pd(g, h), _mm512_unpackhi_pd(g, h));
    __m512d abcd = _mm512_add_pd(_mm512_shuffle_f64x2(ab, cd, 0x88),
                                 _mm512_shuffle_f64x2(ab, cd, 0xDD));
    __m512d efgh = _mm512_add_pd(_mm512_shuffle_f64x2(ef, gh, 0x88),
                                 _mm512_shuffle_f64x2(ef, gh, 0xDD));
    return _mm512_add_pd(
        _mm512_permutex2var_pd(abcd, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), efgh),
        _mm512_permutex2var_pd(abcd, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), efgh));
}""",
    # four rows of 16 f32: within the 128-bit lanes, unpacks and adds, then shuffles and
    # adds leave in lane l the sums of each row's quarter l (a_l, b_l, c_l, d_l)
    "blacc_sum4x4x4_ps": """static inline __m512 blacc_sum4x4x4_ps(__m512 a, __m512 b, __m512 c,
                                       __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
}""",
    # lanes 0 + 1 and 2 + 3 of x, then of y
    "blacc_lanes_added_ps": """static inline __m512 blacc_lanes_added_ps(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
}""",
    # rows a..p of 16 f32: quarter sums of four rows at a time, 128-bit lanes exchanged
    # and added twice (45 instructions for sixteen rows, where two sums of eight from
    # halves added take 74)
    "blacc_sum16x16_ps": """static inline __m512 blacc_sum16x16_ps(__m512 a, __m512 b, __m512 c,
                                       __m512 d, __m512 e, __m512 f,
                                       __m512 g, __m512 h, __m512 i,
                                       __m512 j, __m512 k, __m512 l,
                                       __m512 m, __m512 n, __m512 o,
                                       __m512 p) {
    __m512 ah = blacc_lanes_added_ps(blacc_sum4x4x4_ps(a, b, c, d),
                                     blacc_sum4x4x4_ps(e, f, g, h));
    __m512 ip = blacc_lanes_added_ps(blacc_sum4x4x4_ps(i, j, k, l),
                                     blacc_sum4x4x4_ps(m, n, o, p));
    return blacc_lanes_added_ps(ah, ip);
}""",
    # quarter q of a (b, c, d) holds row q (4 + q, ...): unpacks and adds leave in ab,
    # per quarter q, sums of two elements of rows q and 4 + q (a q01, b q01, a q23, b q23),
    # in cd of rows 8 + q and 12 + q; two two-source permutes gather the first and the
    # second sums in row order and one add finishes (in place of two shuffles, an add
    # and a permute: y = alpha*A*x + beta*B*x, A 80 x 4 f32, 9.1 -> 8.8 ns on Zen 5)
    "blacc_sum16x4_ps": """static inline __m512 blacc_sum16x4_ps(__m512 a, __m512 b, __m512 c,
                                      __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(
        _mm512_permutex2var_ps(ab, _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13,
                                                     16, 20, 24, 28, 17, 21, 25, 29), cd),
        _mm512_permutex2var_ps(ab, _mm512_setr_epi32(2, 6, 10, 14, 3, 7, 11, 15,
                                                     18, 22, 26, 30, 19, 23, 27, 31), cd));
}""",
    # four rows of 16 f32: transposed and added within the quarters (lane 4q + r holds
    # quarter q of row r), then the quarters added: 13 instructions, where each row
    # halved twice and then transposed took 25 (y = alpha*A*x + beta*B*x, A 4 x 64 f32,
    # 6.3 -> 5.1 ns on Zen 5)
    "blacc_sum4x16_ps": """static inline __m128 blacc_sum4x16_ps(__m512 a, __m512 b, __m512 c,
                                      __m512 d) {
    __m512 t = blacc_sum4x4x4_ps(a, b, c, d);
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}""",
    # four rows of 8 f64: unpacks and adds leave per 128-bit lane q [a_q b_q] in ab and
    # [c_q d_q] in cd; the 256-bit halves of each added, then as blacc_sum4x4_pd (13
    # instructions, where each row halved first took 17: y = A*x, A 4 x 16 f64, 1.84 ->
    # 1.60 ns on Zen 5; lanes 0-1 and 2-3 of ab and cd joined by vshuff64x2 and added,
    # then two vpermpd, took 1.65 ns there and 3.89 against 3.65 at A 4 x 48)
    "blacc_sum4x8_pd": """static inline __m256d blacc_sum4x8_pd(__m512d a, __m512d b, __m512d c,
                                      __m512d d) {
    __m512d ab = _mm512_add_pd(_mm512_unpacklo_pd(a, b), _mm512_unpackhi_pd(a, b));
    __m512d cd = _mm512_add_pd(_mm512_unpacklo_pd(c, d), _mm512_unpackhi_pd(c, d));
    __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(ab), _mm512_extractf64x4_pd(ab, 1));
    __m256d l = _mm256_add_pd(_mm512_castpd512_pd256(cd), _mm512_extractf64x4_pd(cd, 1));
    return _mm256_add_pd(_mm256_blend_pd(h, l, 0xC), _mm256_permute2f128_pd(h, l, 0x21));
}""",
}


AVX512 = Isa(
    name="avx512",
    registers=32,
    flags=("-mavx512f", "-mavx512dq", "-mavx512vl", "-mfma"),
    header="immintrin.h",
    vectors={"f32": VectorType("__m512", 16), "f64": VectorType("__m512d", 8)},
    ops=_avx512_ops(),
    narrow={"f32": (VectorType("__m256", 8), VectorType("__m128", 4)),
            "f64": (VectorType("__m256d", 4), VectorType("__m128d", 2))},
    prelude=_AVX512_PRELUDE,
    register_constraint="v",  # any of zmm0-31 ("x" is only the first 16)
    # 6 x 4 vectors and kc up to 384 (B slivers then live in L2, not L1, so rows of tiles
    # run outside: target.blocking._rows_outside_blocking): on a Xeon with AVX-512 and
    # AMX, 1000^3 f32 175 GFLOPS against 157 for 14 x 2 at the model's kc = 224, f64 88
    # against 80 (docs/blocking.md, "AVX-512")
    gemm_tile=(6, 4),
    gemm_kc=384,
    # In place, 9 x 3 and 6 x 4 vectors with narrow edges beat both the packed plan and
    # the narrow in-place tiles up to about 224^3 on the Xeon: 80^3 f32 151 GFLOPS against
    # 104 packed (NumPy 128), 200^3 f64 96 against 84; at 256^3 f32 packing wins (179
    # against 171). Measured with benchmarks/tune_gemm.py's in-place candidates.
    in_place_tiles=((9, 3), (6, 4)),
    in_place_work=224**3,
    mask_registers=True,
    requires=("avx512f", "avx512dq", "avx512vl", "avx2", "fma"),
)

#: Plain C with no intrinsics: any CPU, any C compiler. Tiles use scalar
#: accumulators and the C compiler may auto-vectorize.
GENERIC = Isa(name="generic", registers=16, flags=(), header=None)

ISAS = {isa.name: isa for isa in (AVX512, AVX2, GENERIC)}


def requested_isa() -> str:
    """The ISA name ``BLACC_ISA`` asks for, lower case; '' when unset or blank."""
    return os.environ.get("BLACC_ISA", "").strip().lower()


def isa_for(machine: Machine) -> Isa:
    """The widest ISA table this machine can run, or the one the environment variable
    ``BLACC_ISA`` names (``avx512``, ``avx2``, ``generic``): e.g. AVX2 code on an AVX-512
    machine, to compare the two or to keep a core out of its 512-bit clock license."""
    name = requested_isa()
    if not name:
        return next(isa for isa in ISAS.values() if not isa.missing(machine))
    isa = ISAS.get(name)
    if isa is None:
        raise ArgumentError(f"BLACC_ISA={name!r} is not an instruction set blacc knows: "
                            f"choose one of {', '.join(ISAS)}")
    missing = isa.missing(machine)
    if missing:
        raise ArgumentError(f"BLACC_ISA={name!r}: this machine lacks {', '.join(missing)}")
    return isa
