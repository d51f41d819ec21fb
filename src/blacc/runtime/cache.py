"""Cache of compiled kernels, in memory and on disk.

Compiling a kernel costs tens to hundreds of milliseconds, so each shared library is
built once per machine and reused across processes. Disk entries live at
``<dir>/<key[:2]>/<key><suffix>`` next to a manifest ``<key>.json`` holding the
library's SHA-256. An entry is loaded only after the manifest, the hash and the file
ownership/permissions check out; anything else is rebuilt, never trusted, because
loading a shared library runs its code.

Concurrency: every build goes to its own temporary file in the destination directory
and is moved into place with ``os.replace`` (atomic), library first and manifest last.
A reader therefore sees either no file or a complete one, and the hash check rejects a
library whose manifest belongs to a different build.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blacc.errors import CompilerError

__all__ = ["KernelCache", "cache_key", "default_cache", "default_cache_dir"]

_KEY_RE = re.compile(r"[A-Za-z0-9_-]{2,128}")
_SUFFIX_RE = re.compile(r"(\.[A-Za-z0-9_-]+)+")
_CHUNK = 1 << 20

_fallback_warned = False
_fallback_lock = threading.Lock()


def default_cache_dir() -> Path:
    """Where kernels are cached: ``$BLACC_CACHE_DIR``, ``$XDG_CACHE_HOME/blacc``, or
    ``~/.cache/blacc``. Read at the runtime edge so tests and users can redirect it."""
    explicit = os.environ.get("BLACC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says relative paths are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "blacc"
    return Path.home() / ".cache" / "blacc"


def cache_key(**parts: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``parts``.

    Parts must be JSON values (str, int, float, bool, None, lists, dicts with str keys);
    anything else raises TypeError rather than being stringified non-canonically.
    """
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.cache
def _blacc_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("blacc")
    except PackageNotFoundError:
        return "unknown"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_ownership() -> bool:
    return os.name == "posix" and hasattr(os, "geteuid")


def _is_private(path: Path, *, directory: bool) -> bool:
    """True when ``path`` is a real file/dir owned by us and not group/world-writable,
    so no other user could have planted or altered what we are about to load."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        return False
    if not _check_ownership():
        return True
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class KernelCache:
    """Maps cache keys to loaded shared libraries, building each at most once.

    ``directory`` defaults to :func:`default_cache_dir`. If it cannot be created or
    written, or is not private to this user, the cache warns once and builds into a
    private temporary directory for the rest of the process instead of failing.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = Path(directory) if directory is not None else default_cache_dir()
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._fallback: Path | None = None

    @property
    def directory(self) -> Path:
        """The directory entries are read from and written to now."""
        return self._fallback if self._fallback is not None else self._directory

    def library(self, key: str, build: Callable[[Path], None], suffix: str = ".so",
                load: Callable[[Path], Any] = ctypes.CDLL) -> Any:
        """Return the library for ``key``, loading it from memory or disk or building it.

        ``build(path)`` must write the shared library to ``path`` (a fresh temporary file
        in the cache directory); its exceptions propagate. The key must be a safe file
        name (e.g. from :func:`cache_key`) and the suffix like ``".so"``. ``load`` turns a
        checked file into the loaded object (a ``ctypes.CDLL`` by default; the LLVM
        backend loads object files into its JIT).
        """
        if not _KEY_RE.fullmatch(key):
            raise ValueError(f"cache key {key!r} is not a 2-128 character file-name-safe token")
        if not _SUFFIX_RE.fullmatch(suffix):
            raise ValueError(f"library suffix {suffix!r} must look like '.so'")
        with self._lock:
            lib = self._loaded.get(key)
            if lib is not None:
                return lib
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        # Per-key lock: threads asking for the same kernel build it once; different
        # kernels build in parallel.
        with key_lock:
            with self._lock:
                lib = self._loaded.get(key)
            if lib is None:
                lib = self._load_or_build(key, build, suffix, load)
                with self._lock:
                    self._loaded[key] = lib
        return lib

    def _paths(self, root: Path, key: str, suffix: str) -> tuple[Path, Path, Path]:
        subdir = root / key[:2]
        return subdir, subdir / f"{key}{suffix}", subdir / f"{key}.json"

    def _load_or_build(self, key: str, build: Callable[[Path], None], suffix: str,
                       load: Callable[[Path], Any]) -> Any:
        _, lib_path, manifest_path = self._paths(self.directory, key, suffix)
        if self._verify(key, lib_path, manifest_path):
            try:
                return load(lib_path)
            except (OSError, RuntimeError):
                pass  # Verified but unloadable (e.g. a foreign architecture): rebuild.
        lib_path = self._build(key, build, suffix)
        try:
            return load(lib_path)
        except (OSError, RuntimeError) as exc:
            raise CompilerError(f"freshly built kernel {lib_path} cannot be loaded: {exc}") from exc

    def _verify(self, key: str, lib_path: Path, manifest_path: Path) -> bool:
        """True if the disk entry is complete, matches its manifest and is private."""
        root = self.directory
        if not (
            _is_private(root, directory=True)
            and _is_private(lib_path.parent, directory=True)
            and _is_private(manifest_path, directory=False)
            and _is_private(lib_path, directory=False)
        ):
            return False
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if not isinstance(manifest, dict):
                return False
            if manifest.get("key") != key or manifest.get("library") != lib_path.name:
                return False
            if manifest.get("size") != os.path.getsize(lib_path):
                return False
            return manifest.get("sha256") == _sha256_file(lib_path)
        except (OSError, ValueError):
            return False

    def _reserve(self, key: str, suffix: str) -> tuple[Path, Path]:
        """Create the entry's directory and a unique temp file in it.

        Switches to the private fallback directory (warning once) when the configured
        directory cannot be used.
        """
        try:
            return self._reserve_in(self.directory, key, suffix)
        except OSError as exc:
            if self._fallback is not None:
                raise
            reason = str(exc)
        self._use_fallback(reason)
        return self._reserve_in(self.directory, key, suffix)

    def _reserve_in(self, root: Path, key: str, suffix: str) -> tuple[Path, Path]:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _is_private(root, directory=True):
            raise PermissionError(f"{root} is not a directory private to this user")
        subdir = root / key[:2]
        subdir.mkdir(mode=0o700, exist_ok=True)
        if not _is_private(subdir, directory=True):
            raise PermissionError(f"{subdir} is not a directory private to this user")
        fd, tmp = tempfile.mkstemp(prefix=f"{key}.", suffix=f"{suffix}.tmp", dir=subdir)
        os.close(fd)
        return subdir, Path(tmp)

    def _use_fallback(self, reason: str) -> None:
        global _fallback_warned
        fallback = Path(tempfile.mkdtemp(prefix="blacc-cache-"))
        atexit.register(shutil.rmtree, fallback, ignore_errors=True)
        self._fallback = fallback
        with _fallback_lock:
            warn, _fallback_warned = not _fallback_warned, True
        if warn:
            warnings.warn(
                f"blacc kernel cache directory {self._directory} is not usable ({reason}); "
                f"compiled kernels will not persist across processes. Set BLACC_CACHE_DIR "
                f"to a writable directory to fix this.",
                RuntimeWarning,
                stacklevel=6,
            )

    def _build(self, key: str, build: Callable[[Path], None], suffix: str) -> Path:
        """Build into a temp file, then publish library and manifest atomically."""
        subdir, tmp_lib = self._reserve(key, suffix)
        lib_path = subdir / f"{key}{suffix}"
        manifest_path = subdir / f"{key}.json"
        tmp_manifest: Path | None = None
        try:
            build(tmp_lib)
            st = os.lstat(tmp_lib)
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                raise CompilerError(f"kernel build did not write a library to {tmp_lib}")
            # Linkers create the output with umask-derived modes; make it private so the
            # ownership check passes whatever the umask.
            os.chmod(tmp_lib, 0o700)
            if not _is_private(tmp_lib, directory=False):
                raise CompilerError(f"kernel build left {tmp_lib} not a private regular file")
            manifest = {
                "key": key,
                "library": lib_path.name,
                "sha256": _sha256_file(tmp_lib),
                "size": os.path.getsize(tmp_lib),
                "blacc_version": _blacc_version(),
            }
            fd, name = tempfile.mkstemp(prefix=f"{key}.", suffix=".json.tmp", dir=subdir)
            tmp_manifest = Path(name)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(manifest, f, sort_keys=True)
            os.replace(tmp_lib, lib_path)
            os.replace(tmp_manifest, manifest_path)
        except BaseException:
            _unlink_quietly(tmp_lib)
            if tmp_manifest is not None:
                _unlink_quietly(tmp_manifest)
            raise
        return lib_path


@functools.cache
def default_cache() -> KernelCache:
    """The process-wide cache in :func:`default_cache_dir` (read on first use)."""
    return KernelCache()
