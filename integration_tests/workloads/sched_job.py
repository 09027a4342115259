"""A training job for the scheduler tests and benchmark: an MLP trained for N steps on a fixed batch.

Every step is one RunStep with the same fetches (loss + train op), so after its first two runs the server
sees a repeated signature; with the default size (3 dense layers of 512, batch 256) a step takes several
milliseconds on a laptop-class CPU, well above the server's cheap-run threshold, so steps are "main"
iterations that the scheduler orders. --tiny makes a step of ~0.1 ms instead; --force-main then fetches an
identity node named salus_main_iter, which makes every run a main iteration regardless of its duration.

Job hints reach the server the stock way, in ConfigProto.experimental.session_metadata.name
("NAME?priority=P&iterations=N&seconds=S"); --name is passed through as is.

Start protocol (optional, for tests that control arrival times): with --go-file the script imports
TensorFlow, builds its graph, touches --ready-file, then waits for the go file to exist. The go file may
contain the target (used when --target is not given). The session is created (the job arrives) after that.

CLI: python sched_job.py [--target grpc://127.0.0.1:PORT] --name NAME [--seed N] [--steps N | --seconds S]
                         [--tiny] [--force-main] [--ready-file F --go-file G] [--hold] [--digest-only]
                         [--step-times]
prints one JSON line at the end:
  {"name", "seed", "steps", "losses" (unless --digest-only), "digest", "go", "start", "end",
   "step_ms_median", "step_ms_p95"}
--hold: after training print {"phase": "holding", ...} and keep the session open until killed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import time
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

IN_DIM, OUT_DIM = 64, 10
SIZES = {"default": dict(width=512, depth=3, batch=256), "tiny": dict(width=32, depth=1, batch=16)}
THREADS = 2  # intra- and inter-op threads, the same in-process and through the server


def build(seed: int, *, tiny: bool = False, force_main: bool = False) -> SimpleNamespace:
    size = SIZES["tiny" if tiny else "default"]
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
                b = tf.compat.v1.get_variable(f"b{i}", [size["width"]],
                                              initializer=tf.compat.v1.zeros_initializer())
                h, d = tf.nn.relu(tf.matmul(h, w) + b), size["width"]
            wo = tf.compat.v1.get_variable("wo", [d, OUT_DIM], initializer=init(seed=seed * 10 + 9))
        logits = tf.matmul(h, wo)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                              name="loss")
        train_op = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        fetch = tf.identity(loss, name="salus_main_iter") if force_main else loss
        return SimpleNamespace(graph=g, loss=fetch, train_op=train_op,
                               init=tf.compat.v1.global_variables_initializer())


def config(name: str = ""):
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=THREADS, inter_op_parallelism_threads=THREADS)
    if name:
        cfg.experimental.session_metadata.name = name
    return cfg


def digest(losses) -> str:
    return hashlib.sha256(struct.pack(f"<{len(losses)}d", *losses)).hexdigest()[:16]


def reference(seed: int, steps: int, tiny: bool = False) -> list[float]:
    """The same job in-process (no server): the per-step losses a correct server must reproduce."""
    m = build(seed, tiny=tiny)
    with m.graph.as_default(), tf.compat.v1.Session(config=config()) as sess:
        sess.run(m.init)
        return [float(sess.run([m.loss, m.train_op])[0]) for _ in range(steps)]


def wait_for(go_file: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit(f"sched_job: no go file {go_file} within {timeout}s")
        time.sleep(0.005)
    with open(go_file) as f:
        return f.read().strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="")
    ap.add_argument("--name", default="", help="session_metadata.name: NAME?priority=P&iterations=N&seconds=S")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=0.0, help="train until this many seconds passed instead")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--force-main", action="store_true")
    ap.add_argument("--ready-file")
    ap.add_argument("--go-file")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--digest-only", action="store_true")
    ap.add_argument("--step-times", action="store_true", help="also print each step's wall time (ms)")
    args = ap.parse_args()

    m = build(args.seed, tiny=args.tiny, force_main=args.force_main)
    target = args.target
    if args.go_file:
        if args.ready_file:
            open(args.ready_file, "w").close()
        target = wait_for(args.go_file) or target
    go = time.time()
    with m.graph.as_default():
        sess = tf.compat.v1.Session(target, config=config(args.name))
        sess.run(m.init)  # the session (job) is created here
        start = time.time()
        losses, times = [], []
        deadline = time.monotonic() + args.seconds
        while (len(losses) < args.steps) if not args.seconds else (time.monotonic() < deadline):
            t0 = time.perf_counter()
            loss, _ = sess.run([m.loss, m.train_op])
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
        end = time.time()
        times_ms = sorted(t * 1000 for t in times) or [0.0]
        result = {"name": args.name, "seed": args.seed, "steps": len(losses), "digest": digest(losses),
                  "go": go, "start": start, "end": end,
                  "step_ms_median": times_ms[len(times_ms) // 2],
                  "step_ms_p95": times_ms[min(len(times_ms) - 1, int(len(times_ms) * 0.95))]}
        if not args.digest_only:
            result["losses"] = losses
        if args.step_times:
            result["step_ms"] = [round(t * 1000, 3) for t in times]
        if args.hold:
            print(json.dumps({"phase": "holding", **result}), flush=True)
            while True:  # keep the session open until the test kills this process
                time.sleep(3600)
        sess.close()
        result["closed"] = time.time()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
