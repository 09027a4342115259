"""Stock TF1 training clients for the fault tests: several sessions, one thread each, in one process.

Every session trains a small deterministic MLP (model TINY or SLOW below, seed per session) with one RunStep per
step that fetches a node named salus_main_iter, so every repeated step is a main iteration the server
schedules. The same graph run in-process (`reference`) gives the losses a correct server must reproduce.

A session steps until --steps or its first error, then closes its session and reports how long the close took
and what it raised. Events are printed as JSON lines as they happen:
  {"phase": "ready", "t": ...}                     every session has done --warm steps
  {"phase": "error", "session": i, ...}            a step failed (class, message, when it was sent and failed)
  {"phase": "closed", "session": i, ...}           close outcome ("ok" or the error class) and seconds
  {"phase": "done", "sessions": [...]}             everything, per session: seed, losses, step send/end times
A watchdog prints "done" after --deadline seconds (or once --stop-file exists) whatever is still pending (a
close that blocks against a server that is gone is reported as {"outcome": "pending", "seconds": ...}, a
step as "pending_step": {"sent", "seconds"}). The process leaves with
os._exit(0): at interpreter exit TensorFlow would close every open session, which blocks while the server is
unreachable (the stock client waits for the server to come back).

Start protocol as sched_job.py: with --go-file the script imports TensorFlow and builds its graphs, touches
--ready-file, waits for the go file (which holds the target), then creates its sessions.

Per-session client settings, comma-separated lists (the last value repeats):
  --op-timeout-ms   ConfigProto.operation_timeout_in_ms (0: TensorFlow's default, no timeout)
  --run-timeout-ms  RunOptions.timeout_in_ms of every step (0: none)

CLI: python fault_client.py [--target grpc://HOST:PORT | --ready-file R --go-file G] --seeds 1,2 [--model tiny]
                            [--steps N] [--warm N] [--step-sleep-ms MS] [--op-timeout-ms 0,2000]
                            [--run-timeout-ms 0] [--deadline S] [--stop-file F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

IN_DIM, OUT_DIM = 32, 10
# TINY: ~0.1 ms a step in-process; SLOW: ~15-30 ms a step on a 2-core machine.
MODELS = {"tiny": dict(width=32, depth=1, batch=16), "slow": dict(width=768, depth=3, batch=512)}
THREADS = 2  # intra- and inter-op threads, the same in-process and through the server


def build(seed: int, model: str = "tiny") -> SimpleNamespace:
    size = MODELS[model]
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(seed)
        rng = np.random.RandomState(seed)
        x = tf.constant(rng.normal(size=(size["batch"], IN_DIM)).astype(np.float32), name="x")
        y = tf.constant(rng.randint(0, OUT_DIM, size=size["batch"]).astype(np.int64), name="y")
        init = tf.compat.v1.glorot_uniform_initializer
        h, d = x, IN_DIM
        with tf.compat.v1.variable_scope("mlp"):
            for i in range(size["depth"]):
                w = tf.compat.v1.get_variable(f"w{i}", [d, size["width"]], initializer=init(seed=seed * 10 + i))
                b = tf.compat.v1.get_variable(f"b{i}", [size["width"]], initializer=tf.compat.v1.zeros_initializer())
                h, d = tf.nn.relu(tf.matmul(h, w) + b), size["width"]
            wo = tf.compat.v1.get_variable("wo", [d, OUT_DIM], initializer=init(seed=seed * 10 + 9))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(h, wo)))
        train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        fetch = tf.identity(loss, name="salus_main_iter")  # every repeated step is a main iteration
        return SimpleNamespace(graph=g, loss=fetch, train_op=train_op,
                               init=tf.compat.v1.global_variables_initializer())


def config(name: str = "", op_timeout_ms: int = 0):
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=THREADS, inter_op_parallelism_threads=THREADS)
    if name:
        cfg.experimental.session_metadata.name = name
    if op_timeout_ms:
        cfg.operation_timeout_in_ms = op_timeout_ms
    return cfg


class Reference:
    """The same job in-process, extended on demand: losses[:n] is what a correct server returns for n steps."""

    def __init__(self, seed: int, model: str = "tiny"):
        self.m = build(seed, model)
        self.sess = tf.compat.v1.Session(graph=self.m.graph, config=config())
        self.sess.run(self.m.init)
        self.losses: list[float] = []

    def first(self, n: int) -> list[float]:
        while len(self.losses) < n:
            self.losses.append(float(self.sess.run([self.m.loss, self.m.train_op])[0]))
        return self.losses[:n]


def reference(seed: int, steps: int, model: str = "tiny") -> list[float]:
    ref = Reference(seed, model)
    try:
        return ref.first(steps)
    finally:
        ref.sess.close()


def wait_for(path: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"fault_client: no file {path} within {timeout}s")
        time.sleep(0.005)
    with open(path) as f:
        return f.read().strip()


_print_lock = threading.Lock()


def emit(msg: dict) -> None:
    with _print_lock:
        print(json.dumps(msg), flush=True)


def per_session(text: str, n: int) -> list[int]:
    values = [int(v) for v in text.split(",")]
    return [values[min(i, len(values) - 1)] for i in range(n)]


class Client(threading.Thread):
    def __init__(self, index: int, seed: int, model: str, target: str, args, op_timeout_ms: int,
                 run_timeout_ms: int, warm: threading.Barrier):
        super().__init__(daemon=True)
        self.index, self.seed, self.target, self.args = index, seed, target, args
        self.op_timeout_ms, self.run_timeout_ms, self.warm = op_timeout_ms, run_timeout_ms, warm
        self.m = build(seed, model)
        self.losses: list[float] = []
        self.sent: list[float] = []
        self.ended: list[float] = []
        self.error: dict | None = None
        self.close: dict | None = None
        self.t_close_start: float | None = None
        self.t_step_start: float | None = None

    def report(self) -> dict:
        close = self.close
        if close is None and self.t_close_start is not None:
            close = {"outcome": "pending", "seconds": time.time() - self.t_close_start}
        pending = None
        if self.error is None and close is None and self.t_step_start is not None:
            pending = {"sent": self.t_step_start, "seconds": time.time() - self.t_step_start}
        return {"session": self.index, "seed": self.seed, "op_timeout_ms": self.op_timeout_ms,
                "run_timeout_ms": self.run_timeout_ms, "losses": self.losses, "sent": self.sent,
                "ended": self.ended, "error": self.error, "close": close, "pending_step": pending}

    def run(self) -> None:
        a = self.args
        options = tf.compat.v1.RunOptions(timeout_in_ms=self.run_timeout_ms) if self.run_timeout_ms else None
        with self.m.graph.as_default():
            sess = tf.compat.v1.Session(self.target, config=config(f"fault-{self.index}", self.op_timeout_ms))
            waited = False
            try:
                sess.run(self.m.init)
                while len(self.losses) < a.steps:
                    self.t_step_start = time.time()
                    loss, _ = sess.run([self.m.loss, self.m.train_op], options=options)
                    self.ended.append(time.time())
                    self.sent.append(self.t_step_start)
                    self.losses.append(float(loss))
                    self.t_step_start = None
                    if len(self.losses) == a.warm and not waited:
                        waited = True
                        try:
                            self.warm.wait()
                        except threading.BrokenBarrierError:  # another session failed before warming up
                            pass
                    if a.step_sleep_ms:
                        time.sleep(a.step_sleep_ms / 1000)
            except tf.errors.OpError as e:
                self.error = {"class": type(e).__name__, "message": e.message, "sent": self.t_step_start,
                              "at": time.time(), "steps": len(self.losses)}
                emit({"phase": "error", "session": self.index, **self.error})
            finally:
                if not waited:
                    self.warm.abort()
            self.t_close_start = time.time()
            try:
                sess.close()
                outcome, message = "ok", ""
            except tf.errors.OpError as e:
                outcome, message = type(e).__name__, e.message
            self.close = {"outcome": outcome, "message": message, "seconds": time.time() - self.t_close_start,
                          "at": time.time()}
            emit({"phase": "closed", "session": self.index, **self.close})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--model", default="tiny", choices=sorted(MODELS))
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--step-sleep-ms", type=float, default=0.0)
    ap.add_argument("--op-timeout-ms", default="0")
    ap.add_argument("--run-timeout-ms", default="0")
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--stop-file", help="report and exit as soon as this file exists (or at --deadline)")
    ap.add_argument("--ready-file")
    ap.add_argument("--go-file")
    args = ap.parse_args()

    seeds = [int(s) for s in args.seeds.split(",")]
    op_timeouts = per_session(args.op_timeout_ms, len(seeds))
    run_timeouts = per_session(args.run_timeout_ms, len(seeds))
    warm = threading.Barrier(len(seeds), action=lambda: emit({"phase": "ready", "t": time.time()}))
    target = args.target
    clients = [Client(i, s, args.model, target, args, op_timeouts[i], run_timeouts[i], warm)
               for i, s in enumerate(seeds)]
    if args.go_file:
        if args.ready_file:
            open(args.ready_file, "w").close()
        target = wait_for(args.go_file) or target
        for c in clients:
            c.target = target
    deadline = time.monotonic() + args.deadline
    for c in clients:
        c.start()
    while any(c.is_alive() for c in clients) and time.monotonic() < deadline:
        if args.stop_file and os.path.exists(args.stop_file):
            break
        time.sleep(0.02)
    emit({"phase": "done", "sessions": [c.report() for c in clients],
          "timed_out": any(c.is_alive() for c in clients)})
    sys.stderr.flush()
    os._exit(0)  # see the module docstring


if __name__ == "__main__":
    main()
