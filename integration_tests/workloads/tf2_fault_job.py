"""A TF2 client for the TF2 fault tests (test_tf2_faults.py): an unmodified eager script (no salus import; run with
SALUS_SERVER set, the adapter sends its eager work to the server as one job; without it, it runs in-process and
gives the reference numbers).

Every model's initial values come from numpy with a fixed seed, and intra/inter-op threads are fixed at 2, so a
mode's numbers depend only on the mode and --seed: the same sequence in-process and on a correct server.
Events are printed as JSON lines on stdout as they happen ({"phase": ..., "t": time.time()}).

--mode train    a small MLP trained by a tf.function (GradientTape, momentum by hand), one loss fetched per step:
                {"phase": "step", "n", "loss"} per step; {"phase": "ready"} after --warm steps. Steps until
                --steps (then idles), or until --stop-file exists; then {"phase": "done", "losses": [...]}.
--mode kernel   a tf.function that checks its input (check_numerics "fault-test input", assert_less
                "fault-test bound") and adds its sum to a variable: 4 good calls, a NaN, a value over the bound,
                2 good calls; {"phase": "done", "outcomes": [...]}, each {"ok", "value"} or {"ok": false,
                "error": class, "message"}.
--mode oom      a tf.function adding sum(tf.zeros(shape)) + 1 to a variable: 4 calls of shape [64, 64], one of
                [2**46] floats (256 TiB: fails at once), a good one, the huge one again, a good one; outcomes.
--mode long     --warm train steps, {"phase": "long-sent"}, one long call (--long-iters tanh(x @ w) in a
                tf.while_loop, about a second or two), {"phase": "long", "ok", "value" | "error", "message"},
                then one more train step, whose outcome (value or error) is {"phase": "after"}. A watchdog ends the process
                --deadline seconds after the start ({"phase": "done", "timed_out": true}) if a request blocks.
--mode wait     --warm train steps, {"phase": "ready"}, then waits for a line on stdin and tries up to 3 more
                train steps, until one succeeds: {"phase": "after", "attempts": [{"ok", "loss" | "error",
                "message"}, ...]}.
--mode victim   Keras 3 fit of a model whose steps take about a second ({"phase": "batch", "n"} at each batch's
                start), for --epochs; the test SIGKILLs it mid-step.
--mode reference  train (--steps), kernel, oom and long in one in-process run: {"phase": "reference", ...}.

Every mode leaves with os._exit(0) after its last line: TensorFlow's teardown of a remote context whose server
went away can block.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)

IN_DIM, WIDTH, OUT_DIM, BATCH = 16, 32, 4, 32
HUGE_SHAPE = [2 ** 46]  # float32: 256 TiB, more than a 47-bit address space
LONG_DIM = 384

_lock = threading.Lock()


def emit(msg: dict) -> None:
    with _lock:
        print(json.dumps({**msg, "t": time.time()}), flush=True)


def leave(msg: dict | None = None) -> None:
    if msg is not None:
        emit(msg)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def error_of(e: Exception) -> dict:
    return {"ok": False, "error": type(e).__name__, "message": str(getattr(e, "message", e))[-3000:]}


def settle_after_error() -> None:
    """Lets TensorFlow's client finish recording a failed remote op before the next call.

    TF's remote-eager client (against any server, TensorFlow's own too) wakes the caller waiting on a failed op's
    outputs before it marks its executor failed; the next op clears the executor's error when it starts, so if the
    caller gets there first, the mark lands after the clearing and that next op fails with the old error (seen once
    on a loaded machine: the OOM reported again by the following good call). Waiting for the executor's pending
    nodes and clearing its error closes that window; in-process it does nothing.
    """
    from tensorflow.python.eager import context
    try:
        context.async_wait()
    except tf.errors.OpError:
        pass
    context.async_clear_error()


class Mlp:
    """x -> relu(x W1 + b1) W2, softmax cross-entropy, momentum SGD by hand; everything from numpy(seed)."""

    def __init__(self, seed: int):
        rng = np.random.RandomState(seed)
        self.x = tf.constant(rng.normal(size=(BATCH, IN_DIM)).astype(np.float32))
        self.y = tf.constant(rng.randint(0, OUT_DIM, size=BATCH).astype(np.int64))
        self.vars = [tf.Variable(rng.normal(scale=0.3, size=(IN_DIM, WIDTH)).astype(np.float32)),
                     tf.Variable(np.zeros(WIDTH, np.float32)),
                     tf.Variable(rng.normal(scale=0.3, size=(WIDTH, OUT_DIM)).astype(np.float32))]
        self.slots = [tf.Variable(tf.zeros_like(v)) for v in self.vars]

        @tf.function
        def step(x, y):
            w1, b1, w2 = self.vars
            with tf.GradientTape() as tape:
                logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = tape.gradient(loss, self.vars)
            for slot, g, v in zip(self.slots, grads, self.vars):
                slot.assign(0.9 * slot + g)
                v.assign_sub(0.05 * slot)
            return loss

        self._step = step

    def step(self) -> float:
        return float(self._step(self.x, self.y).numpy())


def kernel_sequence() -> list[dict]:
    total = tf.Variable(0.0)

    @tf.function
    def add(x):
        checked = tf.debugging.check_numerics(x, "fault-test input")
        with tf.control_dependencies([tf.debugging.assert_less(checked, 1e6, message="fault-test bound")]):
            return total.assign_add(tf.reduce_sum(checked))  # a failed check leaves the total as it was

    inputs = [[1.0, 2.0, 3.0]] * 4 + [[1.0, float("nan")], [2e6], [1.0, 1.0], [1.0, 1.0]]
    outcomes = []
    for x in inputs:
        try:
            outcomes.append({"ok": True, "value": float(add(tf.constant(x, tf.float32)).numpy())})
        except tf.errors.OpError as e:
            outcomes.append(error_of(e))
            settle_after_error()
    outcomes.append({"ok": True, "total": float(total.numpy())})
    return outcomes


def oom_sequence() -> list[dict]:
    total = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def add(shape):
        total.assign_add(tf.reduce_sum(tf.zeros(shape, tf.float32)) + 1.0)
        return total.read_value()

    shapes = [[64, 64]] * 4 + [HUGE_SHAPE, [64, 64], HUGE_SHAPE, [64, 64]]
    outcomes = []
    for shape in shapes:
        t0 = time.monotonic()
        try:
            out = {"ok": True, "value": float(add(tf.constant(shape, tf.int64)).numpy())}
        except tf.errors.OpError as e:
            out = error_of(e)
            settle_after_error()
        outcomes.append({**out, "seconds": time.monotonic() - t0})
    return outcomes


def long_function(iters: int):
    rng = np.random.RandomState(5)
    w = tf.Variable((rng.normal(size=(LONG_DIM, LONG_DIM)) / np.sqrt(LONG_DIM)).astype(np.float32))
    x0 = tf.constant(rng.normal(size=(LONG_DIM, LONG_DIM)).astype(np.float32))

    @tf.function
    def long_call(x):
        _, out = tf.while_loop(lambda i, h: i < iters, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                               (tf.constant(0), x))
        return tf.reduce_sum(out)

    return lambda: float(long_call(x0).numpy())


def keras_victim(epochs: int) -> None:
    import keras
    rng = np.random.RandomState(3)
    x = rng.normal(size=(8192, 1024)).astype(np.float32)
    y = rng.normal(size=(8192, 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(2048, activation="relu"),
                              keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")

    class Announce(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.n = 0

        def on_train_batch_begin(self, batch, logs=None):
            self.n += 1
            emit({"phase": "batch", "n": self.n})

    model.fit(x, y, batch_size=4096, epochs=epochs, verbose=0, callbacks=[Announce()])
    leave({"phase": "done"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True,
                    choices=["train", "kernel", "oom", "long", "wait", "victim", "reference"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--step-sleep-ms", type=float, default=0.0)
    ap.add_argument("--stop-file")
    ap.add_argument("--long-iters", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=1000)
    ap.add_argument("--deadline", type=float, default=120.0)
    args = ap.parse_args()

    def watchdog():
        time.sleep(args.deadline)
        leave({"phase": "done", "timed_out": True})

    threading.Thread(target=watchdog, daemon=True).start()

    if args.mode == "reference":
        m = Mlp(args.seed)
        losses = [m.step() for _ in range(args.steps)]
        long_value = long_function(args.long_iters)()
        leave({"phase": "reference", "losses": losses, "kernel": kernel_sequence(), "oom": oom_sequence(),
               "long": long_value})
    if args.mode == "kernel":
        leave({"phase": "done", "outcomes": kernel_sequence()})
    if args.mode == "oom":
        leave({"phase": "done", "outcomes": oom_sequence()})
    if args.mode == "victim":
        keras_victim(args.epochs)

    m = Mlp(args.seed)
    losses: list[float] = []
    for _ in range(args.warm):
        losses.append(m.step())
    if args.mode == "long":
        run_long = long_function(args.long_iters)
        emit({"phase": "ready", "losses": losses})
        emit({"phase": "long-sent"})
        try:
            emit({"phase": "long", "ok": True, "value": run_long()})
        except Exception as e:  # reported: (d) checks that the call's value reached the client
            emit({"phase": "long", **error_of(e)})
        try:
            after = {"ok": True, "loss": m.step()}
        except Exception as e:  # the server is gone: expected, reported
            after = error_of(e)
        emit({"phase": "after", **after})
        leave({"phase": "done", "losses": losses})
    if args.mode == "wait":
        emit({"phase": "ready", "losses": losses})
        sys.stdin.readline()
        attempts = []
        for _ in range(3):  # until a step succeeds: the test checks which errors a client of a restarted server gets
            try:
                attempts.append({"ok": True, "loss": m.step()})
                break
            except Exception as e:
                attempts.append(error_of(e))
        leave({"phase": "after", "attempts": attempts})

    # train
    for n, loss in enumerate(losses, 1):
        emit({"phase": "step", "n": n, "loss": loss})
    emit({"phase": "ready"})
    while not (args.stop_file and os.path.exists(args.stop_file)):
        if len(losses) < args.steps:
            losses.append(m.step())
            emit({"phase": "step", "n": len(losses), "loss": losses[-1]})
        elif not args.stop_file:
            break
        if args.step_sleep_ms or len(losses) >= args.steps:
            time.sleep(max(args.step_sleep_ms, 20.0 if len(losses) >= args.steps else 0.0) / 1000)
    leave({"phase": "done", "losses": losses})


if __name__ == "__main__":
    main()
