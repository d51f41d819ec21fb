#!/usr/bin/env python3
"""Reproduce LGen's section 5 (CGO'14) on this machine: blacc against straightforward
fixed-size loops, OpenBLAS (cblas), Eigen (fixed-size Maps) and LIBXSMM (JIT).

    python benchmarks/lgen/run.py --quick                 # 4 sizes per series, f32 + f64
    python benchmarks/lgen/run.py --dtype f32 --cases simple 'gemm_*'
    python benchmarks/lgen/run.py                         # full: n in 4..100, micro 2..10

Writes results.json, results.jsonl, results.md and one plot per group and dtype into
--out (default benchmarks/results/lgen/). See benchmarks/lgen/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bound  # noqa: E402
import harness as h  # noqa: E402

REPO = HERE.parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "lgen"
LABELS = {"blacc": "blacc", "loops": "fixed-size loops (gcc -O3 -march=native)",
          "openblas": "OpenBLAS (cblas)", "eigen": "Eigen (fixed size)",
          "libxsmm": "LIBXSMM (JIT)"}
MULTI_CALL = ("gesummv", "blinf", "gemam")
NOISE = 0.03  # ratios within 3% of the goal are listed apart: on a shared machine that is noise


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"sizes {h.SIZES_QUICK} (micro {h.MICRO_QUICK}) and 5 batches per "
                    "implementation instead of the full lists and 9 batches")
    ap.add_argument("--dtype", choices=("f32", "f64", "both"), default="both")
    ap.add_argument("--cases", nargs="*", metavar="PATTERN",
                    help="keep only cases whose series, group (simple, blas, multi, micro), "
                    "BLAC (smv, smm, axpy, gemv, gemm, gesummv, blinf, gemam) or id matches "
                    "(wildcards allowed), e.g. --cases micro 'gemm_*' smv_4xn_n16")
    ap.add_argument("--impls", nargs="*", default=list(h.IMPLS), choices=h.IMPLS,
                    help="implementations to run (default: all that are installed)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    ap.add_argument("--build", type=Path, default=None,
                    help="build directory (default: OUT/build); blacc kernels there are "
                    "reused while blacc's sources are unchanged")
    ap.add_argument("--target-ms", type=float, default=20.0,
                    help="minimum duration of one timed batch of calls (default 20)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timed batches per implementation (default 9; 5 with --quick)")
    ap.add_argument("--processes", type=int, default=3,
                    help="runs of each series' executable the rounds are split over "
                    "(default 3: a call of a nanosecond or so may run at one speed for a "
                    "whole process and at another in the next)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="thread CPU time (default; robust on a shared machine) or wall time")
    ap.add_argument("--placement", choices=("offsets", "page-ends"), default="offsets",
                    help="where each round puts the arrays: in pages of their own at "
                    "offsets that change from round to round (default), or each ending "
                    "where an inaccessible page begins, where a masked move reaching past "
                    "an array's end takes a microcode assist")
    ap.add_argument("--jobs", type=int, default=h.cpu_count(), help="parallel compiles")
    ap.add_argument("--search", choices=("model", "exhaustive", "random"), default="model",
                    help="blacc.emit's schedule search (the measuring ones time candidate "
                         "kernels here, so blacc's kernels are then emitted one at a time)")
    ap.add_argument("--target", choices=("host", "avx512", "avx2", "generic"), default="host",
                    help="blacc.emit's target: this machine's ISAs (default), one of them, "
                         "or plain C99 without intrinsics")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--report", type=Path, metavar="RESULTS_JSON",
                    help="run nothing: rewrite results.md and the plots in --out from an "
                    "earlier results.json")
    return ap.parse_args(argv)


def log(msg: str) -> None:
    print(msg, flush=True)


def machine_info(tc: h.Toolchain) -> dict:
    import subprocess

    cpu = platform.processor()
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(tool):
        if not tool:
            return None
        try:
            return subprocess.run([tool, "--version"], capture_output=True,
                                  text=True).stdout.splitlines()[0]
        except (OSError, IndexError):
            return None

    return {"cpu": cpu, "cores_usable": h.cpu_count(), "machine": platform.machine(),
            "cc": version(tc.cc), "cxx": version(tc.cxx), "peers": tc.peers,
            "missing_peers": tc.missing, "lanes": vector_lanes()}


def vector_lanes() -> dict[str, int]:
    """Lanes of a full vector per dtype of the widest ISA blacc may emit for ('host')."""
    from blacc.blacs import host_isas

    isa = host_isas()[-1]
    return {dt: isa.lanes(dt) for dt in ("f32", "f64")}


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def summarize(rows: list[dict], ghz: float | None, lanes: dict[str, int]) -> list[dict]:
    """One record per case: GFLOPS (median) per implementation, best peer, speedups, and
    the core's throughput bound in flops per cycle (``bound.py``)."""
    by_case: dict[str, dict] = {}
    for r in rows:
        rec = by_case.setdefault(r["case"], {k: r[k] for k in (
            "case", "series", "group", "blac", "n", "dtype", "M", "K", "N", "flops")}
            | {"impls": {}, "failed": [], "skipped": {}})
        if "skipped" in r:
            rec["skipped"][r["impl"]] = r["skipped"]
        elif not r.get("verified"):
            rec["failed"].append(r["impl"])
        else:
            rec["impls"][r["impl"]] = {
                "gflops": r["gflops"], "median_ns": r["median_ns"], "best_ns": r["best_ns"],
                "q1_ns": r["q1_ns"], "q3_ns": r["q3_ns"],
                "flops_per_cycle": r["gflops"] / ghz if ghz else None}
    out = []
    for rec in by_case.values():
        case = h.Case(rec["series"], rec["n"], rec["dtype"])
        rec["bound_fpc"], rec["bound_by"] = bound.flops_per_cycle(case, lanes[rec["dtype"]])
        imp = rec["impls"]
        peers = {k: v for k, v in imp.items() if k != "blacc"}
        if peers:
            best = max(peers, key=lambda k: peers[k]["gflops"])
            rec["best_peer"] = best
            if "blacc" in imp:
                rec["speedup_vs_best_peer"] = imp["blacc"]["gflops"] / peers[best]["gflops"]
        for ref in ("loops", "libxsmm"):
            if "blacc" in imp and ref in imp:
                rec[f"speedup_vs_{ref}"] = imp["blacc"]["gflops"] / imp[ref]["gflops"]
        out.append(rec)
    return out


def check_aims(summary: list[dict]) -> dict:
    """The issue's aims, checked case by case on median times."""
    aims = {"vs_libxsmm": [], "multi_call_2x": [], "vs_loops": [], "failed": [],
            "beyond_bound": []}
    counted = {"vs_libxsmm": 0, "multi_call_2x": 0, "vs_loops": 0}
    for s in summary:
        if s["failed"]:
            aims["failed"].append((s["case"], s["failed"]))
        sp = s.get("speedup_vs_libxsmm")
        if sp is not None:
            counted["vs_libxsmm"] += 1
            if sp < 1.0:
                aims["vs_libxsmm"].append((s["case"], sp))
        sp = s.get("speedup_vs_loops")
        if sp is not None:
            counted["vs_loops"] += 1
            if sp < 1.0:
                aims["vs_loops"].append((s["case"], sp))
        sp = s.get("speedup_vs_best_peer")
        if s["blac"] in MULTI_CALL and sp is not None:
            counted["multi_call_2x"] += 1
            if sp < 2.0:
                aims["multi_call_2x"].append((s["case"], sp, s["best_peer"]))
                peer_fpc = s["impls"][s["best_peer"]]["flops_per_cycle"]
                if peer_fpc is not None and 2.0 * peer_fpc > s["bound_fpc"]:
                    aims["beyond_bound"].append(s["case"])
    aims["counted"] = counted
    return aims


def fmt(x: float | None, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def markdown(summary: list[dict], aims: dict, info: dict, config: dict,
             impls: list[str]) -> str:
    ghz = info.get("clock_ghz")
    lanes = info["lanes"]
    lines = ["# LGen section 5 on this machine", "",
             f"CPU: {info['cpu']} ({info['cores_usable']} usable core(s)); measured clock "
             f"{fmt(ghz)} GHz. Compilers: {info['cc']}; {info['cxx']}.",
             f"Peers: {', '.join(f'{k} ({v})' for k, v in info['peers'].items()) or 'none'}."
             + (f" Missing: {', '.join(f'{k} ({v})' for k, v in info['missing_peers'].items())}."
                if info["missing_peers"] else ""),
             f"Timing: {config['clock']} clock, batches >= {config['target_ms']} ms, "
             f"{config['rounds']} batches per implementation interleaved"
             + (f", over {config['processes']} runs of each series"
                if config.get("processes", 1) > 1 else "")
             + ("; every array ending where an inaccessible page begins (--placement "
                "page-ends)" if config.get("placement") == "page-ends" else "")
             + "; GFLOPS from the "
             "median time per call, f/c = GFLOPS / clock. Every implementation was verified "
             "against float64 loops before timing. blacc's schedules: "
             + ("its cost model (the default)" if config.get("search", "model") == "model"
                else f"search={config['search']!r}, candidates timed in a C loop")
             + (f", target {config['target']!r}." if config.get("target", "host") != "host"
                else "."), ""]
    for dtype in ("f32", "f64"):
        for group, title in h.GROUPS.items():
            recs = [s for s in summary if s["dtype"] == dtype and s["group"] == group]
            if not recs:
                continue
            lines += [f"## {title}, {dtype}", "",
                      "GFLOPS (median); `f/c` is blacc's flops per cycle and `bound` the "
                      "most any code can reach on this core (see below); speedups are "
                      "blacc over the best peer and over the fixed-size loops.", ""]
            head = ["case", "n", "flops"] + [i for i in impls] + [
                "blacc f/c", "bound f/c", "best peer", "vs best", "vs loops"]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for s in recs:
                cells = [s["series"], str(s["n"]), str(s["flops"])]
                for i in impls:
                    if i in s["impls"]:
                        cells.append(fmt(s["impls"][i]["gflops"]))
                    elif i in s["failed"]:
                        cells.append("FAILED")
                    else:
                        cells.append("—")
                b = s["impls"].get("blacc")
                cells.append(fmt(b["flops_per_cycle"]) if b else "—")
                cells.append(f"{s['bound_fpc']:.1f} ({s['bound_by'][0]})")
                cells.append(s.get("best_peer", "—"))
                sp = s.get("speedup_vs_best_peer")
                cells.append(f"{sp:.2f}x" if sp is not None else "—")
                sp = s.get("speedup_vs_loops")
                cells.append(f"{sp:.2f}x" if sp is not None else "—")
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    c = aims["counted"]

    def verdict(key: str, goal: float) -> str:
        bad = aims[key]
        clear = [b for b in bad if b[1] < goal * (1 - NOISE)]
        return (f"{'met' if not bad else 'NOT met'}: {c[key] - len(bad)}/{c[key]} cases meet "
                f"it; {len(clear)} miss by more than {NOISE:.0%}")

    def listing(key: str, goal: float) -> list[str]:
        bad = sorted(aims[key], key=lambda b: b[1])
        clear = [b for b in bad if b[1] < goal * (1 - NOISE)]
        near = [b for b in bad if b[1] >= goal * (1 - NOISE)]
        item = lambda b: f"{b[0]} ({b[1]:.2f}x" + (f" vs {b[2]})" if len(b) > 2 else ")")  # noqa: E731
        out = []
        if clear:
            out.append(f"  * by more than {NOISE:.0%}: " + ", ".join(map(item, clear)))
        if near:
            out.append(f"  * within {NOISE:.0%} (noise): " + ", ".join(map(item, near)))
        return out

    lines += ["## Aims", "", "Checked on median times, case by case.", "",
              "* blacc at least as fast as LIBXSMM on every product it supports: "
              + verdict("vs_libxsmm", 1.0), *listing("vs_libxsmm", 1.0),
              "* blacc at least 2x the best peer on the multi-call BLACs: "
              + verdict("multi_call_2x", 2.0)
              + (f"; for {len(aims['beyond_bound'])} of the misses 2x the best peer is "
                 "beyond the core's bound: " + ", ".join(aims["beyond_bound"])
                 if aims["beyond_bound"] else ""),
              *listing("multi_call_2x", 2.0),
              "* blacc never slower than the fixed-size loops: " + verdict("vs_loops", 1.0),
              *listing("vs_loops", 1.0), ""]
    lines += ["The bound (`bound f/c`) is the case's flops over the most cycles that one of "
              "three resources needs, whatever the code: the multiplies of its products on "
              f"{bound.FP_PIPES} FMA pipes (m), loads of every array it reads on "
              f"{bound.FULL_VECTOR_LOADS} load ports (l), stores of every array it writes on "
              f"{bound.STORE_PORTS} store port (s), full vectors of "
              + ", ".join(f"{n} {dt}" for dt, n in lanes.items())
              + " lanes. It counts no latency, no call and no adds, so nothing can beat "
              "it; how close to it a case can get depends mostly on its size.", ""]
    if aims["failed"]:
        lines += ["Verification failures: " + ", ".join(f"{k}: {', '.join(v)}"
                                                      for k, v in aims["failed"]), ""]
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], out: Path, impls: list[str], ghz: float | None) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed (pip install matplotlib): no plots")
        return []
    styles = {"blacc": ("C3", "o", 2.2), "loops": ("C7", "s", 1.2), "openblas": ("C0", "^", 1.2),
              "eigen": ("C2", "D", 1.2), "libxsmm": ("C1", "v", 1.2)}
    paths = []
    for dtype in ("f32", "f64"):
        for group, title in h.GROUPS.items():
            series = [s for s in h.SERIES if h.SERIES[s][0] == group
                      and any(r["series"] == s and r["dtype"] == dtype for r in summary)]
            if not series:
                continue
            ncol = min(len(series), 4 if len(series) > 4 else len(series))
            nrow = (len(series) + ncol - 1) // ncol
            fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow),
                                     squeeze=False)
            for ax in axes.flat[len(series):]:
                ax.set_visible(False)
            for ax, s in zip(axes.flat, series, strict=False):
                recs = sorted((r for r in summary if r["series"] == s and r["dtype"] == dtype),
                              key=lambda r: r["n"])
                for impl in impls:
                    have = [r for r in recs if impl in r["impls"]]
                    if not have:
                        continue
                    color, marker, lw = styles[impl]
                    xs = [r["n"] for r in have]
                    ys = [r["impls"][impl]["gflops"] for r in have]
                    # whiskers: the quartiles of the batches
                    lo = [max(0.0, y - r["flops"] / r["impls"][impl]["q3_ns"])
                          for r, y in zip(have, ys, strict=True)]
                    hi = [max(0.0, r["flops"] / r["impls"][impl]["q1_ns"] - y)
                          for r, y in zip(have, ys, strict=True)]
                    ax.errorbar(xs, ys, yerr=[lo, hi],
                                color=color, marker=marker, lw=lw, ms=4, capsize=2,
                                label=LABELS[impl])
                blac = h.SERIES[s][1]
                ax.set_title(f"{h.BLACS[blac][1]}\n{h.SERIES[s][3]}", fontsize=9)
                ax.set_xlabel("n")
                ax.set_ylabel("GFLOPS (median)")
                ax.set_ylim(bottom=0)
                ax.grid(alpha=0.3)
                if ghz:
                    sec = ax.secondary_yaxis("right", functions=(lambda g: g / ghz,
                                                                 lambda f: f * ghz))
                    sec.set_ylabel("flops/cycle", fontsize=8)
            handles, labels = axes.flat[0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8,
                       frameon=False)
            fig.suptitle(f"{title}, {dtype}" + (f" (clock {ghz:.2f} GHz)" if ghz else ""))
            fig.tight_layout(rect=(0, 0.05, 1, 0.96))
            p = out / f"lgen_{group}_{dtype}.png"
            fig.savefig(p, dpi=110)
            plt.close(fig)
            paths.append(p)
    return paths


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def report_only(path: Path, out: Path, no_plots: bool) -> int:
    d = json.loads(path.read_text())
    info, config, rows = d["machine"], d["config"], d["rows"]
    if "lanes" not in info:  # results from before the bound was reported
        info["lanes"] = vector_lanes()
    summary = summarize(rows, info.get("clock_ghz"), info["lanes"])
    aims = check_aims(summary)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(summary, aims, info, config, config["impls"])
    (out / "results.md").write_text(md)
    paths = [] if no_plots else plot(summary, out, config["impls"], info.get("clock_ghz"))
    log(md)
    log(f"wrote {out / 'results.md'}" + "".join(f", {p}" for p in paths))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        return report_only(args.report, args.out.resolve(), args.no_plots)
    dtypes = ("f32", "f64") if args.dtype == "both" else (args.dtype,)
    cases = h.select(h.all_cases(args.quick, dtypes), args.cases)
    if not cases:
        log("no case matches --cases")
        return 2
    if args.list:
        for c in cases:
            print(f"{c.cid:32s} {c.program:34s} M={c.dims[0]} K={c.dims[1]} N={c.dims[2]}")
        return 0
    rounds = args.rounds or (5 if args.quick else 9)
    out = args.out.resolve()
    build = (args.build or out / "build").resolve()
    out.mkdir(parents=True, exist_ok=True)
    build.mkdir(parents=True, exist_ok=True)

    try:
        tc = h.detect([i for i in args.impls if i in h.PEERS])
    except RuntimeError as e:
        log(f"cannot run: {e}")
        return 2
    impls = [i for i in h.IMPLS if i in args.impls and (i not in h.PEERS or i in tc.peers)]
    for peer, why in tc.missing.items():
        log(f"note: skipping {peer}: {why}")
    if "eigen" in args.impls and "eigen" in tc.missing:
        log("      (apt-get install -y libeigen3-dev)")
    if "libxsmm" in args.impls and "libxsmm" in tc.missing:
        log("      (apt-get install -y libxsmm-dev)")
    if "openblas" in args.impls and "openblas" in tc.missing:
        log("      (apt-get install -y libopenblas-dev)")
    log(f"{len(cases)} cases, implementations: {', '.join(impls)}; build dir {build}")

    ghz = h.measure_clock_ghz(tc.cc)
    info = machine_info(tc) | {"clock_ghz": ghz}
    emit_cpu: dict = {}
    log(f"clock: {fmt(ghz)} GHz (dependent-add chain)")

    groups = h.group_by_series(cases)
    blacc_results: dict = {}
    t0 = time.time()
    if "blacc" in impls:
        fp = h.blacc_fingerprint()
        work = [(c, str(build / name), fp, args.search, args.target)
                for name, cs in groups.items() for c in cs]
        for name in groups:
            (build / name).mkdir(parents=True, exist_ok=True)
        log(f"emitting {len(work)} blacc kernels (search: {args.search}, "
            f"target: {args.target}) ...")
        # a measuring search times kernels: nothing else may run beside it
        jobs = max(1, min(args.jobs if args.search == "model" else 1, len(work)))
        pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
        results = pool.map(h._emit_worker, work) if pool else map(h._emit_worker, work)
        emit_cpu = {}
        for k, (cid, res, err, secs) in enumerate(results, 1):
            emit_cpu[cid] = secs
            if err:
                log(f"  blacc failed on {cid}: {err}")
            else:
                blacc_results[cid] = res
            if secs > 10:
                log(f"  [{k}/{len(work)}] {cid}: blacc.emit took {secs:.0f} s CPU")
        if pool:
            pool.shutdown()
        log(f"  done in {time.time() - t0:.0f} s")

    rows: list[dict] = []
    jsonl = out / "results.jsonl"
    with jsonl.open("w") as f:
        for i, (name, cs) in enumerate(groups.items(), 1):
            t1 = time.time()
            try:
                exe = h.build_series(name, cs, impls, tc, build, jobs=args.jobs, log=log,
                                     blacc_results=blacc_results)
            except RuntimeError as e:
                log(f"[{i}/{len(groups)}] {name}: BUILD FAILED\n{e}")
                continue
            tb = time.time() - t1
            try:
                got = h.run_series(exe, cs, target_ms=args.target_ms, rounds=rounds,
                                   clock=args.clock, processes=args.processes,
                                   page_ends=args.placement == "page-ends")
            except RuntimeError as e:
                log(f"[{i}/{len(groups)}] {name}: RUN FAILED\n{e}")
                continue
            for r in got:
                f.write(json.dumps(r) + "\n")
            f.flush()
            rows += got
            bl = [r for r in got if r["impl"] == "blacc" and r.get("gflops")]
            bad = [f"{r['case']}:{r['impl']}" for r in got
                   if "skipped" not in r and not r.get("verified")]
            log(f"[{i}/{len(groups)}] {name}: build {tb:.0f} s, run {time.time() - t1 - tb:.0f} s;"
                f" blacc GFLOPS " + " ".join(f"n={r['n']}:{r['gflops']:.1f}" for r in bl)
                + (f"  VERIFICATION FAILED: {', '.join(bad)}" if bad else ""))

    summary = summarize(rows, ghz, info["lanes"])
    aims = check_aims(summary)
    config = {"quick": args.quick, "dtypes": dtypes, "cases": args.cases, "impls": impls,
              "target_ms": args.target_ms, "rounds": rounds, "clock": args.clock,
              "processes": args.processes, "search": args.search,
              "target": args.target, "placement": args.placement}
    (out / "results.json").write_text(json.dumps(
        {"machine": info, "config": config, "summary": summary, "aims": aims,
         "blacc_emit_cpu_s": emit_cpu, "rows": rows},
        indent=1))
    md = markdown(summary, aims, info, config, impls)
    (out / "results.md").write_text(md)
    paths = [] if args.no_plots else plot(summary, out, impls, ghz)
    log(md)
    log(f"wrote {out / 'results.json'}, {out / 'results.md'}"
        + "".join(f", {p}" for p in paths))
    log(f"total {time.time() - t0:.0f} s")
    failed = any(not r.get("verified") for r in rows if "skipped" not in r)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    sys.exit(main())
