"""blacc works with no C compiler at all: 'auto' falls back to the LLVM JIT."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import shutil, numpy as np, blacc
    from blacc.runtime.build import resolve_backend
    assert all(shutil.which(cc) is None for cc in ("cc", "gcc", "clang")), "a compiler is on PATH"
    assert resolve_backend(None) == "llvm", resolve_backend(None)
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        a = rng.standard_normal((37, 29)).astype(dt)
        b = rng.standard_normal((29, 41)).astype(dt)
        c = blacc.gemm(a, b)
        assert np.allclose(c, a.astype(float) @ b, rtol=1e-4, atol=1e-4)
    try:
        blacc.gemm(a, b, backend="c")
    except blacc.CompilerNotFoundError as exc:
        assert "CC" in str(exc)
    else:
        raise AssertionError("backend='c' worked without a compiler")
    print("ok")
""")


def test_llvm_backend_needs_no_c_compiler(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("BLACC_BACKEND",)}
    env.update(PATH=str(bin_dir), CC=str(tmp_path / "no-such-compiler"),
               BLACC_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([str(bin_dir / "python"), "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    assert proc.stdout.strip() == "ok"
