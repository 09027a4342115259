#!/usr/bin/env python3
"""Benchmark: Keras 3 `fit` (TF2 eager) in-process, through TensorFlow's own server, and through salus-server in both
isolation modes (--isolation tenant: a supervisor that hands the client's connection to the tenant's own
executor process; none: one process), side by side in one run.

Each target is one long-lived client process running the same unmodified Keras code: "in-process" without
SALUS_SERVER, "tf-server", "salus-tenant" and "salus-none" with SALUS_SERVER pointing at the server, so the
adapter's startup hook connects the eager context (TensorFlow's remote-eager protocol) exactly as for a user's
script. Every client runs as this Unix user, so the tenant-mode server serves its client from one executor. The
parent starts the servers, then runs interleaved rounds: each round asks every client in turn (the order rotates)
for a block of training steps; one client works at a time, so machine noise hits them equally. A step's time is the
gap between consecutive on_train_batch_end callbacks (steps_per_execution=1), after warm-up.

Workloads
  mlp   a small MLP (32 -> 64 -> 64 -> 1), batch 64: protocol + scheduling overhead per step
  cnn   a CNN (4 conv layers, 32-64 filters) on 32x32x3 images, batch 32 (about 50 ms per step in-process on
        a 2-core CPU; at least 20 ms)

Goals (printed next to the measured ratios; exit status only with --check)
  TF2 CNN step   salus-tenant / in-process  <= 1.02   (salus-none / in-process <= 1.05)
  TF2 MLP step   salus-* / tf-server        <= 0.8
Each comparison also prints, per target, the CPU time one step costs: the client process's own (Keras, and for
the remote targets TensorFlow's remote-eager client) plus its server's processes' (supervisor and executors; 0 for
in-process). On a machine whose cores the step already fills, the remote targets' extra CPU per step is where
their extra wall time comes from.
The "isolation" block of the output has one line per ratio, e.g.
  TF2 CNN step     tenant/in-process  1.010x (tenant 52.100 ms, in-process 51.600 ms)   goal <= 1.02: met
  TF2 CNN step     tenant/none        1.004x (tenant 52.100 ms, none 51.900 ms)

  .venv/bin/python scripts/bench_eager.py [--quick] [--repeat N] [--isolation both|tenant|none]
                                          [--server-bin target/release/salus-server]

Takes about 1.5 minutes on a 2-core machine (--quick about 45 s; --rounds 1 about 30 s, most of it four client
processes importing TensorFlow and building their models). --repeat N runs the whole comparison N times
with the same clients and ends with each ratio's min / median / max over the runs and in how many runs its goal
was met.

A target that fails (salus-server missing, or its eager front end refusing the context) is reported with its
error and the others keep going.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_tenants as tenants  # noqa: E402

T, N = "salus-tenant", "salus-none"  # the two salus-server targets (_bench_tenants.label)
GOALS = {("mlp", T, "tf-server"): 0.8, ("mlp", N, "tf-server"): 0.8,
         ("cnn", T, "in-process"): 1.02, ("cnn", N, "in-process"): 1.05}
PAIRS = [(T, N), (T, "tf-server"), (N, "tf-server"), (T, "in-process"), (N, "in-process"),
         ("tf-server", "in-process")]
WHAT = {"mlp": "TF2 MLP step", "cnn": "TF2 CNN step"}
ISOLATION_LINES = {"mlp": [(T, N)], "cnn": [(T, "in-process"), (T, N), (N, "in-process")]}
# (steps per block, warm-up steps)
BLOCKS = {"mlp": (40, 30), "cnn": (10, 5)}


# --- the client (child process): python bench_eager.py --client ----------------------------------------

def client_main() -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    want_remote = bool(os.environ.get("SALUS_SERVER"))
    keras.utils.set_random_seed(1)
    rng = np.random.RandomState(0)
    data = {
        "mlp": (rng.normal(size=(64 * 8, 32)).astype(np.float32), rng.normal(size=(64 * 8, 1)).astype(np.float32),
                64),
        "cnn": (rng.rand(32 * 4, 32, 32, 3).astype(np.float32), rng.randint(0, 10, 32 * 4).astype(np.int64), 32),
    }

    def build(name):
        if name == "mlp":
            m = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
            m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=1)
        else:
            L = keras.layers
            m = keras.Sequential([keras.Input((32, 32, 3)),
                                  L.Conv2D(32, 3, padding="same", activation="relu"),
                                  L.Conv2D(32, 3, padding="same", activation="relu"), L.MaxPooling2D(),
                                  L.Conv2D(64, 3, padding="same", activation="relu"),
                                  L.Conv2D(64, 3, padding="same", activation="relu"),
                                  L.GlobalAveragePooling2D(), L.Dense(10)])
            m.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=1)
        return m

    class Stamps(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.t = []

        def on_train_batch_end(self, batch, logs=None):
            self.t.append(time.perf_counter())

    def run(name, steps):
        # One epoch of steps + 1 batches from a repeating dataset: steps gaps between batch ends, no epoch
        # boundary inside the block. Also this process's CPU seconds for the steps + 1 batches.
        cb = Stamps()
        cpu = tenants.process_cpu_seconds()
        models[name].fit(datasets[name], steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[cb])
        return [b - a for a, b in zip(cb.t, cb.t[1:])], tenants.process_cpu_seconds() - cpu

    try:
        models = {name: build(name) for name in data}
        datasets = {name: tf.data.Dataset.from_tensor_slices((x, y)).batch(b, drop_remainder=True).repeat()
                    for name, (x, y, b) in data.items()}
        devices = sorted({getattr(w.value, "device", "") for m in models.values() for w in m.weights})
        if want_remote:
            import salus._patch
            mode = salus._patch.stats().get("eager")
            if mode != "connected" or not all(d.startswith("/job:worker") for d in devices):
                say({"error": f"eager work is not on the server (adapter eager state {mode!r}, variables on "
                              f"{devices})"})
                return 1
        for name, (_, warmup) in BLOCKS.items():
            run(name, warmup)
    except Exception as e:
        say({"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
        return 1
    say({"ready": True, "devices": devices})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        try:
            gaps, cpu = run(cmd[0], int(cmd[1]))
            say({"gaps": gaps, "cpu": cpu})
        except Exception as e:
            say({"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
    return 0


# --- the parent ------------------------------------------------------------------------------------------

class Client:
    """One benchmark client process; speaks JSON lines over stdin/stdout."""

    def __init__(self, name: str, server: str | None, server_pid: int | None = None, timeout: float = 300):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SALUS_") and k != "TF_USE_LEGACY_KERAS"}
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        if server:
            env.update(SALUS_SERVER=server, SALUS_JOB_NAME=f"bench-eager-{name}")
        self.name = name
        self.server_pid = server_pid
        self.error: str | None = None
        self.stderr: list[str] = []
        # CPU seconds over the blocks of steps run so far, per workload: (batches, client, server)
        self.cpu: dict[str, tuple[int, float, float]] = {}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--client"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._drain, daemon=True).start()
        reply = self._read(timeout)
        if "error" in reply:
            self.error = reply["error"]
            self.close()

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)

    def _read(self, timeout: float) -> dict:
        result: list[dict] = []

        def reader():
            for line in self.proc.stdout:
                if line.startswith("{"):
                    result.append(json.loads(line))
                    return

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t.join(timeout)
        if not result:
            tail = "".join(self.stderr[-5:]).strip()
            return {"error": f"client gave no answer (exit code {self.proc.poll()}): {tail[-600:]}"}
        return result[0]

    def steps(self, workload: str, n: int) -> list[float]:
        server_cpu = tenants.tree_cpu_seconds(self.server_pid)
        self.proc.stdin.write(f"{workload} {n}\n")
        self.proc.stdin.flush()
        reply = self._read(600)
        if "error" in reply:
            self.error = reply["error"]
            self.close()
            return []
        server_cpu = tenants.tree_cpu_seconds(self.server_pid) - server_cpu
        batches, client, server = self.cpu.get(workload, (0, 0.0, 0.0))
        self.cpu[workload] = (batches + n + 1, client + reply["cpu"], server + server_cpu)
        return reply["gaps"]

    def cpu_per_step(self, workload: str) -> tuple[float, float] | None:
        """Mean CPU seconds per batch of this client's process and of its server's processes."""
        batches, client, server = self.cpu.get(workload, (0, 0.0, 0.0))
        return (client / batches, server / batches) if batches else None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def start_tf_server():
    """TensorFlow's own server as task 0 of job "worker" (what the adapter's ServerDef names the server)."""
    import re

    from bench_master import Child
    code = ("import socket, time, tensorflow as tf\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "addr = f'127.0.0.1:{port}'\n"
            "srv = tf.distribute.Server(tf.train.ClusterSpec({'worker': [addr]}), job_name='worker', task_index=0,"
            " protocol='grpc', start=True)\n"
            "print('tf-server listening on', addr, flush=True); time.sleep(1e9)")
    return Child("tf-server", [sys.executable, "-c", code], re.compile(r"^tf-server listening on (\S+)$"))


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:8.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:8.1f} us"


def compare_once(workloads: list[str], clients: dict, addresses: dict, errors: dict[str, str],
                 rounds: int) -> dict[tuple[str, str, str], float]:
    """One whole comparison: interleaved rounds, medians per target, ratios (printed and returned)."""
    ratios: dict[tuple[str, str, str], float] = {}
    times: dict[str, dict[str, list[float]]] = {w: {t: [] for t in clients} for w in workloads}
    order = list(clients)
    for c in clients.values():
        c.cpu.clear()
    for r in range(rounds):
        rotated = order[r % len(order):] + order[:r % len(order)] if order else []
        for w in workloads:
            block = BLOCKS[w][0]
            for t in rotated:
                c = clients.get(t)
                if c is None or c.error:
                    continue
                times[w][t].extend(c.steps(w, block))
                if c.error:
                    errors[t] = c.error
                    print(f"bench: {t}: {c.error}", flush=True)

    medians: dict[str, dict[str, float]] = {}
    for w in workloads:
        medians[w] = {t: statistics.median(v) for t, v in times[w].items() if v and t not in errors}
        cols = []
        for t in addresses:
            if t in medians[w]:
                cols.append(f"{t} {fmt_time(medians[w][t])} ({len(times[w][t])} steps)")
            else:
                cols.append(f"{t} error")
        print(f"{w:4s} median per step: " + "  ".join(cols), flush=True)
        cols = []
        for t, c in clients.items():
            per_step = None if t in errors else c.cpu_per_step(w)
            if per_step:
                client, server = per_step
                cols.append(f"{t} {1e3 * client:.2f} + {1e3 * server:.2f} = {1e3 * (client + server):.2f} ms")
        print(f"{w:4s} CPU per step (client + server): " + "  ".join(cols), flush=True)

    print("\nratios (median / median):")
    for w, m in medians.items():
        for a, b in PAIRS:
            if a not in addresses or b not in addresses:
                continue  # a target not asked for (--isolation, --without-salus)
            goal = GOALS.get((w, a, b))
            note = f"   goal <= {goal}" if goal is not None else ""
            if a in m and b in m:
                ratio = ratios[(w, a, b)] = m[a] / m[b]
                if goal is not None:
                    note += f": {'met' if ratio <= goal else 'MISSED'}"
                print(f"  {w:4s} {a:>12s} / {b:<12s} {ratio:6.3f}{note}")
            elif goal is not None:
                missing = a if a not in m else b
                print(f"  {w:4s} {a:>12s} / {b:<12s}    n/a{note}: {missing} failed "
                      f"({errors.get(missing, 'no data')[:200]})")
    lines = [tenants.ratio_line(WHAT[w], a, b, m[a], m[b], GOALS.get((w, a, b)))
             for w, m in medians.items() for a, b in ISOLATION_LINES[w] if a in m and b in m]
    if lines:
        print("\nisolation (salus-server --isolation tenant vs none, and vs in-process; median step):")
        print("\n".join(lines), flush=True)
    if "cnn" in medians and "in-process" in medians["cnn"] and medians["cnn"]["in-process"] < 0.020:
        print(f"  note: cnn in-process median {fmt_time(medians['cnn']['in-process'])} is under 20 ms on "
              f"this machine; the overhead ratio is stricter than intended")
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 10, quick 3)")
    ap.add_argument("--server-bin", help="salus-server binary (default $SALUS_SERVER_BIN or "
                                         "target/release/salus-server)")
    ap.add_argument("--without-salus", action="store_true", help="compare in-process and tf-server only")
    ap.add_argument("--isolation", choices=tenants.ISOLATION_CHOICES, default="both",
                    help="which salus-server isolation modes to run (default both, side by side)")
    ap.add_argument("--workloads", nargs="+", default=list(BLOCKS), choices=list(BLOCKS))
    ap.add_argument("--repeat", type=int, default=1, help="run the whole comparison N times (same servers and "
                                                          "clients) and print each ratio's min / median / max")
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal ratio is missed (with --repeat: "
                                                         "in more than a fifth of the runs)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    rounds = args.rounds or (3 if args.quick else 10)
    if args.server_bin:
        os.environ["SALUS_SERVER_BIN"] = str(Path(args.server_bin).resolve())

    from bench_master import goal_held, print_summary, start_salus
    t_start = time.monotonic()
    servers = []
    errors: dict[str, str] = {}
    clients: dict[str, Client] = {}
    try:
        # Every target asked for, in column order; None until its server is up (a failed one stays None, in errors).
        addresses: dict[str, str | None] = {"in-process": None, "tf-server": None}
        try:
            tf_server = start_tf_server()
            servers.append(tf_server)
            addresses["tf-server"] = tf_server.address
        except SystemExit as e:
            errors["tf-server"] = str(e)
        if not args.without_salus:
            for mode in tenants.modes(args.isolation):
                name = tenants.label(mode)
                addresses[name] = None
                try:
                    salus = start_salus(mode)
                    servers.append(salus)
                    addresses[name] = salus.address
                except SystemExit as e:
                    errors[name] = str(e)
        print(f"bench: targets {addresses}; {rounds} rounds; {os.cpu_count()} CPUs", flush=True)
        for name, address in addresses.items():
            if name in errors:
                continue
            server = next((s for s in servers if s.name == name), None)
            c = Client(name, address, server.pid if server else None)
            if c.error:
                errors[name] = c.error
            else:
                clients[name] = c
        for name, err in errors.items():
            print(f"bench: {name}: {err}", flush=True)

        runs = []
        for run in range(args.repeat):
            if args.repeat > 1:
                print(f"\n== run {run + 1} of {args.repeat}", flush=True)
            runs.append(compare_once(args.workloads, clients, addresses, errors, rounds))
        if args.repeat > 1:
            print_summary(runs, GOALS)
        missed = [f"{w} {a}/{b}" for (w, a, b), goal in GOALS.items()
                  if w in args.workloads and a in addresses and b in addresses
                  and not goal_held(runs, (w, a, b), goal)]
        print(f"\nbench: done in {time.monotonic() - t_start:.0f}s", flush=True)
        if args.check and missed:
            print(f"bench: goals missed: {', '.join(missed)}", file=sys.stderr)
            return 1
        return 0
    finally:
        for c in clients.values():
            c.close()
        for s in servers:
            code = s.stop()
            if s.name.startswith("salus") and code not in (0, None):
                print(f"bench: {s.name} exited with {code} on SIGTERM", file=sys.stderr)


if __name__ == "__main__":
    if "--client" in sys.argv[1:]:
        sys.exit(client_main())
    sys.exit(main())
