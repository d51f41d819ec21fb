#!/usr/bin/env python3
"""The cost model against timings of its own candidates, on LGen's cases.

    python benchmarks/lgen/model_fit.py collect POOLS.jsonl            # ~1 hour, 510 cases
    python benchmarks/lgen/model_fit.py collect POOLS.jsonl --cases 'gemv_*'
    python benchmarks/lgen/model_fit.py evaluate POOLS.jsonl
    python benchmarks/lgen/model_fit.py evaluate POOLS.jsonl --set WINDOW=0 --set WINDOW=64
    python benchmarks/lgen/model_fit.py evaluate POOLS.jsonl.gz --generic   # gzipped too

``collect`` times, per case, the pool an exhaustive search would time (every index form,
each ISA of this machine, the best-modelled first, up to 24 kernels per ISA) with the same
C timer (``runtime.measure``), and appends one JSON line per case: each candidate's ISA,
form, schedule and nanoseconds. Cases already in the file are skipped, so a run can be
resumed. ``evaluate`` models every candidate again with the current sources, once per
``--set`` (constants of ``strategy.small``, NAME=VALUE, several per setting joined with
commas), and reports the model's regret: the time of the kernel the model would pick
(per ISA, then between ISAs by ``worth_wider``) over the fastest timed one, as a geomean
over the cases, and the rule between the ISAs that would fit best. The model can only be
judged within the pool: a setting that would pick a kernel outside it is not seen.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness as h  # noqa: E402

from blacc import blacs  # noqa: E402
from blacc.strategy import small  # noqa: E402
from blacc.target.isa import ISAS  # noqa: E402
from blacc.transform.blac import OpSchedule, build_module  # noqa: E402

#: Constants ``--set`` may change.
TUNABLE = ("WINDOW", "CALL_CYCLES", "WIDER_GAIN", "FMA_LATENCY", "BROADCAST_FP",
           "MASKED_STORE", "MASKED_LOAD", "LOOP_OVERHEAD", "READ_BACK_CYCLES",
           "INTEL_SHUFFLE_PIPES", "INTEL_PAIR_SHUFFLE", "INTEL_WIDE_FP_AND_SHUFFLE_PIPES",
           "INTEL_BROADCAST_FP", "INTEL_WIDER_GAIN", "UNFORWARDED_ROUND_TRIP",
           "INTEL_OVERLAP_BY_FP", "INTEL_REDUCE_SHUFFLE", "DISPATCH", "SCRATCH_ROUND_TRIP",
           "ZEN3_SCRATCH_ROUND_TRIP")
RULES = [(call, gain) for call in (0.0, 2.0, 4.0, 8.0, 16.0, 32.0)
         for gain in (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8)]


def _program(case: h.Case):
    typed = blacs._typed(case.program, h._decls(case))
    return blacs.arg_specs(typed), blacs.forms(typed)


def collect(path: Path, patterns: list[str] | None) -> None:
    done = set()
    if path.exists():
        done = {json.loads(line)["case"] for line in path.read_text().splitlines() if line}
    cases = h.select(h.all_cases(), patterns)
    random.Random(1).shuffle(cases)  # a partial file still covers every series
    start = time.time()
    for n, case in enumerate(c for c in cases if c.cid not in done):
        specs, forms = _program(case)
        pool = [c for isa in blacs.host_isas()
                for c in blacs._search_pool(forms, specs, isa, "exhaustive", "k")]
        times = blacs._measurer(specs, blacs.host_isas()[-1])(pool * 3)
        rows = [{"isa": c.isa.name, "form": forms.index(c.indexed),
                 "schedule": [asdict(s) for s in c.schedule],
                 "ns": min(times[i::len(pool)]) * 1e9} for i, c in enumerate(pool)]
        with path.open("a") as f:
            f.write(json.dumps({"case": case.cid, "candidates": rows}) + "\n")
        print(f"{n + 1} {case.cid}: {len(pool)} kernels, {time.time() - start:.0f} s",
              flush=True)


def _schedule(fields: dict) -> OpSchedule:
    return OpSchedule(**{**fields, "block": tuple(fields["block"])})


def _text(path: Path) -> str:
    """A pools file, gzipped where its name ends in .gz (as kept in benchmarks/results)."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def load(path: Path) -> list[dict]:
    """The collected cases, each candidate with its module rebuilt from the sources."""
    by_id = {c.cid: c for c in h.all_cases()}
    cases = []
    for line in _text(path).splitlines():
        entry = json.loads(line)
        specs, forms = _program(by_id[entry["case"]])
        for c in entry["candidates"]:
            isa, form = ISAS[c["isa"]], forms[c["form"]]
            schedule = tuple(_schedule(s) for s in c["schedule"])
            c["cost_args"] = (build_module(form, specs, schedule, isa, "k"), form, schedule,
                              isa)
        cases.append(entry)
    return cases


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def regrets(cases: list[dict], call: float, gain: float) -> dict[str, list[float]]:
    """Per case: the model's pick over the fastest ('rule'), the same with the faster of
    the ISAs' picks ('oracle ISA'), and each ISA's pick over that ISA's fastest."""
    out: dict[str, list[float]] = {"rule": [], "oracle ISA": []}
    for case in cases:
        fastest = min(c["ns"] for c in case["candidates"])
        picks = []
        for isa in dict.fromkeys(c["isa"] for c in case["candidates"]):
            mine = [c for c in case["candidates"] if c["isa"] == isa]
            pick = min(mine, key=lambda c: c["cost"])
            out.setdefault(isa, []).append(pick["ns"] / min(c["ns"] for c in mine))
            picks.append(pick)
        chosen = picks[small.worth_wider([p["isa_cost"] for p in picks], call=call, gain=gain)]
        out["rule"].append(chosen["ns"] / fastest)
        out["oracle ISA"].append(min(p["ns"] for p in picks) / fastest)
    return out


def evaluate(cases: list[dict], setting: dict[str, float], generic: bool = False) -> None:
    saved = {name: getattr(small, name) for name in setting}
    try:
        for name, value in setting.items():
            setattr(small, name, value)
        machine = blacs.host_target().machine  # as blacs.plan chooses
        if generic:  # the model's constants for every machine's pipes
            machine = replace(machine, vendor="unknown")
        for case in cases:
            for c in case["candidates"]:
                core = small.core_for(machine, c["cost_args"][3])
                c["cost"] = small.program_cost(*c["cost_args"], core=core)
                c["isa_cost"] = small.isa_choice_cost(*c["cost_args"], machine)
        got = regrets(cases, small.CALL_CYCLES, small.wider_gain(machine))
        best = min(RULES, key=lambda r: _geomean(regrets(cases, *r)["rule"]))
        label = (", ".join(f"{k}={v:g}" for k, v in setting.items()) or "as is") + (
            " (generic pipes)" if generic else "")
        print(f"{label}: {len(cases)} cases, regret {_geomean(got['rule']):.4f} "
              f"({sum(r > 1.2 for r in got['rule'])} above 1.2x); "
              + ", ".join(f"{k} {_geomean(v):.4f}" for k, v in got.items() if k != "rule")
              + f"; best rule {best[0]:g} cycles, {best[1]:g}x: "
              f"{_geomean(regrets(cases, *best)['rule']):.4f}")
    finally:
        for name, value in saved.items():
            setattr(small, name, value)


def _setting(text: str) -> dict[str, float]:
    setting = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in TUNABLE:
            raise SystemExit(f"--set: {name!r} is not one of {', '.join(TUNABLE)}")
        setting[name] = float(value)
    return setting


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("collect", "evaluate"))
    ap.add_argument("pools", type=Path, help="JSON lines file of timed candidates")
    ap.add_argument("--cases", nargs="*", metavar="PATTERN", help="as in run.py (collect)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE[,...]",
                    help="a setting of the model's constants to evaluate (evaluate); the "
                    "sources' own values are always evaluated first")
    ap.add_argument("--generic", action="store_true",
                    help="also evaluate the model with its constants' pipes and rule between "
                    "ISAs on every machine, not this machine's (``strategy.small.core_for``, "
                    "``wider_gain``)")
    args = ap.parse_args(argv)
    if args.command == "collect":
        collect(args.pools, args.cases)
        return
    cases = load(args.pools)
    if args.generic:
        evaluate(cases, {}, generic=True)
    for setting in [{}, *map(_setting, args.set)]:
        evaluate(cases, setting)


if __name__ == "__main__":
    main()
