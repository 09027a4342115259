"""A TF1 graph training workload: tf.data one-shot iterator, MLP, AdamOptimizer, global_step.

Written the way an unmodified TF1 script is: the only thing that changes between runs is the session target
("" = in-process, "grpc://..." = through a server). Used in-process by the pytest process (inside its own
tf.Graph, so it does not need eager execution disabled) and as a subprocess by the concurrency test.

CLI: python tf1_train.py --target grpc://127.0.0.1:PORT [--seed N] [--steps N] [--hidden N]
                         [--barrier-dir DIR --name NAME] [--isolate-session-state]
prints one JSON line: {"losses": [...], "global_step": N, "eval_loss": x, "param_sums": [...], ...}
"""

from __future__ import annotations

import argparse
import json
import os
import time
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

N_EXAMPLES, N_FEATURES, BATCH = 256, 8, 32


def make_data(seed: int):
    """Synthetic regression data, a fixed function of the seed."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(N_EXAMPLES, N_FEATURES)).astype(np.float32)
    w = rng.normal(size=(N_FEATURES, 1)).astype(np.float32)
    y = (np.tanh(x @ w) + 0.1 * rng.normal(size=(N_EXAMPLES, 1))).astype(np.float32)
    return x, y


def build(seed: int = 1, hidden: int = 16) -> SimpleNamespace:
    """Build the training graph in a fresh tf.Graph; returns its handles."""
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(seed)  # graph seed; every random op also gets an op seed below
        x_np, y_np = make_data(seed)
        ds = (tf.data.Dataset.from_tensor_slices((x_np, y_np))
              .shuffle(N_EXAMPLES, seed=seed + 100)
              .repeat()
              .batch(BATCH))
        x, y = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        init = tf.compat.v1.glorot_uniform_initializer
        with tf.compat.v1.variable_scope("mlp"):
            w1 = tf.compat.v1.get_variable("w1", [N_FEATURES, hidden], initializer=init(seed=seed + 1))
            b1 = tf.compat.v1.get_variable("b1", [hidden], initializer=tf.compat.v1.zeros_initializer())
            w2 = tf.compat.v1.get_variable("w2", [hidden, 1], initializer=init(seed=seed + 2))
            b2 = tf.compat.v1.get_variable("b2", [1], initializer=tf.compat.v1.zeros_initializer())

        def model(inp):
            return tf.matmul(tf.tanh(tf.matmul(inp, w1) + b1), w2) + b2

        loss = tf.reduce_mean(tf.square(model(x) - y), name="loss")
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
        # A fixed evaluation batch (a constant), independent of the iterator's position.
        eval_loss = tf.reduce_mean(tf.square(model(tf.constant(x_np[:64])) - y_np[:64]), name="eval_loss")
        params = [w1, b1, w2, b2]
        return SimpleNamespace(
            graph=g, loss=loss, train_op=train_op, global_step=global_step, eval_loss=eval_loss,
            params=params, param_sums=[tf.reduce_sum(tf.cast(p, tf.float64)) for p in params],
            init=tf.compat.v1.global_variables_initializer(),
            saver=tf.compat.v1.train.Saver(),
        )


def session_config(isolate: bool):
    # TensorFlow's own server shares variables of the default container across sessions unless
    # isolate_session_state is set; Salus gives each session (job) its own state.
    return tf.compat.v1.ConfigProto(isolate_session_state=True) if isolate else None


def run_steps(sess, m: SimpleNamespace, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        loss, _ = sess.run([m.loss, m.train_op])
        losses.append(float(loss))
    return losses


def snapshot(sess, m: SimpleNamespace) -> dict:
    gs, ev, sums = sess.run([m.global_step, m.eval_loss, m.param_sums])
    return {"global_step": int(gs), "eval_loss": float(ev), "param_sums": [float(s) for s in sums]}


def train(target: str, *, seed: int = 1, steps: int = 20, hidden: int = 16, isolate: bool = False) -> dict:
    m = build(seed, hidden)
    with m.graph.as_default(), tf.compat.v1.Session(target, config=session_config(isolate)) as sess:
        sess.run(m.init)
        losses = run_steps(sess, m, steps)
        return {"losses": losses, **snapshot(sess, m)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--isolate-session-state", action="store_true")
    ap.add_argument("--barrier-dir", help="write NAME.ready there, then wait for a file named go")
    ap.add_argument("--name", default="job")
    args = ap.parse_args()
    if args.barrier_dir:
        # Start both concurrent jobs' sessions at the same moment (TF import time varies a lot).
        open(os.path.join(args.barrier_dir, args.name + ".ready"), "w").close()
        go = os.path.join(args.barrier_dir, "go")
        deadline = time.monotonic() + 300
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise SystemExit("barrier timeout")
            time.sleep(0.02)
    t0 = time.time()
    result = train(args.target, seed=args.seed, steps=args.steps, hidden=args.hidden,
                   isolate=args.isolate_session_state)
    result.update(start=t0, end=time.time())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
