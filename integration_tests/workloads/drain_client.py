"""A TF1 client of test_drain_reload: one graph session (tf.compat.v1.Session("grpc://HOST:PORT")) that trains,
then is held open while the test drains the server, and probes that each open a new session of their own.

argv: TARGET (grpc://HOST:PORT). Prints one JSON line per event on stdout, then reads commands, a line each:
  probe   open a new session and run one step in it: {"probe": "ok"} or {"probe": ERROR CLASS, "code": N,
          "message": "..."} (the TensorFlow error it raised)
  finish  run the held session on and close it: {"losses": [...]} (every step of the held session)
  quit    exit
"""

import json
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

target = sys.argv[1]
rng = np.random.RandomState(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
Y = (X @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
graph = tf.Graph()
with graph.as_default():
    x = tf.placeholder(tf.float32, [None, 4], name="x")
    y = tf.placeholder(tf.float32, [None, 1], name="y")
    w = tf.get_variable("w", [4, 1], initializer=tf.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    train = tf.train.GradientDescentOptimizer(0.05).minimize(loss)
    init = tf.global_variables_initializer()
feed = {x: X, y: Y}


def emit(value: dict) -> None:
    print(json.dumps(value), flush=True)


held = tf.Session(target, graph=graph)
held.run(init)
losses = [float(held.run([loss, train], feed)[0]) for _ in range(5)]
emit({"held": True})
for line in sys.stdin:
    command = line.strip()
    if command == "probe":
        try:
            with tf.Session(target, graph=graph) as probe:
                probe.run(init)
            emit({"probe": "ok"})
        except tf.errors.OpError as err:
            emit({"probe": type(err).__name__, "code": err.error_code, "message": err.message})
    elif command == "finish":
        losses += [float(held.run([loss, train], feed)[0]) for _ in range(5)]
        held.close()
        emit({"losses": losses})
    elif command == "quit":
        break
