"""Driver for the system C compiler.

blacc emits C source and turns it into a shared library with whatever C compiler the
machine has (``$CC``, else ``cc``, ``gcc`` or ``clang``). The compiler's identity and
version go into kernel cache keys, so a compiler upgrade never reuses stale binaries.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from blacc.errors import CompilerError, CompilerNotFoundError

__all__ = ["Compiler", "compile_shared", "find_compiler"]

#: Compilers tried, in order, when no explicit compiler is given.
DEFAULT_CANDIDATES: tuple[str, ...] = ("cc", "gcc", "clang")

#: Most characters of compiler output quoted in an error message.
_MAX_DIAGNOSTIC_CHARS = 4000

#: Seconds a probe (``--version`` or the trial build) may take before it counts as broken.
_PROBE_TIMEOUT_S = 60.0

_PROBE_SOURCE = "int blacc_probe(void) { return 42; }\n"


@dataclass(frozen=True)
class Compiler:
    """A C compiler that was found to work.

    ``path`` is the resolved executable; ``args`` are words that followed it in ``$CC``
    (for ``CC="ccache gcc"``, ``path`` is ccache and ``args`` is ``("gcc",)``).
    ``version`` is the first line of ``--version`` output and belongs in cache keys.
    """

    path: str
    version: str
    args: tuple[str, ...] = ()

    @property
    def command(self) -> tuple[str, ...]:
        """The argv prefix that invokes this compiler."""
        return (self.path, *self.args)


def _subprocess_env() -> dict[str, str]:
    # A fixed locale keeps diagnostics in English and the version string stable, so the
    # same compiler yields the same cache key whatever the user's locale.
    return {**os.environ, "LC_ALL": "C"}


def _truncate(text: str, limit: int = _MAX_DIAGNOSTIC_CHARS) -> str:
    """Keep the start of long compiler output, where the first (root-cause) error is."""
    text = text.strip()
    if len(text) <= limit:
        return text
    rest = text[limit:]
    return f"{text[:limit]}\n... ({rest.count(chr(10)) + 1} more lines, {len(rest)} characters)"


def compile_shared(
    compiler: Compiler,
    source: str,
    output: Path,
    flags: Sequence[str] = (),
    *,
    timeout: float | None = 600.0,
) -> None:
    """Compile C ``source`` into the shared library ``output``.

    Runs ``<cc> -shared -fPIC <flags> -o output file.c -lm`` without a shell. The source
    is written to a private temporary directory. Raises CompilerError quoting the
    compiler's diagnostics when it fails, cannot be run, or exceeds ``timeout`` seconds.
    """
    # Absolute output, relative source: the compiler runs in the temp dir, and the
    # random temp path stays out of the binary, so equal sources give equal bytes.
    output = Path(os.path.abspath(output))
    with tempfile.TemporaryDirectory(prefix="blacc-cc-") as tmp:
        src = Path(tmp) / "kernel.c"
        src.write_text(source, encoding="utf-8")
        argv = [
            *compiler.command,
            "-shared",
            "-fPIC",
            *flags,
            "-o",
            str(output),
            src.name,
            "-lm",
        ]
        try:
            proc = subprocess.run(
                argv,
                cwd=tmp,
                env=_subprocess_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CompilerError(
                f"C compiler {compiler.path} did not finish within {timeout} s "
                f"building {output.name}: {shlex.join(argv)}"
            ) from exc
        except OSError as exc:
            raise CompilerError(f"could not run C compiler {compiler.path}: {exc}") from exc
    if proc.returncode != 0:
        diagnostics = _truncate(proc.stderr or proc.stdout) or "(no output)"
        raise CompilerError(
            f"C compiler {compiler.path} failed with exit status {proc.returncode} "
            f"building {output.name}\ncommand: {shlex.join(argv)}\n{diagnostics}"
        )


def _version_line(command: Sequence[str]) -> str:
    """First non-empty line of ``<cc> --version``; 'unknown' if it prints nothing useful."""
    try:
        proc = subprocess.run(
            [*command, "--version"],
            env=_subprocess_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        if line.strip():
            return line.strip()
    return "unknown"


@functools.cache
def _probe(cc: str) -> Compiler | str:
    """Check that ``cc`` builds a loadable shared library; return it, or why it failed.

    Memoized per ``cc`` string, so each compiler is probed once per process. Failures
    are returned rather than raised so that they are memoized too.
    """
    try:
        words = shlex.split(cc)
    except ValueError as exc:
        return f"{cc!r} cannot be parsed as a command ({exc})"
    if not words:
        return "the compiler command is empty"
    resolved = shutil.which(words[0])
    if resolved is None:
        return f"{words[0]!r} was not found on PATH"
    args = tuple(words[1:])
    compiler = Compiler(path=resolved, version=_version_line((resolved, *args)), args=args)
    with tempfile.TemporaryDirectory(prefix="blacc-probe-") as tmp:
        lib_path = Path(tmp) / "probe.so"
        try:
            compile_shared(compiler, _PROBE_SOURCE, lib_path, (), timeout=_PROBE_TIMEOUT_S)
        except CompilerError as exc:
            return f"{cc!r} could not build a trivial shared library: {exc}"
        try:
            lib = ctypes.CDLL(str(lib_path))
            ok = lib.blacc_probe() == 42
        except (OSError, AttributeError) as exc:
            return f"{cc!r} built a shared library that cannot be loaded: {exc}"
        if not ok:
            return f"{cc!r} built a shared library that returns wrong results"
    return compiler


def find_compiler(cc: str | None = None) -> Compiler:
    """Find a working C compiler.

    ``cc`` is the value of ``$CC`` (read by the caller at the API edge). When given, it
    is used or an error is raised: a broken ``$CC`` is reported rather than silently
    replaced by another compiler. Otherwise ``cc``, ``gcc`` and ``clang`` are tried in
    that order. Raises CompilerNotFoundError saying what was tried and why it failed.
    """
    if cc is not None and cc.strip():
        result = _probe(cc.strip())
        if isinstance(result, Compiler):
            return result
        raise CompilerNotFoundError(
            f"the C compiler given by CC={cc!r} does not work: {result}. "
            "Set CC to a working C compiler, or unset it to use cc, gcc or clang."
        )
    reasons: list[str] = []
    for candidate in DEFAULT_CANDIDATES:
        result = _probe(candidate)
        if isinstance(result, Compiler):
            return result
        reasons.append(f"  {candidate}: {result}")
    raise CompilerNotFoundError(
        "no working C compiler found; tried "
        + ", ".join(DEFAULT_CANDIDATES)
        + ":\n"
        + "\n".join(reasons)
        + "\nInstall one or set CC to a working C compiler."
    )
