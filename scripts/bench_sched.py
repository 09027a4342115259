#!/usr/bin/env python3
"""Benchmark of salus-server's iteration scheduler, with real TensorFlow clients.

(a) Switch latency: N concurrent jobs (2, then 8), each a loop of tiny steps made main iterations by a
    `salus_main_iter` identity node in the fetches, against a fresh server; the server measures the time from
    the end of one job's iteration to the start of another job's queued iteration in the same lane and
    `salus-server ctl stats --json` reports it. Printed: count, median, p99, max against the targets
    (median <= 50 us, p99 <= 500 us).
(b) A trace: six training jobs of the same per-step cost (an MLP step of several ms) and mixed lengths
    (500, 25, 250, 15, 125, 30 iterations, times --scale: 2 by default) arriving 0.2 s x scale apart
    (--gap), longest first, run once per policy against a fresh server each. Printed per policy: makespan,
    mean and p95 job completion time (JCT = end of a job's last step - its arrival), and the FIFO/SRTF
    mean-JCT ratio (target >= 2). The ratio depends on the trace as much as on the server: next to the
    measured figures the script prints what a zero-overhead lane running the same trace at the measured
    iteration rate would give ("ideal"). `srtf` jobs carry `iterations=N` hints (session_metadata.name);
    `srtf-seconds` carries `seconds=` hints from a calibration run instead; other policies get no hints.

Job processes import TensorFlow and build their graphs before the clock starts (they wait for a go file), so
TensorFlow's slow import is not part of any JCT. Every job's losses digest is compared across policies:
the schedule must never change a job's numbers.

  .venv/bin/python scripts/bench_sched.py [--quick] [--policies fifo,srtf,...] [--skip-latency|--skip-trace]

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

from trace_jobs import Server, pct, run_jobs, server_bin

TRACE = [500, 25, 250, 15, 125, 30]  # iterations, in arrival order: heavy-tailed, like training traces
LATENCY_TARGET_US = {"p50": 50.0, "p99": 500.0}
RATIO_TARGET = 2.0
SERVER_ARGS: list[str] = []  # --server-args


def switch_latency(stats: dict) -> dict:
    return stats["switch_latency_us"]


# --- (a) switch latency ------------------------------------------------------------------------------------

def bench_latency(n_jobs: int, policy: str, seconds: float) -> dict:
    server = Server("--policy", policy, *SERVER_ARGS)
    try:
        specs = [(f"tiny{i}", ["--tiny", "--force-main", "--seed", str(i + 1), "--seconds", str(seconds),
                               "--name", f"tiny{i}"], 0.0) for i in range(n_jobs)]
        _, results = run_jobs(server.target, specs)
        stats = server.ctl("stats", "--json")
    finally:
        code = server.stop()
    lat = switch_latency(stats)
    steps = sum(r["steps"] for r in results.values())
    return {"jobs": n_jobs, "policy": policy, "count": lat["count"], "p50": lat["p50"], "p99": lat["p99"],
            "max": lat["max"], "iterations_total": stats["iterations_total"], "client_steps": steps,
            "step_ms_median": statistics.median(r["step_ms_median"] for r in results.values()),
            "exit_code": code}


# --- (b) trace ---------------------------------------------------------------------------------------------

def trace_specs(policy: str, iterations: list[int], gap: float, step_s: float | None) -> list:
    specs = []
    for i, n in enumerate(iterations):
        name = f"job{i}-{n}"
        if policy == "srtf":
            name += f"?iterations={n}"
        elif policy == "srtf-seconds":
            name += f"?seconds={n * step_s:.3f}"
        specs.append((f"job{i}", ["--seed", str(100 + i), "--steps", str(n), "--name", name], i * gap))
    return specs


def bench_trace(policy: str, iterations: list[int], gap: float, step_s: float | None) -> dict:
    server_policy = "srtf" if policy.startswith("srtf") else policy
    server = Server("--policy", server_policy, *SERVER_ARGS)
    try:
        _, results = run_jobs(server.target, trace_specs(policy, iterations, gap, step_s))
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
            "iters_per_s": stats["iterations_total"] / (max(r["end"] for r in results.values()) -
                                                        min(r["start"] for r in results.values())),
            "switch": switch_latency(stats), "iterations_total": stats["iterations_total"], "exit_code": code}


def ideal_mean_jct(policy: str, iterations: list[int], gap: float, step_s: float) -> float | None:
    """Mean JCT of the trace on a zero-overhead lane running one iteration at a time (job i arrives at
    i * gap), for the policies with a simple model; None for the others."""
    if policy not in ("fifo", "srtf", "srtf-seconds", "las"):
        return None
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
            j = min(ready, key=lambda i: (left[i], i))
        t += step_s
        left[j] -= 1
        attained[j] += 1
        if not left[j]:
            done[j] = t
    return statistics.mean(d - a for d, a in zip(done, arrival))


def calibrate_step_s() -> float:
    """Seconds per step of the trace's job alone on a server (for srtf-seconds hints)."""
    server = Server(*SERVER_ARGS)
    try:
        _, res = run_jobs(server.target, [("calib", ["--seed", "99", "--steps", "40", "--name", "calib"], 0.0)])
    finally:
        server.stop()
    return res["calib"]["step_ms_median"] / 1000


# --- main --------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="quarter-length trace, no srtf-seconds, 2 s latency runs under pack only (~1.5 min)")
    ap.add_argument("--policies", default=None,
                    help="trace policies, comma-separated (default fifo,srtf,fair,las,pack,srtf-seconds; quick: "
                         "without srtf-seconds); srtf-seconds is SRTF with seconds= hints from a calibration run")
    ap.add_argument("--server-args", default="", help="extra salus-server flags for every server, e.g. "
                                                      "--server-args='--anticipation-us 0'")
    ap.add_argument("--latency-policies", default=None, help="default: pack,fair (quick: pack)")
    ap.add_argument("--latency-jobs", default="2,8")
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
    SERVER_ARGS.extend(args.server_args.split())
    scale = args.scale if args.scale is not None else (0.5 if args.quick else 2.0)
    args.gap = args.gap if args.gap is not None else 0.2 * scale
    lat_seconds = args.latency_seconds or (2.0 if args.quick else 4.0)
    lat_policies = (args.latency_policies or ("pack" if args.quick else "pack,fair")).split(",")
    out: dict = {"latency": [], "trace": []}
    t_start = time.monotonic()

    if not args.skip_latency:
        print(f"== switch latency: tiny main iterations, {lat_seconds:g} s per run, targets "
              f"median <= {LATENCY_TARGET_US['p50']:g} us, p99 <= {LATENCY_TARGET_US['p99']:g} us")
        print(f"{'policy':8} {'jobs':>4} {'samples':>8} {'median us':>10} {'p99 us':>9} {'max us':>9} "
              f"{'iters':>7} {'ms/step':>8}  verdict")
        for policy in lat_policies:
            for n in (int(x) for x in args.latency_jobs.split(",")):
                r = bench_latency(n, policy, lat_seconds)
                out["latency"].append(r)
                ok = (r["count"] > 0 and r["p50"] <= LATENCY_TARGET_US["p50"]
                      and r["p99"] <= LATENCY_TARGET_US["p99"])
                print(f"{policy:8} {n:>4} {r['count']:>8} {r['p50']:>10.1f} {r['p99']:>9.1f} {r['max']:>9.1f} "
                      f"{r['iterations_total']:>7} {r['step_ms_median']:>8.2f}  {'ok' if ok else 'MISSED'}"
                      + ("" if r["exit_code"] == 0 else f"  (server exit code {r['exit_code']})"), flush=True)

    if not args.skip_trace:
        iterations = [max(4, round(n * scale)) for n in TRACE]
        policies = (args.policies or ("fifo,srtf,fair,las,pack" if args.quick
                                      else "fifo,srtf,fair,las,pack,srtf-seconds")).split(",")
        step_s = calibrate_step_s() if "srtf-seconds" in policies else None
        print(f"\n== trace: {len(iterations)} jobs, iterations {iterations} in arrival order, "
              f"{args.gap:g} s apart, fresh server per policy")
        print("(ideal: mean JCT on a zero-overhead lane at the measured iteration rate; setup: mean time from "
              "arrival to the end of a job's init run (session creation); ms/step: median RunStep time seen by "
              "a client, queue wait included; iters/s: main iterations per second while jobs ran)")
        print(f"{'policy':13} {'makespan s':>10} {'mean JCT s':>10} {'(ideal)':>7} {'p95 JCT s':>9} {'setup s':>7} "
              f"{'ms/step':>8} {'iters/s':>7}  {'switch p50/p99 us':>18}  finish order (iterations)")
        for policy in policies:
            r = bench_trace(policy, iterations, args.gap, step_s)
            r["ideal_mean_jct"] = ideal_mean_jct(policy, iterations, args.gap, 1 / r["iters_per_s"])
            out["trace"].append(r)
            ideal = "-" if r["ideal_mean_jct"] is None else f"{r['ideal_mean_jct']:.2f}"
            order = " ".join(str(iterations[int(k[3:])]) for k in r["order"])
            sw = r["switch"]
            print(f"{policy:13} {r['makespan']:>10.2f} {r['mean_jct']:>10.2f} {ideal:>7} {r['p95_jct']:>9.2f} {r['setup']:>7.3f} "
                  f"{r['step_ms']:>8.2f} {r['iters_per_s']:>7.0f}  {sw['p50']:>8.0f}/{sw['p99']:<9.0f}  {order}"
                  + ("" if r["exit_code"] == 0 else f"  (server exit code {r['exit_code']})"), flush=True)
        by = {r["policy"]: r for r in out["trace"]}
        if "fifo" in by and "srtf" in by:
            ratio = by["fifo"]["mean_jct"] / by["srtf"]["mean_jct"]
            out["fifo_srtf_ratio"] = ratio
            step = 2 / (by["fifo"]["iters_per_s"] + by["srtf"]["iters_per_s"])
            ideal = ideal_mean_jct("fifo", iterations, args.gap, step) / ideal_mean_jct(
                "srtf", iterations, args.gap, step)
            out["fifo_srtf_ratio_ideal"] = ideal
            print(f"\nFIFO/SRTF mean-JCT ratio: {ratio:.2f} (target >= {RATIO_TARGET:g}: "
                  f"{'ok' if ratio >= RATIO_TARGET else 'MISSED'}; a zero-overhead lane would give {ideal:.2f} "
                  f"on this trace)")
        digests = {k: {r["digests"][k] for r in out["trace"]} for k in out["trace"][0]["digests"]} \
            if out["trace"] else {}
        same = all(len(v) == 1 for v in digests.values())
        print(f"per-job loss digests identical across policies: {'yes' if same else 'NO: ' + str(digests)}")

    print(f"\n(total {time.monotonic() - t_start:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
