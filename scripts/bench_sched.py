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
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB_SCRIPT = REPO / "integration_tests" / "workloads" / "sched_job.py"
LISTEN_RE = re.compile(r"^salus-server listening on (127\.0\.0\.1:\d+)\s*$")
TRACE = [500, 25, 250, 15, 125, 30]  # iterations, in arrival order: heavy-tailed, like training traces
LATENCY_TARGET_US = {"p50": 50.0, "p99": 500.0}
RATIO_TARGET = 2.0
SERVER_ARGS: list[str] = []  # --server-args


def server_bin() -> Path:
    return Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))


def python() -> str:
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def child_env() -> dict:
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", PYTHONHASHSEED="0")
    return env


class Server:
    """A salus-server we started on a free port; stopped by its own PID."""

    def __init__(self, *flags: str, timeout: float = 90):
        self.log = tempfile.NamedTemporaryFile(prefix="salus-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([str(server_bin()), "--listen", "127.0.0.1:0", *flags],
                                     stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True)
        self.pid = self.proc.pid
        found: list[str] = []
        ready = threading.Event()

        def reader():
            for line in self.proc.stdout:  # keep draining so the pipe never fills
                m = LISTEN_RE.match(line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(timeout) or not found:
            self.stop()
            sys.exit(f"bench: salus-server {' '.join(flags)} did not start (exit code {self.proc.poll()}); "
                     f"log: {self.log.name}")
        self.address = found[0]
        self.target = f"grpc://{self.address}"

    def ctl(self, *args: str):
        proc = subprocess.run([str(server_bin()), "ctl", "--server", self.address, *args],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            sys.exit(f"bench: ctl {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-1000:]}")
        return json.loads(proc.stdout) if "--json" in args else proc.stdout

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


class Job:
    """A sched_job.py child; imports TF and builds its graph, then waits for its go file."""

    def __init__(self, tmp: Path, key: str, args: list[str]):
        self.key = key
        self.ready = tmp / f"{key}.ready"
        self.go_file = tmp / f"{key}.go"
        self.proc = subprocess.Popen([python(), str(JOB_SCRIPT), "--ready-file", str(self.ready),
                                      "--go-file", str(self.go_file), "--digest-only", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=child_env(), stdin=subprocess.DEVNULL)

    def release(self, target: str) -> None:
        tmp = self.go_file.with_suffix(".tmp")
        tmp.write_text(target)
        tmp.rename(self.go_file)

    def result(self, timeout: float = 600) -> dict:
        out, err = self.proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if self.proc.returncode != 0 or not lines:
            sys.exit(f"bench: job {self.key} failed ({self.proc.returncode}):\n{err[-3000:]}")
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child
            self.proc.wait()


def wait_ready(jobs: list[Job], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(j.ready.exists() for j in jobs):
        dead = [j for j in jobs if j.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            err = dead[0].proc.stderr.read()[-3000:] if dead else "timeout"
            sys.exit(f"bench: jobs did not get ready: {err}")
        time.sleep(0.02)


def run_jobs(server: Server, specs: list[tuple[str, list[str], float]]) -> dict[str, dict]:
    """specs: (key, sched_job args, arrival offset in s). Returns each job's result line."""
    with tempfile.TemporaryDirectory(prefix="salus-bench-") as d:
        jobs = [Job(Path(d), key, args) for key, args, _ in specs]
        try:
            wait_ready(jobs)
            t0 = time.monotonic()
            for job, (_, _, offset) in sorted(zip(jobs, specs), key=lambda p: p[1][2]):
                delay = t0 + offset - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                job.release(server.target)
            return {job.key: job.result() for job in jobs}
        finally:
            for job in jobs:
                job.kill()


def switch_latency(stats: dict) -> dict:
    return stats["switch_latency_us"]


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# --- (a) switch latency ------------------------------------------------------------------------------------

def bench_latency(n_jobs: int, policy: str, seconds: float) -> dict:
    server = Server("--policy", policy, *SERVER_ARGS)
    try:
        specs = [(f"tiny{i}", ["--tiny", "--force-main", "--seed", str(i + 1), "--seconds", str(seconds),
                               "--name", f"tiny{i}"], 0.0) for i in range(n_jobs)]
        results = run_jobs(server, specs)
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
        results = run_jobs(server, trace_specs(policy, iterations, gap, step_s))
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
        res = run_jobs(server, [("calib", ["--seed", "99", "--steps", "40", "--name", "calib"], 0.0)])
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
