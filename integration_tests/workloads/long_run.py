"""A client whose one RunStep takes a few seconds, for the graceful-shutdown test.

Prints {"phase": "warm", ...} once the session is set up and the loop length is calibrated (so the test
knows when to send SIGTERM), then {"phase": "done", ...} when the long run returns.

CLI: python long_run.py --target grpc://127.0.0.1:PORT [--seconds 3]
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()

    with tf.Graph().as_default():
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        m = tf.constant(np.random.RandomState(0).normal(size=(256, 256)).astype(np.float32) / 16)
        x0 = tf.ones([256, 256])
        i, x = tf.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, tf.tanh(tf.matmul(x, m))),
                             (tf.constant(0), x0), parallel_iterations=1)
        out = [i, tf.reduce_sum(x)]
        sess = tf.compat.v1.Session(args.target)
        sess.run(out, {n: 1})
        # Calibrate the loop length through the server so the long run lasts about --seconds.
        t0 = time.perf_counter()
        sess.run(out, {n: 50})
        per_iter = (time.perf_counter() - t0) / 50
        steps = max(200, int(args.seconds / per_iter))
        print(json.dumps({"phase": "warm", "n": steps}), flush=True)
        t0 = time.perf_counter()
        count, total = sess.run(out, {n: steps})
        print(json.dumps({"phase": "done", "i": int(count), "n": steps, "sum": float(total),
                          "seconds": time.perf_counter() - t0, "end_wall": time.time()}), flush=True)
    # The server is shutting down: TF's client retries CloseSession against a server that is gone for
    # minutes, which is not what the test is about, so leave without closing.
    os._exit(0)


if __name__ == "__main__":
    main()
