"""Shared plumbing of the scheduler benchmarks (bench_sched.py, real_trace.py, validate_sim.py).

- `Server`: a salus-server started on a free port (stopped by its own PID), with a fresh state directory unless
  its flags name one; `require_server()` exits with a clear message when the binary is missing.
- `Job` / `run_jobs`: integration_tests/workloads/sched_job.py children (TF1 graph sessions) that import
  TensorFlow and build their graphs first, then wait for a go file; `run_jobs` releases them at given offsets (or
  one after another) so TensorFlow's slow import is never inside a measured time. The go file holds the target: a
  server's `grpc://...`, or "" to run the job in-process. A spec of kind "tf2" runs
  integration_tests/workloads/tf2_sched_job.py instead (the same model and step as TF2 code: a tf.function called
  per step), with SALUS_SERVER set from the target when the job is started (its eager context opens at its first
  op, after the go; "" runs it in-process) and its --name's hints ("NAME?iterations=N&seconds=S&priority=P") as SALUS_* variables.
- Trace CSV (`job_id,model,iterations,submit_time_s,duration_s`) reading and writing, and the summary figures
  of a run (makespan, mean and p95 JCT).
"""

from __future__ import annotations

import csv
import json
import math
import os
import queue
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB_SCRIPT = REPO / "integration_tests" / "workloads" / "sched_job.py"
TF2_JOB_SCRIPT = REPO / "integration_tests" / "workloads" / "tf2_sched_job.py"
KINDS = ("tf1", "tf2")
HINT_ENV = {"iterations": "SALUS_EXPECTED_ITERATIONS", "seconds": "SALUS_EXPECTED_SECONDS",
            "priority": "SALUS_PRIORITY"}
LISTEN_RE = re.compile(r"^salus-server listening on (127\.0\.0\.1:\d+)\s*$")
TRACE_FIELDS = ["job_id", "model", "iterations", "submit_time_s", "duration_s"]


def server_bin() -> Path:
    return Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))


def require_server(prog: str) -> Path:
    """The server binary, or exit 2 with a message naming it."""
    path = server_bin()
    if not path.is_file() or not os.access(path, os.X_OK):
        sys.stderr.write(f"{prog}: salus-server binary not found at {path}\n"
                         f"  build it (cargo build --release --bins, or scripts/setup.sh) or set SALUS_SERVER_BIN\n")
        sys.exit(2)
    return path


def python() -> str:
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def child_env() -> dict:
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", PYTHONHASHSEED="0")
    return env


def tf2_child_env(target: str, args: list[str]) -> dict:
    """A TF2 job's environment: none of the caller's SALUS_* settings, no TF_USE_LEGACY_KERAS; SALUS_SERVER from
    the target ("" = in-process) and the job's name and hints from its --name (a session_metadata-style
    "NAME?iterations=N&seconds=S&priority=P", which the adapter takes as SALUS_JOB_NAME + SALUS_* hints)."""
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_") and k != "TF_USE_LEGACY_KERAS"}
    if target:
        env["SALUS_SERVER"] = target.removeprefix("grpc://")
    name = args[args.index("--name") + 1] if "--name" in args else ""
    base, _, query = name.partition("?")
    if base:
        env["SALUS_JOB_NAME"] = base
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        if key not in HINT_ENV:
            raise ValueError(f"job name {name!r}: unknown hint {key!r}")
        env[HINT_ENV[key]] = value
    return env


class Server:
    """A salus-server we started on a free port; stopped by its own PID."""

    def __init__(self, *flags: str, timeout: float = 90):
        self.log = tempfile.NamedTemporaryFile(prefix="salus-bench-", suffix=".log", delete=False)
        # A state directory of its own unless the caller names one: a benchmark's job history (which `learned`
        # ranks by) and tokens must neither come from earlier runs nor outlive this server in root's default one.
        self.own_state = None
        if "--state-dir" not in flags:
            self.own_state = tempfile.mkdtemp(prefix="salus-bench-state-")
            flags = ("--state-dir", self.own_state, *flags)
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
        proc = subprocess.run([str(server_bin().with_name("salus")), "--server", self.address, *args],
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
        if self.proc.returncode == 0 and os.path.exists(self.log.name):
            os.unlink(self.log.name)  # kept when something went wrong
        if self.own_state:
            shutil.rmtree(self.own_state, ignore_errors=True)
        return self.proc.returncode


class Job:
    """A sched_job.py child (kind "tf1"; "tf2": tf2_sched_job.py with SALUS_SERVER = `target`); imports TF and builds
    its graph (TF2: prepares its data), then waits for its go file. Its stdout is read on a thread, so its result
    line counts as soon as it is printed (the process exits a little later)."""

    def __init__(self, tmp: Path, key: str, args: list[str], kind: str = "tf1", target: str = ""):
        if kind not in KINDS:
            raise ValueError(f"job {key}: kind {kind!r} is not one of {KINDS}")
        self.key = key
        self.kind = kind
        self.ready = tmp / f"{key}.ready"
        self.go_file = tmp / f"{key}.go"
        self.released: float | None = None
        script, env = (JOB_SCRIPT, child_env()) if kind == "tf1" else (TF2_JOB_SCRIPT, tf2_child_env(target, args))
        self.proc = subprocess.Popen([python(), str(script), "--ready-file", str(self.ready),
                                      "--go-file", str(self.go_file), "--digest-only", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, stdin=subprocess.DEVNULL)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def release(self, target: str) -> None:
        tmp = self.go_file.with_suffix(".tmp")
        tmp.write_text(target)
        self.released = time.time()
        tmp.rename(self.go_file)

    def result(self, timeout: float = 600) -> dict:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            msg = None
        if msg is None:
            self.kill()
            time.sleep(0.2)  # let the stderr thread drain
            sys.exit(f"bench: job {self.key} gave no result (exit code {self.proc.returncode}):\n"
                     f"{''.join(self.stderr)[-3000:]}")
        return {"kind": self.kind, **msg, "released": self.released}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child
            self.proc.wait()


def wait_ready(jobs: list[Job], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(j.ready.exists() for j in jobs):
        dead = [j for j in jobs if j.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            time.sleep(0.2)  # let the stderr thread drain
            err = "".join(dead[0].stderr)[-3000:] if dead else "timeout"
            sys.exit(f"bench: jobs did not get ready: {err}")
        time.sleep(0.02)


def run_jobs(target: str, specs: list[tuple], *, one_at_a_time: bool = False,
             timeout: float = 600) -> tuple[float, dict[str, dict]]:
    """specs: (key, sched_job args, arrival offset in s[, kind: "tf1" (default) or "tf2"]). Every job is started
    and made ready first; then the clock starts (t0, wall time) and each job is released with `target` ("" =
    in-process) at t0 + offset, or, with one_at_a_time, at max(t0 + offset, end of the previous job) so each runs
    alone. Returns t0 and each job's result line (plus "released": the wall time its go file appeared, and
    "kind")."""
    with tempfile.TemporaryDirectory(prefix="salus-bench-") as d:
        jobs = [Job(Path(d), spec[0], spec[1], spec[3] if len(spec) > 3 else "tf1", target) for spec in specs]
        try:
            wait_ready(jobs)
            t0 = time.time()
            results = {}
            for job, spec in sorted(zip(jobs, specs), key=lambda p: p[1][2]):
                delay = t0 + spec[2] - time.time()
                if delay > 0:
                    time.sleep(delay)
                job.release(target)
                if one_at_a_time:
                    results[job.key] = job.result(timeout)
            results = {job.key: results.get(job.key) or job.result(timeout) for job in jobs}
            for job in jobs:  # let them close their sessions and exit on their own
                try:
                    job.proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            return t0, results
        finally:
            for job in jobs:
                job.kill()


class OtherCpu:
    """Context manager: the share of the machine's CPU that processes other than this one and its (waited-for)
    children used meanwhile, from /proc/stat (None where there is none). On a shared machine a run with a
    large share is noise."""

    def __enter__(self):
        self.start = (time.monotonic(), _busy_s(), _own_s())
        return self

    def __exit__(self, *exc):
        t, busy, own = self.start
        elapsed = time.monotonic() - t
        now_busy = _busy_s()
        self.share = None if busy is None or now_busy is None or elapsed <= 0 else max(
            0.0, (now_busy - busy - (_own_s() - own)) / (elapsed * (os.cpu_count() or 1)))


def _busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def _own_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summary(jct: list[float], makespan: float) -> dict:
    return {"jobs": len(jct), "makespan_s": makespan, "mean_jct_s": statistics.mean(jct),
            "p95_jct_s": pct(jct, 95)}


# --- traces ------------------------------------------------------------------------------------------------

@dataclass
class TraceJob:
    job_id: str
    model: str
    iterations: int
    submit_time_s: float
    duration_s: float | None = None  # optional; a simulator's srtf takes it as the expected-seconds hint


def read_trace(path: Path) -> list[TraceJob]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or set(TRACE_FIELDS) - set(rows[0]):
        sys.exit(f"trace {path}: need a header {','.join(TRACE_FIELDS)} and at least one job")
    jobs = [TraceJob(r["job_id"], r["model"], int(r["iterations"]), float(r["submit_time_s"]),
                     float(r["duration_s"]) if (r.get("duration_s") or "").strip() else None) for r in rows]
    return sorted(jobs, key=lambda j: j.submit_time_s)


def write_trace(path: Path, jobs: list[TraceJob], *, with_duration: bool = True) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRACE_FIELDS)
        for j in jobs:
            dur = "" if j.duration_s is None or not with_duration else f"{j.duration_s:.3f}"
            w.writerow([j.job_id, j.model, j.iterations, f"{j.submit_time_s:.3f}", dur])


def write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
