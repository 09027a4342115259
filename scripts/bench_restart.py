#!/usr/bin/env python3
"""The pause a training job sees across a restart of the server (issue 53).

A TF1 graph job (integration_tests/workloads/restart_job.py: an MLP step every ~20 ms) trains through one
salus-server (--isolation tenant) while the server is restarted N times (default 10): SIGTERM, then the same
command line (the keeper hands the listening socket on; the new supervisor adopts the executor). For each
restart it prints the longest gap between two of the job's steps around it, and the pause (that gap less the
job's median step); then p50 and max over the restarts, and the same for SIGUSR2 (an in-place upgrade) with
--upgrade. (That the job's numbers are its in-process ones is integration_tests/test_restart.py's to check.)

    .venv/bin/python scripts/bench_restart.py [--restarts 10] [--upgrade]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "integration_tests" / "workloads" / "restart_job.py"
SERVER = Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))
PYTHON = str(REPO / ".venv" / "bin" / "python")


def start_server(args: list[str], log) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen([str(SERVER), *args], stdout=subprocess.PIPE, stderr=log, text=True)
    lines: list[str] = []
    found = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(120):
        raise SystemExit("the server did not start")
    address = next(line.split()[-1] for line in lines if "listening on" in line)
    return proc, address, lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--upgrade", action="store_true", help="restart by SIGUSR2 (exec in place) instead")
    ap.add_argument("--pace", type=float, default=0.01)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="salus-bench-restart-"))
    log = open(work / "server.log", "w")
    server_args = ["--listen", "127.0.0.1:0", "--state-dir", str(work / "state")]
    server, address, lines = start_server(server_args, log)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    steps = 4000
    job = subprocess.Popen([PYTHON, str(JOB), "--kind", "tf1", "--target", f"grpc://{address}", "--steps",
                            str(steps), "--pace", str(args.pace)], stdout=subprocess.PIPE, text=True, env=env)
    times: list[float] = []

    def read_job():
        for line in job.stdout:
            msg = json.loads(line)
            if "step" in msg:
                times.append(msg["t"])

    threading.Thread(target=read_job, daemon=True).start()
    while len(times) < 50:
        time.sleep(0.05)
    restarts: list[float] = []
    for _ in range(args.restarts):
        time.sleep(1.0)
        at = time.time()
        if args.upgrade:
            seen = len(lines)
            server.send_signal(signal.SIGUSR2)
            while not any("listening on" in line for line in lines[seen:]):
                time.sleep(0.01)
        else:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
            server, _, lines = start_server(server_args, log)
        restarts.append(at)
        n = len(times)
        while len(times) < n + 20:
            if job.poll() is not None:
                raise SystemExit("the job ended during the restarts: raise --steps")
            time.sleep(0.05)
    time.sleep(1.0)
    gaps = [b - a for a, b in zip(times, times[1:])]
    step = statistics.median(gaps)
    pauses = []
    for at, until in zip(restarts, restarts[1:] + [float("inf")]):
        # The steps from this restart to the next one.
        around = [b - a for a, b in zip(times, times[1:]) if b >= at and a < until]
        pauses.append(max(around) - step)
    server.send_signal(signal.SIGINT)
    server.wait(60)
    job.kill()
    how = "SIGUSR2 (in-place upgrade)" if args.upgrade else "SIGTERM, then the same command line"
    print(f"restarts: {len(pauses)} by {how}; the job's median step {step * 1000:.1f} ms")
    for i, p in enumerate(pauses, 1):
        print(f"  restart {i:2d}: pause {p:.3f} s")
    print(f"pause across a restart: p50 {statistics.median(pauses):.3f} s, max {max(pauses):.3f} s "
          f"(min {min(pauses):.3f} s)")
    print(f"server log: {work / 'server.log'}")


if __name__ == "__main__":
    sys.exit(main())
