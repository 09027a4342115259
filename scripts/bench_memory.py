#!/usr/bin/env python3
"""Benchmark of salus-server's memory lanes, with real TensorFlow clients.

1. Estimates: every model of the job mix (inference MLPs/CNNs at batch 1-32, training MLPs/CNN) runs once,
   without hints, against a server with a large --memory-capacity; while its session is open the script
   reads persistent_estimate_bytes / ephemeral_estimate_bytes from `salus jobs --json` and prints
   them next to TensorFlow's own numbers for the same graph in-process (variable bytes incl. optimizer
   slots; rise of allocator_bytes_in_use over one FULL_TRACE step + fed bytes).
2. Packing: the whole mix is started against a fresh server with --memory-capacity CAP, released one job at a
   time in a fixed order (each released once the previous one is admitted or waiting), every admitted job
   holding its session open. Counted: jobs with memory_state "admitted" vs "waiting for memory" (measured
   Salus rule), next to what the same P/E figures give under the Salus rule computed in Python, under an
   MPS-style rule (admit while the sum of P+E of all admitted jobs fits) and exclusively (one job per device).

Jobs are integration_tests/workloads/mem_job.py; their first steps run without the salus_main_iter fetch
(--plain-steps) so the server samples their memory in warm-up runs before they ask for a lane.

  .venv/bin/python scripts/bench_memory.py [--quick] [--capacity auto|64MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "integration_tests"))
JOB_SCRIPT = REPO / "integration_tests" / "workloads" / "mem_job.py"
LISTEN_RE = re.compile(r"^salus-server listening on (127\.0\.0\.1:\d+)\s*$")
MiB = 1 << 20
PLAIN_STEPS = 3
STEPS = 15  # > 10: the server's run-10 sample is in the estimate

# (model, copies) in arrival order
MIX = [("mlp_huge_infer", 1), ("mlp_adam", 2), ("mlp_large_infer", 2), ("cnn_train", 2), ("mlp_momentum", 1),
       ("mlp_small_infer", 1), ("cnn_small_infer", 1)]
QUICK_MIX = [("mlp_huge_infer", 1), ("mlp_adam", 2), ("cnn_train", 1), ("mlp_small_infer", 1)]
SMALL = {"mlp_small_infer", "cnn_small_infer"}
AUTO_SLACK = 64 << 10


def auto_capacity(specs: list[tuple[str, str]], needs: list[tuple[int, int]]) -> int:
    """The sum of P+E of every job but the last big one and the small inference ones, + 64 KiB: the last big
    one waits, and with the pool used up the small jobs can only share a lane (Salus) or wait (MPS-style)."""
    big = [i for i, (_, m) in enumerate(specs) if m not in SMALL]
    return sum(needs[i][0] + needs[i][1] for i in big[:-1]) + AUTO_SLACK


def server_bin() -> Path:
    return Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))


def python() -> str:
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def env() -> dict:
    e = dict(os.environ)
    e.update(TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", PYTHONHASHSEED="0")
    return e


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB)?", text.strip())
    if not m:
        raise SystemExit(f"bad size {text!r}")
    return int(m.group(1)) * {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]


def mib(n: float) -> str:
    return f"{n / MiB:8.2f}"


class Server:
    def __init__(self, capacity: str, log: Path):
        self._log = open(log, "wb")
        self.proc = subprocess.Popen([str(server_bin()), "--listen", "127.0.0.1:0", "--memory-capacity", capacity,
                                      "--shutdown-grace", "1s"], stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL)
        found: list[str] = []
        ready = threading.Event()

        def reader():
            for raw in self.proc.stdout:
                m = LISTEN_RE.match(raw.decode(errors="replace"))
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(90) or not found:
            self.stop()
            raise SystemExit(f"salus-server did not start; see {log}")
        self.address = found[0]
        self.target = f"grpc://{self.address}"

    def jobs(self) -> list[dict]:
        out = subprocess.run([str(server_bin().with_name("salus")), "--server", self.address, "jobs", "--json"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return json.loads(out)["jobs"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


class Job:
    def __init__(self, key: str, model: str, tmp: Path):
        self.key, self.model = key, model
        self.ready, self.go, self.close_file = tmp / f"{key}.ready", tmp / f"{key}.go", tmp / f"{key}.close"
        self.out = open(tmp / f"{key}.out", "w+")
        self.err = open(tmp / f"{key}.err", "w+")
        self.proc = subprocess.Popen(
            [python(), str(JOB_SCRIPT), "--model", model, "--name", key, "--steps", str(STEPS),
             "--plain-steps", str(PLAIN_STEPS), "--ready-file", str(self.ready), "--go-file", str(self.go),
             "--close-file", str(self.close_file)], stdout=self.out, stderr=self.err, env=env(),
            stdin=subprocess.DEVNULL)

    def release(self, target: str) -> None:
        tmp = self.go.with_suffix(".tmp")
        tmp.write_text(target)
        tmp.rename(self.go)

    def holding(self) -> bool:
        self.out.flush()
        return "holding" in Path(self.out.name).read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_until(pred, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def start_jobs(specs: list[tuple[str, str]], tmp: Path) -> list[Job]:
    jobs = [Job(key, model, tmp) for key, model in specs]
    if not wait_until(lambda: all(j.ready.exists() or j.proc.poll() is not None for j in jobs), 300, 0.2):
        raise SystemExit("jobs did not get ready")
    dead = [j.key for j in jobs if j.proc.poll() is not None]
    if dead:
        raise SystemExit(f"jobs died: {dead}: {Path(jobs[0].err.name).read_text()[-2000:]}")
    return jobs


def measure_estimates(models: list[str], tmp: Path) -> dict[str, dict]:
    """Each model once on a big server: its row of ctl jobs --json while it holds its session."""
    server = Server("8GiB", tmp / "estimates.server.log")
    jobs = start_jobs([(f"est-{m}", m) for m in models], tmp)
    rows: dict[str, dict] = {}
    try:
        for j in jobs:  # one after another: each measured alone
            j.release(server.target)
            if not wait_until(j.holding, 120):
                raise SystemExit(f"{j.key} did not finish its steps: {Path(j.err.name).read_text()[-2000:]}")
            rows[j.model] = {r["name"].split("?")[0]: r for r in server.jobs()}[j.key]
            j.close_file.touch()
            j.proc.wait(60)
    finally:
        for j in jobs:
            j.kill()
        server.stop()
    return rows


def simulate_salus(needs: list[tuple[int, int]], capacity: int) -> int:
    """The server's rule (sched/lanes.rs): a new lane of exactly P+E if the pool holds it, else the first lane
    that can grow from the pool to sum(P) + max(E) with the job added."""
    lanes: list[dict] = []
    free, admitted = capacity, 0
    for p, e in needs:
        if p + e <= free:
            lanes.append(dict(size=p + e, psum=p, emax=e))
            free -= p + e
            admitted += 1
            continue
        for lane in lanes:
            grown = lane["psum"] + p + max(e, lane["emax"])
            if grown <= lane["size"] + free:
                free -= max(0, grown - lane["size"])
                lane.update(size=max(lane["size"], grown), psum=lane["psum"] + p, emax=max(lane["emax"], e))
                admitted += 1
                break
    return admitted


def simulate_mps(needs: list[tuple[int, int]], capacity: int) -> int:
    used = admitted = 0
    for p, e in needs:
        if used + p + e <= capacity:
            used += p + e
            admitted += 1
    return admitted


def pack(specs: list[tuple[str, str]], capacity: str, tmp: Path) -> dict:
    server = Server(capacity, tmp / "pack.server.log")
    jobs = start_jobs(specs, tmp)
    states: dict[str, str] = {}
    try:
        for j in jobs:
            j.release(server.target)

            def settled() -> bool:
                row = {r["name"].split("?")[0]: r for r in server.jobs()}.get(j.key)
                if j.holding():
                    states[j.key] = "admitted"
                    return True
                if row and row["memory_state"] == "waiting for memory":
                    states[j.key] = "waiting"
                    return True
                if j.proc.poll() is not None:
                    states[j.key] = "failed: " + Path(j.out.name).read_text()[-300:]
                    return True
                return False

            if not wait_until(settled, 120, 0.1):
                states[j.key] = "unsettled"
        rows = {r["name"].split("?")[0]: r for r in server.jobs()}
    finally:
        for j in jobs:
            j.kill()
        server.stop()
    return {"states": states, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller mix (5 jobs)")
    ap.add_argument("--capacity", default="auto",
                    help="device memory for the packing run, e.g. 64MiB; auto (default): the sum of P+E of all "
                         "jobs but the last big one and the small inference ones, + 64 KiB")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    mix = QUICK_MIX if args.quick else MIX
    models = [m for m, _ in mix]
    specs = [(f"{m}-{i}", m) for m, n in mix for i in range(n)]
    t0 = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="bench_memory.") as d:
        tmp = Path(d)
        est = measure_estimates(models, tmp)
        # TensorFlow's default CPU allocator keeps statistics only with oneDNN on (which TensorFlow turns on by
        # CPU); its BFC CPU allocator keeps them either way. Set for this process only, after the servers ran.
        os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
        from workloads import mem_job  # TensorFlow in this process only now, after the children are done
        tf_nums = {m: mem_job.tf_numbers(m) for m in models}

        print("\n== Estimates (server, no hints) vs TensorFlow's own numbers, MiB ==")
        print(f"{'model':18} {'batch':>5} {'P salus':>8} {'P tf':>8} {'P x':>6} {'src':>6}  "
              f"{'E salus':>8} {'E tf':>8} {'E x':>6} {'src':>8}  {'tf rise':>8} {'fed':>8}")
        for m in models:
            r, t = est[m], tf_nums[m]
            px = r["persistent_estimate_bytes"] / max(t["variable_bytes"], 1)
            ex = r["ephemeral_estimate_bytes"] / max(t["ephemeral_bytes"], 1)
            print(f"{m:18} {mem_job.MODELS[m]['batch']:5d} {mib(r['persistent_estimate_bytes'])} "
                  f"{mib(t['variable_bytes'])} {px:6.2f} {r['persistent_source']:>6}  "
                  f"{mib(r['ephemeral_estimate_bytes'])} {mib(t['ephemeral_bytes'])} {ex:6.2f} "
                  f"{r['ephemeral_source']:>8}  {mib(t['trace_rise_bytes'])} {mib(t['fed_bytes'])}")

        needs = [(est[m]["persistent_estimate_bytes"], est[m]["ephemeral_estimate_bytes"]) for _, m in specs]
        capacity = auto_capacity(specs, needs) if args.capacity == "auto" else parse_size(args.capacity)
        result = pack(specs, str(capacity), tmp)
    states = result["states"]
    measured = sum(1 for s in states.values() if s == "admitted")
    print(f"\n== Packing {len(specs)} jobs on {capacity / MiB:.2f} MiB ({capacity} bytes, {args.capacity}), "
          f"arrival order as listed ==")
    print(f"{'job':20} {'P MiB':>8} {'E MiB':>8} {'lane':>5}  state (server)     note")
    for (key, m), (p, e) in zip(specs, needs):
        row = result["rows"].get(key, {})
        print(f"{key:20} {mib(p)} {mib(e)} {str(row.get('lane', '-')):>5}  {states.get(key, '?'):18} "
              f"{row.get('note', '')[:110]}")
    print(f"\nSalus lanes (measured, real server):  {measured} of {len(specs)} admitted at once, "
          f"{sum(1 for s in states.values() if s == 'waiting')} waiting")
    print(f"Salus lanes (computed from P/E):      {simulate_salus(needs, capacity)}")
    print(f"MPS-style (sum of P+E <= capacity):   {simulate_mps(needs, capacity)}")
    print(f"Exclusive (one job per device):       {1 if any(p + e <= capacity for p, e in needs) else 0}")
    print(f"\n(total {time.monotonic() - t0:.0f}s)")


if __name__ == "__main__":
    main()
