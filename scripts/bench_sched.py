#!/usr/bin/env python3
"""Benchmark of salus-server's iteration scheduler, with real TensorFlow clients, in both isolation modes.

salus-server --isolation tenant (the default) is a supervisor that schedules every main iteration and hands each
tenant's TF1 connections to (relays its TF2 calls to) that tenant's own executor process; --isolation none runs everything in one process. The
latency sections run every scenario on a fresh server of each mode that --isolation selects (default both) and
print the modes side by side; the traces run on one mode (tenant when selected, else none).

(a) Switch latency: N concurrent jobs (2, then 8; all of this Unix user, so one tenant), each a loop of tiny steps
    made main iterations by a `salus_main_iter` identity node in the fetches, against a fresh server; the server
    measures the time from the end of one job's iteration to the start of another job's queued iteration in the
    same lane and `salus stats --json` reports it (switch_latency_us). Printed: count, median, p99, max
    against the targets (median <= 50 us, p99 <= 500 us).
(b) A trace: six training jobs of the same per-step cost (an MLP step of several ms) and mixed lengths
    (500, 25, 250, 15, 125, 30 iterations, times --scale: 2 by default) arriving 0.2 s x scale apart
    (--gap), longest first, run once per policy against a fresh server each. Printed per policy: makespan,
    mean and p95 job completion time (JCT = end of a job's last step - its arrival), and the FIFO/SRTF
    mean-JCT ratio (target >= 2). The ratio depends on the trace as much as on the server: next to the
    measured figures the script prints what a zero-overhead lane running the same trace at the measured
    iteration rate would give ("ideal"). `srtf` jobs carry `iterations=N` hints (session_metadata.name);
    `srtf-seconds` carries `seconds=` hints from a calibration run instead; other policies get no hints.
(c) The same trace with TF2 jobs (--traces, default tf1,tf2,mixed): "tf2" runs every job as TF2 code
    (integration_tests/workloads/tf2_sched_job.py: the same model and step as a tf.function called per step, sent
    to the server by the adapter, SALUS_SERVER set; hints as SALUS_EXPECTED_ITERATIONS / _SECONDS), "mixed"
    alternates TF1 and TF2 jobs in arrival order (job 0 TF1, job 1 TF2, ...); same iterations and arrivals. Each
    trace prints the same table and its FIFO/SRTF mean-JCT ratio next to the zero-overhead ideal, with whether the
    ratio is within 10% of that ideal. Where the trace mixes kinds, the ideal lane gives each job its kind's
    step time (relative step times from the FIFO run, where each job runs alone; scaled to the measured rate).
(d) Switch latency by job kind: 2 tiny jobs of one tenant busy at once, TF1+TF1, TF2+TF2 (a tf.function named
    salus_main_iter, so every call is a main iteration) and TF1+TF2, each against a fresh server; median and p99
    of the server's switch latency for each, side by side (with 2 jobs every switch is between the two, so the
    mixed pair measures TF1->TF2 and TF2->TF1 switches).
(e) Switch between two tenants' jobs (target: median <= 50 us, p99 <= 500 us on the tenant-mode server): the
    two-job scenario of (d) (--tenant-pairs, default TF1+TF1) with each job its own tenant: SALUS_TOKEN set to
    one of two tokens of a tenants file written to a temporary directory (RUN_AS "-": when this runs as root
    their executors run as nobody), so the tenant-mode server runs two executor processes and every switch goes
    from one executor to the other. The same scenario (same tokens) on the none-mode server is printed next to it:
      pack     TF1-TF1  two tenants: switch median/p99 tenant 31.0/220.5 us (ok), none 12.0/80.1 us (ok)
    The table's "exec" column is the server's executors_started counter (2 on a tenant-mode server, 0 on none).

Job processes import TensorFlow and build their graphs before the clock starts (they wait for a go file), so
TensorFlow's slow import is not part of any JCT. Every job's losses digest is compared across policies:
the schedule must never change a job's numbers.

  .venv/bin/python scripts/bench_sched.py [--quick] [--isolation both|tenant|none] [--policies fifo,srtf,...]
                                         [--traces tf1,tf2,mixed] [--kind-pairs tf1+tf1,tf2+tf2,tf1+tf2]
                                         [--tenant-pairs tf1+tf1] [--skip-latency|--skip-trace]

Time on a 2-core machine (each run: a fresh server, job processes importing TensorFlow, then the measured part):
--quick about 3.5 minutes (12 latency runs with both modes, 9 trace runs); the full run about 15 minutes, mostly
the traces. Only the two-tenant switch, smallest (2 runs, about 20 s):
  --skip-trace --latency-jobs '' --kind-pairs '' --latency-policies pack --latency-seconds 1

On a 2-core machine the clients compete with the server for CPU; read ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _bench_tenants as tenants
from trace_jobs import Server, pct, run_jobs, server_bin

TRACE = [500, 25, 250, 15, 125, 30]  # iterations, in arrival order: heavy-tailed, like training traces
LATENCY_TARGET_US = {"p50": 50.0, "p99": 500.0}
RATIO_TARGET = 2.0
IDEAL_TOLERANCE = 0.10  # the FIFO/SRTF ratio within 10% of the zero-overhead ideal
TRACE_KINDS = {"tf1": lambda i: "tf1", "tf2": lambda i: "tf2", "mixed": lambda i: ("tf1", "tf2")[i % 2]}
PAIR_LABEL = {("tf1", "tf1"): "TF1-TF1", ("tf2", "tf2"): "TF2-TF2", ("tf1", "tf2"): "TF1-TF2"}
SERVER_ARGS: list[str] = []  # --server-args
TRACE_ISOLATION: list[str] = []  # --isolation flags of the trace servers


def switch_latency(stats: dict) -> dict:
    return stats["switch_latency_us"]


# --- (a) switch latency ------------------------------------------------------------------------------------

def bench_latency(n_jobs: int, policy: str, seconds: float, kinds: list[str] | None = None,
                  isolation: str | None = None, tenant_file: tenants.Tenants | None = None) -> dict:
    """isolation: the server's --isolation (None: its default). tenant_file: job i runs as token tenant t<i> of it
    (SALUS_TOKEN), so each job is its own tenant; None: all jobs are this Unix user's."""
    kinds = kinds or ["tf1"] * n_jobs
    flags = ["--policy", policy, *(tenants.isolation_flags(isolation) if isolation else []),
             *(tenant_file.flags() if tenant_file else []), *SERVER_ARGS]
    tokens = {f"tiny{i}": tenant_file.tokens[f"t{i}"] for i in range(n_jobs)} if tenant_file else {}
    server = Server(*flags)
    try:
        specs = [(f"tiny{i}", ["--tiny", "--force-main", "--seed", str(i + 1), "--seconds", str(seconds),
                               "--name", f"tiny{i}"], 0.0, kinds[i]) for i in range(n_jobs)]
        if tokens:
            # tf2_sched_job.py closes its eager context over a plain grpcio channel that carries no token: on a
            # tenant-mode server that call is this Unix user's and starts one more executor (after the job's last
            # step; the context is then reclaimed by the server either way). Exit as the stock client does.
            specs = [(k, a + ["--no-close"] if kind == "tf2" else a, t, kind) for k, a, t, kind in specs]
        with tenants.jobs_with_tokens(tokens):
            _, results = run_jobs(server.target, specs)
        stats = server.ctl("stats", "--json")
    finally:
        code = server.stop()
    lat = switch_latency(stats)
    steps = sum(r["steps"] for r in results.values())
    return {"jobs": n_jobs, "policy": policy, "isolation": isolation or "default", "tenants": len(tokens) or 1,
            "executors": stats.get("server_counters", {}).get("executors_started"),
            "count": lat["count"], "p50": lat["p50"], "p99": lat["p99"],
            # --isolation tenant: the go-ahead's trip to the executor and its start there, which the switch
            # latency (measured in the supervisor) does not include; 0 in one process.
            "handover_p50": stats.get("handover_latency_us", {}).get("p50", 0.0),
            "handover_p99": stats.get("handover_latency_us", {}).get("p99", 0.0),
            "max": lat["max"], "iterations_total": stats["iterations_total"], "client_steps": steps,
            "step_ms_median": statistics.median(r["step_ms_median"] for r in results.values()),
            "step_ms_by_kind": {k: statistics.median(r["step_ms_median"] for r in results.values() if r["kind"] == k)
                                for k in sorted(set(kinds))},
            "kinds": kinds, "exit_code": code}


# --- (b) trace ---------------------------------------------------------------------------------------------

def trace_specs(policy: str, iterations: list[int], gap: float, step_s: dict | None,
                kinds: list[str] | None = None) -> list:
    """step_s: seconds per step by kind (srtf-seconds hints)."""
    kinds = kinds or ["tf1"] * len(iterations)
    specs = []
    for i, n in enumerate(iterations):
        name = f"job{i}-{n}"
        if policy == "srtf":
            name += f"?iterations={n}"
        elif policy == "srtf-seconds":
            name += f"?seconds={n * step_s[kinds[i]]:.3f}"
        specs.append((f"job{i}", ["--seed", str(100 + i), "--steps", str(n), "--name", name], i * gap, kinds[i]))
    return specs


def bench_trace(policy: str, iterations: list[int], gap: float, step_s: dict | None,
                kinds: list[str] | None = None) -> dict:
    kinds = kinds or ["tf1"] * len(iterations)
    server_policy = "srtf" if policy.startswith("srtf") else policy
    server = Server("--policy", server_policy, *TRACE_ISOLATION, *SERVER_ARGS)
    try:
        _, results = run_jobs(server.target, trace_specs(policy, iterations, gap, step_s, kinds))
        stats = server.ctl("stats", "--json")
    finally:
        code = server.stop()
    t0 = min(r["go"] for r in results.values())
    jct = {k: r["end"] - r["go"] for k, r in results.items()}
    order = sorted(results, key=lambda k: results[k]["end"])
    return {"policy": policy, "makespan": max(r["end"] for r in results.values()) - t0,
            "mean_jct": statistics.mean(jct.values()), "p95_jct": pct(list(jct.values()), 95),
            "jct": jct, "order": order,
            "setup": statistics.mean(r["start"] - r["go"] for r in results.values()), "digests": {k: r["digest"] for k, r in results.items()},
            "step_ms": statistics.median(r["step_ms_median"] for r in results.values()),
            "step_ms_by_kind": {k: statistics.median(r["step_ms_median"] for r in results.values() if r["kind"] == k)
                                for k in sorted(set(kinds))},
            "kinds": kinds, "devices": sorted({r["device"] for r in results.values() if "device" in r}),
            "iters_per_s": stats["iterations_total"] / (max(r["end"] for r in results.values()) -
                                                        min(r["start"] for r in results.values())),
            "switch": switch_latency(stats), "iterations_total": stats["iterations_total"], "exit_code": code}


def ideal_mean_jct(policy: str, iterations: list[int], gap: float, step_s) -> float | None:
    """Mean JCT of the trace on a zero-overhead lane running one iteration at a time (job i arrives at
    i * gap), for the policies with a simple model; None for the others. step_s: seconds per iteration, one for
    all jobs or a list (job i's); SRTF ranks by remaining time (remaining iterations x the job's step time)."""
    if policy not in ("fifo", "srtf", "srtf-seconds", "las"):
        return None
    step = list(step_s) if isinstance(step_s, (list, tuple)) else [step_s] * len(iterations)
    arrival = [i * gap for i in range(len(iterations))]
    left, attained, done, t = list(iterations), [0] * len(iterations), [0.0] * len(iterations), 0.0
    while any(left):
        ready = [i for i in range(len(left)) if left[i] and arrival[i] <= t + 1e-9]
        if not ready:
            t = min(arrival[i] for i in range(len(left)) if left[i])
            continue
        if policy == "fifo":
            j = min(ready)
        elif policy == "las":
            j = min(ready, key=lambda i: (attained[i], i))
        else:
            j = min(ready, key=lambda i: (left[i] * step[i], i))
        t += step[j]
        left[j] -= 1
        attained[j] += 1
        if not left[j]:
            done[j] = t
    return statistics.mean(d - a for d, a in zip(done, arrival))


def ideal_steps(iterations: list[int], kinds: list[str], weights: dict[str, float], iters_per_s: float) -> list:
    """Per-job seconds per iteration for the ideal lane: each kind's relative step time (weights, e.g. its median
    ms/step when running alone), scaled so that the trace's iterations take as long as at the measured rate. With
    one kind: 1 / iters_per_s for every job."""
    total = sum(iterations) / iters_per_s
    work = sum(n * weights[k] for n, k in zip(iterations, kinds))
    return [weights[k] * total / work for k in kinds]


def calibrate_step_s(kind: str = "tf1") -> float:
    """Seconds per step of the trace's job alone on a server (for srtf-seconds hints)."""
    server = Server(*TRACE_ISOLATION, *SERVER_ARGS)
    try:
        _, res = run_jobs(server.target, [("calib", ["--seed", "99", "--steps", "40", "--name", "calib"], 0.0,
                                           kind)])
    finally:
        server.stop()
    return res["calib"]["step_ms_median"] / 1000


# --- (b)/(c) one trace under every policy --------------------------------------------------------------------

def run_trace(trace: str, policies: list[str], iterations: list[int], gap: float, out: dict) -> None:
    kinds = [TRACE_KINDS[trace](i) for i in range(len(iterations))]
    step_s = {k: calibrate_step_s(k) for k in sorted(set(kinds))} if "srtf-seconds" in policies else None
    what = {"tf1": "TF1 graph jobs", "tf2": "TF2 jobs (tf.function steps)",
            "mixed": "TF1 and TF2 jobs alternating (" + " ".join(k.upper() for k in kinds) + ")"}[trace]
    print(f"\n== trace {trace}: {len(iterations)} {what}, iterations {iterations} in arrival order, "
          f"{gap:g} s apart, fresh server per policy ({' '.join(TRACE_ISOLATION) or 'default isolation'})")
    print("(ideal: mean JCT on a zero-overhead lane at the measured iteration rate; setup: mean time from "
          "arrival to the end of a job's init run (TF1: session creation and init run; TF2: eager context and "
          "variables created, step function traced); ms/step: median step time seen by a client, queue wait included; iters/s: main iterations per "
          "second while jobs ran)")
    by_kind = len(set(kinds)) > 1
    print(f"{'policy':13} {'makespan s':>10} {'mean JCT s':>10} {'(ideal)':>7} {'p95 JCT s':>9} {'setup s':>7} "
          f"{'ms/step':>{15 if by_kind else 8}} {'iters/s':>7}  {'switch p50/p99 us':>18}  finish order (iterations)")
    runs: list[dict] = []
    weights: dict[str, float] | None = None  # relative step time per kind, from the FIFO run (each job alone)
    for policy in policies:
        r = bench_trace(policy, iterations, gap, step_s, kinds)
        r["trace"] = trace
        r["isolation"] = TRACE_ISOLATION[1] if TRACE_ISOLATION else "default"
        if weights is None or policy == "fifo":
            weights = r["step_ms_by_kind"]
        r["ideal_mean_jct"] = ideal_mean_jct(policy, iterations, gap,
                                             ideal_steps(iterations, kinds, weights, r["iters_per_s"]))
        runs.append(r)
        ideal = "-" if r["ideal_mean_jct"] is None else f"{r['ideal_mean_jct']:.2f}"
        order = " ".join(str(iterations[int(k[3:])]) for k in r["order"])
        sw = r["switch"]
        step = ("/".join(f"{r['step_ms_by_kind'][k]:.2f}" for k in sorted(r["step_ms_by_kind"])) if by_kind
                else f"{r['step_ms']:.2f}")
        print(f"{policy:13} {r['makespan']:>10.2f} {r['mean_jct']:>10.2f} {ideal:>7} {r['p95_jct']:>9.2f} "
              f"{r['setup']:>7.3f} {step:>{15 if by_kind else 8}} {r['iters_per_s']:>7.0f}  "
              f"{sw['p50']:>8.0f}/{sw['p99']:<9.0f}  {order}"
              + ("" if r["exit_code"] == 0 else f"  (server exit code {r['exit_code']})"), flush=True)
    if by_kind:
        print("(ms/step: TF1/TF2)")
    bad_devices = sorted({d for r in runs for d in r["devices"] if not d.startswith("/job:worker")})
    if bad_devices:
        print(f"WARNING: TF2 jobs' variables not on the server: {bad_devices}")
    summary = {"trace": trace, "kinds": kinds, "runs": runs, "step_weights": weights}
    by = {r["policy"]: r for r in runs}
    if "fifo" in by and "srtf" in by:
        ratio = by["fifo"]["mean_jct"] / by["srtf"]["mean_jct"]
        rate = 2 / (1 / by["fifo"]["iters_per_s"] + 1 / by["srtf"]["iters_per_s"])  # harmonic mean
        steps = ideal_steps(iterations, kinds, weights, rate)
        ideal = ideal_mean_jct("fifo", iterations, gap, steps) / ideal_mean_jct("srtf", iterations, gap, steps)
        off = ratio / ideal - 1
        within = abs(off) <= IDEAL_TOLERANCE
        summary.update(fifo_srtf_ratio=ratio, fifo_srtf_ratio_ideal=ideal, off_ideal=off, within_tolerance=within)
        print(f"\n[{trace}] FIFO/SRTF mean-JCT ratio: {ratio:.2f}; zero-overhead ideal on this trace {ideal:.2f}: "
              f"{off:+.1%} ({'within' if within else 'NOT within'} {IDEAL_TOLERANCE:.0%} of the ideal); "
              f"target >= {RATIO_TARGET:g}: {'ok' if ratio >= RATIO_TARGET else 'MISSED'}")
    out["traces"][trace] = summary
    if trace == "tf1":  # the keys of earlier versions of this script
        out["trace"] = runs
        for k in ("fifo_srtf_ratio", "fifo_srtf_ratio_ideal"):
            if k in summary:
                out[k] = summary[k]


# --- main --------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="quarter-length traces, no srtf-seconds, tf2 and mixed traces under fifo,srtf only, 2 s "
                         "latency runs under pack only (~3.5 min with both isolation modes)")
    ap.add_argument("--isolation", choices=tenants.ISOLATION_CHOICES, default="both",
                    help="salus-server isolation modes of the latency sections, side by side (default both); the "
                         "traces run on one: tenant when selected, else none")
    ap.add_argument("--tenant-pairs", default="tf1+tf1",
                    help="switch latency between two tenants' jobs: pairs of tiny jobs, each job its own token "
                         "tenant, comma-separated (tf1+tf1, tf2+tf2, tf1+tf2; '' skips); default tf1+tf1")
    ap.add_argument("--policies", default=None,
                    help="trace policies, comma-separated, for every trace (default fifo,srtf,fair,las,pack,"
                         "srtf-seconds; quick: without srtf-seconds, and fifo,srtf for the tf2 and mixed traces); "
                         "srtf-seconds is SRTF with seconds= hints from a calibration run")
    ap.add_argument("--traces", default="tf1,tf2,mixed",
                    help="which traces, comma-separated: tf1 (TF1 graph jobs), tf2 (TF2 tf.function jobs), mixed "
                         "(alternating TF1, TF2); default all three")
    ap.add_argument("--server-args", default="", help="extra salus-server flags for every server, e.g. "
                                                      "--server-args='--anticipation 0'")
    ap.add_argument("--latency-policies", default=None, help="default: pack,fair (quick: pack)")
    ap.add_argument("--latency-jobs", default="2,8", help="jobs per run of (a), comma-separated ('' skips (a))")
    ap.add_argument("--kind-pairs", default="tf1+tf1,tf2+tf2,tf1+tf2",
                    help="switch latency by job kind: pairs of tiny jobs busy at once, comma-separated ('' skips)")
    ap.add_argument("--latency-seconds", type=float, default=None, help="default 4 (quick: 2)")
    ap.add_argument("--gap", type=float, default=None,
                    help="seconds between trace arrivals (default 0.2 x scale: 0.4, quick 0.1)")
    ap.add_argument("--scale", type=float, default=None,
                    help="trace length factor for the iterations (default 2, quick 0.5)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-trace", action="store_true")
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    if not server_bin().exists():
        sys.exit(f"bench: {server_bin()} not found (build it or set SALUS_SERVER_BIN)")
    help_text = subprocess.run([str(server_bin()), "--help"], capture_output=True, text=True).stdout
    if "--policy" not in help_text:
        sys.exit(f"bench: {server_bin()} has no --policy flag (built before the scheduler)")
    if "--isolation" not in help_text:
        sys.exit(f"bench: {server_bin()} has no --isolation flag (built before tenant isolation)")
    traces = [t for t in args.traces.split(",") if t]
    if set(traces) - set(TRACE_KINDS):
        ap.error(f"--traces: unknown {sorted(set(traces) - set(TRACE_KINDS))}; known: {', '.join(TRACE_KINDS)}")
    def parse_pairs(flag: str, value: str) -> list[tuple[str, ...]]:
        out = []
        for p in filter(None, value.split(",")):
            pair = tuple(sorted(p.split("+")))
            if pair not in PAIR_LABEL:
                ap.error(f"{flag}: {p!r} is not one of tf1+tf1, tf2+tf2, tf1+tf2")
            out.append(pair)
        return out

    pairs = parse_pairs("--kind-pairs", args.kind_pairs)
    tenant_pairs = parse_pairs("--tenant-pairs", args.tenant_pairs)
    SERVER_ARGS.extend(args.server_args.split())
    if any(a.startswith(("--isolation", "--tenants-file")) for a in SERVER_ARGS):
        ap.error("--server-args: give the isolation mode with --isolation; the tenants file is written here")
    modes = tenants.modes(args.isolation)
    TRACE_ISOLATION.extend(tenants.isolation_flags("tenant" if "tenant" in modes else "none"))
    scale = args.scale if args.scale is not None else (0.5 if args.quick else 2.0)
    args.gap = args.gap if args.gap is not None else 0.2 * scale
    lat_seconds = args.latency_seconds or (2.0 if args.quick else 4.0)
    lat_policies = (args.latency_policies or ("pack" if args.quick else "pack,fair")).split(",")
    out: dict = {"latency": [], "latency_by_kind": [], "latency_two_tenants": [], "trace": [], "traces": {},
                 "isolation": modes, "trace_isolation": TRACE_ISOLATION[1]}
    t_start = time.monotonic()

    def ok(r: dict) -> bool:
        # A switch also includes the go-ahead's handover to the thread that runs the iteration (under tenant
        # isolation in the executor process); the sum of the two percentiles bounds the whole switch's (the two
        # are measured separately).
        p50 = r["p50"] + r.get("handover_p50", 0.0)
        p99 = r["p99"] + r.get("handover_p99", 0.0)
        return r["count"] > 0 and p50 <= LATENCY_TARGET_US["p50"] and p99 <= LATENCY_TARGET_US["p99"]

    def exit_note(r: dict) -> str:
        return "" if r["exit_code"] == 0 else f"  (server exit code {r['exit_code']})"

    jobs_list = [int(x) for x in args.latency_jobs.split(",") if x.strip()]
    if not args.skip_latency and jobs_list:
        print(f"== switch latency: tiny main iterations of one tenant, {lat_seconds:g} s per run, fresh server "
              f"each, targets median <= {LATENCY_TARGET_US['p50']:g} us, p99 <= {LATENCY_TARGET_US['p99']:g} us")
        print(f"{'policy':8} {'jobs':>4} {'isolation':9} {'samples':>8} {'median us':>10} {'p99 us':>9} "
              f"{'max us':>9} {'iters':>7} {'ms/step':>8}  verdict")
        for policy in lat_policies:
            for n in jobs_list:
                for mode in modes:
                    r = bench_latency(n, policy, lat_seconds, isolation=mode)
                    out["latency"].append(r)
                    print(f"{policy:8} {n:>4} {mode:9} {r['count']:>8} {r['p50']:>10.1f} {r['p99']:>9.1f} "
                          f"{r['max']:>9.1f} {r['iterations_total']:>7} {r['step_ms_median']:>8.2f}  "
                          f"{'ok' if ok(r) else 'MISSED'}{exit_note(r)}", flush=True)
    if not args.skip_latency and pairs:
        print(f"\n== switch latency by job kind: 2 tiny jobs of one tenant busy at once (TF2: a tf.function named "
              f"salus_main_iter, every call a main iteration), {lat_seconds:g} s per run, fresh server each; "
              f"with 2 jobs every switch is from one to the other")
        print(f"{'policy':8} {'jobs':8} {'isolation':9} {'samples':>8} {'median us':>10} {'p99 us':>9} {'max us':>9} "
              f"{'iters':>7} {'ms/step':>11}  verdict")
        for policy in lat_policies:
            row = []
            for pair in pairs:
                for mode in modes:
                    r = bench_latency(2, policy, lat_seconds, list(pair), isolation=mode)
                    r["pair"] = PAIR_LABEL[pair]
                    out["latency_by_kind"].append(r)
                    step = "/".join(f"{r['step_ms_by_kind'][k]:.2f}" for k in sorted(r["step_ms_by_kind"]))
                    print(f"{policy:8} {r['pair']:8} {mode:9} {r['count']:>8} {r['p50']:>10.1f} {r['p99']:>9.1f} "
                          f"{r['max']:>9.1f} {r['iterations_total']:>7} {step:>11}  "
                          f"{'ok' if ok(r) else 'MISSED'}{exit_note(r)}", flush=True)
                    row.append(f"{r['pair']} {mode} {r['p50']:.1f}/{r['p99']:.1f}")
            print(f"{policy}: switch latency median/p99 us: " + ", ".join(row))
    if not args.skip_latency and tenant_pairs:
        with tenants.Tenants(["t0", "t1"]) as tenant_file:
            print(f"\n== switch between two tenants' jobs: 2 tiny jobs busy at once, each its own tenant (a token "
                  f"of its own; on the tenant-mode server each tenant's own executor process), {lat_seconds:g} s "
                  f"per run, fresh server each; targets median <= {LATENCY_TARGET_US['p50']:g} us, p99 <= "
                  f"{LATENCY_TARGET_US['p99']:g} us (exec: executor processes the server started)")
            print(f"{'policy':8} {'jobs':8} {'isolation':9} {'exec':>4} {'samples':>8} {'median us':>10} "
                  f"{'p99 us':>9} {'max us':>9} {'iters':>7} {'ms/step':>11}  verdict")
            side_by_side = []
            for policy in lat_policies:
                for pair in tenant_pairs:
                    by_mode = {}
                    for mode in modes:
                        r = bench_latency(2, policy, lat_seconds, list(pair), isolation=mode, tenant_file=tenant_file)
                        r["pair"] = PAIR_LABEL[pair]
                        out["latency_two_tenants"].append(r)
                        by_mode[mode] = r
                        step = "/".join(f"{r['step_ms_by_kind'][k]:.2f}" for k in sorted(r["step_ms_by_kind"]))
                        print(f"{policy:8} {r['pair']:8} {mode:9} {r['executors']!s:>4} {r['count']:>8} "
                              f"{r['p50']:>10.1f} {r['p99']:>9.1f} {r['max']:>9.1f} {r['iterations_total']:>7} "
                              f"{step:>11}  {'ok' if ok(r) else 'MISSED'}{exit_note(r)}", flush=True)
                    cols = [f"{m} {r['p50']:.1f}/{r['p99']:.1f} us"
                            + (f" + handover {r['handover_p50']:.1f}/{r['handover_p99']:.1f} us"
                               if r["handover_p50"] else "")
                            + f" ({'ok' if ok(r) else 'MISSED'})"
                            for m, r in by_mode.items()]
                    line = f"{policy:8} {PAIR_LABEL[pair]:8} two tenants: switch median/p99 " + ", ".join(cols)
                    if "tenant" in by_mode and "none" in by_mode and by_mode["none"]["p50"] > 0:
                        whole = {m: by_mode[m]["p50"] + by_mode[m]["handover_p50"] for m in ("tenant", "none")}
                        line += f"; tenant/none median with handovers {whole['tenant'] / whole['none']:.2f}x"
                    side_by_side.append(line)
            print("\n" + "\n".join(side_by_side), flush=True)

    if not args.skip_trace:
        iterations = [max(4, round(n * scale)) for n in TRACE]
        for trace in traces:
            if args.policies:
                policies = args.policies.split(",")
            elif args.quick:
                policies = ["fifo", "srtf", "fair", "las", "pack"] if trace == "tf1" else ["fifo", "srtf"]
            else:
                policies = ["fifo", "srtf", "fair", "las", "pack", "srtf-seconds"]
            run_trace(trace, policies, iterations, args.gap, out)
        if out["traces"]:
            print("\n== FIFO/SRTF mean-JCT ratio per trace (zero-overhead ideal; within "
                  f"{IDEAL_TOLERANCE:.0%}?)")
            for trace, t in out["traces"].items():
                if "fifo_srtf_ratio" in t:
                    print(f"  {trace:6} {t['fifo_srtf_ratio']:.2f} vs ideal {t['fifo_srtf_ratio_ideal']:.2f} "
                          f"({t['off_ideal']:+.1%}): {'within' if t['within_tolerance'] else 'NOT within'}")
            # The schedule must never change a job's numbers: the same job (kind, seed, steps) gives the same
            # losses under every policy and in every trace.
            digests: dict = {}
            for t in out["traces"].values():
                for r in t["runs"]:
                    for k, d in r["digests"].items():
                        i = int(k[3:])
                        digests.setdefault((t["kinds"][i], k, iterations[i]), set()).add(d)
            same = all(len(v) == 1 for v in digests.values())
            print(f"per-job loss digests identical across policies and traces: "
                  f"{'yes' if same else 'NO: ' + str({str(k): sorted(v) for k, v in digests.items() if len(v) > 1})}")

    print(f"\n(total {time.monotonic() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
