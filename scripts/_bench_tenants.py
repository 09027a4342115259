"""Shared by bench_master.py, bench_eager.py and bench_sched.py: salus-server's two isolation modes side by side.

salus-server --isolation tenant (the default) is a supervisor that hands each tenant's TF1 connections to, and
relays its TF2 calls to, that tenant's own executor process (started at the tenant's first request) and schedules every main iteration itself; --isolation
none runs everything in one process. The benchmarks start one server per mode and compare them in one run.

- `modes()` / `label()`: the --isolation choice of a benchmark (both | tenant | none) as server modes, and the
  target name of a mode ("salus-tenant", "salus-none"); `isolation_flags()`: a mode's server flags (each server
  its own --state-dir).
- `Tenants`: a tenants file in a temporary directory with token tenants (RUN_AS `-`: no Unix user; their
  executors run as `nobody` when the server runs as root). Fresh random tokens every run.
- `first_calls()`: the wall time of a new token tenant's first call (its executor starts) and of its second call.
- `jobs_with_tokens()`: trace_jobs' job processes, each with its own SALUS_TOKEN (so each its own tenant).
- `tree_rss_mib()`, `tree_cpu_seconds()`: the resident memory and the CPU time of a server and its executor
  processes; `process_cpu_seconds()`: this process's CPU time.
- `ratio_line()`: one printed "LABEL  a/b 1.07x (a 412.0 us, b 385.0 us)   goal <= 1.1: met" line.

Standard library only at import (grpc is imported by first_calls()).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ISOLATION_CHOICES = ("both", "tenant", "none")


def modes(choice: str) -> list[str]:
    """The server modes of an --isolation choice, tenant first."""
    return ["tenant", "none"] if choice == "both" else [choice]


def label(mode: str) -> str:
    return f"salus-{mode}"


def short(target: str) -> str:
    """The name of a target in a ratio line: salus-tenant -> tenant."""
    return target.removeprefix("salus-")


def isolation_flags(mode: str) -> list[str]:
    """--isolation MODE, and a state directory of the server's own: the two servers of a benchmark run side by
    side, and one state directory serves one server at a time (root's default, /var/lib/salus/state, is locked
    by the first). Removed when this process exits."""
    state = Path(tempfile.mkdtemp(prefix=f"salus-bench-state-{mode}-"))
    atexit.register(shutil.rmtree, state, True)
    return ["--isolation", mode, "--state-dir", str(state)]


def server_supports_isolation(binary: Path) -> bool:
    import subprocess
    try:
        out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--isolation" in out


class Tenants:
    """A tenants file (`NAME SHA256-OF-TOKEN -` a line) in a temporary directory; `tokens` maps name -> token."""

    def __init__(self, names: list[str]):
        self.dir = Path(tempfile.mkdtemp(prefix="salus-bench-tenants-"))
        self.path = self.dir / "tenants"
        self.tokens = {n: f"bench-{n}-{secrets.token_hex(8)}" for n in names}
        self.path.write_text("# written by a salus benchmark: name  sha256-of-token  run-as\n" + "".join(
            f"{n} {hashlib.sha256(t.encode()).hexdigest()} -\n" for n, t in self.tokens.items()))

    def flags(self) -> list[str]:
        return ["--tenants-file", str(self.path)]

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


def first_calls(address: str, tokens: list[str], timeout: float = 120) -> list[tuple[float, float]]:
    """For each token (a tenant the server has not seen yet): (first call, second call) wall times in seconds of a
    raw `/tensorflow.MasterService/ListDevices` on a connected channel carrying the token. The first call starts
    the tenant's executor process (--isolation tenant); the second finds it running."""
    import grpc

    out = []
    for token in tokens:
        options = [("grpc.primary_user_agent", f"salus1.{token}"), ("grpc.enable_http_proxy", 0)]
        with grpc.insecure_channel(address, options=options) as ch:
            grpc.channel_ready_future(ch).result(timeout=timeout)  # TCP + HTTP/2 set-up is not part of the call
            call = ch.unary_unary("/tensorflow.MasterService/ListDevices", request_serializer=None,
                                  response_deserializer=None)
            t0 = time.perf_counter()
            call(b"", timeout=timeout)
            t1 = time.perf_counter()
            call(b"", timeout=timeout)
            t2 = time.perf_counter()
        out.append((t1 - t0, t2 - t1))
    return out


def min_med_max(values: list[float]) -> tuple[float, float, float]:
    s = sorted(values)
    return s[0], statistics.median(s), s[-1]


@contextlib.contextmanager
def jobs_with_tokens(tokens: dict[str, str]):
    """Within the block, trace_jobs.run_jobs starts the job whose key is in `tokens` with SALUS_TOKEN=<token> in its
    environment (the adapter's start-up hook then puts the token in the job's gRPC user agent, TF1 and TF2 alike);
    other jobs as usual. Patches trace_jobs' module globals (this process is single-threaded there)."""
    import trace_jobs

    orig_job, orig_env, orig_tf2_env = trace_jobs.Job, trace_jobs.child_env, trace_jobs.tf2_child_env

    class TokenJob(orig_job):
        def __init__(self, tmp, key, args, kind="tf1", target=""):
            token = tokens.get(key)
            if token is None:
                super().__init__(tmp, key, args, kind, target)
                return
            trace_jobs.child_env = lambda: {**orig_env(), "SALUS_TOKEN": token}
            trace_jobs.tf2_child_env = lambda t, a: {**orig_tf2_env(t, a), "SALUS_TOKEN": token}
            try:
                super().__init__(tmp, key, args, kind, target)
            finally:
                trace_jobs.child_env, trace_jobs.tf2_child_env = orig_env, orig_tf2_env

    trace_jobs.Job = TokenJob
    try:
        yield
    finally:
        trace_jobs.Job = orig_job


def _status(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (a tenant-mode server's executors), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _status(int(entry)).get("PPid")
            if ppid and ppid.isdigit():
                children.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def tree_rss_mib(pid: int | None) -> tuple[float | None, int]:
    """VmRSS (MiB) of `pid` plus all its descendants (a tenant-mode server's executors), and how many descendants."""
    if not pid:
        return None, 0
    me = _status(pid)
    if "VmRSS" not in me:
        return None, 0
    total, count = int(me["VmRSS"].split()[0]), 0
    for p in _descendants(pid):
        rss = _status(p).get("VmRSS")
        if rss:
            total += int(rss.split()[0])
            count += 1
    return total / 1024, count


def process_cpu_seconds() -> float:
    """User + system CPU seconds used so far by this process (all its threads)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds used so far by `pid` and its live descendants (0 without a pid)."""
    if not pid:
        return 0.0
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def ratio_line(what: str, a: str, b: str, ma: float, mb: float, goal: float | None = None) -> str:
    """'  TF1 tiny step    tenant/none        1.070x (tenant 412.0 us, none 385.0 us)   goal <= 1.1: met'"""
    ratio = ma / mb
    pair = f"{short(a)}/{short(b)}"
    line = f"  {what:16s} {pair:17s} {ratio:6.3f}x ({short(a)} {fmt_time(ma)}, {short(b)} {fmt_time(mb)})"
    if goal is not None:
        line += f"   goal <= {goal}: {'met' if ratio <= goal else 'MISSED'}"
    return line
