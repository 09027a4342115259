#!/usr/bin/env python3
"""Real-trace runner: a trace of TensorFlow training jobs run through salus-server under each policy, and
without a server as two baselines.

The trace is a CSV `job_id,model,iterations,submit_time_s,duration_s` (--trace), or one generated here: --jobs
jobs (default 8) with Poisson arrivals (--mean-gap seconds apart on average, shifted so that no two are closer
than 0.25 s) and heavy-tailed lengths (lognormal, scaled so the jobs' alone times add up to about --work
seconds), all from --seed. duration_s (optional) is the job's expected alone time; the generator fills it from
nominal per-step times, and this runner does not use it (srtf jobs get `iterations=N` hints, as in
bench_sched.py). Models are those of
integration_tests/workloads/sched_job.py: mlp_small (~5 ms/step), cnn_small (~8 ms), mlp_large (~22 ms).

Runs (fresh processes for each; every job imports TensorFlow and builds its graph, then waits for a go file,
so TensorFlow's import is in no JCT):
  POLICY     each of --policies (default fifo,srtf,pack) on a fresh salus-server; jobs released at their
             submit times
  alone      no server: each job in-process, one after another in submit order (a job starts at its submit
             time or when the previous one ends, whichever is later), so each runs alone
  together   no server: every job in-process, released at its submit time, all running at once

Recurring work (--history-runs N): the same jobs were run before. The trace first runs N times under `learned` on
a fresh state directory, each job's steps scaled by a lognormal factor (--history-noise sigma, default 0.2: a
script's runs vary around its usual length), so every job name (its identity, with its model's graph) has N
earlier runs in the server's job history; every measured server run then starts from a copy of that state
directory, and runs the trace's own lengths. Only srtf gets hints; `learned` orders by the history alone. The
ratios add each policy's share of SRTF's mean-JCT gain over FIFO.

Per job: arrival (release), start of its first step (after session creation and the init run), end of its last
step, JCT = end - submit time, and each step's end. Printed per run: makespan (last end - trace start), mean and
p95 JCT; then FIFO/SRTF mean JCT, each policy against "together", and "alone" makespan against each policy's.
Written to --out-dir (default: a new temp dir, printed): trace.csv, jobs.csv (per job and run), steps.csv (each
step's end), runs.csv (the table) and timeline_RUN.png (one row per job, a tick per step end).

  .venv/bin/python scripts/real_trace.py [--quick] [--trace T.csv] [--policies fifo,srtf,pack]
                                         [--baselines alone,together] [--history-runs N] [--out-dir DIR]
                                         [--seeds N]

--seeds N runs the whole (history runs included) on N generated traces, seeds --seed to --seed + N - 1, each in
its own subfolder of --out-dir, and ends with each ratio's min / median / max over them: quote that, not one run.

A full run takes about 3.5 minutes on 2 cores (--quick: about 1); each history run adds one more trace run.
Clients compete with the server for the CPU, and so does anything else running: the table's "other CPU" column
says how much other processes used.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trace_jobs import (OtherCpu, Server, TraceJob, read_trace, require_server, run_jobs, summary, write_rows,
                        write_trace)

# The models a trace may name, with nominal seconds per step (used only to size generated jobs).
NOMINAL_STEP_S = {"mlp_small": 0.005, "cnn_small": 0.008, "mlp_large": 0.022}
BASELINES = ("alone", "together")
MIN_ITERATIONS = 20
# Generated arrivals are at least this far apart: session creation takes up to ~0.2 s, so closer arrivals would
# reach the scheduler in an order the trace does not say.
MIN_GAP_S = 0.25


def generate_trace(n_jobs: int, seed: int, mean_gap_s: float, work_s: float) -> list[TraceJob]:
    rng = random.Random(seed)
    models = sorted(NOMINAL_STEP_S)
    weights = [rng.lognormvariate(0.0, 1.0) for _ in range(n_jobs)]
    jobs, t = [], 0.0
    for i, w in enumerate(weights):
        model = models[i % len(models)] if i < len(models) else rng.choice(models)
        step = NOMINAL_STEP_S[model]
        iterations = max(MIN_ITERATIONS, round(work_s * w / sum(weights) / step))
        jobs.append(TraceJob(f"job{i}", model, iterations, round(t, 3), round(iterations * step, 3)))
        t += MIN_GAP_S + rng.expovariate(1.0 / max(1e-3, mean_gap_s - MIN_GAP_S))  # mean mean_gap_s
    return jobs


def job_args(job: TraceJob, index: int, run: str) -> list[str]:
    name = job.job_id + (f"?iterations={job.iterations}" if run == "srtf" else "")
    return ["--model", job.model, "--seed", str(100 + index), "--steps", str(job.iterations), "--name", name,
            "--step-times"]


def run_trace(trace: list[TraceJob], run: str, server_args: tuple[str, ...] = (),
              history: Path | None = None) -> dict:
    """Runs the trace once: `run` is a server policy, "alone" or "together"; the server starts from a copy of the
    state directory `history` (its job history) when given. Returns {"run", "jobs": rows, "steps": {job_id: [step
    end s]}, "digests", "summary", "server_exit", "other_cpu"}; times in s after the trace start."""
    specs = [(j.job_id, job_args(j, i, run), j.submit_time_s) for i, j in enumerate(trace)]
    state = None
    if history and run not in BASELINES:
        state = Path(tempfile.mkdtemp(prefix="salus-trace-state-")) / "state"
        shutil.copytree(history, state)
        server_args = ("--state-dir", str(state), *server_args)
    with OtherCpu() as other:
        server = None if run in BASELINES else Server("--policy", run, *server_args)
        try:
            t0, res = run_jobs(server.target if server else "", specs, one_at_a_time=run == "alone")
        finally:
            code = server.stop() if server else None
            if state:
                shutil.rmtree(state.parent, ignore_errors=True)
    rows, steps = [], {}
    for j in trace:
        r = res[j.job_id]
        rows.append({"run": run, "job_id": j.job_id, "model": j.model, "iterations": j.iterations,
                     "submit_s": j.submit_time_s, "arrival_s": round(r["released"] - t0, 4),
                     "start_s": round(r["start"] - t0, 4), "end_s": round(r["end"] - t0, 4),
                     "jct_s": round(r["end"] - t0 - j.submit_time_s, 4),
                     "step_ms_median": round(r["step_ms_median"], 3)})
        steps[j.job_id] = [r["start"] - t0 + e for e in r["step_end_s"]]
    first = min(j.submit_time_s for j in trace)
    return {"run": run, "jobs": rows, "steps": steps, "digests": {j.job_id: res[j.job_id]["digest"] for j in trace},
            "summary": summary([row["jct_s"] for row in rows], max(row["end_s"] for row in rows) - first),
            "server_exit": code, "other_cpu": other.share}


def record_history(trace: list[TraceJob], runs: int, noise: float, seed: int, server_args: tuple[str, ...],
                   state: Path) -> None:
    """Runs the trace `runs` times under `learned` on the state directory `state`, each job's steps scaled by a
    lognormal factor of spread `noise`: afterwards every job name has `runs` earlier runs in its job history."""
    rng = random.Random(seed * 7919 + 1)
    for n in range(runs):
        earlier = [dataclasses.replace(j, iterations=max(MIN_ITERATIONS,
                                                         round(j.iterations * rng.lognormvariate(0.0, noise))))
                   for j in trace]
        t = time.monotonic()
        run = run_trace(earlier, "learned", ("--state-dir", str(state), *server_args))
        if run["server_exit"] != 0:
            sys.exit(f"real_trace: the server of history run {n + 1} exited with {run['server_exit']}")
        print(f"  history run {n + 1}/{runs} (learned): {time.monotonic() - t:.0f} s, steps "
              + " ".join(str(j.iterations) for j in earlier), flush=True)


def print_table(runs: list[dict]) -> None:
    print("(ms/step: median over jobs of a job's median step time seen by its client, queue waits included; "
          "other CPU: share of the machine's CPU other processes used during the run: noise if large)")
    print(f"{'run':10} {'makespan s':>10} {'mean JCT s':>10} {'p95 JCT s':>9} {'ms/step':>8} {'other CPU':>9}  "
          f"finish order")
    for r in runs:
        s = r["summary"]
        order = " ".join(row["job_id"] for row in sorted(r["jobs"], key=lambda row: row["end_s"]))
        ms = statistics.median(row["step_ms_median"] for row in r["jobs"])
        note = "" if r["server_exit"] in (0, None) else f"  (server exit code {r['server_exit']})"
        other = "-" if r["other_cpu"] is None else f"{r['other_cpu'] * 100:.0f} %"
        print(f"{r['run']:10} {s['makespan_s']:>10.2f} {s['mean_jct_s']:>10.2f} {s['p95_jct_s']:>9.2f} "
              f"{ms:>8.2f} {other:>9}  {order}{note}", flush=True)


def ratios(runs: list[dict]) -> list[tuple[str, float]]:
    by = {r["run"]: r["summary"] for r in runs}
    policies = [r["run"] for r in runs if r["run"] not in BASELINES]
    out = []
    if "fifo" in by and "srtf" in by:
        out.append(("FIFO/SRTF mean JCT", by["fifo"]["mean_jct_s"] / by["srtf"]["mean_jct_s"]))
    for p in policies:
        if "together" in by:
            out.append((f"{p}/together mean JCT", by[p]["mean_jct_s"] / by["together"]["mean_jct_s"]))
            out.append((f"{p}/together makespan", by[p]["makespan_s"] / by["together"]["makespan_s"]))
        if "alone" in by:
            out.append((f"alone/{p} makespan", by["alone"]["makespan_s"] / by[p]["makespan_s"]))
    if "learned" in by and "fair" in by:
        # The default policy's bounds (docs/EVALUATION.md, (f)): mean <= 1.02, p95 <= 1.05.
        out.append(("learned/fair mean JCT", by["learned"]["mean_jct_s"] / by["fair"]["mean_jct_s"]))
        out.append(("learned/fair p95 JCT", by["learned"]["p95_jct_s"] / by["fair"]["p95_jct_s"]))
    if "fifo" in by and "srtf" in by and by["fifo"]["mean_jct_s"] > by["srtf"]["mean_jct_s"]:
        gain = by["fifo"]["mean_jct_s"] - by["srtf"]["mean_jct_s"]
        for p in policies:
            if p not in ("fifo", "srtf"):
                out.append((f"{p} share of SRTF gain", (by["fifo"]["mean_jct_s"] - by[p]["mean_jct_s"]) / gain))
    return out


def plot_timeline(run: dict, path: Path, xmax: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = run["jobs"]
    models = sorted({row["model"] for row in jobs})
    colors = dict(zip(models, plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(jobs) + 1.6))
    for y, row in enumerate(jobs):
        ax.hlines(y, row["submit_s"], row["end_s"], color="0.85", linewidth=6, zorder=1)
        ax.scatter(run["steps"][row["job_id"]], [y] * row["iterations"], marker="|", s=60, linewidths=0.6,
                   color=colors[row["model"]], zorder=2)
        ax.plot(row["submit_s"], y, marker=">", color="black", markersize=5, zorder=3)
    for m in models:
        ax.scatter([], [], marker="|", color=colors[m], label=m)
    ax.set_yticks(range(len(jobs)), [f"{row['job_id']} ({row['iterations']})" for row in jobs])
    ax.invert_yaxis()
    ax.set_xlim(0, xmax)
    ax.set_xlabel("seconds after trace start (> submit, grey: submit to end, tick: a step's end)")
    s = run["summary"]
    ax.set_title(f"{run['run']}: makespan {s['makespan_s']:.1f} s, mean JCT {s['mean_jct_s']:.1f} s")
    ax.legend(loc="lower left", bbox_to_anchor=(1.0, 0.0), fontsize="small", frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_results(out: Path, runs: list[dict], plot: bool = True) -> None:
    write_rows(out / "jobs.csv", [row for r in runs for row in r["jobs"]])
    write_rows(out / "steps.csv", [{"run": r["run"], "job_id": k, "iteration": i + 1, "end_s": round(e, 4)}
                                   for r in runs for k, ends in r["steps"].items() for i, e in enumerate(ends)])
    write_rows(out / "runs.csv", [{"run": r["run"], **{k: round(v, 4) for k, v in r["summary"].items()},
                                   "other_cpu": None if r["other_cpu"] is None else round(r["other_cpu"], 3)}
                                  for r in runs])
    if plot:
        xmax = max(r["summary"]["makespan_s"] for r in runs) * 1.02  # one scale for every run
        for r in runs:
            plot_timeline(r, out / f"timeline_{r['run']}.png", xmax)


def trace_args(ap: argparse.ArgumentParser) -> None:
    """The trace options, shared with validate_sim.py."""
    ap.add_argument("--quick", action="store_true", help="4 short jobs (about 6 s of work) instead of 8 (about 30 s)")
    ap.add_argument("--trace", type=Path, help="trace CSV (default: generate one)")
    ap.add_argument("--jobs", type=int, help="generated trace: number of jobs (default 8, quick 4)")
    ap.add_argument("--seed", type=int, default=1, help="generated trace: random seed (default 1)")
    ap.add_argument("--mean-gap", type=float, help="generated trace: mean seconds between arrivals (default 1.2, "
                                                   "quick 0.5)")
    ap.add_argument("--work", type=float, help="generated trace: sum of the jobs' nominal alone times in s "
                                               "(default 30, quick 6)")
    ap.add_argument("--server-args", default="", help="extra salus-server flags, e.g. --server-args='-v'")
    ap.add_argument("--out-dir", type=Path, help="where results go (default: a new temp dir)")


def load_trace(args, prog: str) -> tuple[list[TraceJob], Path]:
    """The trace (read or generated) and the output dir, which gets a copy of it as trace.csv."""
    out = args.out_dir or Path(tempfile.mkdtemp(prefix=f"salus-{prog.replace('_', '-')}-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.trace:
        trace = read_trace(args.trace)
        if unknown := sorted({j.model for j in trace} - set(NOMINAL_STEP_S)):
            sys.exit(f"{prog}: {args.trace}: unknown models {unknown} (known: {', '.join(sorted(NOMINAL_STEP_S))})")
    else:
        trace = generate_trace(args.jobs or (4 if args.quick else 8), args.seed,
                               args.mean_gap or (0.5 if args.quick else 1.2), args.work or (6.0 if args.quick else 30))
    write_trace(out / "trace.csv", trace)
    return trace, out


def describe(trace: list[TraceJob]) -> str:
    return ", ".join(f"{j.job_id} {j.model} x{j.iterations} @{j.submit_time_s:g}s" for j in trace)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    trace_args(ap)
    ap.add_argument("--policies", help="server policies, comma-separated ('' for none; default fifo,srtf,pack, "
                                       "with --history-runs fifo,srtf,fair,learned)")
    ap.add_argument("--baselines", default="alone,together", help="in-process baselines ('' for none)")
    ap.add_argument("--history-runs", type=int, default=0,
                    help="recurring work: earlier runs of every job in the server's history before the measured runs")
    ap.add_argument("--history-noise", type=float, default=0.2,
                    help="spread (lognormal sigma) of an earlier run's steps around the trace's (default 0.2)")
    ap.add_argument("--no-plot", action="store_true", help="skip the timeline PNGs")
    ap.add_argument("--seeds", type=int, default=1,
                    help="run N generated traces (seeds --seed..--seed+N-1) and summarize each ratio over them")
    args = ap.parse_args()
    if args.policies is None:
        args.policies = "fifo,srtf,fair,learned" if args.history_runs else "fifo,srtf,pack"
    policies = [p for p in args.policies.split(",") if p]
    baselines = [b for b in args.baselines.split(",") if b]
    if policies:
        require_server("real_trace")
    if bad := set(baselines) - set(BASELINES):
        sys.exit(f"real_trace: unknown baselines {sorted(bad)} (have {', '.join(BASELINES)})")
    plot = not args.no_plot and importlib.util.find_spec("matplotlib") is not None
    if not plot and not args.no_plot:
        print("real_trace: matplotlib is not installed (scripts/setup.sh installs it): no timelines")
    if args.seeds > 1 and args.trace:
        sys.exit("real_trace: --seeds generates its traces: leave out --trace")
    base = args.out_dir or Path(tempfile.mkdtemp(prefix="salus-real-trace-"))
    first_seed = args.seed
    per_seed = []
    for k in range(args.seeds):
        if args.seeds > 1:
            args.seed = first_seed + k
            args.out_dir = base / f"seed{args.seed}"
            print(f"\n=== seed {args.seed} ({k + 1} of {args.seeds})", flush=True)
        else:
            args.out_dir = base
        per_seed.append(run_once(args, policies, baselines, plot))
    if args.seeds > 1:
        print(f"\nover seeds {first_seed}-{first_seed + args.seeds - 1}: min / median / max")
        for label in per_seed[0]:
            values = [r[label] for r in per_seed if label in r]
            print(f"{label:28} {min(values):6.2f} / {statistics.median(values):6.2f} / {max(values):6.2f}")


def run_once(args, policies: list[str], baselines: list[str], plot: bool) -> dict[str, float]:
    """One trace (read, or generated from args.seed): history runs, every run, the table; returns the ratios."""
    trace, out = load_trace(args, "real_trace")
    print(f"results in {out}\ntrace ({len(trace)} jobs): {describe(trace)}", flush=True)
    t_start = time.monotonic()
    server_args = tuple(args.server_args.split())
    history = None
    if args.history_runs > 0 and policies:
        history = out / "history-state"
        shutil.rmtree(history, ignore_errors=True)
        record_history(trace, args.history_runs, args.history_noise, args.seed, server_args, history)
    runs = []
    for run in [*policies, *baselines]:
        t = time.monotonic()
        runs.append(run_trace(trace, run, server_args, history))
        print(f"  {run}: {time.monotonic() - t:.0f} s", flush=True)
    print()
    print_table(runs)
    print("\n(X/Y: X's figure divided by Y's)")
    measured = dict(ratios(runs))
    for label, value in measured.items():
        print(f"{label:28} {value:6.2f}")
    digests = {k: {r["digests"][k] for r in runs} for k in runs[0]["digests"]}
    same = all(len(v) == 1 for v in digests.values())
    print(f"per-job loss digests identical across runs: {'yes' if same else 'NO: ' + str(digests)}")
    write_results(out, runs, plot=plot)
    print(f"\nwrote {out}/jobs.csv, steps.csv, runs.csv" + (", timeline_*.png" if plot else "")
          + f" (total {time.monotonic() - t_start:.0f} s)")
    return measured


if __name__ == "__main__":
    main()
