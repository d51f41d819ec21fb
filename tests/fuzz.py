"""Long runs of random programs, beyond what the test suite has time for.

    python tests/fuzz.py interp --minutes 30             # planned per target, interpreted
    python tests/fuzz.py compiled --minutes 30 --size 40  # compiled, arrays on guard pages
    python tests/fuzz.py candidates --minutes 30         # every candidate rendered as C
    python tests/fuzz.py emitted --minutes 30 --size 40  # blacc.emit, strict cc, ctypes
    python tests/fuzz.py spine --minutes 30              # programs of GEMMs emitted so

The programs are ``test_blac_property``'s (sums, differences, negation, scalings,
products of every kind, transposes; one or two statements, updates in place; operands
row- or column-major, some with padded leading dimensions), with sizes up to ``--size``
(the suite's 12 by default here too). ``interp`` plans each for AVX-512, AVX2 or the
generic target, renders it as C (an operation the target lacks raises), and runs it in
the kernel IR interpreter on buffers that end at the operands' last elements, where a
read or write past an operand raises. ``compiled``
compiles it for this machine (``blacc.compile``) and calls it, in a child process, with
every array ending (or starting) at a page mapped ``PROT_NONE``. ``candidates`` builds
every candidate schedule of every operation for AVX-512 and AVX2 (what a measuring
search compiles) and renders each as C: an operation the ISA lacks raises. ``emitted``
writes it with ``blacc.emit`` for the generic target, AVX2 or AVX-512 (those the CPU
has), compiles the file alone with ``cc -std=c99 -O2 -Wall -Wextra -Werror`` (and
``-pedantic`` for generic C; a warning fails) and calls it through ctypes, in a child
process, on buffers fenced by sentinels that must survive; for one seed in three every
temporary is allocated from the heap, as those too large for the stack are
(``blac.STACK_BYTES`` 0). ``spine`` does the same with
``test_blac_gemm_route``'s random programs of GEMMs (chains, sums as factors, two
statements, maybe statements that are not GEMMs after them, run by the small path's
kernels), the route to the spine forced at their small sizes. Each program
is checked against the float64 reference; failures are appended to ``--log`` as JSON lines (source,
declarations, target, seed, traceback) and the run goes on. The exit status is 1 when
any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import blacc  # noqa: E402
import test_blac_property as programs  # noqa: E402
from blacc.backend import c as c_backend  # noqa: E402
from blacc.blacs import _typed, plan  # noqa: E402
from blacc.errors import ScheduleError  # noqa: E402
from blacc.strategy import route  # noqa: E402
from blacc.target.isa import AVX2, AVX512  # noqa: E402
from blacc.transform import blac  # noqa: E402
from blacc.transform.blac import build_module, candidates  # noqa: E402
from guard import guarded_array, run_in_child  # noqa: E402
from test_blac_emit import HAS_AVX2, HAS_AVX512, run_emitted  # noqa: E402
from test_blac_gemm_route import _gemm_chains  # noqa: E402
from test_blac_programs import NP, assert_matches, make_values, unplanned  # noqa: E402


def _guarded(spec, dtype: str, value, side: str) -> np.ndarray:
    """``spec``'s array, holding ``value`` (zeros for outputs), against a guard page."""
    rows, cols = spec.rows, spec.cols
    natural = cols if spec.layout == "row" else rows
    pad = spec.leading_dimension - natural if rows > 1 and cols > 1 else 0
    fill = 0.0 if value is None else np.asarray(value).reshape(rows, cols)
    a = guarded_array((rows, cols), NP[dtype], "C" if spec.layout == "row" else "F",
                      side=side, ld_pad=pad, fill=fill)
    return a.reshape(-1) if (rows == 1) != (cols == 1) else a


def check_interpreted(source: str, decls: dict, dtype: str, seed: int, target: str) -> None:
    programs._check_interpreted(source, decls, dtype, seed, target, slack=0, render=True)


def check_compiled(source: str, decls: dict, dtype: str, seed: int, side: str) -> None:
    kernel = blacc.compile(source, **decls)
    specs = kernel.specs
    typed = _typed(source, decls)  # type-checked only: compile has planned
    values = make_values(decls, dtype, np.random.default_rng(seed))

    def body() -> None:
        kwargs = {}
        for s in specs:
            if s.kind == "scalar":
                if s.role != "out":
                    kwargs[s.name] = values[s.name]
            else:
                kwargs[s.name] = _guarded(s, dtype, values.get(s.name), side)
        result = kernel(**kwargs)
        written = [s.name for s in specs if s.role != "in"]
        assert_matches(typed, values, result if len(written) > 1 else {written[0]: result},
                       repr(source))

    outcome = run_in_child(body, timeout=120)
    if outcome.signal is not None or outcome.timed_out or outcome.exitcode != 0:
        raise AssertionError(f"{outcome.describe()}\n{outcome.report}")


def check_candidates(source: str, decls: dict) -> None:
    for isa in (AVX512, AVX2):
        p = plan(source, target=isa.name, **decls)
        for i, op in enumerate(p.indexed.ops):
            for schedule in candidates(p.indexed, op, isa):
                whole = (*p.schedule[:i], schedule, *p.schedule[i + 1:])
                try:
                    module = build_module(p.indexed, p.specs, whole, isa, "candidate")
                except ScheduleError:
                    continue  # refused: the planner drops it too
                c_backend.render(module, isa)


def check_emitted(source: str, decls: dict, dtype: str, seed: int, target: str,
                  spine: bool = False) -> None:
    # one seed in three: every temporary allocated, as those too large for the stack are
    stack_bytes = blac.STACK_BYTES
    blac.STACK_BYTES = 0 if seed % 3 == 0 else stack_bytes
    try:
        with tempfile.TemporaryDirectory(prefix="blacc-fuzz-") as tmp:
            _check_emitted(source, decls, dtype, seed, target, spine, Path(tmp))
    finally:
        blac.STACK_BYTES = stack_bytes


def _check_emitted(source: str, decls: dict, dtype: str, seed: int, target: str,
                   spine: bool, tmp: Path) -> None:
    c_path, _ = blacc.emit(source, tmp / "kern", target=target, **decls)
    if spine:  # what the kernel computes, whoever planned it
        assert "blacc_gemm_" in c_path.read_text(), "not on the spine"
        p, status = unplanned(source, decls), True
    else:
        p = plan(source, name="kern", target=target, **decls)
        status = p.module.function(p.module.entry).status

    def body() -> None:
        run_emitted(c_path, p, decls, dtype, target, "kern", misalign=seed % 2 == 1,
                    seed=seed, context=repr(source), status=status)

    outcome = run_in_child(body, timeout=120)
    if outcome.signal is not None or outcome.timed_out or outcome.exitcode != 0:
        raise AssertionError(f"{outcome.describe()}\n{outcome.report}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("interp", "compiled", "candidates", "emitted", "spine"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=programs.MAX_SIZE,
                        help="largest extent of an operand (default %(default)s)")
    parser.add_argument("--log", default="fuzz-failures.jsonl")
    args = parser.parse_args(argv)
    programs.sizes = st.integers(1, args.size)  # read by the generator as it draws
    if args.mode == "spine":  # every program of GEMMs to the spine, however small
        route.SPINE_L1_MULTIPLE, route.PASS_MIN_EXTENT, route.PLAIN_C_MIN_K = 0.0, 0, 0
        drawn = _gemm_chains(others=True).map(lambda p: (*p, next(iter(p[1].values())).dtype))
    else:
        drawn = programs.programs()
    deadline = time.monotonic() + 60 * args.minutes
    count, failed = 0, 0

    # failures are caught and logged; the one exception, _Done, ends the run (generation
    # only: nothing to shrink, and quiet about the "falsifying" example it stops in)
    @settings(max_examples=10**9, deadline=None, database=None, phases=[Phase.generate],
              verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck))
    @given(drawn, st.integers(0, 2**32 - 1),
           st.sampled_from(["avx512", "avx2", "generic"]), st.sampled_from(["after", "before"]))
    def run(program, seed: int, target: str, side: str) -> None:
        nonlocal count, failed
        if time.monotonic() > deadline:
            raise _Done
        source, decls, dtype = program
        count += 1
        try:
            if args.mode == "interp":
                check_interpreted(source, decls, dtype, seed, target)
            elif args.mode in ("emitted", "spine"):
                check_emitted(source, decls, dtype, seed, _runnable(target),
                              spine=args.mode == "spine")
            elif args.mode == "compiled":
                check_compiled(source, decls, dtype, seed, side)
            else:
                check_candidates(source, decls)
        except Exception:  # noqa: BLE001 - every failure is recorded, the run goes on
            failed += 1
            with open(args.log, "a") as log:
                log.write(json.dumps({
                    "mode": args.mode, "source": source,
                    "decls": {n: repr(d) for n, d in decls.items()},
                    "target": {"interp": target, "emitted": _runnable(target),
                               "spine": _runnable(target),
                               "compiled": "host"}.get(args.mode, "all"),
                    "side": side,
                    "seed": seed, "error": traceback.format_exc()[-4000:]}) + "\n")
        if count % 100 == 0:
            print(f"{count} programs, {failed} failed", flush=True)

    try:
        run()
    except _Done:
        pass
    print(f"{count} programs, {failed} failed" + (f" (see {args.log})" if failed else ""))
    return 1 if failed else 0


def _runnable(target: str) -> str:
    """``target``, or the widest this CPU runs below it."""
    if target == "avx512" and not HAS_AVX512:
        target = "avx2"
    return target if target != "avx2" or HAS_AVX2 else "generic"


class _Done(Exception):
    """The time is up."""


if __name__ == "__main__":
    raise SystemExit(main())
