"""Layer 3: schedule records (blacc.transform.schedule), the named GEMM strategies
(blacc.strategy.gemm) and the preconditions ``apply`` checks (blacc.transform.apply)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blacc.errors import BlaccError, ScheduleError
from blacc.ir import kernel as k
from blacc.ir.structured import REDUCTION, Access, Contraction, Dim, matmul
from blacc.ir.walk import nodes_of
from blacc.strategy.gemm import blis, no_packing
from blacc.transform.apply import apply
from blacc.transform.schedule import (
    NarrowEdges,
    Pack,
    Tile,
    UnrollJam,
    Vectorize,
    from_json,
    show,
    to_json,
)

#: The names show() prints, and nothing else (no builtins): eval of our own printed text.
NAMESPACE = {"__builtins__": {}, "Tile": Tile, "Pack": Pack, "UnrollJam": UnrollJam,
             "Vectorize": Vectorize, "NarrowEdges": NarrowEdges}

SCHEDULES = {
    "blis-f32": blis(12, 8, 32, 6, 16, 4, 8),
    "blis-f64": blis(12, 8, 32, 6, 8, 4, 4),
    "blis-scalar": blis(12, 8, 32, 4, 4, 4),
    "blis-big": blis(306, 320, 4096, 6, 16, 4, 8),
    "no_packing-vec": no_packing(6, 16, 4, 8),
    "no_packing-scalar": no_packing(4, 4, 4),
    "no_packing-ku1": no_packing(3, 5, 1),
}


# ----------------------------------------------------------------------------- records


@pytest.mark.parametrize("size", [0, -1, -16, 1.5, 4.0, "4", None])
def test_tile_rejects_non_positive_or_non_int_sizes(size):
    with pytest.raises(ScheduleError, match="positive integer"):
        Tile((("i", size),))
    with pytest.raises(ScheduleError, match="positive integer"):
        Tile((("j", 16), ("i", size)))


def test_tile_rejects_duplicate_and_empty():
    with pytest.raises(ScheduleError, match="twice"):
        Tile((("i", 4), ("i", 8)))
    with pytest.raises(ScheduleError, match="twice"):
        Tile((("i", 4), ("j", 8), ("i", 4)))
    with pytest.raises(ScheduleError, match="at least one"):
        Tile(())


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_tile_balanced_is_a_bool(bad):
    with pytest.raises(ScheduleError, match="balanced must be True or False"):
        Tile((("k", 8),), balanced=bad)
    with pytest.raises(ScheduleError, match="balanced"):
        from_json(json.dumps([{"kind": "Tile", "sizes": [["k", 8]], "balanced": bad}]))


def test_the_register_tile_cannot_be_balanced():
    schedule = (Tile((("k", 8),), balanced=True), Tile((("j", 16), ("i", 6)), balanced=True),
                Vectorize("j", 8))
    with pytest.raises(ScheduleError, match="register tile has a fixed size"):
        apply(F32, schedule, name="gemm", known_strides=CS1)


@pytest.mark.parametrize("bad", [0, -3, 2.0, "6", None])
def test_pack_unroll_vectorize_reject_non_positive(bad):
    with pytest.raises(ScheduleError):
        Pack("A", bad)
    with pytest.raises(ScheduleError):
        UnrollJam("k", bad)
    with pytest.raises(ScheduleError):
        Vectorize("j", bad)


def test_records_are_frozen_hashable_values():
    t = Tile((("j", 16), ("i", 6)))
    assert t == Tile((("j", 16), ("i", 6)))
    assert t != Tile((("i", 6), ("j", 16)))  # the order is the loop nesting
    assert len({t, Tile((("j", 16), ("i", 6))), Pack("A", 6), Pack("A", 6)}) == 2
    with pytest.raises(AttributeError):
        t.sizes = ()  # type: ignore[misc]
    assert issubclass(ScheduleError, BlaccError) and issubclass(ScheduleError, ValueError)


def test_blis_and_no_packing_shapes():
    s = blis(12, 8, 32, 6, 16, 4, 8)
    assert s == (Tile((("j", 32),), balanced=True), Tile((("k", 8),), balanced=True),
                 Pack("B", 16), Tile((("i", 12),)), Pack("A", 6), Tile((("j", 16), ("i", 6))),
                 UnrollJam("k", 4), Vectorize("j", 8), NarrowEdges("j"))
    assert blis(12, 8, 32, 6, 16, 4, 8, rows_outside=True)[5] == Tile((("i", 6), ("j", 16)))
    assert blis(12, 8, 32, 4, 4, 4)[-1] == UnrollJam("k", 4)  # lanes=1: no Vectorize
    assert no_packing(6, 16, 4, 8) == (Tile((("i", 6), ("j", 16))), UnrollJam("k", 4),
                                       Vectorize("j", 8))
    assert no_packing(4, 4, 2) == (Tile((("i", 4), ("j", 4))), UnrollJam("k", 2))


# ----------------------------------------------------------------------------- JSON and show


@pytest.mark.parametrize("name", SCHEDULES)
def test_json_round_trip(name):
    schedule = SCHEDULES[name]
    text = to_json(schedule)
    assert isinstance(json.loads(text), list)
    back = from_json(text)
    assert back == schedule
    assert isinstance(back, tuple)
    assert all(type(a) is type(b) for a, b in zip(back, schedule, strict=True))
    assert to_json(back) == text
    # Tile sizes come back as tuples of tuples (hashable), not JSON lists.
    assert hash(back) == hash(schedule)


def test_json_names_the_kind():
    items = json.loads(to_json(blis(12, 8, 32, 6, 16, 4, 8)))
    assert [i["kind"] for i in items] == ["Tile", "Tile", "Pack", "Tile", "Pack", "Tile",
                                          "UnrollJam", "Vectorize", "NarrowEdges"]
    assert items[2] == {"kind": "Pack", "operand": "B", "sliver": 16}


@pytest.mark.parametrize("raw", [
    '[{"kind": "Fuse", "dims": ["i", "j"]}]',
    '[{"kind": "tile", "sizes": [["i", 4]]}]',
    '[{"sizes": [["i", 4]]}]',
    '[{"kind": "Tile", "sizes": [["i", 4]]}, {"kind": "Parallelize", "dim": "i"}]',
    '[{"kind": null}]',
])
def test_json_unknown_kind(raw):
    with pytest.raises(ScheduleError, match="unknown transformation"):
        from_json(raw)


def test_json_invalid_values_raise_schedule_error():
    with pytest.raises(ScheduleError):
        from_json('[{"kind": "Tile", "sizes": [["i", 0]]}]')
    with pytest.raises(ScheduleError):
        from_json('[{"kind": "Tile", "sizes": [["i", 4], ["i", 8]]}]')
    with pytest.raises(ScheduleError):
        from_json('[{"kind": "Pack", "operand": "A", "sliver": -6}]')


def test_json_empty_schedule():
    assert to_json(()) == "[]"
    assert from_json("[]") == ()


@pytest.mark.parametrize("name", SCHEDULES)
def test_show_evaluates_back(name):
    schedule = SCHEDULES[name]
    text = show(schedule)
    assert text.startswith("(") and text.endswith(")")
    assert eval(text, dict(NAMESPACE)) == schedule  # noqa: S307 - our own printed text


@pytest.mark.parametrize("schedule", [
    (Tile((("i", 4), ("j", 4))),),
    (Vectorize("j", 8),),
    (),
], ids=["tile", "vectorize", "empty"])
def test_show_evaluates_back_short_schedules(schedule):
    """A schedule is a tuple whatever its length: a one-record schedule must print as a
    1-tuple, ``(Tile(...),)``, not as the parenthesized record ``(Tile(...))``."""
    assert eval(show(schedule), dict(NAMESPACE)) == schedule  # noqa: S307


@settings(max_examples=60, deadline=None)
@given(mr=st.integers(1, 16), nr=st.integers(1, 32), ku=st.integers(1, 8),
       lanes=st.sampled_from([1, 2, 4, 8]), mcx=st.integers(1, 64), kc=st.integers(1, 512),
       ncx=st.integers(1, 64))
def test_round_trip_property(mr, nr, ku, lanes, mcx, kc, ncx):
    for schedule in (blis(mr * mcx, kc, nr * ncx, mr, nr, ku, lanes),
                     no_packing(mr, nr, ku, lanes)):
        assert from_json(to_json(schedule)) == schedule
        assert eval(show(schedule), dict(NAMESPACE)) == schedule  # noqa: S307


# ----------------------------------------------------------------------------- apply preconditions

F32 = matmul("f32")
CS1 = {"C_s1": 1}


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, True)])
def test_apply_accepts_the_named_schedules(name, trans_a, trans_b):
    module = apply(matmul("f32", trans_a=trans_a, trans_b=trans_b), SCHEDULES[name],
                   name="gemm", known_strides=CS1)
    assert module.entry == "gemm"
    entry = module.function("gemm")
    assert entry.exported
    assert [p.name for p in entry.params] == ["m", "n", "k", "alpha", "A", "A_s0", "A_s1", "B",
                                              "B_s0", "B_s1", "beta", "C", "C_s0", "C_s1"]
    assert [p.name for p in entry.params if p.pointer] == ["A", "B", "C"]
    assert [p.name for p in entry.params if p.const] == ["A", "B"]
    assert module.function("gemm_micro").exported is False


@pytest.mark.parametrize("schedule", [
    (Tile((("i", 6),)),),
    (Tile((("i", 6), ("k", 4))),),
    (Tile((("j", 16), ("i", 6))), Tile((("k", 4),))),
    (Tile((("i", 12),)), Tile((("i", 6),))),
    (UnrollJam("k", 4),),
    (),
], ids=["only-i", "i-k", "k-innermost", "i-twice", "no-tile", "empty"])
def test_innermost_tile_must_be_i_j(schedule):
    with pytest.raises(ScheduleError, match="innermost Tile"):
        apply(F32, schedule)


def test_k_tiled_twice():
    with pytest.raises(ScheduleError, match="tiled once"):
        apply(F32, (Tile((("k", 16),)), Tile((("k", 8),)), Tile((("i", 6), ("j", 16)))))
    with pytest.raises(ScheduleError, match="tiled once"):
        apply(F32, (Tile((("k", 16), ("j", 32))), Tile((("k", 8),)),
                    Tile((("j", 16), ("i", 6)))))


@pytest.mark.parametrize("schedule", [
    (Tile((("k", 8),)), Pack("B", 8), Tile((("j", 16), ("i", 6)))),
    (Tile((("k", 8),)), Pack("A", 4), Tile((("j", 16), ("i", 6)))),
    (Tile((("k", 8),)), Pack("A", 16), Tile((("j", 16), ("i", 6)))),  # A's sliver is mr
    (Tile((("k", 8),)), Pack("B", 6), Tile((("j", 16), ("i", 6)))),  # B's sliver is nr
])
def test_pack_sliver_must_be_register_tile(schedule):
    with pytest.raises(ScheduleError, match="sliver must equal"):
        apply(F32, schedule)


def test_pack_before_tile_k():
    with pytest.raises(ScheduleError, match="after Tile of 'k'"):
        apply(F32, (Tile((("j", 32),)), Pack("B", 16), Tile((("k", 8),)),
                    Tile((("j", 16), ("i", 6)))))
    with pytest.raises(ScheduleError, match="after Tile of 'k'"):
        apply(F32, (Pack("A", 6), Tile((("k", 8),)), Tile((("j", 16), ("i", 6)))))
    # After a Tile that names k among others, the k loop encloses the pack: accepted.
    apply(F32, (Tile((("j", 32), ("k", 8))), Pack("B", 16), Tile((("j", 16), ("i", 6)))))


def test_pack_after_register_tile():
    with pytest.raises(ScheduleError, match="before the register tile"):
        apply(F32, (Tile((("k", 8),)), Tile((("j", 16), ("i", 6))), Pack("A", 6)))


def test_pack_bad_operand_or_twice():
    with pytest.raises(ScheduleError, match="not an input"):
        apply(F32, (Tile((("k", 8),)), Pack("C", 6), Tile((("j", 16), ("i", 6)))))
    with pytest.raises(ScheduleError, match="packed twice"):
        apply(F32, (Tile((("k", 8),)), Pack("A", 6), Pack("A", 6),
                    Tile((("j", 16), ("i", 6)))))


@pytest.mark.parametrize("dim", ["i", "q"])
def test_vectorize_only_j_or_k(dim):
    with pytest.raises(ScheduleError, match="Vectorize"):
        apply(F32, (Tile((("i", 6), ("j", 16))), Vectorize(dim, 8)), known_strides=CS1)


@pytest.mark.parametrize("extra", [
    (Tile((("k", 64),)), Pack("A", 4)),  # packed
    (Tile((("k", 64),)),),  # k blocked
])
def test_vectorize_k_reads_operands_in_place(extra):
    """A tile of dot products runs over all of k on the operands as given."""
    with pytest.raises(ScheduleError, match="dot products"):
        apply(F32, (*extra, Tile((("i", 4), ("j", 1))), Vectorize("k", 8)))
    apply(F32, (Tile((("i", 4), ("j", 1))), Vectorize("k", 8)))  # fine on its own


@pytest.mark.parametrize("nr, lanes", [(16, 3), (12, 8), (6, 4), (1, 2)])
def test_vectorize_lanes_must_divide_nr(nr, lanes):
    with pytest.raises(ScheduleError, match="do not divide"):
        apply(F32, no_packing(6, nr, 4, lanes), known_strides=CS1)


def test_narrow_edges_needs_the_vectorized_columns():
    with pytest.raises(ScheduleError, match="NarrowEdges: only 'j'"):
        apply(F32, (Tile((("i", 6), ("j", 16))), Vectorize("j", 8), NarrowEdges("i")),
              known_strides=CS1)
    with pytest.raises(ScheduleError, match="needs 'j' vectorized"):
        apply(F32, (Tile((("i", 6), ("j", 16))), NarrowEdges("j")))
    with pytest.raises(ScheduleError, match="needs 'j' vectorized"):
        apply(F32, (Tile((("i", 4), ("j", 1))), Vectorize("k", 8), NarrowEdges("j")))


def test_narrow_edges_call_a_tile_as_wide_as_the_columns_left():
    """A 6 x 32 tile of 8 lanes gets micro-kernels 8, 16 and 24 columns wide, called when
    the columns left are at most that many; the full one otherwise."""
    module = apply(F32, blis(12, 8, 64, 6, 32, 4, 8), name="gemm", known_strides=CS1)
    names = [f.name for f in module.functions]
    assert names == ["gemm_micro8", "gemm_micro16", "gemm_micro24", "gemm_micro", "gemm"]
    for f in module.functions[:-1]:
        (mma,) = [s for s in f.body if isinstance(s, k.TileMMA)]
        assert mma.tile.cols == int(f.name.removeprefix("gemm_micro") or 32)
    ifs = nodes_of(module.function("gemm").body, k.If)[::-1]  # outermost first
    assert [(s.cond.op, s.cond.b.value) for s in ifs] == [("<=", 8), ("<=", 16), ("<=", 24)]
    assert [s.then[0].func for s in ifs] == ["gemm_micro8", "gemm_micro16", "gemm_micro24"]
    assert ifs[-1].orelse[0].func == "gemm_micro"


@pytest.mark.parametrize("dim", ["i", "j", "x"])
def test_unroll_jam_only_the_reduction(dim):
    with pytest.raises(ScheduleError, match="UnrollJam"):
        apply(F32, (Tile((("i", 6), ("j", 16))), UnrollJam(dim, 4)))


def test_tile_unknown_dim_and_growing_tile():
    with pytest.raises(ScheduleError, match="no dimension 'q'"):
        apply(F32, (Tile((("q", 8),)), Tile((("i", 6), ("j", 16)))))
    with pytest.raises(ScheduleError, match="larger than the enclosing"):
        apply(F32, (Tile((("j", 8),)), Tile((("i", 6), ("j", 16)))))


def test_unknown_transformation():
    with pytest.raises(ScheduleError, match="unknown transformation"):
        apply(F32, (Tile((("i", 6), ("j", 16))), "Parallelize"))  # type: ignore[arg-type]


_IJK = (Dim("i", "m"), Dim("j", "n"), Dim("k", "k", REDUCTION))


@pytest.mark.parametrize("op", [
    # three inputs
    Contraction("three", _IJK, (Access("A", ("i", "k")), Access("B", ("k", "j")),
                                Access("D", ("k", "j"))), Access("C", ("i", "j")), "f32"),
    # two reductions
    Contraction("two_red", (*_IJK, Dim("l", "l", REDUCTION)),
                (Access("A", ("i", "k")), Access("B", ("l", "j"))), Access("C", ("i", "j")),
                "f32"),
    # no reduction (an outer product)
    Contraction("outer", (Dim("i", "m"), Dim("j", "n")),
                (Access("A", ("i",)), Access("B", ("j",))), Access("C", ("i", "j")), "f32"),
    # matrix-vector
    Contraction("gemv", (Dim("i", "m"), Dim("k", "k", REDUCTION)),
                (Access("A", ("i", "k")), Access("x", ("k",))), Access("y", ("i",)), "f64"),
    # both inputs carry i: not matmul-shaped
    Contraction("ik_ik", _IJK, (Access("A", ("i", "k")), Access("B", ("i", "k"))),
                Access("C", ("i", "j")), "f32"),
    # an input that is not 2-D (A[i,j,k]) and no right operand
    Contraction("3d", _IJK, (Access("A", ("i", "j", "k")), Access("B", ("k", "j"))),
                Access("C", ("i", "j")), "f32"),
], ids=lambda op: op.name)
def test_apply_rejects_non_matmul(op):
    with pytest.raises(ScheduleError):
        apply(op, no_packing(4, 4, 1))


def test_apply_known_strides_fold_into_the_code():
    """known_strides substitutes constants: the entry keeps its full ABI, but C_s1 is no longer
    read by the loop nest."""
    from blacc.ir.walk import names_used as _used_names  # the same walk apply uses

    free = apply(F32, no_packing(4, 4, 1))
    fixed = apply(F32, no_packing(4, 4, 1), known_strides=CS1)
    assert "C_s1" in _used_names(free.function("kernel").body)
    assert "C_s1" not in _used_names(fixed.function("kernel").body)
    assert [p.name for p in fixed.function("kernel").params] == [
        p.name for p in free.function("kernel").params]
    assert isinstance(fixed.function("kernel_micro"), k.Function)


@pytest.mark.parametrize("dtype, nr, cols, offset", [
    ("f64", 32, 32, 0), ("f64", 32, 32, 3), ("f64", 32, 13, 7), ("f32", 64, 64, 5),
    ("f32", 16, 16, 9), ("f64", 8, 8, 0), ("f64", 1, 1, 0),
])
def test_micro_kernel_prefetches_every_line_of_its_c_tile(dtype, nr, cols, offset):
    """Each row of the C tile may span one line more than its bytes; every one of them,
    and none outside the tile's valid part, is prefetched before the k loop."""
    from blacc.ir.interp import _Env, evaluate

    module = apply(matmul(dtype), blis(mc=12, kc=64, nc=nr, mr=6, nr=nr, ku=4),
                   name="gemm", known_strides={"C_s1": 1})
    micro = module.function("gemm_micro")
    size = 8 if dtype == "f64" else 4
    rows, c_rs = 5, 1000
    env = _Env(module, {"rows": rows, "cols": cols, "c_rs": c_rs})
    fetched = {evaluate(p.index, env) for p in nodes_of(micro.body, k.Prefetch)
               if p.buf == "c" and p.write}
    valid = {r * c_rs + c for r in range(rows) for c in range(cols)}
    assert fetched <= valid
    line = lambda e: (offset + e) * size // 64  # noqa: E731 - the tile starts mid-line
    assert {line(e) for e in fetched} == {line(e) for e in valid}


@pytest.mark.parametrize("m, n, depth", [(1, 1, 1), (5, 7, 3), (13, 40, 9), (30, 70, 20)])
def test_packing_buffers_hold_a_block_or_the_whole_operand(m, n, depth):
    """A packed panel's buffer is as large as its block, or as the whole operand (in
    slivers) where that is smaller; the interpreter, which bounds-checks every access,
    computes the product in them."""
    import numpy as np

    from blacc.ir.interp import run, value_of

    module = apply(matmul("f64"), blis(mc=12, kc=8, nc=32, mr=4, nr=4, ku=2), name="gemm",
                   known_strides=CS1)
    extents = {"m": m, "n": n, "k": depth}
    sizes = {a.buf: value_of(a.size, extents)
             for a in nodes_of(module.function("gemm").body, k.Alloc)}
    slivers = lambda x: -(-x // 4) * 4  # noqa: E731
    assert sizes == {"Bp": min(32, slivers(n)) * min(8, depth),
                     "Ap": min(12, slivers(m)) * min(8, depth)}
    rng = np.random.default_rng(m * n * depth)
    a, b = rng.standard_normal((m, depth)), rng.standard_normal((depth, n))
    c = np.zeros((m, n))
    run(module, {**extents, "alpha": 1.0, "A": a.reshape(-1), "A_s0": depth, "A_s1": 1,
                 "B": b.reshape(-1), "B_s0": n, "B_s1": 1, "beta": 0.0, "C": c.reshape(-1),
                 "C_s0": n, "C_s1": 1})
    np.testing.assert_allclose(c, a @ b, rtol=1e-12, atol=1e-12)
