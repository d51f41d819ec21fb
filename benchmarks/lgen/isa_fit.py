#!/usr/bin/env python3
"""The rule between this machine's ISAs (``strategy.small.worth_wider``) against two full
LGen runs, one with each ISA forced:

    BLACC_ISA=avx2 python benchmarks/lgen/run.py --jobs 1 --impls blacc loops --out A2
    BLACC_ISA=avx512 python benchmarks/lgen/run.py --jobs 1 --impls blacc loops --out A5
    python benchmarks/lgen/isa_fit.py A2/results.json A5/results.json --costs costs.jsonl

Each case's kernel on each ISA is the one 'host' would build there; its model cost is
the one 'host' compares (``isa_choice_cost``), computed here from the current sources
(and kept in ``--costs``, reused when present). For each rule (cycles of a call, gain)
it reports the geomean over the cases of blacc's speed over the loops' with the ISA the
rule picks, and the cases below the loops by more than 3%; the speeds are each run's own
(normalised by the loops of the same run, so runs on different days compare).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness as h  # noqa: E402
from model_fit import _geomean  # noqa: E402
from run import NOISE  # noqa: E402

from blacc import blacs  # noqa: E402
from blacc.strategy.small import CALL_CYCLES, wider_gain, worth_wider  # noqa: E402

CALLS = (0.0, 2.0, 4.0, 8.0, 16.0, 32.0)
GAINS = (0.9, 0.95, 1.0, 1.01, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5)


def speeds(path: Path) -> dict[str, float]:
    """Per case of a run.py results file (gzipped where its name ends in .gz): the loops'
    median time over blacc's."""
    data = path.read_bytes()
    times: dict[str, dict[str, float]] = {}
    for row in json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)["rows"]:
        if "median_ns" in row:
            times.setdefault(row["case"], {})[row["impl"]] = row["median_ns"]
    return {c: t["loops"] / t["blacc"] for c, t in times.items() if "blacc" in t and "loops" in t}


def case_costs(path: Path | None) -> dict[str, list[float]]:
    """Each case's modelled cost on each of this machine's ISAs, narrowest first."""
    if path is not None and path.exists():
        return {j["case"]: j["costs"] for j in map(json.loads, path.read_text().splitlines())}
    isas = blacs.host_isas()
    if len(isas) < 2:
        raise SystemExit("this machine has one ISA for fixed-size programs: nothing to fit")
    out: dict[str, list[float]] = {}
    for n, case in enumerate(h.all_cases()):
        typed = blacs._typed(case.program, h._decls(case))
        out[case.cid] = blacs.isa_choice_costs(typed, blacs.arg_specs(typed),
                                               blacs.forms(typed), isas, "k")
        print(f"{n + 1} {case.cid}: {out[case.cid]}", file=sys.stderr, flush=True)
    if path is not None:
        path.write_text("".join(json.dumps({"case": c, "costs": v}) + "\n"
                                for c, v in out.items()))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs=2, metavar="RESULTS_JSON",
                    help="run.py results of the narrower ISA, then the wider")
    ap.add_argument("--costs", type=Path, help="JSON lines of the cases' model costs")
    args = ap.parse_args(argv)
    costs = case_costs(args.costs)
    runs = [speeds(p) for p in args.runs]
    cases = [c for c in costs if all(c in r for r in runs)]

    def score(call: float, gain: float) -> tuple[float, int, int]:
        picks = [worth_wider(costs[c], call=call, gain=gain) for c in cases]
        got = [runs[i][c] for i, c in zip(picks, cases, strict=True)]
        return _geomean(got), sum(s < 1 - NOISE for s in got), sum(picks)

    print(f"{len(cases)} cases, blacc over the loops: all on the narrower ISA "
          f"{_geomean([runs[0][c] for c in cases]):.4f}x, all on the wider "
          f"{_geomean([runs[1][c] for c in cases]):.4f}x, the faster per case "
          f"{_geomean([max(runs[0][c], runs[1][c]) for c in cases]):.4f}x")
    gain = wider_gain(blacs.host_target().machine)
    for call in CALLS:
        for g in sorted({*GAINS, gain}):
            speed, misses, wider = score(call, g)
            mark = "  <- this machine's rule" if (call, g) == (CALL_CYCLES, gain) else ""
            print(f"call {call:4.0f} gain {g:4.2f}: {speed:.4f}x, {misses} misses, "
                  f"{wider} on the wider ISA{mark}")


if __name__ == "__main__":
    main()
