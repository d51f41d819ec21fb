"""What the host CPU looks like: ISA features, data caches, cores, frequency.

The blocking model (`blacc.target.blocking`) and the kernel strategies need the cache geometry
and the SIMD flags. Detection reads Linux sysfs and /proc/cpuinfo; the parsers are separate
functions so tests can feed them fixtures. Detection never raises: anything it cannot read falls
back to a generic machine (32 KiB L1d, 256 KiB L2, 8 MiB L3, no SIMD flags).
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CACHES",
    "CacheLevel",
    "CpuInfo",
    "Machine",
    "detect_machine",
    "parse_cpu_list",
    "parse_cpuinfo",
    "parse_size",
    "parse_sysfs",
    "read_machine",
]


@dataclass(frozen=True)
class CacheLevel:
    """One data or unified cache as seen by one core."""

    level: int
    size: int  # bytes
    associativity: int  # ways; a fully associative cache has size // line ways
    line: int  # bytes
    shared_by: int = 1  # logical CPUs sharing this cache

    @property
    def way_size(self) -> int:
        """Bytes in one way (sets * line): the unit the blocking model allocates in."""
        return self.size // max(self.associativity, 1)

    @property
    def sets(self) -> int:
        return self.way_size // max(self.line, 1)


DEFAULT_CACHES: tuple[CacheLevel, ...] = (
    CacheLevel(1, 32 * 1024, 8, 64, 1),
    CacheLevel(2, 256 * 1024, 8, 64, 1),
    CacheLevel(3, 8 * 1024 * 1024, 16, 64, 1),
)


@dataclass(frozen=True)
class Machine:
    """A CPU description; build one directly in tests, or get the host's from detect_machine()."""

    name: str
    arch: str
    features: frozenset[str] = field(default_factory=frozenset)
    caches: tuple[CacheLevel, ...] = DEFAULT_CACHES
    cores: int = 1
    frequency_hz: float | None = None
    vendor: str = "unknown"  # /proc/cpuinfo vendor_id, e.g. GenuineIntel, AuthenticAMD
    family: int | None = None  # /proc/cpuinfo cpu family (x86)
    model: int | None = None  # /proc/cpuinfo model (x86)

    @property
    def vector_datapath(self) -> int:
        """Bits the vector pipes take at once; 0 when any vector register fits. AMD family
        25 (Zen 3, Zen 4) has 256-bit pipes and Zen 4 runs a 512-bit instruction over
        them, taking each pipe twice."""
        return 256 if self.vendor == "AuthenticAMD" and self.family == 25 else 0

    @property
    def prefetches_store_streams(self) -> bool:
        """Whether kernels fetch the lines of large outputs for writing ahead of stores
        that interleave rows (``transform.prefetch_stores``). On a Xeon (Emerald Rapids)
        C = A*B 100 x 4 x 100 f64 ran 1.5x as fast with them; on Zen 3 the same kernel
        ran 1.3-1.5x as fast without them (and 80 x 4 x 80 1.4-1.5x), ahead of LIBXSMM,
        whose speed it had missed by 0.77-0.78x (by hand, LGen's harness, alternating).
        Zen 5 ran it at the loops' speed without them. Off on AMD's cores."""
        return self.vendor != "AuthenticAMD"

    @property
    def one_row_blocks_near_l1(self) -> bool:
        """Whether blocks of one row compute an output (read back, ``beta*C``, or only
        written) that fills a third of L1 to all of it (``strategy.small.ONE_ROW_BAND``).
        Measured on a Xeon of CPU model 167 only (``strategy.small._one_row_near_l1``)."""
        return self._cpu_model_167

    @property
    def whole_short_outputs(self) -> bool:
        """Whether an output of a few rows (``strategy.small.SHORT_OUTPUT_ROWS``) with rows
        of two vectors or more is computed in blocks of all its rows. Measured on a Xeon
        of CPU model 167 only (``strategy.small._short_output_rows``)."""
        return self._cpu_model_167

    @property
    def straight_rows_near_l1(self) -> bool:
        """Whether blocks of rows store into an output that is only written in
        straight-line code, not in a loop along the row, where the call's operands about
        fill L1 (``transform.blac.NEAR_L1``). On a Xeon of CPU model 167 (LGen's harness,
        C = A*B n x 4 x n, 13 sizes, both dtypes) the planned kernels in that band ran
        1.00-1.43x as fast so; below and above it straight-line code ran 0.68-1.0x as
        fast as the loop. Measured on that core only."""
        return self._cpu_model_167

    @property
    def _cpu_model_167(self) -> bool:
        """The one core some rules were measured on (an Intel Xeon of CPU model 167)."""
        return self.vendor == "GenuineIntel" and self.family == 6 and self.model == 167

    def cache(self, level: int) -> CacheLevel | None:
        """The data/unified cache at `level` (1, 2, 3), or None if the machine has none."""
        return next((c for c in self.caches if c.level == level), None)

    def has(self, *features: str) -> bool:
        """True when every named ISA flag is present (case-insensitive)."""
        return all(f.lower() in self.features for f in features)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (features sorted so output is stable)."""
        return {
            "name": self.name,
            "arch": self.arch,
            "features": sorted(self.features),
            "caches": [asdict(c) for c in self.caches],
            "cores": self.cores,
            "frequency_hz": self.frequency_hz,
            "vendor": self.vendor,
            "family": self.family,
            "model": self.model,
        }


@dataclass(frozen=True)
class CpuInfo:
    """The parts of /proc/cpuinfo blacc uses (first value of each field, i.e. processor 0)."""

    name: str = "unknown"
    features: frozenset[str] = frozenset()
    mhz: float | None = None  # nominal if the model name says "@ x GHz", else 'cpu MHz'
    vendor: str = "unknown"
    family: int | None = None
    model: int | None = None


_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes in a sysfs size such as '32K', '32768K', '8M' or '512'; ValueError otherwise."""
    m = _SIZE_RE.match(text)
    if m is None:
        raise ValueError(f"unrecognised cache size {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_cpu_list(text: str) -> int:
    """Number of CPUs in a list such as '0-3,8,10-11' (sysfs shared_cpu_list)."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        count += int(hi) - int(lo) + 1 if hi else 1
    if count < 1:
        raise ValueError(f"empty cpu list {text!r}")
    return count


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model name, vendor, family, ISA flags and MHz from /proc/cpuinfo text (x86 'flags',
    arm 'Features').

    On arm 'asimd' is also reported as 'neon', the name kernels use for the same unit.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:  # first occurrence wins: processor 0, plus trailing blocks such as 'Hardware'
            fields.setdefault(key.strip().lower(), value.strip())
    name = (
        fields.get("model name")
        or fields.get("hardware")
        or fields.get("processor name")
        or fields.get("cpu model")
        or "unknown"
    )
    raw = fields.get("flags") or fields.get("features") or ""
    features = {f.lower() for f in raw.split()}
    if "asimd" in features:
        features.add("neon")
    family, model = fields.get("cpu family", ""), fields.get("model", "")
    return CpuInfo(name=name, features=frozenset(features), mhz=_mhz(name, fields),
                   vendor=fields.get("vendor_id") or "unknown",
                   family=int(family) if family.isdigit() else None,
                   model=int(model) if model.isdigit() else None)


def _mhz(name: str, fields: dict[str, str]) -> float | None:
    m = re.search(r"@\s*([\d.]+)\s*GHz", name)
    if m:
        return float(m.group(1)) * 1000.0
    try:
        mhz = float(fields["cpu mhz"])
    except (KeyError, ValueError):
        return None
    return mhz if mhz > 0 else None


def parse_sysfs(cpu_dir: Path) -> tuple[CacheLevel, ...]:
    """Data/unified caches of one CPU from `cpu_dir`/cache/index*, sorted by level.

    Instruction caches are skipped; an index that cannot be parsed is skipped, not fatal.
    """
    found: dict[int, CacheLevel] = {}
    for index in sorted(Path(cpu_dir, "cache").glob("index*")):
        try:
            cache = _read_index(index)
        except (OSError, ValueError):
            continue
        if cache is not None:
            found.setdefault(cache.level, cache)
    return tuple(found[k] for k in sorted(found))


def _read_index(index: Path) -> CacheLevel | None:
    def read(name: str) -> str:
        return (index / name).read_text().strip()

    if read("type").lower() == "instruction":
        return None
    size = parse_size(read("size"))
    line = int(read("coherency_line_size"))
    if size <= 0 or line <= 0:
        raise ValueError(f"bad cache geometry in {index}")
    ways = int(read("ways_of_associativity"))
    if ways <= 0:  # sysfs reports 0 for fully associative caches
        ways = max(size // line, 1)
    try:
        shared = parse_cpu_list(read("shared_cpu_list"))
    except (OSError, ValueError):
        shared = 1
    return CacheLevel(int(read("level")), size, ways, line, shared)


def _max_freq_hz(cpu_dir: Path) -> float | None:
    try:
        khz = float((cpu_dir / "cpufreq" / "cpuinfo_max_freq").read_text())
    except (OSError, ValueError):
        return None
    return khz * 1e3 if khz > 0 else None


def _host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_machine(root: str | os.PathLike[str] = "/") -> Machine:
    """Build a Machine from the sysfs/procfs tree under `root`, defaulting whatever is missing.

    Core count always comes from the running process (affinity mask), not from `root`.
    """
    root = Path(root)
    cpu_dir = root / "sys/devices/system/cpu/cpu0"
    try:
        info = parse_cpuinfo((root / "proc/cpuinfo").read_text(errors="replace"))
    except (OSError, ValueError):
        info = CpuInfo()
    try:
        caches = parse_sysfs(cpu_dir)
    except (OSError, ValueError):
        caches = ()
    freq = _max_freq_hz(cpu_dir)
    if freq is None and info.mhz is not None:
        freq = info.mhz * 1e6
    return Machine(
        name=info.name if info.name != "unknown" else (platform.processor() or "unknown"),
        arch=platform.machine() or "unknown",
        features=info.features,
        caches=caches or DEFAULT_CACHES,
        cores=_host_cores(),
        frequency_hz=freq,
        vendor=info.vendor,
        family=info.family,
        model=info.model,
    )


@functools.lru_cache(maxsize=1)
def detect_machine() -> Machine:
    """The host machine, detected once per process. Never raises."""
    try:
        return read_machine("/")
    except Exception:  # detection must not take the compiler down
        return Machine(name="unknown", arch=platform.machine() or "unknown",
                       cores=os.cpu_count() or 1)
