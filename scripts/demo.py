#!/usr/bin/env python3
"""Salus demo: an unmodified TF1-style training script, run through salus-server.

Trains a 2-layer MLP on synthetic data with Adam through the server, then runs the very same code
in-process and checks both give the same final loss. Exit status 0 only if training worked and matched.

  salus-server --listen 127.0.0.1:5501 &
  .venv/bin/python scripts/demo.py --target grpc://127.0.0.1:5501
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def make_data(n=4096, features=32, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    w = rng.normal(size=(features, 1)).astype(np.float32)
    y = (np.sin(x @ w) + 0.05 * rng.normal(size=(n, 1))).astype(np.float32)
    return x, y


def dense(inp, units: int, name: str, seed: int, activation=None):
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable("kernel", [inp.shape[-1], units],
                                      initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
        b = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
    out = tf.matmul(inp, w) + b
    return activation(out) if activation else out


def train(target: str, steps: int, batch: int, log_every: int, label: str, quiet: bool = False) -> list[float]:
    """The training script itself: plain TF1 graph code; only the session target differs."""
    x_np, y_np = make_data()
    rng = np.random.RandomState(1)  # minibatch order, identical for both runs
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        x = tf.compat.v1.placeholder(tf.float32, [None, x_np.shape[1]], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        h = dense(x, 64, "hidden1", seed=1, activation=tf.nn.relu)
        h = dense(h, 64, "hidden2", seed=2, activation=tf.nn.relu)
        pred = dense(h, 1, "out", seed=3)
        loss = tf.reduce_mean(tf.square(pred - y))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdamOptimizer(3e-3).minimize(loss, global_step=global_step)
        losses = []
        with tf.compat.v1.Session(target) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            t0 = time.perf_counter()
            for step in range(1, steps + 1):
                idx = rng.randint(0, len(x_np), batch)
                value, _ = sess.run([loss, train_op], {x: x_np[idx], y: y_np[idx]})
                losses.append(float(value))
                if not quiet and (step % log_every == 0 or step == 1):
                    print(f"[{label}] step {step:4d}  loss {value:.6f}", flush=True)
            elapsed = time.perf_counter() - t0
            assert sess.run(global_step) == steps
        if not quiet:
            print(f"[{label}] {steps} steps in {elapsed:.2f}s ({1e3 * elapsed / steps:.2f} ms/step)", flush=True)
    return losses


def wait_for_server(target: str, timeout: float) -> None:
    """TF's client retries an unreachable server for a very long time; fail fast with a clear message."""
    address = target.removeprefix("grpc://")
    with grpc.insecure_channel(address) as ch:
        try:
            grpc.channel_ready_future(ch).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            sys.exit(f"demo: no server reachable at {target} within {timeout:.0f}s "
                     f"(start one: salus-server --listen {address})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="grpc://127.0.0.1:5501")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()

    wait_for_server(args.target, timeout=10)
    remote = train(args.target, args.steps, args.batch, args.log_every, label="salus")
    local = train("", args.steps, args.batch, args.log_every, label="in-process", quiet=True)

    print(f"demo: trained {args.steps} steps through {args.target}, final loss {remote[-1]:.6f} "
          f"(in-process reference {local[-1]:.6f})", flush=True)
    ok = True
    if not remote[-1] < 0.5 * remote[0]:
        print(f"demo: FAILED: loss did not go down ({remote[0]:.4f} -> {remote[-1]:.4f})", file=sys.stderr)
        ok = False
    # Same code, same seeds, same CPU kernels: the numbers should agree (exactly, in practice).
    if not np.allclose(remote, local, rtol=1e-5, atol=0):
        worst = int(np.argmax(np.abs(np.array(remote) - np.array(local))))
        print(f"demo: FAILED: losses differ from in-process (step {worst + 1}: {remote[worst]} vs "
              f"{local[worst]})", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
