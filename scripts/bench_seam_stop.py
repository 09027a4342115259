#!/usr/bin/env python3
"""What a tenant that stops its own executor costs another tenant (issue 58).

One salus-server (--isolation tenant, its defaults: --lane-hold-limit 60, --silence-limit 1), two token
tenants, bench-a and bench-b. bench-b's job is a 60-step TF1 CNN (integration_tests/workloads/sched_job.py
--model cnn_small --force-main --step-times); bench-a's a heavy MLP (mlp_large) that trains until told to stop.
bench-b's job runs four times, each a fresh client process (its TensorFlow import is not in its step times):

  solo      bench-b alone
  beside    bench-a trains beside it (fair share: what sharing the device costs, for context)
  stopped   bench-a's executor is SIGSTOPped while its job trains (before the fix: b waited out the 60 s
            --lane-hold-limit)
  flapping  bench-a's executor is stopped and continued in a loop (--flap-ms stopped, as long running)

For each it prints bench-b's median and max step time, their ratios to solo, and whether its losses equal the
solo run's (they must: "B's numbers are exact"). Targets: stopped and flapping median <= 1.5x solo; max <=
solo max + quantum + 1 s, where the quantum is --silence-limit (a stop of an executor the supervisor started
is seen at once; the quantum bounds a silent one). --repeat K runs the whole set K times and prints min,
median and max of each ratio.

    .venv/bin/python scripts/bench_seam_stop.py [--repeat 3] [--steps 60] [--flap-ms 200]
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
JOB = REPO / "integration_tests" / "workloads" / "sched_job.py"
SERVER = Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))
PYTHON = str(REPO / ".venv" / "bin" / "python")
QUANTUM_S = 1.0  # the server's --silence-limit default


def start_server(args: list[str], log) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([str(SERVER), *args], stdout=subprocess.PIPE, stderr=log, text=True)
    found: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            if "listening on" in line:
                found.append(line.split()[-1])
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(120):
        raise SystemExit("the server did not start")
    return proc, found[0]


def ctl(address: str, *args: str) -> str:
    return subprocess.run([str(SERVER.with_name("salus")), "--server", address, *args], check=True, capture_output=True,
                          text=True, timeout=60).stdout


def job(address: str, token: str, name: str, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "SALUS_TOKEN": token, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([PYTHON, str(JOB), "--target", f"grpc://{address}", "--name", name, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"a job failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def executor_of(address: str, tenant: str) -> int:
    for e in json.loads(ctl(address, "info", "--json"))["executors"]:
        if e["tenant"] == tenant:
            return e["pid"]
    raise SystemExit(f"no executor for {tenant}")


def iterations_of(address: str, name: str) -> int:
    rows = json.loads(ctl(address, "jobs", "--json"))["jobs"]
    return max((r.get("iterations", 0) for r in rows if r["name"].split("?")[0] == name), default=0)


def run_b(address: str, token: str, steps: int, name: str) -> dict:
    return result(job(address, token, name, ["--model", "cnn_small", "--force-main", "--steps", str(steps),
                                             "--step-times", "--seed", "5"]))


def one_set(address: str, tokens: dict, steps: int, flap_s: float, work: Path, n: int) -> dict:
    # bench-b's executor is warm (started, its kernels built) before its solo run, as in the other phases.
    run_b(address, tokens["b"], 5, f"b-warm-{n}")
    out = {"solo": run_b(address, tokens["b"], steps, f"b-solo-{n}")}
    for phase in ("beside", "stopped", "flapping"):
        stop_file = work / f"stop-a-{n}-{phase}"
        a_name = f"a-{phase}-{n}"
        a = job(address, tokens["a"], a_name, ["--model", "mlp_large", "--steps", "5", "--stop-file",
                                               str(stop_file), "--digest-only"])
        while iterations_of(address, a_name) < 5:
            if a.poll() is not None:
                raise SystemExit(a.communicate()[1][-3000:])
            time.sleep(0.2)
        pid = executor_of(address, "bench-a")
        flapping = threading.Event()
        flapper = None
        if phase == "stopped":
            os.kill(pid, signal.SIGSTOP)
        elif phase == "flapping":
            flapping.set()

            def flap():
                while flapping.is_set():
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(flap_s)
                    os.kill(pid, signal.SIGCONT)
                    time.sleep(flap_s)

            flapper = threading.Thread(target=flap, daemon=True)
            flapper.start()
        try:
            out[phase] = run_b(address, tokens["b"], steps, f"b-{phase}-{n}")
        finally:
            flapping.clear()
            if flapper:
                flapper.join()
            os.kill(pid, signal.SIGCONT)
            stop_file.touch()
        result(a)  # bench-a's job ends cleanly after all
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--flap-ms", type=float, default=200)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="salus-bench-seam-"))
    log = open(work / "server.log", "w")
    server, address = start_server(["--listen", "127.0.0.1:0", "--state-dir", str(work / "state")], log)
    try:
        tokens = {t: ctl(address, "token", "issue", "--tenant", f"bench-{t}").strip() for t in ("a", "b")}
        ratios: dict[str, dict[str, list[float]]] = {}
        for n in range(args.repeat):
            runs = one_set(address, tokens, args.steps, args.flap_ms / 1000, work, n)
            solo = runs["solo"]
            solo_med, solo_max = solo["step_ms_median"], max(solo["step_ms"])
            print(f"set {n + 1}: bench-b solo: median {solo_med:.1f} ms, max {solo_max:.1f} ms")
            for phase in ("beside", "stopped", "flapping"):
                r = runs[phase]
                med, mx = r["step_ms_median"], max(r["step_ms"])
                bound_ms = solo_max + (QUANTUM_S + 1.0) * 1000
                ratios.setdefault(phase, {}).setdefault("median", []).append(med / solo_med)
                ratios[phase].setdefault("max_over_bound", []).append(mx / bound_ms)
                print(f"  {phase:9s} median {med:7.1f} ms ({med / solo_med:.2f}x solo)  max {mx:7.1f} ms "
                      f"({mx / solo_max:.2f}x solo; bound {bound_ms:.0f} ms: {'within' if mx <= bound_ms else 'PAST'})"
                      f"  losses equal solo's: {r['digest'] == solo['digest']}")
        if args.repeat > 1:
            print(f"over {args.repeat} sets (min / median / max):")
            for phase, by in ratios.items():
                for what, values in by.items():
                    print(f"  {phase:9s} {what:15s} {min(values):.2f} / {statistics.median(values):.2f} / "
                          f"{max(values):.2f}")
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
        print(f"server log: {work / 'server.log'}")


if __name__ == "__main__":
    sys.exit(main())
