"""Guard-page allocation and crash isolation for tests of native kernels.

``guarded_array`` places an array's memory right against a page mapped ``PROT_NONE``, so a
kernel that reads or writes even one byte outside the region the array spans dies with SIGSEGV
instead of silently touching neighbouring heap memory.

``run_isolated`` runs a test body in a forked child process, so such a crash (or a hang) fails
only that one test, with a message that says what happened, instead of killing pytest.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

PAGE = mmap.PAGESIZE
_PROT_NONE = 0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int


def _protect_none(addr: int, length: int) -> None:
    if _libc.mprotect(addr, length, _PROT_NONE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect({addr:#x}, {length}, PROT_NONE): {os.strerror(err)}")


def guarded_array(
    shape: tuple[int, int],
    dtype=np.float64,
    order: str = "C",
    *,
    side: str = "after",
    ld_pad: int = 0,
    transpose: bool = False,
    fill=0.0,
    pad_fill=np.nan,
) -> np.ndarray:
    """A 2-D array of ``shape`` whose memory touches a PROT_NONE guard page.

    The data lies in anonymous private memory between two guard pages. With ``side='after'``
    the last byte of the region the array spans ends exactly where the trailing guard page
    begins; with ``side='before'`` its first byte is the first byte after the leading guard page.

    ``order`` is the storage order ('C' or 'F'). ``ld_pad`` extra elements are added to the
    leading dimension (rows of length ``cols + ld_pad`` for 'C', columns of length
    ``rows + ld_pad`` for 'F'); the padding lies *between* rows (columns), never after the last
    one, so the spanned region still ends (or starts) at the guard. With ``transpose=True``
    the storage has the reversed shape and the returned array is its transposed view (so its
    shape is still ``shape``).

    Every element of the spanned region is first set to ``pad_fill`` (None: leave zeros), then
    the array's own elements are set to ``fill`` (a scalar or anything broadcastable to
    ``shape``). The mmap stays alive as long as the array (or any view of it) does.
    """
    rows, cols = (int(d) for d in shape)
    if rows < 0 or cols < 0:
        raise ValueError(f"negative dimension in {shape}")
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', not {order!r}")
    if side not in ("after", "before"):
        raise ValueError(f"side must be 'after' or 'before', not {side!r}")
    if ld_pad < 0:
        raise ValueError(f"ld_pad must be >= 0, not {ld_pad}")
    dtype = np.dtype(dtype)
    itemsize = dtype.itemsize

    srows, scols = (cols, rows) if transpose else (rows, cols)
    if order == "C":
        ld = scols + ld_pad
        strides = (ld * itemsize, itemsize)
        span = (srows - 1) * ld + scols if srows and scols else 0
    else:
        ld = srows + ld_pad
        strides = (itemsize, ld * itemsize)
        span = (scols - 1) * ld + srows if srows and scols else 0
    nbytes = span * itemsize

    data_pages = max(1, -(-nbytes // PAGE))
    mm = mmap.mmap(-1, (data_pages + 2) * PAGE, flags=mmap.MAP_PRIVATE)
    anchor = ctypes.c_char.from_buffer(mm)
    base_addr = ctypes.addressof(anchor)
    del anchor  # release the buffer export; the address stays valid while `mm` lives
    trailing_guard = (data_pages + 1) * PAGE
    _protect_none(base_addr, PAGE)
    _protect_none(base_addr + trailing_guard, PAGE)

    start = trailing_guard - nbytes if side == "after" else PAGE
    # Only the spanned bytes are ever wrapped in a numpy array: nothing numpy does with the
    # result (printing, copying, reductions) can reach a guard page.
    flat = np.frombuffer(memoryview(mm)[start : start + nbytes], dtype=dtype)
    if pad_fill is not None:
        flat[...] = pad_fill
    storage = np.ndarray((srows, scols), dtype=dtype, buffer=flat, strides=strides)
    arr = storage.T if transpose else storage
    arr[...] = fill
    return arr


def span_bounds(arr: np.ndarray) -> tuple[int, int]:
    """(first byte address, one past the last byte address) of the memory ``arr`` spans."""
    if arr.size == 0:
        return arr.ctypes.data, arr.ctypes.data
    lo = hi = arr.ctypes.data
    for dim, stride in zip(arr.shape, arr.strides, strict=True):
        if stride < 0:
            lo += (dim - 1) * stride
        else:
            hi += (dim - 1) * stride
    return lo, hi + arr.itemsize


def outside_view(view: np.ndarray) -> np.ndarray:
    """A copy of the elements of the view's root buffer that are not part of ``view``.

    The root is found by following ``.base`` to the first array whose base is not an ndarray
    (for ``guarded_array`` results that is exactly the spanned region; for ``big[2:9, 3:14]``
    it is ``big``). Comparing this before and after a call shows whether the call wrote into
    padding, gaps between strided elements, or anything else around the view.
    """
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not (root.flags.c_contiguous or root.flags.f_contiguous):
        raise ValueError("the root buffer of the view is not contiguous")
    flat = root.ravel(order="K")  # a view, in memory order, for a contiguous root
    if view.size == 0:
        return flat.copy()
    itemsize = view.itemsize
    offset = (view.ctypes.data - root.ctypes.data) // itemsize
    rows, cols = np.indices(view.shape)
    index = offset + rows * (view.strides[0] // itemsize) + cols * (view.strides[1] // itemsize)
    outside = np.ones(flat.size, dtype=bool)
    outside[index.ravel()] = False
    return flat[outside]


def bits(arr: np.ndarray) -> np.ndarray:
    """The array reinterpreted as unsigned integers of the same width, for bitwise comparison."""
    width = arr.itemsize if arr.itemsize in (1, 2, 4, 8) else 1  # complex128: compare bytes
    return np.ascontiguousarray(arr).view(f"u{width}")


@dataclass
class ChildOutcome:
    """How a forked child ended."""

    exitcode: int | None  # exit status if it exited normally
    signal: int | None  # the signal that killed it, if one did
    report: str  # the traceback the child sent back, if the body raised
    timed_out: bool  # killed by us after the timeout

    def describe(self) -> str:
        if self.timed_out:
            return "did not finish in time and was killed"
        if self.signal is not None:
            return f"was killed by signal {signal.Signals(self.signal).name}"
        return f"exited with status {self.exitcode}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_in_child(fn: Callable[[], object], *, timeout: float = 120.0) -> ChildOutcome:
    """Run ``fn()`` in a forked child process and report how the child ended.

    If ``fn`` raises, the child sends the traceback back through a pipe and exits with
    status 1; if it returns, the child exits with status 0. The child never returns into the
    caller's code (it leaves through ``os._exit``), so pytest's own state is never run twice.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        status = 1
        try:
            os.close(read_fd)
            try:
                fn()
                status = 0
            except BaseException:
                _write_all(write_fd, traceback.format_exc().encode("utf-8", "replace"))
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)

    os.close(write_fd)
    deadline = time.monotonic() + timeout
    chunks = []
    timed_out = False
    try:
        while True:  # read until EOF: the child has exited (or closed the pipe)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        while not timed_out:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
            else:
                time.sleep(0.005)
    finally:
        os.close(read_fd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return ChildOutcome(None, None, b"".join(chunks).decode("utf-8", "replace"), True)
    report = b"".join(chunks).decode("utf-8", "replace")
    if os.WIFSIGNALED(status):
        return ChildOutcome(None, os.WTERMSIG(status), report, False)
    return ChildOutcome(os.WEXITSTATUS(status), None, report, False)


def run_isolated(fn: Callable[[], object], *, timeout: float = 120.0) -> None:
    """Run ``fn()`` in a forked child; fail the current test unless the child exits cleanly.

    Put the whole test body, assertions included, in ``fn``. A kernel that reads or writes
    out of bounds kills only the child (SIGSEGV against a guard page); the test then fails
    with a message naming the signal. An assertion failing in the child fails the test with
    the child's traceback.
    """
    outcome = run_in_child(fn, timeout=timeout)
    if outcome.timed_out:
        pytest.fail(
            f"child process did not finish within {timeout} s and was killed "
            "(a hang or deadlock in the kernel, e.g. a thread pool used across fork?)",
            pytrace=False,
        )
    if outcome.signal is not None:
        name = signal.Signals(outcome.signal).name
        hint = (
            " - an out-of-bounds memory access in native code (it hit a guard page?)"
            if outcome.signal in (signal.SIGSEGV, signal.SIGBUS)
            else ""
        )
        pytest.fail(f"child process was killed by {name}{hint}", pytrace=False)
    if outcome.exitcode != 0:
        pytest.fail(
            f"test body failed in the child process (exit status {outcome.exitcode}):\n"
            f"{outcome.report}",
            pytrace=False,
        )
