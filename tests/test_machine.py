"""Machine detection parsers and the analytical blocking model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blacc.errors import ArgumentError
from blacc.target.blocking import Blocking, blis_blocking
from blacc.target.machine import (
    DEFAULT_CACHES,
    CacheLevel,
    Machine,
    detect_machine,
    parse_cpu_list,
    parse_cpuinfo,
    parse_size,
    parse_sysfs,
    read_machine,
)

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 158
model name\t: Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz
cpu MHz\t\t: 800.123
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c

processor\t: 1
model name\t: something else
flags\t\t: fpu
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp
CPU implementer\t: 0x41
CPU part\t: 0xd0c

processor\t: 1
Features\t: fp asimd
"""

AMD_CPUINFO = (
    "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC 7763\n"
    "cpu MHz\t\t: 2445.430\n"
    "flags\t\t: avx2 fma\n"
)

ZEN3_CACHES = (
    CacheLevel(1, 32 * 1024, 8, 64, 1),
    CacheLevel(2, 512 * 1024, 8, 64, 1),
    CacheLevel(3, 32 * 1024 * 1024, 16, 64, 2),
)
ZEN3 = Machine("AMD EPYC", "x86_64", frozenset({"avx2", "fma"}), ZEN3_CACHES, 2, 2.45e9)


def make_index(cache_dir: Path, i: int, level: int, kind: str, size: str, ways: int,
               line: int = 64, shared: str = "0") -> None:
    d = cache_dir / f"index{i}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size),
                        ("ways_of_associativity", ways), ("coherency_line_size", line),
                        ("shared_cpu_list", shared)):
        (d / name).write_text(f"{value}\n")


def make_zen3_cpu(cpu_dir: Path) -> None:
    cache = cpu_dir / "cache"
    make_index(cache, 0, 1, "Data", "32K", 8)
    make_index(cache, 1, 1, "Instruction", "32K", 8)
    make_index(cache, 2, 2, "Unified", "512K", 8)
    make_index(cache, 3, 3, "Unified", "32768K", 16, shared="0-7")


# --- parsers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("32K", 32768), ("512K", 524288), ("32768K", 32 << 20), ("8M", 8 << 20), ("1G", 1 << 30),
    ("4096", 4096), (" 48K\n", 48 * 1024), ("64KiB", 65536), ("2m", 2 << 20),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "12X", "1.5M", "-4K"])
def test_parse_size_rejects_junk(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("text, expected", [("0", 1), ("0-1", 2), ("0-3,8,10-11\n", 7)])
def test_parse_cpu_list(text: str, expected: int) -> None:
    assert parse_cpu_list(text) == expected


def test_parse_cpuinfo_x86() -> None:
    info = parse_cpuinfo(X86_CPUINFO)
    assert info.name == "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"
    assert {"avx2", "fma", "sse4_2"} <= info.features
    assert "avx512f" not in info.features
    assert info.mhz == pytest.approx(3200.0)  # nominal from the name, not the current 800 MHz
    assert info.vendor == "GenuineIntel" and info.family == 6 and info.model == 158
    intel = Machine("x", "x86_64", vendor=info.vendor, family=info.family, model=info.model)
    assert intel.vector_datapath == 0 and intel.prefetches_store_streams
    assert not intel.straight_rows_near_l1  # measured on CPU model 167 only


def test_parse_cpuinfo_mhz_fallback() -> None:
    assert parse_cpuinfo(AMD_CPUINFO).mhz == pytest.approx(2445.43)


def test_parse_cpuinfo_arm() -> None:
    info = parse_cpuinfo(ARM_CPUINFO)
    assert {"asimd", "neon", "fp", "asimdhp"} <= info.features
    assert info.mhz is None


def test_parse_cpuinfo_empty() -> None:
    info = parse_cpuinfo("")
    assert info.name == "unknown" and info.features == frozenset() and info.mhz is None
    assert info.vendor == "unknown"


def test_parse_sysfs_skips_instruction_cache(tmp_path: Path) -> None:
    make_zen3_cpu(tmp_path)
    caches = parse_sysfs(tmp_path)
    assert [c.level for c in caches] == [1, 2, 3]
    l1, l2, l3 = caches
    assert l1 == CacheLevel(1, 32768, 8, 64, 1)
    assert l1.sets == 64 and l1.way_size == 4096
    assert l2.size == 512 * 1024 and l2.associativity == 8
    assert l3.size == 32 << 20 and l3.shared_by == 8


def test_parse_sysfs_tolerates_bad_index(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    make_index(cache, 0, 1, "Data", "48K", 12)
    make_index(cache, 1, 2, "Unified", "garbage", 16)
    (cache / "index2").mkdir()  # empty directory
    make_index(cache, 3, 3, "Unified", "4M", 0)  # fully associative
    make_index(cache, 4, 4, "Unified", "4M", 16, line=0)  # zero line size
    caches = parse_sysfs(tmp_path)
    assert [c.level for c in caches] == [1, 3]
    assert caches[1].associativity == (4 << 20) // 64


def test_parse_sysfs_missing_dir(tmp_path: Path) -> None:
    assert parse_sysfs(tmp_path / "nope") == ()


# --- machine ------------------------------------------------------------------------------------

def test_read_machine_from_fixture_root(tmp_path: Path) -> None:
    make_zen3_cpu(tmp_path / "sys/devices/system/cpu/cpu0")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(AMD_CPUINFO)
    m = read_machine(tmp_path)
    assert m.name == "AMD EPYC 7763" and m.vendor == "AuthenticAMD" and m.family == 25
    assert m.vector_datapath == 256  # Zen 3/4: 256-bit pipes
    assert not m.prefetches_store_streams  # ran faster without write prefetches
    assert m.has("avx2", "fma") and m.has("AVX2") and not m.has("avx512f")
    assert m.cache(2) is not None and m.cache(2).size == 512 * 1024
    assert m.frequency_hz == pytest.approx(2445.43e6)


def test_read_machine_prefers_sysfs_max_freq(tmp_path: Path) -> None:
    cpu = tmp_path / "sys/devices/system/cpu/cpu0"
    (cpu / "cpufreq").mkdir(parents=True)
    (cpu / "cpufreq/cpuinfo_max_freq").write_text("3500000\n")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(AMD_CPUINFO)
    assert read_machine(tmp_path).frequency_hz == pytest.approx(3.5e9)


def test_read_machine_defaults_when_files_missing(tmp_path: Path) -> None:
    m = read_machine(tmp_path)
    assert m.caches == DEFAULT_CACHES
    assert m.features == frozenset()
    assert m.frequency_hz is None
    assert m.cores >= 1
    assert m.cache(1).size == 32 * 1024 and m.cache(3).size == 8 << 20


def test_machine_helpers() -> None:
    m = Machine("x", "aarch64", frozenset({"asimd", "neon"}), ZEN3_CACHES[:2], 4)
    assert m.cache(3) is None and m.cache(1) is ZEN3_CACHES[0]
    assert m.has() and m.has("neon") and not m.has("neon", "sve")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["features"] == ["asimd", "neon"]
    assert d["caches"][1]["size"] == 512 * 1024


def test_detect_machine_on_host() -> None:
    m = detect_machine()
    assert m is detect_machine()  # cached
    assert m.cores >= 1
    l1 = m.cache(1)
    assert l1 is not None and 4 * 1024 <= l1.size <= 1 << 20
    assert l1.associativity >= 1 and l1.line in (32, 64, 128, 256)
    assert all(a.level < b.level for a, b in zip(m.caches, m.caches[1:], strict=False))
    assert m.frequency_hz is None or m.frequency_hz > 1e8
    json.dumps(m.to_dict())


# --- blocking -----------------------------------------------------------------------------------

SMALL = Machine("small", "x86_64", caches=(
    CacheLevel(1, 32 * 1024, 8, 64), CacheLevel(2, 256 * 1024, 4, 64),
    CacheLevel(3, 2 << 20, 16, 64, 4)))
SNB = Machine("sandy bridge", "x86_64", caches=(
    CacheLevel(1, 32 * 1024, 8, 64), CacheLevel(2, 256 * 1024, 8, 64),
    CacheLevel(3, 20 << 20, 20, 64, 8)))
BIG_L1 = Machine("big", "aarch64", caches=(
    CacheLevel(1, 64 * 1024, 4, 64), CacheLevel(2, 1 << 20, 8, 64)))  # no L3
MACHINES = [ZEN3, SMALL, SNB, BIG_L1, Machine("default", "x86_64")]
KERNELS = [(4, 6, 16), (8, 6, 8), (4, 8, 8), (8, 4, 4), (4, 4, 24), (8, 8, 6), (4, 16, 6),
           (8, 12, 8), (2, 8, 32), (16, 3, 4)]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
@pytest.mark.parametrize("closed_form", [False, True])
@pytest.mark.parametrize("s, mr, nr", KERNELS)
def test_blocking_invariants(machine: Machine, closed_form: bool, s: int, mr: int,
                             nr: int) -> None:
    b = blis_blocking(machine, dtype_size=s, mr=mr, nr=nr, closed_form=closed_form)
    assert b.mc % mr == 0 and b.kc % 4 == 0 and b.nc % nr == 0
    assert 64 <= b.kc <= 1024 and mr <= b.mc <= 1024 and nr <= b.nc <= 4096
    l1 = machine.cache(1)
    way1 = l1.way_size
    # A and B slivers fit in whole ways of L1, leaving one way for C.
    ways = -(-mr * b.kc * s // way1) + -(-nr * b.kc * s // way1)
    assert ways <= l1.associativity - 1
    l2 = machine.cache(2)
    assert b.mc * b.kc * s + nr * b.kc * s <= l2.size - l2.way_size
    l3 = machine.cache(3) or DEFAULT_CACHES[2]
    assert b.kc * b.nc * s <= l3.size


@pytest.mark.parametrize("s, mr, nr", KERNELS)
def test_exact_kc_never_below_closed_form(s: int, mr: int, nr: int) -> None:
    for m in MACHINES:
        exact = blis_blocking(m, dtype_size=s, mr=mr, nr=nr)
        closed = blis_blocking(m, dtype_size=s, mr=mr, nr=nr, closed_form=True)
        assert exact.kc >= closed.kc


def test_blocking_zen3_numbers() -> None:
    assert blis_blocking(ZEN3, dtype_size=4, mr=6, nr=16) == Blocking(mc=306, kc=320, nc=4096)
    assert blis_blocking(ZEN3, dtype_size=8, mr=6, nr=8) == Blocking(mc=192, kc=256, nc=4096)
    # Polly's closed form loses a whole L1 way to the floor when nr/mr is large.
    closed = blis_blocking(ZEN3, dtype_size=4, mr=6, nr=16, closed_form=True)
    assert (closed.kc, closed.mc) == (168, 582)


def test_blocking_matches_blis_sandy_bridge() -> None:
    # flame/blis config/sandybridge: dgemm 8x4 mc=96 kc=256, sgemm 8x8 mc=128 kc=384.
    b = blis_blocking(SNB, dtype_size=8, mr=8, nr=4)
    assert (b.mc, b.kc) == (96, 256)
    b = blis_blocking(SNB, dtype_size=4, mr=8, nr=8)
    assert (b.mc, b.kc) == (128, 384)


def test_blocking_low_associativity_falls_back() -> None:
    m = Machine("direct", "x86_64", caches=(
        CacheLevel(1, 16 * 1024, 1, 64), CacheLevel(2, 128 * 1024, 2, 64)))
    b = blis_blocking(m, dtype_size=8, mr=4, nr=4)
    assert b.kc >= 64 and b.mc % 4 == 0 and b.mc >= 4 and b.nc % 4 == 0


def test_blocking_on_host() -> None:
    b = blis_blocking(detect_machine(), dtype_size=4, mr=6, nr=16)
    assert b.mc % 6 == 0 and b.kc % 4 == 0 and b.nc % 16 == 0


@pytest.mark.parametrize("kwargs", [
    {"dtype_size": 0, "mr": 6, "nr": 8}, {"dtype_size": 8, "mr": -1, "nr": 8},
    {"dtype_size": 8, "mr": 6, "nr": 2.0},
])
def test_blocking_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ArgumentError):
        blis_blocking(ZEN3, **kwargs)
