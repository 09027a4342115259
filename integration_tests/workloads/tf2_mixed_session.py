"""One process, both kinds of TensorFlow work: a TF1 graph session (tf.compat.v1.Session on its own graph)
and TF2 eager code (a tf.function training a variable). No salus import. With SALUS_SERVER set the session goes
to the master front end and the eager work to the eager front end.

prints one JSON line: {"session_losses": [...], "eager_losses": [...], "devices": [...]}
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.RandomState(3)
x_np = rng.normal(size=(32, 3)).astype(np.float32)
y_np = (x_np @ np.array([[1.0], [2.0], [-1.0]], np.float32)).astype(np.float32)

# TF2 eager first
w = tf.Variable(tf.zeros([3, 1]))


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


eager_losses = [float(step(x_np, y_np)) for _ in range(4)]

# then a TF1 graph session
with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    gw = tf.compat.v1.get_variable("gw", [3, 1], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(x, gw) - y))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        session_losses = [float(sess.run([loss, train], {x: x_np, y: y_np})[0]) for _ in range(4)]

# and eager again after the session
eager_losses += [float(step(x_np, y_np)) for _ in range(2)]

print(json.dumps({"session_losses": session_losses, "eager_losses": eager_losses,
                  "devices": sorted({w.device, w.handle.device})}))
