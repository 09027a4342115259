#!/usr/bin/env python3
"""Load benchmark for salus-server: TF1 and TF2 jobs together for minutes, then session and context churn.

Phase 1, load: --sessions jobs (default 64) train small models against one server for --minutes (default 5):
--tf2 of them (default 8; --quick 4) are TF2 eager jobs, the rest stock TF1 graph sessions. The mix is not half
and half, honestly stated: a TF2 job is one eager context, and one process has exactly one (its threads share
it), so every TF2 job is a Python process with TensorFlow of its own (~0.5 GiB, ~3 s of CPU to import); 32 of
them do not fit a 2-core, 24 GiB machine next to the TF1 clients. TF1 sessions are threads: --processes worker
processes (default 4) with (sessions - tf2) / processes threads each; every thread has its own tf.Graph and
tf.compat.v1.Session, as separate scripts would. TF1 sessions cycle through three small MLPs (about 0.1-0.5 ms a
step in-process); every other one fetches a node named salus_main_iter, so half the TF1 jobs' steps are main
iterations the scheduler orders in the lane; the other half's steps are brief runs (at once, beside the lane,
unless a job ranked ahead waits) as long as they measure under the server's --cheap-below (1 ms), main
iterations when the loaded machine makes them slower. A TF2 job is this script run with SALUS_SERVER set (the adapter sends its eager work to the
server): an MLP (the same three models) trained by a tf.function (GradientTape, momentum by hand), one loss
fetched per step (Enqueue of the call + a _Send and RecvTensor), on its process's one thread. Clients step back
to back, no think time (--think-ms), so the machine is saturated and latency includes queueing behind the other
jobs. Under the default policy, fair, every job of a lane gets the same device time, brief runs (the other
sessions' fast repeated steps) included: they skip the queue only while no job ranked ahead waits. Under
--policy pack a lane runs the earliest-arrived job that has an iteration ready, so later jobs wait while earlier
ones keep it busy, and the steps per session spread widely.
Printed: steps and steps/s, per-session spread (per class: TF1 main, TF1 other, TF2) and the same spread in device
time (the server's `service_s` per job: main iterations and brief runs), errors (zero expected),
step latency at the clients after the warm-up (p50, p99, max; also per class), the server's resident memory
(VmRSS from /proc/PID/status) after the warm-up and at the end with the growth in % (target <= 10%), its threads
and open file descriptors, graph sessions and eager contexts open, and the scheduler's own stats
(`salus stats --json`).

Tenants mode, --users A,B[,C...] (instead of the load phase above; needs root): each number is one Unix user's TF1
sessions, e.g. --users 1,8: salus-bench-u0 runs 1 session and salus-bench-u1 runs 8. The script creates the users
(useradd; scripts/_bench_users.py, integration_tests/conftest.py's unix_users without pytest: o+x is added to the
interpreter's ancestor directories while it runs) and removes them when it ends (userdel -r, in a finally, SIGTERM
included). Each user's sessions are threads of its own worker process(es) (--user-processes, default 1) running as
that user, so the server (run as root, default --auth both and --isolation tenant) sees one tenant per user and
starts one executor process per tenant running as its user. Sessions are built as in the load phase (the same three
MLPs in turn, salus_main_iter in every other session of each user, or in every one with --all-main; no TF2 jobs)
and step back to back (--think-ms 0), saturating the server. Device time is measured over a window in which every
session of every user runs: from a snapshot of `ctl stats --json` and `ctl jobs --json` taken after the warm-up,
once every session's job has run, to one taken 8 s before the clients stop (ctl takes seconds on a saturated
machine); start-up (executor starts, graph set-up, the first seconds) does not count. Printed per tenant: device
time in the window (the server's per-tenant figure, stats "tenants"; as a cross-check the sum of its jobs'
service_s), share %, steps (the server's runs in the window), steps/s, device ms per step and the clients' step
latency after the warm-up (p50, p99); the max/min ratio of device time between tenants with its target (<= 1.1
under --share tenants, the server's default: each tenant with work gets equal device time, its jobs share its
part); the same ratio over the running totals since the server started, no target (a tenant whose first job arrives
starts level with the busy tenants, so what another got before stays theirs; one that stays busy keeps what it is
behind, so a deficit left by the warm-up is caught up, possibly inside the window); and the per-job spread inside
each tenant (device time per job min / median / max, max/min; every job's line with --details). --compare-share
then repeats the run under --share jobs (the policy orders every job, whoever owns it: a user with 8 sessions gets
about 8 times the device time of a user with 1) and prints both ratios side by side. --server-flag passes further
flags to the server (e.g. --server-flag=--anticipation=0).

Phase 2, churn: --cycles (default 1000) CreateSession / one RunStep / CloseSession cycles, each session a new
small graph (a few ops, one variable) run once, one after another from one client. Printed: sessions open
(`salus jobs --json`), open file descriptors (/proc/PID/fd), threads and RSS before, at checkpoints
and after. Targets: no growth in sessions or file descriptors; memory growth explained by the RSS slope per
cycle early and late (a one-time warm-up levels off; a per-session leak keeps the late slope up).

Phase 3, TF2 churn: --tf2-cycles (default 1000) eager contexts, one after another, each created, used and left:
EagerService/CreateContext (a new random context id, a ServerDef as the adapter builds it), one Enqueue (push a
tensor [1, 2], Mul it by itself, _Send the result), WorkerService/RecvTensor of it ([1, 4] expected), then the
context is left as a client leaves it: every even cycle by CloseContext, every odd one as the stock TF2 client
does (it never closes: its StreamingEnqueue stream ends, and the server reclaims the context 3 s later). The
requests are hand-encoded over grpcio (as integration_tests/salus_wire.py does), so a cycle costs milliseconds
instead of the seconds of a new TensorFlow process; the server sees exactly the stock client's messages for
these items. Printed: eager contexts open (admin ServerInfo.open_eager_contexts: at checkpoints it includes the
few awaiting their 3 s reclaim; after the last cycle it must return to 0), file descriptors, threads, RSS and the
server heap's live bytes (ServerInfo.heap_in_use_bytes), with the same leak judgement as phase 2 plus one on the
live heap (below 1 KiB/cycle late). The server keeps freed heap memory for reuse while jobs run and hands it back
to the system when contexts end (at once when the last one ends), so RSS measured with no context open is
comparable across checkpoints.

Each phase starts its own salus-server ($SALUS_SERVER_BIN, default target/release/salus-server) with
--listen 127.0.0.1:0 (the address is read from its "salus-server listening on ADDR" line) and stops it by its
PID (SIGTERM, then its exit code is printed).

Usage:
  .venv/bin/python scripts/bench_load.py                 # 64 jobs (8 TF2) x 5 minutes, then 1000 + 1000 cycles
  .venv/bin/python scripts/bench_load.py --quick         # 16 jobs (4 TF2) x 1 minute, then 1000 + 1000 cycles
  .venv/bin/python scripts/bench_load.py --minutes 2 --sessions 32 --tf2 4 --processes 2 --skip-churn
  .venv/bin/python scripts/bench_load.py --skip-load --cycles 2000 --tf2-cycles 2000
  .venv/bin/python scripts/bench_load.py --users 1,8 --minutes 1 --skip-churn --compare-share   # as root

The driver itself does not import TensorFlow; its workers are this script run with --worker (internal).
--all-main applies to the load phase too (every TF1 session fetches salus_main_iter).
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
sys.path.insert(0, str(REPO / "integration_tests"))
import salus_wire as wire  # noqa: E402  (the hand-encoded protobuf codec of the integration tests)
RSS_GROWTH_TARGET_PCT = 10.0
SPREAD_TARGET = 3.0  # most / fewest steps of any two sessions in the load phase
LONGEST_WAIT_TARGET_S = 2.0  # the longest any client waits for one step (RunStep, or TF2 call + fetch)
LEAK_KIB_PER_CYCLE = 4.0  # RSS slope over the second half of the churn above which sessions look leaked
HEAP_LEAK_KIB_PER_CYCLE = 1.0  # the same for the server's live heap bytes (admin ServerInfo.heap_in_use_bytes)
TENANT_RATIO_TARGET = 1.1  # tenants mode: most / least device time of any two tenants (--share tenants)
TENANT_END_MARGIN_S = 8.0  # tenants mode: the window ends this long before the clients stop
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
    proc = subprocess.run([str(server_bin().with_name("salus")), "--server", address, *args, "--json"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"ctl {' '.join(args)} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def server_info(address: str) -> dict:
    """Admin GetServerInfo, raw: open_sessions (4), open_eager_contexts (12), heap_in_use_bytes (13, in MiB)."""
    import grpc
    with grpc.insecure_channel(address) as ch:
        raw = wire.call(ch, "/salus.v1.Admin/GetServerInfo", b"", timeout=30)
    return {"open_sessions": wire.first(raw, 4, 0), "open_eager_contexts": wire.first(raw, 12, 0),
            "heap_mib": wire.first(raw, 13, 0) / (1 << 20)}


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
        main = args.all_main or i % 2 == 0
        sessions.append((i, model, main, *build(model, 1000 + i, force_main=main)))
    Path(args.ready_file).touch()
    while not os.path.exists(args.go_file):
        time.sleep(0.01)
    go = json.loads(Path(args.go_file).read_text())
    results = {}

    def run(i, model, main, g, init, fetches):
        lat, steps_warm, errors = [], 0, {}
        cfg = tf.compat.v1.ConfigProto()
        cfg.experimental.session_metadata.name = f"{args.name_prefix}-{i}"
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


def worker_load_tf2(args) -> None:
    """One TF2 job (this process's one eager context, through the adapter: SALUS_SERVER is set): a tf.function
    training step on its main thread until the deadline the go file names; results to --out."""
    import numpy as np
    import tensorflow as tf

    i = args.first_session
    model = list(MODELS)[i % len(MODELS)]
    in_dim, widths, batch = MODELS[model]
    rng = np.random.RandomState(1000 + i)
    x = tf.constant(rng.normal(size=(batch, in_dim)).astype(np.float32))
    y = tf.constant(rng.randint(0, 10, size=batch).astype(np.int64))
    dims = [in_dim, *widths, 10]
    weights = [tf.Variable((rng.normal(size=(a, b)) * np.sqrt(2.0 / a)).astype(np.float32))
               for a, b in zip(dims, dims[1:])]
    slots = [tf.Variable(tf.zeros_like(v)) for v in weights]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            h = x
            for w in weights[:-1]:
                h = tf.nn.relu(tf.matmul(h, w))
            logits = tf.matmul(h, weights[-1])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for slot, g, v in zip(slots, tape.gradient(loss, weights), weights):
            slot.assign(0.9 * slot + g)
            v.assign_sub(0.01 * slot)
        return loss

    float(step().numpy())  # traces the function and opens the context before the go
    device = weights[0].device
    Path(args.ready_file).touch()
    while not os.path.exists(args.go_file):
        time.sleep(0.01)
    go = json.loads(Path(args.go_file).read_text())
    lat, steps_warm, errors = [], 0, {}
    while True:
        t0 = time.perf_counter()
        now = time.time()
        if now >= go["until"]:
            break
        try:
            float(step().numpy())
        except Exception as e:  # tf.errors.OpError and the adapter's errors alike
            key = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
            errors[key] = errors.get(key, 0) + 1
            if sum(errors.values()) > 1000:
                break
            continue
        dt = time.perf_counter() - t0
        if now >= go["warmup_until"]:
            lat.append(dt)
        else:
            steps_warm += 1
        if args.think_ms:
            time.sleep(args.think_ms / 1000)
    if not device.startswith("/job:worker"):
        errors[f"the TF2 job's variables are not on the server: {device}"] = 1
    np.savez(args.out, **{f"lat_{i}": np.asarray(lat, np.float32)})
    Path(args.out + ".json").write_text(json.dumps({i: dict(model=model, main=None, cls="tf2",
                                                           steps_warm=steps_warm, errors=errors)}))
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
    status = [{"cycle": 0, **proc_status(args.server_pid), "sessions": len(ctl_json(args.address, "jobs")["jobs"])}]
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
            st = {"cycle": k, **proc_status(args.server_pid), "sessions": len(ctl_json(args.address, "jobs")["jobs"])}
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


def tf2_env() -> dict:
    """A TF2 worker's environment: Keras 3 (no TF_USE_LEGACY_KERAS), none of the caller's SALUS_* settings."""
    env = {k: v for k, v in worker_env().items() if not k.startswith("SALUS_") and k != "TF_USE_LEGACY_KERAS"}
    return env


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def phase_load(args, tmp: Path) -> bool:
    """Returns True when the targets hold (no errors, RSS growth within the target)."""
    import numpy as np

    tf1 = args.sessions - args.tf2
    procs = min(args.processes, tf1) if tf1 else 0
    per = [tf1 // procs + (1 if p < tf1 % procs else 0) for p in range(procs)]
    print(f"== load: {args.sessions} jobs: {tf1} TF1 graph sessions ({procs} processes x {max(per, default=0)} "
          f"threads) and {args.tf2} TF2 eager jobs ({args.tf2} processes, one eager context each), "
          f"{args.minutes:g} min (warm-up {args.warmup_s:g} s), models {', '.join(MODELS)}, main iterations in "
          f"every other TF1 session, think time {args.think_ms:g} ms, policy {args.policy or 'default (fair)'}",
          flush=True)
    server = Server(*(("--policy", args.policy) if args.policy else ()))
    print(f"salus-server pid {server.pid} on {server.address}; at start: {proc_status(server.pid)}", flush=True)
    workers = []
    try:
        first = 0
        for p, n in enumerate(per):
            out = str(tmp / f"worker{p}")
            argv = [venv_python(), __file__, "--worker", "load", "--sessions", str(n), "--first-session",
                    str(first), "--ready-file", out + ".ready", "--go-file", str(tmp / "go"), "--out", out,
                    "--think-ms", str(args.think_ms), *(["--all-main"] if args.all_main else [])]
            workers.append((subprocess.Popen(argv, env=worker_env(), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=open(out + ".stderr", "w")), out))
            first += n
        for k in range(args.tf2):
            out = str(tmp / f"tf2worker{k}")
            argv = [venv_python(), __file__, "--worker", "load-tf2", "--first-session", str(first),
                    "--ready-file", out + ".ready", "--go-file", str(tmp / "go"), "--out", out,
                    "--think-ms", str(args.think_ms)]
            env = {**tf2_env(), "SALUS_SERVER": server.address, "SALUS_JOB_NAME": f"load-tf2-{first}"}
            workers.append((subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=open(out + ".stderr", "w")), out))
            first += 1
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
        jobs_end = ctl_json(server.address, "jobs")["jobs"]
        jobs_open = len(jobs_end)
        info_end = server_info(server.address)
        stats = ctl_json(server.address, "stats")
        for w, out in workers:
            try:
                w.wait(max(60, args.minutes * 60))
            except subprocess.TimeoutExpired:
                w.kill()  # our own child, by its Popen handle
                w.wait()
        time.sleep(1.0)
        # TF2 clients never close their contexts: the server reclaims each 3 s after its process exits.
        eager_deadline = time.monotonic() + 15
        while server_info(server.address)["open_eager_contexts"] and time.monotonic() < eager_deadline:
            time.sleep(0.25)
        closed_status = proc_status(server.pid)
        jobs_after = len(ctl_json(server.address, "jobs")["jobs"])
        info_after = server_info(server.address)
    finally:
        for w, _ in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        code = server.stop()

    classes = {"main": "TF1 sessions fetching salus_main_iter", "other": "other TF1 sessions",
               "tf2": "TF2 eager jobs"}
    lat_all, steps, warm_steps, errors = [], {}, 0, {}
    lat_by_class: dict[str, list] = {c: [] for c in classes}
    steps_by_class: dict[str, list[int]] = {c: [] for c in classes}

    def cls_of(s: dict) -> str:
        return s.get("cls") or ("main" if s["main"] else "other")

    for _, out in workers:
        if not Path(out + ".json").exists():
            errors["a worker wrote no results (see its .stderr)"] = errors.get("a worker wrote no results", 0) + 1
            continue
        summary = json.loads(Path(out + ".json").read_text())
        data = np.load(out + ".npz")
        for i, s in summary.items():
            lat = data[f"lat_{i}"]
            lat_all.append(lat)
            lat_by_class[cls_of(s)].append(lat)
            steps[int(i)] = len(lat) + s["steps_warm"]
            steps_by_class[cls_of(s)].append(steps[int(i)])
            warm_steps += s["steps_warm"]
            for k, v in s["errors"].items():
                errors[k] = errors.get(k, 0) + v
    if args.details:
        print("    session (process, model, class): steps, p50, p99 after the warm-up")
        for p, (_, out) in enumerate(workers):
            if not Path(out + ".json").exists():
                continue
            summary = json.loads(Path(out + ".json").read_text())
            data = np.load(out + ".npz")
            for i, s in sorted(summary.items(), key=lambda kv: int(kv[0])):
                lat = np.sort(data[f"lat_{i}"])
                kind = cls_of(s)
                print(f"    {int(i):3d} ({p}, {s['model']}, {kind}): {steps[int(i)]:7d} steps, "
                      f"{fmt_ms(percentile(lat, 0.5))}, {fmt_ms(percentile(lat, 0.99))}")
    lat_sorted = np.sort(np.concatenate(lat_all)) if lat_all else np.array([])
    measured_s = args.minutes * 60 - args.warmup_s
    per_session = sorted(steps.values())
    print(f"  steps: {sum(per_session)} in all ({warm_steps} in the warm-up), {len(lat_sorted) / measured_s:.0f} "
          f"steps/s after it; per session min {per_session[0]}, median {int(statistics.median(per_session))}, "
          f"max {per_session[-1]} ({len(per_session)} sessions)")
    for c, label in classes.items():
        cls = sorted(steps_by_class[c])
        if cls:
            print(f"    {label} ({len(cls)}): steps min {cls[0]}, median {int(statistics.median(cls))}, max {cls[-1]}")
    print(f"  errors: {sum(errors.values())}" + "".join(f"\n    {n} x {k}" for k, n in errors.items()))
    line = (f"  step latency at the clients after the warm-up (TF1 RunStep; TF2 function call + fetch): "
            f"p50 {fmt_ms(percentile(lat_sorted, 0.5))}, p99 {fmt_ms(percentile(lat_sorted, 0.99))}, "
            f"max {fmt_ms(float(lat_sorted[-1]) if len(lat_sorted) else 0)}")
    for c, label in (("main", "salus_main_iter sessions"), ("other", "other TF1 sessions"), ("tf2", "TF2 jobs")):
        if lat_by_class[c]:
            cls = np.sort(np.concatenate(lat_by_class[c]))
            line += f"; {label} p50 {fmt_ms(percentile(cls, 0.5))} p99 {fmt_ms(percentile(cls, 0.99))}"
    print(line)
    # Starvation: the spread of per-session step counts, and the longest any client waited for one step.
    spread = per_session[-1] / max(1, per_session[0])
    longest_s = float(lat_sorted[-1]) if len(lat_sorted) else 0.0
    ok_spread, ok_wait = spread <= SPREAD_TARGET, longest_s <= LONGEST_WAIT_TARGET_S
    print(f"  starvation: per-session steps max/min {spread:.2f}x (target <= {SPREAD_TARGET:g}x: "
          f"{'met' if ok_spread else 'MISSED'}); longest client step {longest_s:.3f} s (target <= "
          f"{LONGEST_WAIT_TARGET_S:g} s: {'met' if ok_wait else 'MISSED'})")
    # The same spread in device time, fair's own measure (main iterations and brief runs, from the server).
    service = {k: sorted(j["service_s"] for j in jobs_end if j["kind"] == k) for k in ("graph", "eager")}
    every = sorted(service["graph"] + service["eager"])
    if every and every[0] > 0:
        line = f"  device time per session (server's count, a few s before the end): max/min {every[-1] / every[0]:.2f}x"
        for kind, label in (("graph", "TF1"), ("eager", "TF2")):
            if service[kind]:
                v = service[kind]
                line += f"; {label} min {v[0]:.1f} s, median {statistics.median(v):.1f} s, max {v[-1]:.1f} s"
        print(line)
    warm = next((s for t, s, _ in samples if t >= args.warmup_s), samples[0][1] if samples else end_status)
    growth = (end_status["rss_mib"] - warm["rss_mib"]) / warm["rss_mib"] * 100
    ok_rss = growth <= RSS_GROWTH_TARGET_PCT
    print(f"  server RSS: after the warm-up {warm['rss_mib']:.1f} MiB, at the end {end_status['rss_mib']:.1f} MiB: "
          f"growth {growth:+.1f}% (target <= {RSS_GROWTH_TARGET_PCT:g}%: {'met' if ok_rss else 'MISSED'}); peak "
          f"{max(s['rss_mib'] for _, s, _ in samples):.1f} MiB; after all sessions closed "
          f"{closed_status['rss_mib']:.1f} MiB")
    print(f"  server threads {warm['threads']} -> {end_status['threads']} (after close {closed_status['threads']}), "
          f"fds {warm['fds']} -> {end_status['fds']} (after close {closed_status['fds']}); jobs open at the end "
          f"{jobs_open} ({info_end['open_sessions']} graph sessions, {info_end['open_eager_contexts']} eager "
          f"contexts), after the clients closed or exited {jobs_after} ({info_after['open_sessions']} sessions, "
          f"{info_after['open_eager_contexts']} contexts)")
    lat = stats.get("switch_latency_us", {})
    print(f"  server stats: {stats['iterations_total']} main iterations, {stats['cheap_runs_total']} cheap runs, "
          f"{stats.get('dropped_iterations', 0)} dropped, switch latency p50 {lat.get('p50')} us "
          f"p99 {lat.get('p99')} us; "
          f"server exit code {code}")
    return (not errors and ok_rss and ok_spread and ok_wait and jobs_after == 0
            and info_after["open_eager_contexts"] == 0 and code == 0 and len(steps) == args.sessions)


# --- tenants mode: sessions of several Unix users (--users) ----------------------------------------------

def owner(row: dict) -> str:
    """The user name of a job's or a tenant's row of `salus --json` (its tenant, the uid apart)."""
    return row["tenant"]


def tenant_snapshot(address: str, expected: dict[str, int]) -> dict:
    """ctl stats and ctl jobs, one after the other (the server's per-tenant and per-job device time). ctl jobs
    is asked again (up to 4 times) while it lists fewer jobs of a user than `expected` (under --isolation tenant
    the supervisor collects the rows from the executors and leaves out one that does not report within 5 s);
    the attempts are kept in "jobs_attempts", the seconds from ctl stats' answer to ctl jobs' in "jobs_lag_s"."""
    t0 = time.time()
    stats = ctl_json(address, "stats")
    t_stats = time.time()
    attempts = []
    for _ in range(5):
        a0 = time.monotonic()
        jobs = ctl_json(address, "jobs")["jobs"]
        listed = {n: sum(1 for j in jobs if owner(j) == n) for n in expected}
        attempts.append((round(time.monotonic() - a0, 2), listed))
        if all(listed[n] >= c for n, c in expected.items()):
            break
    return {"t": (t0 + time.time()) / 2, "share": stats.get("share"), "stats": stats,
            "tenants": {owner(r): r for r in stats.get("tenants", [])}, "jobs": {j["id"]: j for j in jobs},
            "jobs_attempts": attempts, "jobs_lag_s": time.time() - t_stats}


def phase_tenants(args, tmp: Path, users: list, counts: list[int], share: str) -> dict:
    """One server (--share SHARE), each user's sessions in its own worker process(es) running as that user; the
    device time of every tenant and job over the window in which all sessions run. Returns the figures."""
    import numpy as np
    from _bench_users import owned_dir, popen_as

    names = [u.pw_name for u in users]
    print(f"== tenants, --share {share}: {len(users)} Unix users, sessions "
          + ", ".join(f"{n} {c}" for n, c in zip(names, counts))
          + f" (TF1 graph sessions, each user's in {args.user_processes} worker process(es) of its own running as "
            f"that user), {args.minutes:g} min (warm-up {args.warmup_s:g} s), main iterations in "
          + ("every session" if args.all_main else "every other session of each user")
          + f", think time {args.think_ms:g} ms, policy {args.policy or 'default (fair)'}"
          + (f", server flags {' '.join(args.server_flag)}" if args.server_flag else ""), flush=True)
    run_dir = tmp / share
    run_dir.mkdir()
    os.chmod(run_dir, 0o711)  # the users' workers pass through it to their own directories and the go file
    flags = ["--share", share, *(("--policy", args.policy) if args.policy else ()), *args.server_flag]
    server = Server(*flags)
    print(f"salus-server {' '.join(flags)} pid {server.pid} on {server.address} (as root: each tenant's executor "
          f"runs as its user)", flush=True)
    script = str(Path(__file__).resolve())  # the workers start in their users' home directories
    workers = []  # (user name, Popen, out)
    first_snap = last_snap = None
    try:
        for user, n in zip(users, counts):
            home = owned_dir(run_dir, user)
            procs = min(args.user_processes, n)
            first = 0
            for p in range(procs):
                k = n // procs + (1 if p < n % procs else 0)
                out = str(home / f"worker{p}")
                argv = [venv_python(), script, "--worker", "load", "--sessions", str(k), "--first-session",
                        str(first), "--ready-file", out + ".ready", "--go-file", str(run_dir / "go"), "--out", out,
                        "--think-ms", str(args.think_ms), "--name-prefix", user.pw_name,
                        *(["--all-main"] if args.all_main else [])]
                workers.append((user.pw_name, popen_as(user, argv, worker_env(), stdin=subprocess.DEVNULL,
                                                       stdout=subprocess.DEVNULL,
                                                       stderr=open(out + ".stderr", "w")), out))
                first += k
        deadline = time.monotonic() + 300
        while not all(Path(o + ".ready").exists() for _, _, o in workers):
            if any(w.poll() is not None for _, w, _ in workers) or time.monotonic() > deadline:
                sys.exit(f"bench_load: a worker died or never got ready; see {run_dir}/*/worker*.stderr")
            time.sleep(0.1)
        start = time.time()
        go = {"target": server.target, "warmup_until": start + args.warmup_s, "until": start + args.minutes * 60}
        (run_dir / "go.tmp").write_text(json.dumps(go))
        os.chmod(run_dir / "go.tmp", 0o644)
        (run_dir / "go.tmp").rename(run_dir / "go")

        # The window opens after the warm-up once every session of every user has its job and has run (a
        # session's first runs include its tenant's executor start and the graph's setup), and closes
        # TENANT_END_MARGIN_S before the clients stop: ctl takes seconds on a saturated machine, and a ctl jobs
        # answered after the clients closed their sessions lists none.
        end_at = go["until"] - TENANT_END_MARGIN_S
        next_print = 30.0
        while time.time() < end_at:
            time.sleep(min(args.sample_s, max(0.1, end_at - time.time())))
            t = time.time() - start
            if first_snap is None and time.time() >= go["warmup_until"]:
                snap = tenant_snapshot(server.address, dict(zip(names, counts)))
                running = {n: sum(1 for j in snap["jobs"].values() if owner(j) == n and j["runs_completed"] >= 2)
                           for n in names}
                if all(running[n] == c for n, c in zip(names, counts)):
                    first_snap = snap
                    print(f"  t={t:5.0f}s  window opens: every session running "
                          f"({', '.join(f'{n} {running[n]}' for n in names)})", flush=True)
                    continue
                print(f"  t={t:5.0f}s  waiting for every session to run: "
                      + ", ".join(f"{n} {running[n]}/{c}" for n, c in zip(names, counts)), flush=True)
            if t >= next_print:
                try:
                    rows = ctl_json(server.address, "stats").get("tenants", [])
                    print(f"  t={t:5.0f}s  device time so far: "
                          + ", ".join(f"{owner(r)} {r['device_s']:.1f} s ({r['jobs']} jobs, {r['queued']} queued)"
                                      for r in rows), flush=True)
                except RuntimeError:
                    pass
                next_print += 30.0
        if first_snap is not None:
            last_snap = tenant_snapshot(server.address, dict(zip(names, counts)))
        for _, w, _ in workers:
            try:
                w.wait(max(60, args.minutes * 60))
            except subprocess.TimeoutExpired:
                w.kill()  # our own child, by its Popen handle
                w.wait()
    finally:
        for _, w, _ in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        code = server.stop()

    # The clients' own counts: steps (warm-up included) and errors.
    errors: dict[str, int] = {}
    client_steps = {n: 0 for n in names}
    client_lat: dict[str, list] = {n: [] for n in names}
    for n, _, out in workers:
        if not Path(out + ".json").exists():
            errors["a worker wrote no results (see its .stderr)"] = errors.get("a worker wrote no results", 0) + 1
            continue
        data = np.load(out + ".npz")
        for i, s in json.loads(Path(out + ".json").read_text()).items():
            client_steps[n] += len(data[f"lat_{i}"]) + s["steps_warm"]
            client_lat[n].append(data[f"lat_{i}"])
            for k, v in s["errors"].items():
                errors[k] = errors.get(k, 0) + v
    result = {"share": share, "ok": False, "ratio": float("nan"), "code": code}
    if first_snap is None or last_snap is None:
        print(f"  no window in which every session ran (see {run_dir}/*/worker*.stderr); errors "
              f"{sum(errors.values())}" + "".join(f"\n    {v} x {k}" for k, v in errors.items()))
        return result
    for label, snap in (("window start", first_snap), ("window end", last_snap)):
        if len(snap["jobs_attempts"]) > 1:
            print(f"  note: at the {label} ctl jobs listed fewer jobs than run; attempts (seconds, jobs listed per "
                  f"user): {snap['jobs_attempts']}")
    window = last_snap["t"] - first_snap["t"]
    rows = []
    for n, c in zip(names, counts):
        dev = last_snap["tenants"][n]["device_s"] - first_snap["tenants"].get(n, {"device_s": 0.0})["device_s"]
        jobs = []
        for jid, j in last_snap["jobs"].items():
            if owner(j) != n:
                continue
            before = first_snap["jobs"].get(jid, {"service_s": 0.0, "runs_completed": 0})
            jobs.append((j["service_s"] - before["service_s"], j["runs_completed"] - before["runs_completed"],
                         j.get("name", ""), j["iterations"] - before.get("iterations", 0)))
        if len(jobs) < c:
            print(f"  note: {n}: ctl jobs listed {len(jobs)} of its {c} jobs at the window end; its jobs' sum, "
                  f"steps and per-job spread below miss the others")
        rows.append({"tenant": n, "sessions": c, "device_s": dev, "jobs_s": sum(j[0] for j in jobs),
                     "steps": sum(j[1] for j in jobs), "per_job": sorted(j[0] for j in jobs), "jobs": sorted(jobs),
                     "client_steps": client_steps[n],
                     "lat": np.sort(np.concatenate(client_lat[n])) if client_lat[n] else np.array([])})
    total = sum(r["device_s"] for r in rows)
    print(f"  window: {window:.1f} s (t={first_snap['t'] - start:.0f}-{last_snap['t'] - start:.0f} s), every "
          f"session running; device time in it {total:.1f} s ({total / window * 100:.0f}% of the window; one lane, "
          f"brief runs beside it); server reports share={last_snap['share']}; ctl jobs answered "
          f"{first_snap['jobs_lag_s']:.1f} s / {last_snap['jobs_lag_s']:.1f} s after ctl stats at its start / end")
    print(f"  {'tenant':<16} {'sessions':>8} {'device s':>9} {'jobs sum s':>10} {'share':>6} {'steps':>8} "
          f"{'steps/s':>8} {'dev ms/step':>11} {'p50 ms':>7} {'p99 ms':>7}")
    for r in rows:
        print(f"  {r['tenant']:<16} {r['sessions']:>8} {r['device_s']:>9.2f} {r['jobs_s']:>10.2f} "
              f"{r['device_s'] / total * 100 if total else 0:>5.1f}% {r['steps']:>8} {r['steps'] / window:>8.0f} "
              f"{r['device_s'] / max(1, r['steps']) * 1000:>11.3f} {percentile(r['lat'], 0.5) * 1000:>7.2f} "
              f"{percentile(r['lat'], 0.99) * 1000:>7.2f}")
    print("  (steps: the server's runs in the window; p50/p99: step latency at the clients after the warm-up)")
    devs = [r["device_s"] for r in rows]
    ratio = max(devs) / min(devs) if min(devs) > 0 else float("inf")
    met = ratio <= TENANT_RATIO_TARGET
    print(f"  device time max/min between tenants: {ratio:.3f}x"
          + (f" (target <= {TENANT_RATIO_TARGET:g}: {'met' if met else 'not met'})" if share == "tenants" else
             f" (per-job sharing: about the ratio of session counts, {max(counts) / min(counts):g}x, expected)"))
    since = [last_snap["tenants"][n]["device_s"] for n in names]
    print("  since the server started (warm-up and start-up included; no target): "
          + ", ".join(f"{n} {d:.2f} s" for n, d in zip(names, since))
          + f", max/min {max(since) / min(since) if min(since) > 0 else float('inf'):.2f}x")
    for r in rows:
        v = r["per_job"]
        if v:
            spread = v[-1] / v[0] if v[0] > 0 else float("inf")
            print(f"    {r['tenant']}: device time per job min {v[0]:.2f} s, median {statistics.median(v):.2f} s, "
                  f"max {v[-1]:.2f} s, max/min {spread:.2f}x ({len(v)} jobs)")
        if args.details:
            for dev, steps, name, iters in r["jobs"]:
                i = int(name.rsplit("-", 1)[-1]) if name.rsplit("-", 1)[-1].isdigit() else -1
                kind = ("main" if args.all_main or i % 2 == 0 else "other") if i >= 0 else "?"
                print(f"      {name or '?'} ({list(MODELS)[i % len(MODELS)] if i >= 0 else '?'}, {kind}): device "
                      f"{dev:.2f} s, {steps} steps ({iters} main iterations), "
                      f"{dev / max(1, steps) * 1000:.3f} ms/step")
    print(f"  errors: {sum(errors.values())}" + "".join(f"\n    {v} x {k}" for k, v in errors.items())
          + "; client steps (warm-up included): " + ", ".join(f"{n} {client_steps[n]}" for n in names)
          + f"; server exit code {code}")
    result.update(ratio=ratio, rows=rows, window_s=window,
                  ok=not errors and code == 0 and (met or share != "tenants"))
    return result


def run_tenants(args, tmp: Path, counts: list[int]) -> bool:
    """Creates the users, runs --share tenants (and --share jobs with --compare-share), removes the users."""
    from _bench_users import bench_users

    os.chmod(tmp, 0o711)
    reach = [Path(venv_python()), REPO / "scripts", REPO / "integration_tests", server_bin()]
    results = []
    with bench_users(len(counts), reach=reach) as users:
        print("users: " + ", ".join(f"{u.pw_name} (uid {u.pw_uid})" for u in users), flush=True)
        for share in ["tenants", "jobs"] if args.compare_share else ["tenants"]:
            results.append(phase_tenants(args, tmp, users, counts, share))
    if len(results) > 1:
        print("== tenants mode, side by side: device time max/min between tenants "
              + "; ".join(f"--share {r['share']} {r['ratio']:.3f}x" for r in results)
              + f" (sessions {','.join(map(str, counts))})")
    return all(r["ok"] for r in results)


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


# --- TF2 churn: hand-encoded remote-eager requests (TensorFlow's field numbers, eager_service.proto) ---------

EAGER = "/tensorflow.eager.EagerService/"
SERVER_DEVICE = "/job:worker/replica:0/task:0/device:CPU:0"
CLIENT_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


def _fixed64(field: int, value: int) -> bytes:
    return wire.tag(field, wire.I64) + value.to_bytes(8, "little")


def _attr(field: int, value) -> bytes:
    """AttrValue{s=2 | i=3 | b=5 | type=6}."""
    return wire.f_bytes(field, value) if field == 2 else wire.f_varint(field, value)


def _op(op_id: int, name: str, inputs: list[int], attrs: dict[str, bytes]) -> bytes:
    """QueueItem{operation=2: Operation{id=1, name=2, op_inputs=10 {remote_handle=1}, attrs=5, device=6}}."""
    msg = wire.f_varint(1, op_id) + wire.f_bytes(2, name)
    for i in inputs:
        handle = (wire.f_varint(1, i) + wire.f_bytes(3, SERVER_DEVICE) + wire.f_bytes(4, SERVER_DEVICE)
                  + wire.f_varint(5, wire.DT_FLOAT))
        msg += wire.f_bytes(10, wire.f_bytes(1, handle))
    for k, v in attrs.items():
        msg += wire.f_bytes(5, wire.f_bytes(1, k) + wire.f_bytes(2, v))
    msg += wire.f_bytes(6, SERVER_DEVICE)
    return wire.f_bytes(2, msg)


def create_context_request(context_id: int, name: str) -> bytes:
    """CreateContextRequest as the stock client sends the adapter's ServerDef: cluster {worker: server,
    localhost: client}, job_name rewritten to the server's job ("worker") task 0, grpc,
    default_session_config.experimental.session_metadata.name; keep-alive 600 s."""
    def job(job_name: str, address: str) -> bytes:
        return wire.f_bytes(1, job_name) + wire.f_bytes(2, wire.f_varint(1, 0) + wire.f_bytes(2, address))

    config = wire.f_bytes(16, wire.f_bytes(11, wire.f_bytes(1, name)))
    server_def = (wire.f_bytes(1, wire.f_bytes(1, job("worker", "127.0.0.1:1")) + wire.f_bytes(1, job("localhost",
                  "localhost:2"))) + wire.f_bytes(2, "worker") + wire.f_bytes(4, config) + wire.f_bytes(5, "grpc"))
    return (wire.f_bytes(1, server_def) + wire.f_varint(3, 600) + _fixed64(7, context_id) + wire.f_varint(9, 1))


def cycle_enqueue(context_id: int, tensor_name: str) -> bytes:
    """EnqueueRequest: send_tensor 1 = [1, 2]; 2 = Mul(1, 1); 3 = _Send(2) to the client as tensor_name."""
    t = wire.f_varint(6, wire.DT_FLOAT)  # AttrValue{type}
    send = wire.f_bytes(3, wire.f_varint(1, 1) + wire.f_bytes(2, wire.tensor_proto(wire.DT_FLOAT, [2],
                                                                                     float_val=[1.0, 2.0]))
                        + wire.f_bytes(3, SERVER_DEVICE))
    mul = _op(2, "Mul", [1, 1], {"T": t})
    send_op = _op(3, "_Send", [2], {"T": t, "tensor_name": _attr(2, tensor_name), "send_device":
                                    _attr(2, SERVER_DEVICE), "recv_device": _attr(2, CLIENT_DEVICE),
                                    "send_device_incarnation": _attr(3, 1), "client_terminated": _attr(5, 0)})
    return _fixed64(1, context_id) + wire.f_bytes(3, send) + wire.f_bytes(3, mul) + wire.f_bytes(3, send_op)


def recv_request(context_id: int, tensor_name: str) -> bytes:
    key = f"{SERVER_DEVICE};0000000000000001;{CLIENT_DEVICE};{tensor_name};0:0"
    return wire.f_varint(1, context_id) + wire.f_bytes(2, key)


def tensor_floats(tensor: bytes) -> list[float]:
    import struct
    content = wire.first(tensor, 4, b"")
    if content:
        return list(struct.unpack(f"<{len(content) // 4}f", content))
    packed = wire.first(tensor, 5, b"")
    return list(struct.unpack(f"<{len(packed) // 4}f", packed)) if isinstance(packed, bytes) else []


def phase_churn_tf2(args) -> bool:
    import random

    import grpc
    print(f"== TF2 churn: {args.tf2_cycles} eager contexts one after another (CreateContext, Enqueue push / Mul "
          f"/ _Send, RecvTensor; then CloseContext every even cycle, end of the StreamingEnqueue stream every odd "
          f"one, as the stock client leaves), hand-encoded gRPC", flush=True)
    server = Server()
    rng = random.Random(7)
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",")} | {args.tf2_cycles})
    errors: dict[str, int] = {}
    times = []

    def status(k: int) -> dict:
        return {"cycle": k, **proc_status(server.pid), **server_info(server.address)}

    def show(st: dict, t0: float) -> None:
        print(f"  after {st['cycle']:5d} cycles ({time.monotonic() - t0:5.1f}s): eager contexts open "
              f"{st.get('pending', 0)} right after the cycle (awaiting reclaim), {st['open_eager_contexts']} once "
              f"reclaimed; fds {st['fds']}, threads {st['threads']}, RSS {st['rss_mib']:.1f} MiB, heap in use "
              f"{st['heap_mib']:.2f} MiB", flush=True)

    t0 = time.monotonic()
    try:
        ch = grpc.insecure_channel(server.address)
        create = ch.unary_unary(EAGER + "CreateContext")
        enqueue = ch.unary_unary(EAGER + "Enqueue")
        streaming = ch.stream_stream(EAGER + "StreamingEnqueue")
        close = ch.unary_unary(EAGER + "CloseContext")
        recv = ch.unary_unary("/tensorflow.WorkerService/RecvTensor")
        st = [status(0)]
        show(st[0], t0)
        for k in range(1, args.tf2_cycles + 1):
            context_id = rng.getrandbits(62) | 1
            name = f"churn-{k}"
            c0 = time.perf_counter()
            try:
                create(create_context_request(context_id, "tf2-churn"), timeout=30)
                request = cycle_enqueue(context_id, name)
                if k % 2:
                    responses = list(streaming(iter([request]), timeout=30))  # the stream ends with the request
                    ok = len(responses) == 1
                else:
                    ok = bool(enqueue(request, timeout=30) is not None)
                value = tensor_floats(wire.first(recv(recv_request(context_id, name), timeout=30), 1, b""))
                if not ok or value != [1.0, 4.0]:
                    errors[f"wrong result {value}"] = errors.get(f"wrong result {value}", 0) + 1
                if k % 2 == 0:
                    close(_fixed64(1, context_id), timeout=30)
            except grpc.RpcError as e:
                key = f"{e.code().name}: {(e.details() or '')[:200]}"
                errors[key] = errors.get(key, 0) + 1
            times.append(time.perf_counter() - c0)
            if k in checkpoints:
                # Measured once the stream-ended contexts (reclaimed 3 s after their streams ended) are gone, so
                # that RSS and threads compare like with like: what is left then is what cycles left behind.
                pending = server_info(server.address)["open_eager_contexts"]
                deadline = time.monotonic() + 15
                while server_info(server.address)["open_eager_contexts"] and time.monotonic() < deadline:
                    time.sleep(0.25)
                time.sleep(0.25)
                st.append({**status(k), "pending": pending})
                show(st[-1], t0)
        ch.close()
    finally:
        code = server.stop()
    first, last = st[0], st[-1]
    times.sort()
    print(f"  errors: {sum(errors.values())}" + "".join(f"\n    {n} x {k}" for k, n in errors.items()))
    print(f"  cycle time p50 {percentile(times, 0.5) * 1000:.1f} ms, p99 {percentile(times, 0.99) * 1000:.1f} ms")
    print(f"  eager contexts open {first['open_eager_contexts']} -> {last['pending']} right after the last cycle "
          f"(stream-ended ones awaiting their 3 s reclaim) -> {last['open_eager_contexts']} once reclaimed "
          f"(target 0), fds {first['fds']} -> {last['fds']} ({last['fds'] - first['fds']:+d}; target: no growth), "
          f"threads {first['threads']} -> {last['threads']}")
    warm = min((x for x in st if x["cycle"] >= 10), key=lambda x: x["cycle"], default=last)
    half = min(st, key=lambda x: abs(x["cycle"] - last["cycle"] / 2))
    steady = (last["rss_mib"] - warm["rss_mib"]) * 1024 / max(1, last["cycle"] - warm["cycle"])
    late = (last["rss_mib"] - half["rss_mib"]) * 1024 / max(1, last["cycle"] - half["cycle"])
    judged = last["cycle"] - half["cycle"] >= 200
    heap_late = (last["heap_mib"] - half["heap_mib"]) * 1024 / max(1, last["cycle"] - half["cycle"])
    leak = judged and (late > LEAK_KIB_PER_CYCLE or heap_late > HEAP_LEAK_KIB_PER_CYCLE)
    print(f"  heap in live blocks {first['heap_mib']:.2f} -> {last['heap_mib']:.2f} MiB: {heap_late * 1024:.0f} "
          f"bytes/cycle over {half['cycle']}-{last['cycle']} (target below {HEAP_LEAK_KIB_PER_CYCLE:g} KiB/cycle)")
    print(f"  RSS {first['rss_mib']:.1f} -> {last['rss_mib']:.1f} MiB "
          f"({last['rss_mib'] - first['rss_mib']:+.1f} MiB, each measured with no context open): "
          f"{warm['rss_mib'] - first['rss_mib']:+.1f} MiB with the first {warm['cycle']} contexts (one-time), then "
          f"{steady:.2f} KiB/cycle over cycles {warm['cycle']}-{last['cycle']} and {late:.2f} KiB/cycle over "
          f"{half['cycle']}-{last['cycle']}: "
          + ("too few cycles to judge" if not judged else
             f"keeps growing, a possible leak of about {late:.1f} KiB per context" if leak else
             f"levels off (below {LEAK_KIB_PER_CYCLE:g} KiB/cycle), no per-context leak")
          + f"; server exit code {code}")
    return (not errors and last["open_eager_contexts"] == 0 == first["open_eager_contexts"]
            and last["fds"] <= first["fds"] + 1 and not leak and code == 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 minute and 16 sessions (unless given explicitly)")
    ap.add_argument("--minutes", type=float, help="length of the load phase (default 5, --quick 1)")
    ap.add_argument("--sessions", type=int, help="concurrent client sessions (default 64, --quick 16)")
    ap.add_argument("--tf2", type=int, help="how many of the jobs are TF2 eager jobs, one process each "
                                           "(default 8, --quick 4)")
    ap.add_argument("--processes", type=int, default=4, help="worker processes the TF1 sessions are spread over")
    ap.add_argument("--warmup-s", type=float, help="warm-up excluded from latency and the RSS baseline "
                                                    "(default 30, --quick 15)")
    ap.add_argument("--think-ms", type=float, default=0.0, help="pause of each client between its steps")
    ap.add_argument("--policy", help="the load server's --policy (default: the server's, fair; pack: by arrival, "
                                     "so later jobs' main iterations wait while earlier ones have work)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="how often the server is sampled")
    ap.add_argument("--details", action="store_true", help="also print every session's steps and latency")
    ap.add_argument("--cycles", type=int, default=1000, help="create/run/close cycles of the churn phase "
                                                              "(0 skips it)")
    ap.add_argument("--tf2-cycles", type=int, default=1000, help="eager context create/run/leave cycles of the "
                                                                   "TF2 churn phase (0 skips it)")
    ap.add_argument("--checkpoints", default="1,10,100,250,500,750",
                    help="cycles after which the server is measured (and after the last)")
    ap.add_argument("--users", help="tenants mode: comma-separated sessions per Unix user, e.g. 1,8 (user "
                                    "salus-bench-u0 runs 1 session, salus-bench-u1 8); replaces the load phase's "
                                    "--sessions/--tf2 mix; needs root")
    ap.add_argument("--user-processes", type=int, default=1, help="tenants mode: worker processes per user")
    ap.add_argument("--compare-share", action="store_true", help="tenants mode: then the same load under "
                                                                 "--share jobs, side by side")
    ap.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                    help="tenants mode: a further salus-server flag, e.g. --server-flag=--anticipation=0 "
                         "(repeatable)")
    ap.add_argument("--all-main", action="store_true", help="every TF1 session fetches salus_main_iter (no brief "
                                                            "runs by name)")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-churn", action="store_true")
    # Internal: the worker processes.
    ap.add_argument("--worker", choices=["load", "load-tf2", "churn"], help=argparse.SUPPRESS)
    ap.add_argument("--first-session", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ready-file", help=argparse.SUPPRESS)
    ap.add_argument("--go-file", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--name-prefix", default="load", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker == "load":
        worker_load(args)
    if args.worker == "load-tf2":
        worker_load_tf2(args)
    if args.worker == "churn":
        worker_churn(args)
    counts = []
    if args.users:
        try:
            counts = [int(c) for c in args.users.split(",")]
        except ValueError:
            ap.error("--users takes comma-separated session counts, e.g. 1,8")
        if len(counts) < 2 or min(counts) < 1:
            ap.error("--users needs two or more users with at least one session each")
        if args.user_processes < 1:
            ap.error("--user-processes must be at least 1")
    elif args.compare_share or args.server_flag:
        ap.error("--compare-share and --server-flag need --users")
    args.minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 5.0)
    args.sessions = args.sessions or (16 if args.quick else 64)
    args.tf2 = args.tf2 if args.tf2 is not None else min(args.sessions, 4 if args.quick else 8)
    if not 0 <= args.tf2 <= args.sessions:
        ap.error("--tf2 must be between 0 and --sessions")
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (15.0 if args.quick else 30.0)
    if args.warmup_s >= args.minutes * 60:
        ap.error("--warmup-s must be shorter than --minutes")

    print(f"bench_load: {server_bin()}; {os.cpu_count()} CPUs", flush=True)
    ok = True
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_load.") as tmp:
        if not args.skip_load:
            ok &= run_tenants(args, Path(tmp), counts) if counts else phase_load(args, Path(tmp))
        if not args.skip_churn:
            if args.cycles:
                ok &= phase_churn(args, Path(tmp))
            if args.tf2_cycles:
                ok &= phase_churn_tf2(args)
    print(f"bench_load: {'all targets met' if ok else 'SOME TARGETS MISSED'} ({time.monotonic() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
