#!/usr/bin/env python3
"""Load benchmark for salus-server: many concurrent client sessions for minutes, then session churn.

Phase 1, load: --sessions stock TF1 client sessions (default 64) train small models against one server for
--minutes (default 5). 64 clients cannot each be a Python process with TensorFlow on a 2-core, 24 GiB machine
(~0.5 GiB and ~3 s of CPU per TensorFlow import), so they are threads: --processes worker processes (default
4) with sessions / processes threads each; every thread has its own tf.Graph and tf.compat.v1.Session, as
separate scripts would. Sessions cycle through three small MLPs (about 0.1-0.5 ms a step in-process); every
other session fetches a node named salus_main_iter, so half the jobs' steps are main iterations the scheduler
orders in the lane; the other half's steps are cheap runs (run at once, beside the lane) as long as they
measure under the server's --cheap-below-us (1 ms), main iterations when the loaded machine makes them
slower. Clients step back to back, no think time (--think-ms), so the machine is saturated and latency
includes queueing behind the other jobs. Under the default policy, pack, a lane runs the earliest-arrived job
that has an iteration ready, so later jobs' main iterations wait while earlier ones keep it busy: the steps
per session spread widely (--policy fair evens them out).
Printed: steps and steps/s, per-session spread, errors (zero expected), RunStep latency at the clients after
the warm-up (p50, p99, max; also per main/cheap class), the server's resident memory (VmRSS from
/proc/PID/status) after the warm-up and at the end with the growth in % (target <= 10%), its threads and
open file descriptors, and the scheduler's own stats (`salus-server ctl stats --json`).

Phase 2, churn: --cycles (default 1000) CreateSession / one RunStep / CloseSession cycles, each session a new
small graph (a few ops, one variable) run once, one after another from one client. Printed: sessions open
(`salus-server ctl jobs --json`), open file descriptors (/proc/PID/fd), threads and RSS before, at checkpoints
and after. Targets: no growth in sessions or file descriptors; memory growth explained by the RSS slope per
cycle early and late (a one-time warm-up levels off; a per-session leak keeps the late slope up).

Each phase starts its own salus-server ($SALUS_SERVER_BIN, default target/release/salus-server) with
--listen 127.0.0.1:0 (the address is read from its "salus-server listening on ADDR" line) and stops it by its
PID (SIGTERM, then its exit code is printed).

Usage:
  .venv/bin/python scripts/bench_load.py                 # 64 sessions x 5 minutes, then 1000 cycles
  .venv/bin/python scripts/bench_load.py --quick         # 16 sessions x 1 minute, then 1000 cycles
  .venv/bin/python scripts/bench_load.py --minutes 2 --sessions 32 --processes 2 --skip-churn
  .venv/bin/python scripts/bench_load.py --skip-load --cycles 2000

The driver itself does not import TensorFlow; its workers are this script run with --worker (internal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trace_jobs import Server, server_bin

REPO = Path(__file__).resolve().parent.parent
RSS_GROWTH_TARGET_PCT = 10.0
LEAK_KIB_PER_CYCLE = 4.0  # RSS slope over the second half of the churn above which sessions look leaked
MODELS = {  # name: (input dim, hidden widths, batch)
    "mlp_a": (32, (64,), 32),
    "mlp_b": (64, (128, 128), 64),
    "mlp_c": (128, (256,), 32),
}


# --- /proc -----------------------------------------------------------------------------------------------

def proc_status(pid: int) -> dict:
    """VmRSS (MiB), Threads and open file descriptors of a process."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_mib"] = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def ctl_json(address: str, *args: str):
    proc = subprocess.run([str(server_bin()), "ctl", "--server", address, *args, "--json"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"ctl {' '.join(args)} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def percentile(sorted_values, q: float) -> float:
    if not len(sorted_values):
        return float("nan")
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


# --- worker (imports TensorFlow) ------------------------------------------------------------------------

def build(model: str, seed: int, force_main: bool):
    import numpy as np
    import tensorflow as tf

    in_dim, widths, batch = MODELS[model]
    rng = np.random.RandomState(seed)
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(seed)
        x = tf.constant(rng.normal(size=(batch, in_dim)).astype(np.float32))
        y = tf.constant(rng.randint(0, 10, size=batch).astype(np.int64))
        h, d = x, in_dim
        for i, width in enumerate(widths):
            w = tf.compat.v1.get_variable(f"w{i}", [d, width],
                                          initializer=tf.compat.v1.glorot_uniform_initializer(seed * 10 + i))
            h, d = tf.nn.relu(tf.matmul(h, w)), width
        wo = tf.compat.v1.get_variable("wo", [d, 10], initializer=tf.compat.v1.glorot_uniform_initializer(seed))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(h, wo)))
        train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        fetch = tf.identity(loss, name="salus_main_iter") if force_main else loss
        init = tf.compat.v1.global_variables_initializer()
    return g, init, [fetch, train_op]


def worker_load(args) -> None:
    """Threads, one session each, stepping until the deadline the go file names; results to --out."""
    import numpy as np
    import tensorflow as tf

    first = args.first_session
    sessions = []
    for i in range(first, first + args.sessions):
        model = list(MODELS)[i % len(MODELS)]
        sessions.append((i, model, i % 2 == 0, *build(model, 1000 + i, force_main=i % 2 == 0)))
    Path(args.ready_file).touch()
    while not os.path.exists(args.go_file):
        time.sleep(0.01)
    go = json.loads(Path(args.go_file).read_text())
    results = {}

    def run(i, model, main, g, init, fetches):
        lat, steps_warm, errors = [], 0, {}
        cfg = tf.compat.v1.ConfigProto()
        cfg.experimental.session_metadata.name = f"load-{i}"
        try:
            with tf.compat.v1.Session(go["target"], graph=g, config=cfg) as sess:
                sess.run(init)
                while True:
                    t0 = time.perf_counter()
                    now = time.time()
                    if now >= go["until"]:
                        break
                    try:
                        sess.run(fetches)
                    except tf.errors.OpError as e:
                        key = f"{type(e).__name__}: {e.message.strip().splitlines()[-1][:200]}"
                        errors[key] = errors.get(key, 0) + 1
                        continue
                    dt = time.perf_counter() - t0
                    if now >= go["warmup_until"]:
                        lat.append(dt)
                    else:
                        steps_warm += 1
                    if args.think_ms:
                        time.sleep(args.think_ms / 1000)
        except Exception as e:  # session creation or close failed
            key = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
            errors[key] = errors.get(key, 0) + 1
        results[i] = dict(model=model, main=main, lat=np.asarray(lat, np.float32), steps_warm=steps_warm,
                          errors=errors)

    threads = [threading.Thread(target=run, args=s, daemon=True) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.savez(args.out, **{f"lat_{i}": r["lat"] for i, r in results.items()})
    summary = {i: {k: v for k, v in r.items() if k != "lat"} for i, r in results.items()}
    Path(args.out + ".json").write_text(json.dumps(summary))
    sys.stdout.flush()
    os._exit(0)  # skip TensorFlow's teardown


def worker_churn(args) -> None:
    """--cycles create / run / close cycles, one after another; measures the server at checkpoints."""
    import numpy as np
    import tensorflow as tf

    def graph(k: int):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
            v = tf.compat.v1.get_variable("v", [], tf.float32)  # a resource in the session's container
            out = tf.reduce_sum(x * 2.0 + v.assign(float(k)))  # one run sets and reads it
        return g, x, out

    checkpoints = sorted({int(c) for c in args.checkpoints.split(",")} | {args.cycles})
    status = [{"cycle": 0, **proc_status(args.server_pid), "sessions": len(ctl_json(args.address, "jobs"))}]
    print(json.dumps({"phase": "checkpoint", **status[0]}), flush=True)
    errors: dict[str, int] = {}
    times = []
    feed = np.arange(4, dtype=np.float32)
    for k in range(1, args.cycles + 1):
        g, x, out = graph(k)
        t0 = time.perf_counter()
        try:
            with tf.compat.v1.Session(args.target, graph=g) as sess:
                value = sess.run(out, {x: feed})
            if value != 12.0 + 4 * k:
                errors["wrong value"] = errors.get("wrong value", 0) + 1
        except tf.errors.OpError as e:
            key = f"{type(e).__name__}: {e.message.strip().splitlines()[-1][:200]}"
            errors[key] = errors.get(key, 0) + 1
        times.append(time.perf_counter() - t0)
        if k in checkpoints:
            time.sleep(0.5)  # let the server finish freeing the last session
            st = {"cycle": k, **proc_status(args.server_pid), "sessions": len(ctl_json(args.address, "jobs"))}
            status.append(st)
            print(json.dumps({"phase": "checkpoint", **st}), flush=True)
    times.sort()
    print(json.dumps({"phase": "done", "errors": errors, "cycle_ms_p50": percentile(times, 0.5) * 1000,
                      "cycle_ms_p99": percentile(times, 0.99) * 1000, "status": status}), flush=True)
    os._exit(0)


# --- driver -----------------------------------------------------------------------------------------------

def venv_python() -> str:
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def worker_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def phase_load(args, tmp: Path) -> bool:
    """Returns True when the targets hold (no errors, RSS growth within the target)."""
    import numpy as np

    procs = min(args.processes, args.sessions)
    per = [args.sessions // procs + (1 if p < args.sessions % procs else 0) for p in range(procs)]
    print(f"== load: {args.sessions} sessions ({procs} processes x {max(per)} threads), {args.minutes:g} min "
          f"(warm-up {args.warmup_s:g} s), models {', '.join(MODELS)}, main iterations in every other session, "
          f"think time {args.think_ms:g} ms, policy {args.policy or 'default (pack)'}", flush=True)
    server = Server(*(("--policy", args.policy) if args.policy else ()))
    print(f"salus-server pid {server.pid} on {server.address}; at start: {proc_status(server.pid)}", flush=True)
    workers = []
    try:
        first = 0
        for p, n in enumerate(per):
            out = str(tmp / f"worker{p}")
            argv = [venv_python(), __file__, "--worker", "load", "--sessions", str(n), "--first-session",
                    str(first), "--ready-file", out + ".ready", "--go-file", str(tmp / "go"), "--out", out,
                    "--think-ms", str(args.think_ms)]
            workers.append((subprocess.Popen(argv, env=worker_env(), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=open(out + ".stderr", "w")), out))
            first += n
        deadline = time.monotonic() + 300
        while not all(Path(o + ".ready").exists() for _, o in workers):
            if any(w.poll() is not None for w, _ in workers) or time.monotonic() > deadline:
                sys.exit(f"bench_load: a worker died or never got ready; see {tmp}/worker*.stderr")
            time.sleep(0.1)
        start = time.time()
        go = {"target": server.target, "warmup_until": start + args.warmup_s, "until": start + args.minutes * 60}
        (tmp / "go.tmp").write_text(json.dumps(go))
        (tmp / "go.tmp").rename(tmp / "go")

        samples = []  # (seconds since start, status, iterations_total)
        next_print = 30.0
        prev = (0.0, 0)
        # The end sample is taken a few seconds before the clients stop (ctl is slow on a saturated machine).
        end_at = go["until"] - 3.0
        while time.time() < end_at:
            time.sleep(min(args.sample_s, max(0.1, end_at - time.time())))
            t = time.time() - start
            st = proc_status(server.pid)
            try:
                stats = ctl_json(server.address, "stats")
                done = stats["iterations_total"] + stats["cheap_runs_total"]
            except RuntimeError:
                done = None
            samples.append((t, st, done))
            if t >= next_print or time.time() >= end_at:
                rate = (done - prev[1]) / (t - prev[0]) if done is not None else float("nan")
                print(f"  t={t:5.0f}s  server runs/s {rate:7.0f}  RSS {st['rss_mib']:7.1f} MiB  threads "
                      f"{st['threads']}  fds {st['fds']}", flush=True)
                prev = (t, done if done is not None else prev[1])
                next_print += 30.0
        end_status = proc_status(server.pid)
        jobs_open = len(ctl_json(server.address, "jobs"))
        stats = ctl_json(server.address, "stats")
        for w, out in workers:
            try:
                w.wait(max(60, args.minutes * 60))
            except subprocess.TimeoutExpired:
                w.kill()  # our own child, by its Popen handle
                w.wait()
        time.sleep(1.0)
        closed_status = proc_status(server.pid)
        jobs_after = len(ctl_json(server.address, "jobs"))
    finally:
        for w, _ in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        code = server.stop()

    lat_all, lat_by_class, steps, warm_steps, errors = [], {True: [], False: []}, {}, 0, {}
    steps_by_class: dict[bool, list[int]] = {True: [], False: []}
    for _, out in workers:
        summary = json.loads(Path(out + ".json").read_text())
        data = np.load(out + ".npz")
        for i, s in summary.items():
            lat = data[f"lat_{i}"]
            lat_all.append(lat)
            lat_by_class[s["main"]].append(lat)
            steps[int(i)] = len(lat) + s["steps_warm"]
            steps_by_class[s["main"]].append(steps[int(i)])
            warm_steps += s["steps_warm"]
            for k, v in s["errors"].items():
                errors[k] = errors.get(k, 0) + v
    if args.details:
        print("    session (process, model, main = fetches salus_main_iter): steps, p50, p99 after the warm-up")
        for p, (_, out) in enumerate(workers):
            summary = json.loads(Path(out + ".json").read_text())
            data = np.load(out + ".npz")
            for i, s in sorted(summary.items(), key=lambda kv: int(kv[0])):
                lat = np.sort(data[f"lat_{i}"])
                kind = "main" if s["main"] else "other"
                print(f"    {int(i):3d} ({p}, {s['model']}, {kind}): {steps[int(i)]:7d} steps, "
                      f"{fmt_ms(percentile(lat, 0.5))}, {fmt_ms(percentile(lat, 0.99))}")
    lat_sorted = np.sort(np.concatenate(lat_all)) if lat_all else np.array([])
    measured_s = args.minutes * 60 - args.warmup_s
    per_session = sorted(steps.values())
    print(f"  steps: {sum(per_session)} in all ({warm_steps} in the warm-up), {len(lat_sorted) / measured_s:.0f} "
          f"steps/s after it; per session min {per_session[0]}, median {int(statistics.median(per_session))}, "
          f"max {per_session[-1]} ({len(per_session)} sessions)")
    for main, label in ((True, "sessions fetching salus_main_iter"), (False, "other sessions")):
        cls = sorted(steps_by_class[main])
        if cls:
            print(f"    {label}: steps min {cls[0]}, median {int(statistics.median(cls))}, max {cls[-1]}")
    print(f"  errors: {sum(errors.values())}" + "".join(f"\n    {n} x {k}" for k, n in errors.items()))
    line = (f"  RunStep latency at the clients after the warm-up: p50 {fmt_ms(percentile(lat_sorted, 0.5))}, "
            f"p99 {fmt_ms(percentile(lat_sorted, 0.99))}, "
            f"max {fmt_ms(float(lat_sorted[-1]) if len(lat_sorted) else 0)}")
    for main, label in ((True, "salus_main_iter sessions"), (False, "other sessions")):
        cls = np.sort(np.concatenate(lat_by_class[main])) if lat_by_class[main] else np.array([])
        line += f"; {label} p50 {fmt_ms(percentile(cls, 0.5))} p99 {fmt_ms(percentile(cls, 0.99))}"
    print(line)
    warm = next((s for t, s, _ in samples if t >= args.warmup_s), samples[0][1] if samples else end_status)
    growth = (end_status["rss_mib"] - warm["rss_mib"]) / warm["rss_mib"] * 100
    ok_rss = growth <= RSS_GROWTH_TARGET_PCT
    print(f"  server RSS: after the warm-up {warm['rss_mib']:.1f} MiB, at the end {end_status['rss_mib']:.1f} MiB: "
          f"growth {growth:+.1f}% (target <= {RSS_GROWTH_TARGET_PCT:g}%: {'met' if ok_rss else 'MISSED'}); peak "
          f"{max(s['rss_mib'] for _, s, _ in samples):.1f} MiB; after all sessions closed "
          f"{closed_status['rss_mib']:.1f} MiB")
    print(f"  server threads {warm['threads']} -> {end_status['threads']} (after close {closed_status['threads']}), "
          f"fds {warm['fds']} -> {end_status['fds']} (after close {closed_status['fds']}); sessions open at the end "
          f"{jobs_open}, after the clients closed {jobs_after}")
    lat = stats.get("switch_latency_us", {})
    print(f"  server stats: {stats['iterations_total']} main iterations, {stats['cheap_runs_total']} cheap runs, "
          f"{stats.get('dropped_iterations', 0)} dropped, switch latency p50 {lat.get('p50')} us "
          f"p99 {lat.get('p99')} us; "
          f"server exit code {code}")
    return not errors and ok_rss and jobs_after == 0 and code == 0


def phase_churn(args, tmp: Path) -> bool:
    print(f"== churn: {args.cycles} CreateSession / RunStep / CloseSession cycles, one after another", flush=True)
    server = Server()
    argv = [venv_python(), __file__, "--worker", "churn", "--target", server.target, "--address", server.address,
            "--server-pid", str(server.pid), "--cycles", str(args.cycles), "--checkpoints", args.checkpoints]
    worker = subprocess.Popen(argv, env=worker_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=open(tmp / "churn.stderr", "w"), text=True)
    done = None
    t0 = time.monotonic()
    try:
        for line in worker.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg["phase"] == "checkpoint":
                print(f"  after {msg['cycle']:5d} cycles ({time.monotonic() - t0:5.1f}s): sessions open "
                      f"{msg['sessions']}, fds {msg['fds']}, threads {msg['threads']}, RSS {msg['rss_mib']:.1f} MiB",
                      flush=True)
            elif msg["phase"] == "done":
                done = msg
        worker.wait(60)
    finally:
        if worker.poll() is None:
            worker.kill()  # our own child, by its Popen handle
            worker.wait()
        code = server.stop()
    if done is None:
        print(f"  the churn worker failed; see {tmp}/churn.stderr")
        return False
    st = done["status"]
    first, last = st[0], st[-1]
    print(f"  errors: {sum(done['errors'].values())}"
          + "".join(f"\n    {n} x {k}" for k, n in done["errors"].items()))
    print(f"  cycle time p50 {done['cycle_ms_p50']:.1f} ms, p99 {done['cycle_ms_p99']:.1f} ms")
    print(f"  sessions open {first['sessions']} -> {last['sessions']} (target: no growth), fds {first['fds']} -> "
          f"{last['fds']} ({last['fds'] - first['fds']:+d}; target: no growth), threads {first['threads']} -> "
          f"{last['threads']}")
    # A one-time rise with the first sessions (TensorFlow's global thread pools, kernel and allocator caches,
    # malloc arenas of the threads serving them), then a flat line: no per-session leak. A leak keeps a slope.
    warm = min((s for s in st if s["cycle"] >= 10), key=lambda s: s["cycle"], default=last)
    half = min(st, key=lambda s: abs(s["cycle"] - last["cycle"] / 2))
    steady = (last["rss_mib"] - warm["rss_mib"]) * 1024 / max(1, last["cycle"] - warm["cycle"])
    late = (last["rss_mib"] - half["rss_mib"]) * 1024 / max(1, last["cycle"] - half["cycle"])
    judged = last["cycle"] - half["cycle"] >= 200  # RSS moves in pages: a few cycles say nothing
    leak = judged and late > LEAK_KIB_PER_CYCLE
    print(f"  RSS {first['rss_mib']:.1f} -> {last['rss_mib']:.1f} MiB "
          f"({last['rss_mib'] - first['rss_mib']:+.1f} MiB): "
          f"{warm['rss_mib'] - first['rss_mib']:+.1f} MiB with the first {warm['cycle']} sessions (one-time), then "
          f"{steady:.2f} KiB/cycle over cycles {warm['cycle']}-{last['cycle']} and {late:.2f} KiB/cycle over "
          f"{half['cycle']}-{last['cycle']}: "
          + ("too few cycles to judge" if not judged else
             f"keeps growing, a possible leak of about {late:.1f} KiB per session" if leak else
             f"levels off (below {LEAK_KIB_PER_CYCLE:g} KiB/cycle), no per-session leak")
          + f"; server exit code {code}")
    return (not done["errors"] and last["sessions"] == first["sessions"] == 0 and last["fds"] <= first["fds"]
            and not leak and code == 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 minute and 16 sessions (unless given explicitly)")
    ap.add_argument("--minutes", type=float, help="length of the load phase (default 5, --quick 1)")
    ap.add_argument("--sessions", type=int, help="concurrent client sessions (default 64, --quick 16)")
    ap.add_argument("--processes", type=int, default=4, help="worker processes the sessions are spread over")
    ap.add_argument("--warmup-s", type=float, help="warm-up excluded from latency and the RSS baseline "
                                                    "(default 30, --quick 15)")
    ap.add_argument("--think-ms", type=float, default=0.0, help="pause of each client between its steps")
    ap.add_argument("--policy", help="the load server's --policy (default: the server's, pack: by arrival, "
                                     "so later jobs' main iterations wait while earlier ones have work)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="how often the server is sampled")
    ap.add_argument("--details", action="store_true", help="also print every session's steps and latency")
    ap.add_argument("--cycles", type=int, default=1000, help="create/run/close cycles of the churn phase")
    ap.add_argument("--checkpoints", default="1,10,100,250,500,750",
                    help="cycles after which the server is measured (and after the last)")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-churn", action="store_true")
    # Internal: the worker processes.
    ap.add_argument("--worker", choices=["load", "churn"], help=argparse.SUPPRESS)
    ap.add_argument("--first-session", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ready-file", help=argparse.SUPPRESS)
    ap.add_argument("--go-file", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker == "load":
        worker_load(args)
    if args.worker == "churn":
        worker_churn(args)
    args.minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 5.0)
    args.sessions = args.sessions or (16 if args.quick else 64)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (15.0 if args.quick else 30.0)
    if args.warmup_s >= args.minutes * 60:
        ap.error("--warmup-s must be shorter than --minutes")

    print(f"bench_load: {server_bin()}; {os.cpu_count()} CPUs", flush=True)
    ok = True
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_load.") as tmp:
        if not args.skip_load:
            ok &= phase_load(args, Path(tmp))
        if not args.skip_churn:
            ok &= phase_churn(args, Path(tmp))
    print(f"bench_load: {'all targets met' if ok else 'SOME TARGETS MISSED'} ({time.monotonic() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
