#!/usr/bin/env python3
"""Simulator validation: salus-sim's JCTs against the same trace run for real through salus-server.

(a) Workload table, measured here: each model of the trace alone through a fresh salus-server (--steps steps).
    iteration_s = median (--iteration-stat mean: mean) step wall time of its main iterations (every step after
    the first two, which the server runs unscheduled as cheap runs); startup_s = time from the job's arrival
    (release, before session creation) to the end of its second step, minus 2 x iteration_s: the off-device
    time such that startup_s + iterations x iteration_s is the job's time alone, since the simulator runs all
    of a trace job's iterations as scheduled ones. utilization = 1 (one CPU lane, iterations serialised);
    persistent_mb = ephemeral_mb = 1 (no --capacity: one lane, memory unused). Written to workloads.csv.
(b) The trace run for real under each of --policies (default fifo,srtf) with real_trace.py's runner (fresh
    server per policy; srtf jobs carry iterations=N hints).
(c) salus-sim run --trace sim_trace.csv --workloads workloads.csv --policy P --jobs-out sim_jobs_P.csv --json,
    on the same jobs with duration_s left empty, so its srtf uses iterations x iteration_s from the table as
    each job's hint, as the server does from the iterations=N hint and its measured iteration time.
(d) Per job: real JCT, simulated JCT, error %; per policy the mean and max |error| and whether the mean JCT is
    within 15% of the real one (the target). Exit code 1 when a policy misses it.

The trace is real_trace.py's (same options: --trace, --jobs, --seed, --mean-gap, --work, --quick).
--reuse DIR skips (a) and (b) and takes workloads.csv, trace.csv and jobs.csv from an earlier --out-dir.

  .venv/bin/python scripts/validate_sim.py [--quick] [--policies fifo,srtf] [--out-dir DIR] [--reuse DIR]

Takes about 2 minutes on 2 cores (--quick: under 1). On a shared machine, watch the "other CPU" column and the
warnings: the comparison means something only when nothing else used the CPU meanwhile.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from real_trace import describe, load_trace, print_table, run_trace, trace_args, write_results
from trace_jobs import REPO, OtherCpu, Server, read_trace, require_server, run_jobs, write_rows, write_trace

WARMUP = 2  # a signature's first two runs are cheap: they run at once, unscheduled
TARGET = 0.15
NOISY = 0.10  # a real run during which other processes used more of the CPU than this is flagged
WORKLOAD_FIELDS = ["model", "iteration_s", "persistent_mb", "ephemeral_mb", "utilization", "startup_s"]


def sim_bin() -> Path:
    return Path(os.environ.get("SALUS_SIM_BIN", REPO / "target" / "release" / "salus-sim"))


def measure_workload(model: str, steps: int, stat: str, server_args: tuple[str, ...]) -> dict:
    args = ["--model", model, "--seed", "7", "--steps", str(steps), "--name", f"measure-{model}", "--step-times"]
    with OtherCpu() as other:
        server = Server(*server_args)
        try:
            _, res = run_jobs(server.target, [(model, args, 0.0)])
        finally:
            server.stop()
    r = res[model]
    main_ms = r["step_ms"][WARMUP:]
    iteration_s = getattr(statistics, stat)(main_ms) / 1000
    first_main = r["start"] + r["step_end_s"][WARMUP - 1] - r["released"]
    return {"model": model, "iteration_s": round(iteration_s, 6), "persistent_mb": 1, "ephemeral_mb": 1,
            "utilization": 1.0, "startup_s": round(max(0.0, first_main - WARMUP * iteration_s), 4),
            # printed, not written
            "median_s": statistics.median(main_ms) / 1000, "mean_s": statistics.mean(main_ms) / 1000,
            "first_main_s": first_main, "other_cpu": other.share or 0.0,
            "alone_s": r["end"] - r["released"]}


def measure_table(models: list[str], steps: int, stat: str, server_args: tuple[str, ...]) -> list[dict]:
    rows = [measure_workload(m, steps, stat, server_args) for m in models]
    print(f"{'model':10} {'median ms':>9} {'mean ms':>8} {'startup s':>9} {'arrival->1st main s':>19} {'alone s':>7} "
          f"{'other CPU':>9}")
    for w in rows:
        print(f"{w['model']:10} {w['median_s'] * 1000:>9.2f} {w['mean_s'] * 1000:>8.2f} {w['startup_s']:>9.3f} "
              f"{w['first_main_s']:>19.3f} {w['alone_s']:>7.2f} {w['other_cpu'] * 100:>7.0f} %", flush=True)
    if any(w["other_cpu"] > NOISY for w in rows):
        print("warning: other processes used the CPU during a measurement: the table is not trustworthy")
    return [{k: w[k] for k in WORKLOAD_FIELDS} for w in rows]


def simulate(out: Path, policy: str) -> tuple[dict, dict[str, float]]:
    """salus-sim on out/sim_trace.csv and out/workloads.csv: its JSON summary and JCT by job_id."""
    jobs_out = out / f"sim_jobs_{policy}.csv"
    cmd = [str(sim_bin()), "run", "--trace", str(out / "sim_trace.csv"), "--workloads", str(out / "workloads.csv"),
           "--policy", policy, "--jobs-out", str(jobs_out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines or not jobs_out.exists():
        sys.exit(f"validate_sim: {' '.join(cmd)}\n  exit code {proc.returncode}, "
                 f"{'no JSON line on stdout' if not lines else 'no ' + jobs_out.name}; stderr: {proc.stderr[-2000:]}")
    with open(jobs_out, newline="") as f:
        jct = {row["job_id"]: float(row["jct_s"]) for row in csv.DictReader(f) if row.get("jct_s")}
    return json.loads(lines[-1]), jct


def compare(policy: str, real: list[dict], sim_summary: dict, sim_jct: dict[str, float]) -> tuple[list[dict], bool]:
    rows = []
    for r in real:
        s = sim_jct.get(r["job_id"])
        rows.append({"policy": policy, **{k: r[k] for k in ("job_id", "model", "iterations", "submit_s")},
                     "real_jct_s": r["jct_s"], "sim_jct_s": None if s is None else round(s, 4),
                     "error_pct": None if s is None else round((s - r["jct_s"]) / r["jct_s"] * 100, 2)})
    print(f"\n== {policy}\n{'job':6} {'model':10} {'iters':>6} {'submit s':>8} {'real JCT s':>10} "
          f"{'sim JCT s':>10} {'error %':>8}")
    for row in rows:
        sim = "-" if row["sim_jct_s"] is None else f"{row['sim_jct_s']:.2f}"
        err = "-" if row["error_pct"] is None else f"{row['error_pct']:+.1f}"
        print(f"{row['job_id']:6} {row['model']:10} {row['iterations']:>6} {row['submit_s']:>8.2f} "
              f"{row['real_jct_s']:>10.2f} {sim:>10} {err:>8}")
    errs = [abs(row["error_pct"]) for row in rows if row["error_pct"] is not None]
    real_mean = statistics.mean(row["real_jct_s"] for row in rows)
    mean_err = (sim_summary["mean_jct_s"] - real_mean) / real_mean
    ok = len(errs) == len(rows) and abs(mean_err) <= TARGET
    if errs:
        print(f"per-job |error|: mean {statistics.mean(errs):.1f} %, max {max(errs):.1f} %")
    print(f"mean JCT: real {real_mean:.2f} s, simulated {sim_summary['mean_jct_s']:.2f} s, "
          f"error {mean_err * 100:+.1f} % -> {'within' if ok else 'NOT within'} {TARGET * 100:.0f} %")
    return rows, ok


def other_cpu(out: Path) -> dict[str, float]:
    """Share of the CPU other processes used during each real run (runs.csv), by policy."""
    if not (out / "runs.csv").exists():
        return {}
    with open(out / "runs.csv", newline="") as f:
        return {r["run"]: float(r["other_cpu"]) for r in csv.DictReader(f) if r.get("other_cpu")}


def real_runs(args, trace, out: Path, server_args: tuple[str, ...]) -> list[dict]:
    models = sorted({j.model for j in trace})
    steps = args.steps or (60 if args.quick else 300)
    print(f"\n(a) workload table: each model alone through a fresh salus-server, {steps} steps "
          f"(iteration_s: the {args.iteration_stat})")
    write_rows(out / "workloads.csv", measure_table(models, steps, args.iteration_stat, server_args))
    print(f"\n(b) the trace for real under {', '.join(args.policies)}")
    runs = []
    for policy in args.policies:
        t = time.monotonic()
        runs.append(run_trace(trace, policy, server_args))
        print(f"  {policy}: {time.monotonic() - t:.0f} s", flush=True)
    print_table(runs)
    write_results(out, runs, plot=False)
    return [row for r in runs for row in r["jobs"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    trace_args(ap)
    ap.add_argument("--policies", default="fifo,srtf", help="policies to compare (default fifo,srtf)")
    ap.add_argument("--steps", type=int, help="steps per model when measuring the workload table (default 300, "
                                              "quick 60)")
    ap.add_argument("--iteration-stat", choices=("median", "mean"), default="median",
                    help="iteration_s from the median (default) or the mean of the measured main steps")
    ap.add_argument("--reuse", type=Path, help="skip (a) and (b): workloads.csv, trace.csv, jobs.csv from this dir")
    args = ap.parse_args()
    args.policies = [p for p in args.policies.split(",") if p]
    t_start = time.monotonic()
    if args.reuse:
        if not sim_bin().exists():
            sys.exit(f"validate_sim: {sim_bin()} not found (build salus-sim or set SALUS_SIM_BIN)")
        missing = [n for n in ("trace.csv", "workloads.csv", "jobs.csv") if not (args.reuse / n).exists()]
        if missing:
            sys.exit(f"validate_sim: --reuse {args.reuse}: no {', '.join(missing)} "
                     f"(the --out-dir of a run without --reuse has them)")
        args.trace = args.reuse / "trace.csv"
    else:
        require_server("validate_sim")
    trace, out = load_trace(args, "validate_sim")
    print(f"results in {out}\ntrace ({len(trace)} jobs): {describe(trace)}", flush=True)
    if args.reuse:
        for name in ("workloads.csv", "jobs.csv", "runs.csv"):
            if (args.reuse / name).exists() and (args.reuse / name).resolve() != (out / name).resolve():
                shutil.copy(args.reuse / name, out / name)
        with open(out / "jobs.csv", newline="") as f:
            real = [{**r, "iterations": int(r["iterations"]), "submit_s": float(r["submit_s"]),
                     "jct_s": float(r["jct_s"])} for r in csv.DictReader(f)]
    else:
        if not sim_bin().exists():
            print(f"note: {sim_bin()} is not there: (a) and (b) run, then this stops; when it is built, "
                  f"compare with --reuse {out}", flush=True)
        real = real_runs(args, trace, out, tuple(args.server_args.split()))
    write_trace(out / "sim_trace.csv", read_trace(out / "trace.csv"), with_duration=False)
    if not sim_bin().exists():
        sys.exit(f"validate_sim: {sim_bin()} not found (build salus-sim or set SALUS_SIM_BIN); the real results "
                 f"are in {out}: rerun with --reuse {out}")
    print("\n(c)+(d) salus-sim on the same trace (duration_s empty: srtf hints = iterations x iteration_s)")
    comparison, verdicts = [], {}
    for policy in args.policies:
        jobs = [r for r in real if r["run"] == policy]
        if not jobs:
            sys.exit(f"validate_sim: no real results for policy {policy}")
        summary, jct = simulate(out, policy)
        rows, verdicts[policy] = compare(policy, jobs, summary, jct)
        comparison.extend(rows)
    write_rows(out / "comparison.csv", comparison)
    print(f"\nmean JCT within {TARGET * 100:.0f} %: "
          + ", ".join(f"{p} {'yes' if ok else 'NO'}" for p, ok in verdicts.items())
          + f"\nwrote {out}/workloads.csv, jobs.csv, sim_jobs_*.csv, comparison.csv "
          f"(total {time.monotonic() - t_start:.0f} s)")
    noisy = {p: x for p, x in other_cpu(out).items() if p in verdicts and x > NOISY}
    if noisy:
        print("warning: other processes used " + ", ".join(f"{x * 100:.0f} % of the CPU during the real {p} run"
                                                         for p, x in noisy.items())
              + ": those real JCTs are not trustworthy; rerun on a quiet machine")
    sys.exit(0 if all(verdicts.values()) else 1)


if __name__ == "__main__":
    main()
