"""A job for the memory-lane tests and benchmark: a small TF1 graph (inference or training) run N steps.

Models (--model): inference ones run a forward pass only, training ones also an optimizer step. Inputs are
fed through placeholders every step from a fixed batch, so the fed tensors count towards the per-step
(ephemeral) memory. Every step fetches an identity node named salus_main_iter, so every repeated run is a
main iteration (the one that asks for a memory lane), however fast it is.

Start protocol like sched_job.py: with --go-file the script imports TensorFlow, builds its graph, touches
--ready-file, then waits for the go file (which may hold the target). With --close-file, after its steps it
prints {"phase": "holding", ...} and keeps the session open until the close file exists, then closes the
session and prints its final JSON line. A run that fails with a TF error prints {"error": CLASS, "message"}.

Other modes, in-process (no server):
  --reference          print {"losses": [...]} of the same job run in-process
  --tf-numbers         print TensorFlow's own memory numbers for the graph: {"variable_bytes", "variables",
                       "ephemeral_bytes" (rise of allocator_bytes_in_use over one FULL_TRACE step + fed bytes),
                       "fed_bytes", "trace_rise_bytes"}
  --allocator-peak     print {"rises": [...]}: each of the first --steps main steps' peak in the CPU allocator above
                       its use at the step's start, as get_memory_info reads it (TF_CPU_ALLOCATOR_USE_BFC=true)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

THREADS = int(os.environ.get("MEM_JOB_THREADS", "2"))  # inter- and intra-op threads of the session
# name: (kind, layers/params, batch, train optimizer or None)
MODELS = {
    "mlp_adam": dict(kind="mlp", dims=[784, 512, 10], batch=256, opt="adam"),
    "mlp_momentum": dict(kind="mlp", dims=[64, 512, 512, 512, 10], batch=256, opt="momentum"),
    "tiny_sgd": dict(kind="mlp", dims=[64, 32, 10], batch=16, opt="sgd"),
    "mlp_small_infer": dict(kind="mlp", dims=[784, 128, 10], batch=1, opt=None),
    "mlp_large_infer": dict(kind="mlp", dims=[784, 1024, 1024, 10], batch=32, opt=None),
    "mlp_huge_infer": dict(kind="mlp", dims=[1024, 4096, 4096, 10], batch=8, opt=None),
    "cnn_small_infer": dict(kind="cnn", filters=[16, 32], batch=8, opt=None),
    "cnn_train": dict(kind="cnn", filters=[32, 64], batch=32, opt="adam"),
}


def build(model: str, seed: int = 1) -> SimpleNamespace:
    spec = MODELS[model]
    g = tf.Graph()
    rng = np.random.RandomState(seed)
    batch = spec["batch"]
    with g.as_default():
        tf.compat.v1.set_random_seed(seed)
        init = tf.compat.v1.glorot_uniform_initializer
        if spec["kind"] == "mlp":
            dims = spec["dims"]
            x = tf.compat.v1.placeholder(tf.float32, [None, dims[0]], name="x")
            x_val = rng.normal(size=(batch, dims[0])).astype(np.float32)
            h = x
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
                w = tf.compat.v1.get_variable(f"w{i}", [a, b], initializer=init(seed=seed * 10 + i))
                bias = tf.compat.v1.get_variable(f"b{i}", [b], initializer=tf.compat.v1.zeros_initializer())
                h = tf.matmul(h, w) + bias
                if i < len(dims) - 2:
                    h = tf.nn.relu(h)
            logits, n_out = h, dims[-1]
        else:
            x = tf.compat.v1.placeholder(tf.float32, [None, 28, 28, 1], name="x")
            x_val = rng.normal(size=(batch, 28, 28, 1)).astype(np.float32)
            h, c_in = x, 1
            for i, c in enumerate(spec["filters"]):
                k = tf.compat.v1.get_variable(f"k{i}", [3, 3, c_in, c], initializer=init(seed=seed * 10 + i))
                h = tf.nn.relu(tf.nn.conv2d(h, k, strides=1, padding="SAME"))
                h = tf.nn.max_pool2d(h, 2, 2, "VALID")
                c_in = c
            flat = int(np.prod(h.shape[1:]))
            h = tf.reshape(h, [-1, flat])
            w = tf.compat.v1.get_variable("wo", [flat, 10], initializer=init(seed=seed * 10 + 9))
            logits, n_out = tf.matmul(h, w), 10
        feeds = {x: x_val}
        if spec["opt"]:
            y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
            feeds[y] = rng.randint(0, n_out, size=batch).astype(np.int64)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            opt = {"adam": lambda: tf.compat.v1.train.AdamOptimizer(1e-3),
                   "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.01, 0.9),
                   "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01)}[spec["opt"]]()
            train_op = opt.minimize(loss)
            out = tf.identity(loss, name="salus_main_iter")
            fetches, plain = [out, train_op], [loss, train_op]
        else:
            value = tf.reduce_sum(tf.nn.softmax(logits))
            out = tf.identity(value, name="salus_main_iter")
            fetches, plain = [out], [value]
        return SimpleNamespace(graph=g, fetches=fetches, plain=plain, feeds=feeds,
                               init=tf.compat.v1.global_variables_initializer(),
                               train=bool(spec["opt"]))


def config(name: str = ""):
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=THREADS, inter_op_parallelism_threads=THREADS)
    if name:
        cfg.experimental.session_metadata.name = name
    return cfg


def step(sess, m, plain: bool = False, **kw) -> float:
    return float(sess.run(m.plain if plain else m.fetches, feed_dict=m.feeds, **kw)[0])


def reference(model: str, seed: int, steps: int) -> list[float]:
    m = build(model, seed)
    with m.graph.as_default(), tf.compat.v1.Session(config=config()) as sess:
        sess.run(m.init)
        return [step(sess, m) for _ in range(steps)]


def tf_numbers(model: str, seed: int = 1, warmup: int = 2) -> dict:
    """TensorFlow's own numbers for the graph: variable bytes, and one traced step's allocation rise."""
    m = build(model, seed)
    with m.graph.as_default(), tf.compat.v1.Session(config=config()) as sess:
        variables = tf.compat.v1.global_variables()
        var_bytes = sum(v.shape.num_elements() * v.dtype.size for v in variables)
        sess.run(m.init)
        for _ in range(warmup):
            step(sess, m)
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        rises = []
        # allocator_bytes_in_use is the whole process's: in a process that ran other TensorFlow work (the test
        # runner), one traced step can also see unrelated allocations. The least rise of a few steps is the step's.
        for _ in range(3):
            meta = tf.compat.v1.RunMetadata()
            step(sess, m, options=opts, run_metadata=meta)
            in_use: dict[str, list[int]] = {}
            for dev in meta.step_stats.dev_stats:
                for ns in dev.node_stats:
                    for mem in ns.memory:
                        in_use.setdefault(mem.allocator_name, []).append(mem.allocator_bytes_in_use)
            rises.append(sum(max(v) - min(v) for v in in_use.values() if v))
        rise = min(rises)
        if rise <= 0:
            # TensorFlow's default CPU allocator keeps no statistics with oneDNN off: no reference, not a zero.
            raise SystemExit(f"mem_job: allocators {sorted(in_use)} report no bytes in use; run with "
                             "TF_CPU_ALLOCATOR_USE_BFC=true (or oneDNN on) for TensorFlow's own accounting")
        fed = sum(v.nbytes for v in m.feeds.values())
        return {"model": model, "variable_bytes": int(var_bytes), "variables": len(variables),
                "trace_rise_bytes": int(rise), "fed_bytes": int(fed), "ephemeral_bytes": int(rise + fed),
                "allocators": sorted(in_use)}


def allocator_peak(model: str, seed: int = 1, steps: int = 10) -> dict:
    """TensorFlow's own accounting of each of the first `steps` main steps, as get_memory_info reads it: the CPU
    allocator's peak above what it held at the step's start (run with TF_CPU_ALLOCATOR_USE_BFC=true: TensorFlow's
    default CPU allocator keeps no statistics). {"rises": [step 1's, step 2's, ...]}."""
    m = build(model, seed)
    rises = []
    with m.graph.as_default(), tf.compat.v1.Session(config=config()) as sess:
        sess.run(m.init)
        for _ in range(steps):
            tf.config.experimental.reset_memory_stats("CPU:0")
            before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            step(sess, m)
            rises.append(int(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before))
    return {"model": model, "rises": rises}


def wait_for(path: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"mem_job: no file {path} within {timeout}s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read().strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny_sgd", choices=sorted(MODELS))
    ap.add_argument("--target", default="")
    ap.add_argument("--name", default="")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--plain-steps", type=int, default=0,
                    help="run the first N steps without the salus_main_iter fetch (so the server samples the "
                         "job's memory in its cheap warm-up runs before it asks for a lane)")
    ap.add_argument("--ready-file")
    ap.add_argument("--go-file")
    ap.add_argument("--close-file", help="hold the session open after the steps until this file exists")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--tf-numbers", action="store_true")
    ap.add_argument("--allocator-peak", action="store_true")
    args = ap.parse_args()

    if args.reference:
        print(json.dumps({"losses": reference(args.model, args.seed, args.steps)}), flush=True)
        return
    if args.tf_numbers:
        print(json.dumps(tf_numbers(args.model, args.seed)), flush=True)
        return
    if args.allocator_peak:
        print(json.dumps(allocator_peak(args.model, args.seed, args.steps)), flush=True)
        return

    m = build(args.model, args.seed)
    target = args.target
    if args.go_file:
        if args.ready_file:
            open(args.ready_file, "w").close()
        target = wait_for(args.go_file) or target
    go = time.time()
    losses: list[float] = []
    result = {"name": args.name, "model": args.model, "seed": args.seed, "go": go}
    with m.graph.as_default():
        sess = tf.compat.v1.Session(target, config=config(args.name))
        try:
            sess.run(m.init)
            result["start"] = time.time()
            for i in range(args.steps):
                losses.append(step(sess, m, plain=i < args.plain_steps))
        except tf.errors.OpError as e:
            result.update(error=type(e).__name__, message=e.message, steps=len(losses), end=time.time())
            print(json.dumps(result), flush=True)
            sess.close()
            return
        result.update(steps=len(losses), losses=losses, end=time.time())
        if args.close_file:
            print(json.dumps({"phase": "holding", **result}), flush=True)
            wait_for(args.close_file)
        sess.close()
        result["closed"] = time.time()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
