"""Tests of the C compiler driver and the on-disk kernel cache."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from blacc.backend import compiler as compiler_mod
from blacc.backend.compiler import Compiler, compile_shared, find_compiler
from blacc.errors import CompilerError, CompilerNotFoundError
from blacc.runtime import cache as cache_mod
from blacc.runtime.cache import KernelCache, cache_key, default_cache_dir

ADD_SOURCE = "int add(int a, int b) { return a + b; }\n"
SRC_DIR = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def cc() -> Compiler:
    return find_compiler()


def _call_add(lib: ctypes.CDLL, a: int = 2, b: int = 40) -> int:
    fn = lib.add
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn(a, b)


class CountingBuild:
    """A build callback that compiles ADD_SOURCE and counts its calls."""

    def __init__(self, compiler: Compiler) -> None:
        self.compiler = compiler
        self.calls = 0

    def __call__(self, path: Path) -> None:
        self.calls += 1
        compile_shared(self.compiler, ADD_SOURCE, path, ["-O2"])


# --- compiler -------------------------------------------------------------------------


def test_find_compiler_finds_a_working_compiler(cc: Compiler) -> None:
    assert os.path.isabs(cc.path)
    assert cc.version and cc.version != "unknown"
    assert find_compiler() is cc  # memoized


def test_explicit_cc_is_used() -> None:
    gcc = find_compiler("gcc")
    assert gcc.path == shutil.which("gcc")


def test_missing_cc_raises_and_names_it() -> None:
    with pytest.raises(CompilerNotFoundError) as info:
        find_compiler("blacc-no-such-compiler-xyz")
    message = str(info.value)
    assert "blacc-no-such-compiler-xyz" in message
    assert "CC" in message


def test_broken_cc_raises_rather_than_falling_back() -> None:
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` program")
    with pytest.raises(CompilerNotFoundError, match="false"):
        find_compiler(false)


def test_no_compiler_on_path_lists_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler_mod, "DEFAULT_CANDIDATES", ("blacc-nope-1", "blacc-nope-2"))
    with pytest.raises(CompilerNotFoundError) as info:
        find_compiler()
    message = str(info.value)
    assert "blacc-nope-1" in message and "blacc-nope-2" in message
    assert "set CC" in message


def test_compile_shared_and_call(cc: Compiler, tmp_path: Path) -> None:
    out = tmp_path / "add.so"
    compile_shared(cc, ADD_SOURCE, out, ["-O2"])
    assert _call_add(ctypes.CDLL(str(out)), 2, 40) == 42


def test_compile_error_quotes_compiler_message(cc: Compiler, tmp_path: Path) -> None:
    with pytest.raises(CompilerError) as info:
        compile_shared(cc, "int broken( { return blacc_undeclared; }\n", tmp_path / "x.so", [])
    message = str(info.value)
    assert "error" in message.lower()
    assert "kernel.c" in message  # the diagnostics themselves, not just an exit status
    assert not (tmp_path / "x.so").exists()


# --- cache keys and directories -------------------------------------------------------


def test_cache_key_is_canonical() -> None:
    a = cache_key(program="C = A @ B", schedule={"tile": [64, 64], "unroll": 4}, cc="gcc 12")
    b = cache_key(cc="gcc 12", schedule={"unroll": 4, "tile": [64, 64]}, program="C = A @ B")
    assert a == b
    assert len(a) == 64 and int(a, 16) >= 0
    assert a != cache_key(program="C = A @ B", schedule={"tile": [64, 32]}, cc="gcc 12")
    with pytest.raises(TypeError):
        cache_key(program=object())


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BLACC_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("BLACC_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "blacc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "blacc"


def test_kernel_cache_uses_default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BLACC_CACHE_DIR", str(tmp_path / "env"))
    assert KernelCache().directory == tmp_path / "env"


# --- kernel cache ---------------------------------------------------------------------


def _entry(root: Path, key: str) -> tuple[Path, Path]:
    return root / key[:2] / f"{key}.so", root / key[:2] / f"{key}.json"


def test_cache_builds_once_then_loads_from_disk(cc: Compiler, tmp_path: Path) -> None:
    key = cache_key(test="builds-once")
    build = CountingBuild(cc)
    cache = KernelCache(tmp_path)
    lib = cache.library(key, build)
    assert _call_add(lib) == 42
    assert cache.library(key, build) is lib
    assert build.calls == 1

    lib_path, manifest_path = _entry(tmp_path, key)
    manifest = json.loads(manifest_path.read_text())
    assert manifest["key"] == key
    assert manifest["size"] == lib_path.stat().st_size
    if os.name == "posix":
        assert lib_path.parent.stat().st_mode & 0o077 == 0
    assert [p.name for p in lib_path.parent.iterdir() if p.name.endswith(".tmp")] == []

    fresh = CountingBuild(cc)
    assert _call_add(KernelCache(tmp_path).library(key, fresh)) == 42
    assert fresh.calls == 0


def _replace_bytes(path: Path, data: bytes) -> None:
    # Write a new inode, as a real corrupter would, so the copy this process has
    # already mapped is left alone.
    tmp = path.with_name(path.name + ".corrupt")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o700)
    os.replace(tmp, path)


@pytest.mark.parametrize(
    "damage",
    [
        "flip-library",
        "truncate-library",
        "bad-manifest",
        "wrong-hash",
        "missing-manifest",
        "other-key",
    ],
)
def test_damaged_entry_is_rebuilt(cc: Compiler, tmp_path: Path, damage: str) -> None:
    key = cache_key(test="damaged", damage=damage)
    KernelCache(tmp_path).library(key, CountingBuild(cc))
    lib_path, manifest_path = _entry(tmp_path, key)
    data = lib_path.read_bytes()
    manifest = json.loads(manifest_path.read_text())

    if damage == "flip-library":
        mid = len(data) // 2
        _replace_bytes(
            lib_path, data[:mid] + bytes(b ^ 0xFF for b in data[mid : mid + 16]) + data[mid + 16 :]
        )
    elif damage == "truncate-library":
        _replace_bytes(lib_path, data[: len(data) // 3])
    elif damage == "bad-manifest":
        manifest_path.write_text("{not json")
    elif damage == "wrong-hash":
        manifest["sha256"] = "0" * 64
        manifest_path.write_text(json.dumps(manifest))
    elif damage == "missing-manifest":
        manifest_path.unlink()
    elif damage == "other-key":
        manifest["key"] = "f" * 64
        manifest_path.write_text(json.dumps(manifest))

    rebuild = CountingBuild(cc)
    assert _call_add(KernelCache(tmp_path).library(key, rebuild)) == 42
    assert rebuild.calls == 1
    repaired = json.loads(manifest_path.read_text())
    assert repaired["key"] == key
    assert repaired["sha256"] == hashlib.sha256(lib_path.read_bytes()).hexdigest()
    again = CountingBuild(cc)
    KernelCache(tmp_path).library(key, again)
    assert again.calls == 0


@pytest.mark.skipif(os.name != "posix", reason="ownership checks are POSIX-only")
def test_group_writable_library_is_not_trusted(cc: Compiler, tmp_path: Path) -> None:
    key = cache_key(test="group-writable")
    KernelCache(tmp_path).library(key, CountingBuild(cc))
    lib_path, _ = _entry(tmp_path, key)
    os.chmod(lib_path, 0o772)
    rebuild = CountingBuild(cc)
    KernelCache(tmp_path).library(key, rebuild)
    assert rebuild.calls == 1
    assert lib_path.stat().st_mode & 0o077 == 0


def test_failed_build_leaves_no_entry(tmp_path: Path) -> None:
    key = cache_key(test="failing")

    def failing(path: Path) -> None:
        raise CompilerError("boom")

    with pytest.raises(CompilerError, match="boom"):
        KernelCache(tmp_path).library(key, failing)
    assert list((tmp_path / key[:2]).iterdir()) == []


def test_unsafe_key_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        KernelCache(tmp_path).library("../../etc/evil", lambda p: None)


def test_unusable_dir_falls_back_with_warning(
    cc: Compiler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_mod, "_fallback_warned", False)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    cache = KernelCache(not_a_dir / "cache")
    build = CountingBuild(cc)
    with pytest.warns(RuntimeWarning, match="not usable"):
        lib = cache.library(cache_key(test="fallback-1"), build)
    assert _call_add(lib) == 42
    assert cache.directory != not_a_dir / "cache"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        KernelCache(not_a_dir / "cache").library(cache_key(test="fallback-2"), build)
    assert build.calls == 2


_CHILD = textwrap.dedent(
    """
    import ctypes, sys, time
    from pathlib import Path
    from blacc.backend.compiler import compile_shared, find_compiler
    from blacc.runtime.cache import KernelCache

    root, key, me = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    cc = find_compiler()
    calls = 0

    def build(path):
        global calls
        calls += 1
        # Rendezvous inside build, so both processes miss the cache and race to publish.
        (root / f"ready-{me}").touch()
        deadline = time.monotonic() + 5
        while len(list(root.glob("ready-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        compile_shared(cc, "int add(int a, int b) { return a + b; }\\n", path, ["-O2"])

    lib = KernelCache(root).library(key, build)
    lib.add.argtypes = [ctypes.c_int, ctypes.c_int]
    print(calls, lib.add(20, 22))
    """
)


def test_concurrent_processes_build_same_key(cc: Compiler, tmp_path: Path) -> None:
    key = cache_key(test="concurrent")
    env = {**os.environ, "PYTHONPATH": SRC_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path), key, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    results = [p.communicate(timeout=30) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert out.split() == ["1", "42"]  # each built (both missed) and got a valid library
    fresh = CountingBuild(cc)
    assert _call_add(KernelCache(tmp_path).library(key, fresh)) == 42
    assert fresh.calls == 0
    leftovers = [p.name for p in (tmp_path / key[:2]).iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
