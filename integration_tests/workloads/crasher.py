"""A tenant's job that crashes TensorFlow's process: `tf.data.Dataset.range(10).shuffle(2**62)` (an ordinary
tf.data pipeline with an absurd buffer size) segfaults TensorFlow 2.21 when it runs, in-process or in a server.

CLI: python crasher.py eager|function|tf1 [--target grpc://HOST:PORT]   (eager and function: SALUS_SERVER set)
Prints one JSON line: {"mode", "error": class name or null, "message"}.
"""

from __future__ import annotations

import argparse
import json

import tensorflow as tf


def crashing_dataset():
    return tf.data.Dataset.range(10).shuffle(2**62).take(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["eager", "function", "tf1"])
    p.add_argument("--target", default="")
    args = p.parse_args()
    error, message = None, ""
    try:
        if args.mode == "eager":
            value = [int(x) for x in crashing_dataset()]
        elif args.mode == "function":
            @tf.function
            def first():
                return crashing_dataset().reduce(tf.constant(0, tf.int64), lambda a, b: a + b)
            value = int(first())
        else:
            tf.compat.v1.disable_eager_execution()
            nxt = tf.compat.v1.data.make_one_shot_iterator(crashing_dataset()).get_next()
            with tf.compat.v1.Session(args.target) as sess:
                value = int(sess.run(nxt))
        message = f"survived with {value}"
    except tf.errors.OpError as err:
        error, message = type(err).__name__, err.message
    print(json.dumps({"mode": args.mode, "error": error, "message": message[:2000]}), flush=True)


if __name__ == "__main__":
    main()
