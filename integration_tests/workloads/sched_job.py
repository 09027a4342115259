"""A training job for the scheduler tests and benchmarks: a small model trained for N steps on a fixed batch.

Every step is one RunStep with the same fetches (loss + train op), so after its first two runs the server
sees a repeated signature; with the default model (mlp_small: 3 dense layers of 512, batch 256) a step takes
several milliseconds on a laptop-class CPU, well above the server's cheap-run threshold, so steps are "main"
iterations that the scheduler orders. --model picks another graph-mode model (MODELS; per-step time in-process
on a 2-core machine): mlp_small ~5 ms, mlp_large (4 dense layers of 1024, batch 256) ~22 ms, cnn_small (two
3x3 conv + max-pool layers of 16 and 32 channels on 32x32x3 images, batch 128) ~8 ms.
--tiny (model "tiny") makes a step of ~0.1 ms instead; --force-main then fetches an identity node named
salus_main_iter, which makes every run a main iteration regardless of its duration.

Job hints reach the server the stock way, in ConfigProto.experimental.session_metadata.name
("NAME?priority=P&iterations=N&seconds=S"); --name is passed through as is.

Start protocol (optional, for tests that control arrival times): with --go-file the script imports
TensorFlow, builds its graph, touches --ready-file, then waits for the go file to exist. The go file may
contain the target (used when --target is not given). The session is created (the job arrives) after that.

CLI: python sched_job.py [--target grpc://127.0.0.1:PORT] --name NAME [--seed N] [--steps N | --seconds S]
                         [--model M | --tiny] [--force-main] [--ready-file F --go-file G] [--hold]
                         [--stop-file F] [--gap-ms MS] [--digest-only] [--step-times]
prints one JSON line at the end:
  {"name", "model", "seed", "steps", "losses" (unless --digest-only), "digest", "go", "start", "end",
   "step_ms_median", "step_ms_p95"}
("go": wall clock (time.time()) just before the session is created; "start": after the init run, just before
the first step; "end": after the last step.) --step-times adds "step_ms" (each step's wall time) and
"step_end_s" (each step's end, in seconds after "start").
--hold: after training print {"phase": "holding", ...} and keep the session open until killed.
--stop-file F: after the --steps steps, keep training until F exists (a job that outlasts whatever the test
does meanwhile, on any CPU; "steps" in the output says how many it ran).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import time
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

IN_DIM, OUT_DIM, IMAGE = 64, 10, 32
MODELS = {"mlp_small": dict(width=512, depth=3, batch=256), "mlp_large": dict(width=1024, depth=4, batch=256),
          "cnn_small": dict(channels=(16, 32), batch=128), "tiny": dict(width=32, depth=1, batch=16)}
DEFAULT_MODEL = "mlp_small"
THREADS = 2  # intra- and inter-op threads, the same in-process and through the server


def _mlp_logits(size: dict, seed: int, rng):
    x = tf.constant(rng.normal(size=(size["batch"], IN_DIM)).astype(np.float32), name="x")
    init = tf.compat.v1.glorot_uniform_initializer
    h, d = x, IN_DIM
    with tf.compat.v1.variable_scope("mlp"):
        for i in range(size["depth"]):
            w = tf.compat.v1.get_variable(f"w{i}", [d, size["width"]], initializer=init(seed=seed * 10 + i))
            b = tf.compat.v1.get_variable(f"b{i}", [size["width"]], initializer=tf.compat.v1.zeros_initializer())
            h, d = tf.nn.relu(tf.matmul(h, w) + b), size["width"]
        wo = tf.compat.v1.get_variable("wo", [d, OUT_DIM], initializer=init(seed=seed * 10 + 9))
    return tf.matmul(h, wo)


def _cnn_logits(size: dict, seed: int, rng):
    x = tf.constant(rng.normal(size=(size["batch"], IMAGE, IMAGE, 3)).astype(np.float32), name="x")
    init = tf.compat.v1.glorot_uniform_initializer
    h, c = x, 3
    with tf.compat.v1.variable_scope("cnn"):
        for i, out in enumerate(size["channels"]):
            k = tf.compat.v1.get_variable(f"k{i}", [3, 3, c, out], initializer=init(seed=seed * 10 + i))
            h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(h, k, 1, "SAME")), 2, 2, "VALID")
            c = out
        h = tf.reshape(h, [size["batch"], -1])
        wo = tf.compat.v1.get_variable("wo", [h.shape[1], OUT_DIM], initializer=init(seed=seed * 10 + 9))
    return tf.matmul(h, wo)


def build(seed: int, *, tiny: bool = False, force_main: bool = False, model: str = DEFAULT_MODEL) -> SimpleNamespace:
    size = MODELS["tiny" if tiny else model]
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(seed)
        rng = np.random.RandomState(seed)
        logits = (_cnn_logits if "channels" in size else _mlp_logits)(size, seed, rng)
        y = tf.constant(rng.randint(0, OUT_DIM, size=size["batch"]).astype(np.int64), name="y")
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


def reference(seed: int, steps: int, tiny: bool = False, model: str = DEFAULT_MODEL) -> list[float]:
    """The same job in-process (no server): the per-step losses a correct server must reproduce."""
    m = build(seed, tiny=tiny, model=model)
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
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    ap.add_argument("--tiny", action="store_true", help="same as --model tiny")
    ap.add_argument("--force-main", action="store_true")
    ap.add_argument("--ready-file")
    ap.add_argument("--go-file")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--stop-file", help="after --steps steps, train on until this file exists")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="sleep this long after each step (a job that trains through whatever the test does meanwhile "
                         "with few steps)")
    ap.add_argument("--digest-only", action="store_true")
    ap.add_argument("--step-times", action="store_true",
                    help="also print each step's wall time (ms) and end (s after start)")
    args = ap.parse_args()
    model = "tiny" if args.tiny else args.model

    m = build(args.seed, model=model, force_main=args.force_main)
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
        losses, times, ends = [], [], []
        deadline = time.monotonic() + args.seconds
        p0 = time.perf_counter()
        def more() -> bool:
            if args.seconds:
                return time.monotonic() < deadline
            return len(losses) < args.steps or bool(args.stop_file and not os.path.exists(args.stop_file))

        while more():
            t0 = time.perf_counter()
            loss, _ = sess.run([m.loss, m.train_op])
            t1 = time.perf_counter()
            times.append(t1 - t0)
            ends.append(t1 - p0)
            losses.append(float(loss))
            if args.gap_ms:
                time.sleep(args.gap_ms / 1000)
        end = time.time()
        times_ms = sorted(t * 1000 for t in times) or [0.0]
        result = {"name": args.name, "model": model, "seed": args.seed, "steps": len(losses), "digest": digest(losses),
                  "go": go, "start": start, "end": end,
                  "step_ms_median": times_ms[len(times_ms) // 2],
                  "step_ms_p95": times_ms[min(len(times_ms) - 1, int(len(times_ms) * 0.95))]}
        if not args.digest_only:
            result["losses"] = losses
        if args.step_times:
            result["step_ms"] = [round(t * 1000, 3) for t in times]
            result["step_end_s"] = [round(t, 5) for t in ends]
        if args.hold:
            print(json.dumps({"phase": "holding", **result}), flush=True)
            while True:  # keep the session open until the test kills this process
                time.sleep(3600)
        sess.close()
        result["closed"] = time.time()
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    # Skip the interpreter's teardown of TensorFlow (~0.5 s of CPU): on a small machine it would compete with the
    # other jobs' iterations for the CPU that stands in for the device.
    os._exit(0)


if __name__ == "__main__":
    main()
